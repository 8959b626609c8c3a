"""torch_gemm_bench.py: PyTorch's matmuls at one micro-step's linear-layer GEMM shapes, each alone, with
the kernel each runs; the counterpart of build/gemm_bench (same shapes, same repetitions), to tell whether
a gap to the torch.compile peer is in the kernels cuBLAS picks or elsewhere.

    python3 dev/bench/torch_gemm_bench.py C N        # e.g. 1024 32768 (d24, B=32) or 768 65536 (d12, B=64)
Prints per linear (qkv, attproj, fc, fcproj): forward with bias, dgrad, wgrad: ms, TFLOP/s, kernel names.
"""
import sys
if len(sys.argv) != 3 or not all(a.isdigit() and int(a) > 0 for a in sys.argv[1:]):
    sys.exit("usage: python3 dev/bench/torch_gemm_bench.py C N   (channels and rows per micro-step, positive integers)")
import torch
from torch.profiler import profile, ProfilerActivity
torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
if not torch.cuda.is_available():
    sys.exit("torch_gemm_bench: no CUDA device")
C = int(sys.argv[1]); N = int(sys.argv[2]); reps = 20
dev = "cuda"; bf = torch.bfloat16
print(f"torch {torch.__version__} (CUDA {torch.version.cuda}) C={C} N={N}")
def t(fn):
    for _ in range(3): fn()
    s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(); s.record()
    for _ in range(reps): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / reps
def kname(fn):
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as p:
        fn(); torch.cuda.synchronize()
    names = [ev.name for ev in p.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    return ",".join(n[:70] for n in names)
for name, OC in [("qkv", 3 * C), ("attproj", C), ("fc", 4 * C), ("fcproj", C)]:
    IC = 4 * C if name == "fcproj" else C
    x = torch.rand(N, IC, device=dev, dtype=bf) * 2 - 1
    W = torch.rand(OC, IC, device=dev, dtype=bf) * 2 - 1
    b = torch.rand(OC, device=dev, dtype=bf)
    dy = torch.rand(N, OC, device=dev, dtype=bf) * 2 - 1
    flop = 2.0 * N * OC * IC
    for what, fn in [("forward+bias", lambda: torch.nn.functional.linear(x, W, b)),
                     ("dgrad", lambda: dy @ W),
                     ("wgrad", lambda: dy.t() @ x)]:
        ms = t(fn)
        print(f"{name:8s} {what:13s} {ms:7.3f} ms {flop / ms / 1e9:6.1f} TFLOP/s  {kname(fn)}")
