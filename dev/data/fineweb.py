"""Tokenize FineWeb or FineWeb-Edu (or any local text corpus) into llm.c token shards.

    python3 dev/data/fineweb.py                         # HF dataset HuggingFaceFW/fineweb, sample-10BT (network)
    python3 dev/data/fineweb.py --edu                   # HF dataset HuggingFaceFW/fineweb-edu, sample-10BT
    python3 dev/data/fineweb.py --edu --name sample-100BT   # FineWeb-Edu's 100B-token sample
    python3 dev/data/fineweb.py --local-dir DIR         # *.parquet / *.jsonl / *.txt files under DIR (offline)

Each document becomes <|endoftext|> followed by its GPT-2 tokens; the token stream is cut into
shards of --shard-size tokens (default 100M; a document can straddle two shards). Shard 0 is the
validation split, the rest are training data:
    dev/data/fineweb10B/fineweb_val_000000.bin
    dev/data/fineweb10B/fineweb_train_000001.bin ...
The last shard holds whatever is left, so it is usually shorter. Also writes dev/data/gpt2_tokenizer.bin.

The names follow llm.c's fineweb.py: the subset sample-<N>BT goes to fineweb<N>B/ (FineWeb) or
edu_fineweb<N>B/ (--edu, FineWeb-Edu, whose shards are edu_fineweb_val_000000.bin,
edu_fineweb_train_000001.bin, ...); a subset of another name (a single crawl, CC-MAIN-...) to
fineweb_<name>/ or edu_fineweb_<name>/. --edu also names the shards of a --local-dir run, for a local
copy of FineWeb-Edu. --out-dir overrides the directory, never the file names.

Local inputs: .parquet and .jsonl rows take their "text" field (parquet needs pyarrow);
a .txt file is one document.
"""
import argparse
import json
import multiprocessing as mp
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import data_common as dc  # noqa: E402

_enc = None  # per worker process


def _init_worker(data_dir):
    # with fork the parent's encoding is inherited; with spawn each worker builds its own
    global _enc
    if _enc is None:
        _enc = dc.get_gpt2_encoding(data_dir, quiet=True)


def tokenize_doc(text):
    """<|endoftext|> + the document's tokens, as uint16."""
    toks = [dc.GPT2_EOT]
    toks.extend(_enc.encode_ordinary(text))
    return np.asarray(toks, dtype=np.uint16)


def iter_local_docs(local_dir):
    files = []
    for root, _, names in os.walk(local_dir):
        for n in names:
            if n.endswith((".parquet", ".jsonl", ".txt")):
                files.append(os.path.join(root, n))
    files.sort()
    if not files:
        sys.exit(f"error: no .parquet, .jsonl or .txt files under --local-dir {local_dir}")
    for path in files:
        if path.endswith(".txt"):
            with open(path, "r", encoding="utf-8") as f:
                yield f.read()
        elif path.endswith(".jsonl"):
            with open(path, "r", encoding="utf-8") as f:
                for lineno, line in enumerate(f, 1):
                    if not line.strip():
                        continue
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError as e:
                        sys.exit(f"error: {path}:{lineno}: not JSON ({e})")
                    if not isinstance(row, dict) or not isinstance(row.get("text"), str):
                        sys.exit(f"error: {path}:{lineno}: expected an object with a string \"text\" field")
                    yield row["text"]
        else:
            try:
                import pyarrow.parquet as pq
            except ImportError:
                sys.exit(f"error: reading {path} needs pyarrow (pip install pyarrow)")
            pf = pq.ParquetFile(path)
            if "text" not in pf.schema_arrow.names:
                sys.exit(f"error: {path} has no \"text\" column")
            for batch in pf.iter_batches(columns=["text"], batch_size=1024):
                for t in batch.column(0).to_pylist():
                    if t is not None:
                        yield t


def dataset_layout(edu, name):
    """(HF dataset, default output directory, shard file prefix) of FineWeb (edu False) or FineWeb-Edu
    (edu True) subset `name`; llm.c's names: sample-10BT -> fineweb10B/fineweb_*, edu_fineweb10B/edu_fineweb_*."""
    m = re.fullmatch(r"sample-(\d+)BT", name)
    suffix = f"{m.group(1)}B" if m else f"_{name}"
    prefix = "edu_fineweb" if edu else "fineweb"
    dataset = "HuggingFaceFW/fineweb-edu" if edu else "HuggingFaceFW/fineweb"
    return dataset, os.path.join(dc.REPO_ROOT, "dev", "data", prefix + suffix), prefix


