"""Tokenize tiny-shakespeare (~1 MB of text, ~338k GPT-2 tokens) into llm.c token shards.

    python3 dev/data/tinyshakespeare.py [--data-dir DIR]

Reads tinyshakespeare.txt from the first of: --data-dir, $LLMC_SHARED_DATA, <repo>/../shared/data,
<repo>/shared/data; if it is in none of them, downloads it (needs network). Writes
    dev/data/tinyshakespeare/tiny_shakespeare_val.bin    the first 32,768 tokens
    dev/data/tinyshakespeare/tiny_shakespeare_train.bin  the rest
    dev/data/gpt2_tokenizer.bin                          decoder table, for printing samples

Every "\\n\\n"-separated section (a speech) starts with <|endoftext|>, so the model sees document
boundaries the same way it would in web data.

    python3 dev/data/tinyshakespeare.py --repeat-to 2000000 --out-dir dev/data/tinyshakespeare_2M

writes each split repeated end to end until it holds at least that many tokens. A step of
scripts/run_gpt2_124M.sh (-d 524288) needs more tokens than the train split has, and a validation
batch there (B 64 × T 1024 × processes) more than the val split: the repeated shards let that
script run on this text for speed and scaling measurements. The model then sees each token many
times per epoch, so its loss is a memorization curve: good for comparing two runs, not for quality.
"""
import argparse
import os
import sys
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_common as dc  # noqa: E402

URL = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt"
VAL_TOKENS = 32768


def load_text(data_dir, out_dir):
    path = dc.find_local_file("tinyshakespeare.txt", data_dir)
    if path is None:
        # a download we made earlier
        cached = os.path.join(out_dir, "tiny_shakespeare.txt")
        if os.path.isfile(cached):
            path = cached
        else:
            print(f"tinyshakespeare.txt not found in {dc.candidate_dirs(data_dir)}; downloading {URL}")
            try:
                with urllib.request.urlopen(URL, timeout=60) as r:
                    data = r.read()
            except Exception as e:
                sys.exit(f"error: cannot download tiny-shakespeare ({e}); put tinyshakespeare.txt in --data-dir")
            dc.atomic_write(cached, [data])
            path = cached
    print(f"text from {path}")
    with open(path, "r", encoding="utf-8") as f:
        return f.read()


def tokenize(enc, text):
    # "<|endoftext|>" before the text and after every blank line, then encode with the special
    # token allowed, so each one becomes the single id 50256.
    marked = "<|endoftext|>" + text.replace("\n\n", "\n\n<|endoftext|>")
    return enc.encode(marked, allowed_special={"<|endoftext|>"})


def repeat_to(tokens, min_tokens):
    """tokens repeated whole, end to end, the fewest times that give at least min_tokens tokens."""
    copies = max(1, -(-min_tokens // len(tokens)))
    return list(tokens) * copies


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data-dir", default=None, help="directory with tinyshakespeare.txt, encoder.json, vocab.bpe")
    ap.add_argument("--out-dir", default=os.path.join(dc.REPO_ROOT, "dev", "data", "tinyshakespeare"))
    ap.add_argument("--tokenizer-out", default=os.path.join(dc.REPO_ROOT, "dev", "data", "gpt2_tokenizer.bin"))
    ap.add_argument("--repeat-to", type=int, default=0, metavar="TOKENS",
                    help="repeat each split end to end until it holds at least TOKENS tokens (0 = no repetition)")
    args = ap.parse_args()
    if args.repeat_to < 0:
        sys.exit(f"error: --repeat-to {args.repeat_to} must be >= 0")

    enc = dc.get_gpt2_encoding(args.data_dir)
    text = load_text(args.data_dir, args.out_dir)
    tokens = tokenize(enc, text)
    if len(tokens) <= VAL_TOKENS:
        sys.exit(f"error: only {len(tokens)} tokens; expected the full tiny-shakespeare text")
    val, train = tokens[:VAL_TOKENS], tokens[VAL_TOKENS:]
    print(f"tokens: {len(tokens):,} total = {len(val):,} val + {len(train):,} train")
    if args.repeat_to > 0:
        val, train = repeat_to(val, args.repeat_to), repeat_to(train, args.repeat_to)
        print(f"repeated to at least {args.repeat_to:,} tokens: {len(val):,} val, {len(train):,} train")
    dc.write_datafile(os.path.join(args.out_dir, "tiny_shakespeare_val.bin"), val)
    dc.write_datafile(os.path.join(args.out_dir, "tiny_shakespeare_train.bin"), train)
    dc.write_tokenizer(enc, args.tokenizer_out)


if __name__ == "__main__":
    main()
