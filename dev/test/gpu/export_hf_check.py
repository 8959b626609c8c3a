"""Check an exported Hugging Face directory against the trainer: mean cross-entropy on a token shard.

    python3 dev/test/gpu/export_hf_check.py OUTDIR SHARD.bin -b 8 -t 1024 --batches 20 --expect 3.2871 --tol 2e-3

Loads OUTDIR with transformers.GPT2LMHeadModel.from_pretrained (no custom code) and computes the mean
next-token cross-entropy over the first --batches batches of SHARD, read as llm.c's dataloader reads a
shard on one process (llmc/dataloader.h): batch k is the tokens [k*B*T, k*B*T + B*T + 1), the inputs its
first B*T as B rows of T, the targets the same shifted by one. That is what the trainer's "val loss" line
reports for a one-process run with -b B -t T -m BATCHES on a one-shard validation set, so pass that number
as --expect. Prints both and the difference; exits 1 when |difference| > --tol.

Needs torch and transformers (it uses the GPU when there is one). The layout it relies on is checked without
them by dev/test/cpu/test_export_hf.py.
"""
import argparse
import sys

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GPT2LMHeadModel


def read_shard(path):
    header = np.fromfile(path, dtype="<i4", count=256)
    if header.size != 256 or header[0] != 20240520:
        sys.exit(f"error: {path} is not an llm.c token shard")
    return np.fromfile(path, dtype="<u2", count=int(header[2]), offset=1024)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("shard")
    ap.add_argument("-b", type=int, default=8, help="rows per batch (B)")
    ap.add_argument("-t", type=int, default=1024, help="sequence length (T)")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--expect", type=float, required=True, help="the trainer's loss on the same batches")
    ap.add_argument("--tol", type=float, default=2e-3, help="largest allowed |loss - expect|")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32", help="compute type")
    args = ap.parse_args()

    tokens = read_shard(args.shard)
    BT = args.b * args.t
    if len(tokens) < args.batches * BT + 1:
        sys.exit(f"error: {args.shard} has {len(tokens)} tokens, fewer than {args.batches} batches of {BT} + 1")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = GPT2LMHeadModel.from_pretrained(args.outdir, torch_dtype=getattr(torch, args.dtype)).to(device).eval()

    total = 0.0
    with torch.no_grad():
        for k in range(args.batches):
            chunk = torch.from_numpy(tokens[k * BT:k * BT + BT + 1].astype(np.int64)).to(device)
            x = chunk[:-1].view(args.b, args.t)
            y = chunk[1:].view(args.b, args.t)
            logits = model(x).logits.float()
            total += F.cross_entropy(logits.view(-1, logits.size(-1)), y.reshape(-1)).item()
    loss = total / args.batches
    diff = loss - args.expect
    print(f"HF loss {loss:.6f}  expected {args.expect:.6f}  difference {diff:+.6f}  (tolerance {args.tol})")
    sys.exit(0 if abs(diff) <= args.tol else 1)


if __name__ == "__main__":
    main()