def shard_name(prefix, index):
    """Shard 0 is the validation split, the others training data: <prefix>_{val|train}_<index:06d>.bin."""
    split = "val" if index == 0 else "train"
    return f"{prefix}_{split}_{index:06d}.bin"


def iter_hf_docs(dataset, name):
    try:
        from datasets import load_dataset
    except ImportError:
        sys.exit("error: the HF dataset needs `pip install datasets` and network; or pass --local-dir")
    ds = load_dataset(dataset, name=name, split="train", streaming=True)
    for row in ds:
        yield row["text"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--local-dir", default=None, help="tokenize the .parquet/.jsonl/.txt files here instead of the HF dataset")
    ap.add_argument("--edu", action="store_true",
                    help="FineWeb-Edu (HuggingFaceFW/fineweb-edu) instead of FineWeb: edu_fineweb<N>B/edu_fineweb_*.bin")
    ap.add_argument("--name", default="sample-10BT",
                    help="HF subset: sample-10BT, sample-100BT, ... (names the output directory too)")
    ap.add_argument("--data-dir", default=None, help="directory with encoder.json and vocab.bpe (GPT-2 BPE)")
    ap.add_argument("--out-dir", default=None,
                    help="output directory (default dev/data/fineweb10B, or edu_fineweb10B with --edu; "
                         "100B for sample-100BT)")
    ap.add_argument("--tokenizer-out", default=os.path.join(dc.REPO_ROOT, "dev", "data", "gpt2_tokenizer.bin"))
    ap.add_argument("--shard-size", type=int, default=10**8, help="tokens per shard")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 1), help="tokenizer processes")
    ap.add_argument("--max-docs", type=int, default=-1, help="stop after this many documents (-1 = all)")
    args = ap.parse_args()
    dataset, default_out_dir, prefix = dataset_layout(args.edu, args.name)
    if args.out_dir is None:
        args.out_dir = default_out_dir
    if args.shard_size < 1:
        sys.exit("error: --shard-size must be >= 1")

    if args.local_dir and not os.path.isdir(args.local_dir):
        sys.exit(f"error: --local-dir {args.local_dir} is not a directory")

    global _enc
    _enc = dc.get_gpt2_encoding(args.data_dir)
    dc.write_tokenizer(_enc, args.tokenizer_out)

    docs = iter_local_docs(args.local_dir) if args.local_dir else iter_hf_docs(dataset, args.name)
    if args.max_docs >= 0:
        docs = (d for i, d in zip(range(args.max_docs), docs))

    if args.workers > 1:
        pool = mp.Pool(args.workers, initializer=_init_worker, initargs=(args.data_dir,))
        tokenized = pool.imap(tokenize_doc, docs, chunksize=16)   # imap keeps document order
    else:
        pool = None
        tokenized = map(tokenize_doc, docs)

    def shard_path(index):
        return os.path.join(args.out_dir, shard_name(prefix, index))

    # fill a fixed buffer; when a document does not fit, its head ends this shard and its tail
    # starts the next one
    buf = np.empty(args.shard_size, dtype=np.uint16)
    fill = 0
    shard = 0
    ndocs = 0
    total = 0
    for toks in tokenized:
        ndocs += 1
        total += len(toks)
        while len(toks) > 0:
            take = min(len(toks), args.shard_size - fill)
            buf[fill:fill + take] = toks[:take]
            fill += take
            toks = toks[take:]
            if fill == args.shard_size:
                dc.write_datafile(shard_path(shard), buf)
                shard += 1
                fill = 0
    if fill > 0:
        dc.write_datafile(shard_path(shard), buf[:fill])
        shard += 1
    if pool is not None:
        pool.close()
        pool.join()
    print(f"{ndocs:,} documents, {total:,} tokens, {shard} shard(s) in {args.out_dir}")
    if shard < 2:
        print("warning: everything fit in the validation shard; there is no training shard (lower --shard-size)")


if __name__ == "__main__":
    main()
