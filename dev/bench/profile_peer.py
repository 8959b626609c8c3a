#!/usr/bin/env python3
"""Where the PyTorch peer's step goes: its GPU kernels grouped into the trainer's phases.

    python3 dev/bench/profile_peer.py --size d24 [--peer-kind torch-bf16] [--B 32 --T 1024 --total-batch 524288]

Builds the same peer as dev/bench/bench.py (its make_peer_model: the dev/reference model, bf16 autocast,
SDPA, fused AdamW, torch.compile, the peer kind's loss and, for a torchao kind, its FP8 Linears; torchao
must be importable), runs warm-up steps, then records one optimizer step with torch.profiler and sums
the CUDA kernel time per group: GEMMs (cuBLAS / CUTLASS / nvjet), attention forward and backward
(flash / cuDNN / memory-efficient SDPA kernels), Triton kernels (torch.compile's fused elementwise,
LayerNorm, softmax / cross-entropy), the optimizer, and the rest. The trainer's own per-phase view
is `LLMC_PROFILE=1 ./train_gpt_bf16 ...`; comparing the two says which phase loses to the peer.

Prints one table (ms per optimizer step, share) and the heaviest kernels. Needs a GPU.
"""
import argparse
import os
import re
import sys
from collections import defaultdict

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Ordered: the first pattern that matches a kernel's name decides its group.
GROUPS = [
    ("attention backward", re.compile(r"flash_bwd|fmha.*(bwd|backward|B_)|attn.*bwd|bprop|dgrad.*attn", re.I)),
    ("attention forward", re.compile(r"flash_fwd|fmha|attn|attention|fprop", re.I)),
    ("GEMMs", re.compile(r"gemm|nvjet|xmma|cutlass|cublas|sm90_|sm80_", re.I)),
    ("optimizer", re.compile(r"adam|multi_tensor|foreach|_amp_|clip", re.I)),
    ("Triton (fused elementwise, norms, loss)", re.compile(r"^triton_", re.I)),
]


def group_of(name):
    for group, pattern in GROUPS:
        if pattern.search(name):
            return group
    return "other"


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="d12")
    p.add_argument("--peer-kind", default="torch-bf16", help="one of bench.py's PEERS (default torch-bf16)")
    p.add_argument("--B", type=int, default=None, help="micro-batch (default: the bench's for the size)")
    p.add_argument("--T", type=int, default=None)
    p.add_argument("--total-batch", type=int, default=524288)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=25, help="how many of the heaviest kernels to list")
    a = p.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile
    sys.path.insert(0, os.path.join(REPO_ROOT, "dev", "bench"))
    import bench

    B0, T0 = bench.SIZE_DEFAULTS[a.size]
    B, T = a.B or B0, a.T or T0
    accum = a.total_batch // (B * T)
    if accum * B * T != a.total_batch:
        sys.exit(f"total batch {a.total_batch} is not a multiple of B*T = {B * T}")
    if not torch.cuda.is_available():
        sys.exit("profile_peer.py needs a CUDA device")

    if a.peer_kind not in bench.PEERS:
        sys.exit(f"--peer-kind {a.peer_kind}: not one of {', '.join(bench.PEERS)}")
    bench.allow_fast_fp32_matmuls(torch)
    model, _ = bench.make_peer_model(a.peer_kind, a.size, "cuda")
    params = list(model.parameters())
    opt = torch.optim.AdamW([{"params": [t for t in params if t.dim() >= 2], "weight_decay": 0.1},
                             {"params": [t for t in params if t.dim() < 2], "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    batches = []
    for _ in range(min(accum, 16)):
        buf = torch.randint(0, bench.VOCAB_SIZE, (B, T + 1), device="cuda", generator=gen)
        batches.append((buf[:, :-1].contiguous(), buf[:, 1:].contiguous()))
    fwd = torch.compile(model)

    def step():
        for m in range(accum):
            x, y = batches[m % len(batches)]
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                _, loss = fwd(x, y, return_logits=False)
            (loss / accum).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()

    per_kernel = defaultdict(lambda: [0.0, 0])   # name -> [total us, calls]
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA and ev.device_time_total > 0:
            k = per_kernel[ev.name]
            k[0] += ev.device_time_total
            k[1] += 1
    groups = defaultdict(float)
    for name, (us, _) in per_kernel.items():
        groups[group_of(name)] += us
    total = sum(groups.values())
    print(f"# peer kernels, one optimizer step: {a.peer_kind}, {a.size}, B={B}, T={T}, {accum} micro-steps, "
          f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    print(f"{'group':42s} {'ms/step':>10s} {'share':>7s}")
    for g, us in sorted(groups.items(), key=lambda kv: -kv[1]):
        print(f"{g:42s} {us / 1e3:10.3f} {100 * us / total:6.1f}%")
    print(f"{'total kernel time':42s} {total / 1e3:10.3f}")
    print(f"\n# the {a.top} heaviest kernels")
    print(f"{'ms/step':>10s} {'calls':>6s}  group / name")
    for name, (us, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:a.top]:
        print(f"{us / 1e3:10.3f} {n:6d}  [{group_of(name)}] {name[:150]}")


if __name__ == "__main__":
    main()
