"""HellaSwag for evaluation during training: the validation split, GPT-2-tokenized, in llm.c's
multiple-choice eval file format (llm.c's own hellaswag_val.bin files read here too).

    python3 dev/data/hellaswag.py                      # downloads hellaswag_val.jsonl (network), or
    python3 dev/data/hellaswag.py --jsonl FILE         # a local copy of it (any file of that format)

writes dev/data/hellaswag/hellaswag_val.bin (--out). Each example is a context and four endings; the model
picks the ending whose tokens have the lowest mean cross-entropy after the context (acc_norm, as llm.c and
lm-evaluation-harness score it). An ending is tokenized with a leading space, as it continues the context.

Eval file, little-endian:
    256 x int32 header: [0] = 20240522 (magic), [1] = 1 (version), [2] = number of examples,
                        [3] = bytes of the longest example, rest 0
    per example, a run of uint16:
        65535 (start of an example), the example's bytes (these three values included), its index (0, 1, ...),
        the label (index of the right ending), the number of endings (4),
        the context's token count, its tokens, then per ending: its token count, its tokens
Every count and index must fit in a uint16; an example over 65,535 bytes cannot be written.
"""
import argparse
import json
import os
import sys
import urllib.request

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_common as dc  # noqa: E402

EVAL_MAGIC = 20240522
EVAL_VERSION = 1
START_OF_EXAMPLE = 65535
HELLASWAG_VAL_URL = "https://raw.githubusercontent.com/rowanz/hellaswag/master/data/hellaswag_val.jsonl"


def read_jsonl(path):
    """The examples of a HellaSwag .jsonl: dicts with ctx (str), endings (list of str) and label (int)."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for line_number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                ex = json.loads(line)
                ctx, endings, label = ex["ctx"], ex["endings"], int(ex["label"])
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f"{path}:{line_number}: not a HellaSwag example ({e})") from None
            if not isinstance(ctx, str) or not isinstance(endings, list) or not all(isinstance(e, str) for e in endings):
                raise ValueError(f"{path}:{line_number}: ctx must be text and endings a list of texts")
            if not 0 <= label < len(endings):
                raise ValueError(f"{path}:{line_number}: label {label} is not one of its {len(endings)} endings")
            examples.append((ctx, endings, label))
    if not examples:
        raise ValueError(f"{path}: no examples")
    return examples


def encode_example(index, ctx_tokens, ending_tokens, label):
    """One example as its uint16 run (see the module's docstring)."""
    body = [label, len(ending_tokens), len(ctx_tokens), *ctx_tokens]
    for toks in ending_tokens:
        body += [len(toks), *toks]
    n_bytes = 2 * (3 + len(body))
    values = [START_OF_EXAMPLE, n_bytes, index, *body]
    if not ctx_tokens or any(not t for t in ending_tokens):
        raise ValueError(f"example {index}: the context and every ending need at least one token")
    if max(values) > 65535 or index > 65534:
        raise ValueError(f"example {index}: a count, index or size does not fit in 16 bits ({n_bytes} bytes)")
    return np.asarray(values, dtype="<u2")


def write_eval_file(path, examples):
    """examples: (context tokens, [ending tokens, ...], label) triples, in order."""
    runs = [encode_example(i, ctx, ends, label) for i, (ctx, ends, label) in enumerate(examples)]
    header = np.zeros(dc.HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = EVAL_MAGIC, EVAL_VERSION, len(runs)
    header[3] = max(r.nbytes for r in runs)
    dc.atomic_write(path, [header.tobytes()] + [r.tobytes() for r in runs])
    print(f"wrote {len(runs):,} examples to {path}")


def tokenize_examples(enc, examples):
    out = []
    for ctx, endings, label in examples:
        out.append((enc.encode_ordinary(ctx), [enc.encode_ordinary(" " + e) for e in endings], label))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--jsonl", default=None, help="a local hellaswag_val.jsonl instead of the download")
    ap.add_argument("--data-dir", default=None, help="directory with encoder.json and vocab.bpe (GPT-2 BPE)")
    ap.add_argument("--out", default=os.path.join(dc.REPO_ROOT, "dev", "data", "hellaswag", "hellaswag_val.bin"))
    args = ap.parse_args(argv)
    src = args.jsonl
    if src is None:
        src = os.path.join(os.path.dirname(os.path.abspath(args.out)), "hellaswag_val.jsonl")
        if not os.path.isfile(src):
            print(f"downloading {HELLASWAG_VAL_URL}")
            try:
                os.makedirs(os.path.dirname(src), exist_ok=True)
                with urllib.request.urlopen(HELLASWAG_VAL_URL, timeout=60) as r:
                    dc.atomic_write(src, [r.read()])
            except OSError as e:
                sys.exit(f"error: cannot download HellaSwag ({e}); pass a local copy with --jsonl FILE")
    try:
        examples = read_jsonl(src)
        enc = dc.get_gpt2_encoding(args.data_dir, quiet=True)
        write_eval_file(args.out, tokenize_examples(enc, examples))
    except (OSError, ValueError) as e:
        sys.exit(f"error: {e}")


if __name__ == "__main__":
    main()
