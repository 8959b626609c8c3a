#!/usr/bin/env python3
"""The project's speed protocol (doc/protocol.md, "dev/bench") in one command.

    python3 dev/bench/bench.py [--sizes d12,d24] [--recipes bf16,fp8] [--out out/bench.md]
    python3 dev/bench/bench.py --sizes d48 --recipes "bf16,tcfp12,tcfp12:-tabd 1 -tfw 1 -tfa 1"   (a recipe with flags: a row of its own)

For every model size it runs every recipe's trainer (train_gpt_<recipe>) and the PyTorch peers
(the dev/reference/gpt_reference.py model as nanoGPT trains it: FP32 parameters, bf16 autocast, SDPA,
fused AdamW, torch.compile, the loss over the padded vocabulary; and the same with torchao's float8
training, tensorwise and rowwise; PEERS below) on synthetic uniform random tokens, one run at a time
on GPU 0 (with --gpus 1,2 each recipe also on GPUs 0-1, data parallel through scripts/launch.sh),
and prints one table:

    size | recipe | GPUs | B | T | ms/step | tok/s | MFU % | peak GiB | vs peer | vs FP8 peer | vs bf16 | vs 1 GPU | notes

vs peer is against the fastest BF16 peer of the size, vs FP8 peer (FP8 rows: our fp8 recipe and
the torchao peers) against the fastest torchao FP8 peer.

Protocol: total batch 524,288 tokens per optimizer step (gradient accumulation over
total / (B*T) micro-steps), 5 warm-up steps, then the median of 10 timed steps.
MFU counts 6*N + 6*L*C*T FLOPs per token (N = all parameters, as llm.c) against the GPU's dense
BF16 peak (989.4 TFLOP/s on H100/H200, the trainer's own figure).

Micro-batch sizes: the defaults below are starting points. A run that runs out of GPU memory is
retried with B halved (ours and each peer independently), and the table reports the B used.

Rounds (--repeat N): the whole plan runs N times over (every recipe and the peers, then all again), and
each round's ratios use that round's bf16 and peer rows. The report adds one line per recipe over the
rounds: the median ms/step and the median and range of its ratios. Where a ratio sits near a target, one
round cannot say which side it is on: machines and runs of one binary vary by a few ms at d12.

The script itself never imports torch: each peer runs in a subprocess per size (this same file
with --peer-worker), so one run's GPU memory cannot leak into the next measurement.
"""
import argparse
import datetime
import glob
import json
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Recipe names the project plans (README): a Makefile target train_gpt_<name> is benchmarked
# by default only if <name> is in this list (so e.g. the fp32 reference build is left out).
KNOWN_RECIPES = ["bf16", "fp8", "tcfp12", "nvfp4", "q115", "vcast"]

# Per-size starting micro-batch B and sequence length T. GPT-2 sizes have maxT 1024, GPT-3 2048.
# The B values are starting points (the protocol's "largest B that fits"); on OOM the run is retried with
# B/2. On an 80 GB GPU d24 64 fits ours and the peer; d36 32 fits both; gpt3:c768 64 fits ours and the peer
# falls back to 32; d48 16 fits bf16 and fp8. On a 141 GB H200 d48 32 fits both, so d48 starts at 32: an
# H200 runs the protocol's largest B, an 80 GB GPU runs out of memory at allocation (seconds) and falls
# back to 16; recipes that need more (tcfp12) and the peer fall back further.
SIZE_DEFAULTS = {
    "d6": (64, 1024),
    "d12": (64, 1024),
    "d24": (64, 1024),
    "d36": (32, 1024),
    "d48": (32, 1024),
    "gpt3:c768": (64, 2048),
}

VOCAB_SIZE = 50257          # GPT-2 vocab; synthetic tokens are uniform in [0, VOCAB_SIZE)
SHARD_MAGIC = 20240520      # llm.c token shard header (llmc/dataloader.h)
SHARD_VERSION = 1
SHARD_HEADER_INTS = 256
GIB = 1024.0 ** 3

# The PyTorch peers: kind (--peers) -> (the row's name in the table, family, what it runs).
# Every peer trains the dev/reference model with FP32 parameters, bf16 autocast, SDPA, fused AdamW and
# torch.compile. The family says which ratio a peer sets: "bf16" peers `vs peer`, "fp8" peers `vs FP8 peer`.
PEERS = {
    # nanoGPT: the cross-entropy over all 50,304 logits of the padded vocabulary
    "torch-bf16": ("torch.compile bf16", "bf16", {"padded_loss": True, "fp8_recipe": None}),
    # the loss over the logits sliced to the 50,257 real tokens (the trainer's loss): slower, so only on request
    "torch-bf16-sliced": ("torch.compile bf16 sliced", "bf16", {"padded_loss": False, "fp8_recipe": None}),
    # torchao.float8.convert_to_float8_training with Float8LinearConfig.from_recipe_name(recipe): the blocks'
    # four nn.Linear per layer in FP8, the tied LM head (F.linear on wte, no nn.Linear) stays bf16
    "torchao-fp8-tensorwise": ("torchao fp8 tensorwise", "fp8", {"padded_loss": True, "fp8_recipe": "tensorwise"}),
    "torchao-fp8-rowwise": ("torchao fp8 rowwise", "fp8", {"padded_loss": True, "fp8_recipe": "rowwise"}),
}
DEFAULT_PEERS = ["torch-bf16", "torchao-fp8-tensorwise", "torchao-fp8-rowwise"]
# Our recipes whose rows (and RECIPE:FLAGS variants) also get `vs FP8 peer`
FP8_FAMILY_RECIPES = {"fp8"}
# Where bench.py looks for a torchao wheel by default (git-ignored; it travels with the checkout)
TORCHAO_WHEEL_GLOB = os.path.join(".deps", "wheels", "torchao-*.whl")

# Dense BF16 tensor-core peak by GPU name; the same table as peak_bf16_flops() in train_gpt.cu,
# so our MFU column agrees with the trainer's own per-step MFU.
PEAK_BF16_FLOPS = [(("H100", "H200", "H800"), 989.4e12), (("A100", "A800"), 312e12)]


# ================================================================================================
# arguments


def build_arg_parser():
    p = argparse.ArgumentParser(
        description="Speed protocol: every recipe and the PyTorch peer, one table (doc/protocol.md).")
    p.add_argument("--sizes", default="d12",
                   help="comma list of model descriptors, e.g. d12,d24,d36,d48,gpt3:c768 (default d12)")
    p.add_argument("--recipes", default=None,
                   help="comma list of recipes (default: every train_gpt_<r> target of the Makefile "
                        f"with r in {','.join(KNOWN_RECIPES)}); RECIPE:FLAGS runs train_gpt_RECIPE with the "
                        "trainer flags FLAGS added, as its own row, e.g. 'bf16,tcfp12,tcfp12:-tabd 1 -tfw 1'"),
    p.add_argument("--steps", type=int, default=10, help="timed steps (median over these; protocol: >= 10)")
    p.add_argument("--warmup", type=int, default=5, help="warm-up steps before the timed ones (default 5)")
    p.add_argument("--total-batch", type=int, default=524288, help="tokens per optimizer step (default 524288)")
    p.add_argument("--B", dest="B", default=None,
                   help="starting micro-batch: one number for every size, or SIZE=B pairs "
                        "(e.g. d24=16,d48=4); default per size: "
                        + ", ".join(f"{s} {b}" for s, (b, _) in SIZE_DEFAULTS.items()))
    p.add_argument("--T", dest="T", type=int, default=None,
                   help="sequence length for every size (default: 1024 for GPT-2 sizes, 2048 for GPT-3)")
    p.add_argument("--gpus", default="1",
                   help="comma list of process counts, one GPU each, e.g. 1,2: every recipe runs once per "
                        "count (counts above 1 through scripts/launch.sh, data parallel, the same total batch); "
                        "the peers run on 1 GPU (default 1)")
    p.add_argument("--repeat", type=int, default=1,
                   help="run the whole plan this many times in rounds; the report gives each round's rows and, "
                        "per recipe, the median and range of the ratios over the rounds (default 1)")
    p.add_argument("--no-peer", action="store_true", help="skip every PyTorch peer (whatever --peers says)")
    p.add_argument("--peers", default=None,
                   help="comma list of peer kinds to run, 'default' or 'all' (default: "
                        f"{','.join(DEFAULT_PEERS)}; all: {','.join(PEERS)})")
    p.add_argument("--torchao-wheel", default="auto",
                   help="the torchao wheel the FP8 peers import: a .whl path, installed (pip --no-deps --no-index "
                        "--target) into a temporary directory put first on the peers' PYTHONPATH; 'auto' "
                        f"(default): the newest {TORCHAO_WHEEL_GLOB} if there is one, else the peer python's own "
                        "torchao; 'none': the peer python's own torchao")
    p.add_argument("--no-build", action="store_true", help="use the existing train_gpt_<r> binaries")
    p.add_argument("--out", default=None,
                   help="write the markdown table to FILE, the raw JSON beside it (FILE with .json), "
                        "and every run's log under FILE's stem + _logs/")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per trainer run (default 300)")
    p.add_argument("--peer-timeout", type=float, default=None,
                   help="seconds per peer run, compile included (default: --timeout)")
    p.add_argument("--peer-python", default=sys.executable, help="python with torch for the peers")
    p.add_argument("--peer-eager", action="store_true", help="run the peers without torch.compile")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="dense BF16 peak for MFU (default: from the GPU name, as the trainer does)")
    p.add_argument("--seed", type=int, default=0, help="seed of the synthetic tokens")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan and the commands, write the shard, run nothing")
    return p


def parse_sizes(text):
    """'d12, d24' -> ['d12', 'd24'] (order kept, duplicates dropped)."""
    sizes = []
    for s in text.split(","):
        s = s.strip()
        if s.startswith("gpt2:"):       # gpt2:dN is the trainer's alias of dN
            s = s[len("gpt2:"):]
        if s and s not in sizes:
            sizes.append(s)
    if not sizes:
        raise ValueError("--sizes: no size given")
    return sizes


def parse_peers(text, no_peer=False):
    """--peers / --no-peer -> the peer kinds to run, in PEERS order: None -> DEFAULT_PEERS; 'all' -> every
    kind; 'default' may be combined with kinds ('default,torch-bf16-sliced'); --no-peer -> []."""
    if no_peer:
        return []
    if text is None:
        return list(DEFAULT_PEERS)
    chosen = set()
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            chosen.update(PEERS)
        elif part == "default":
            chosen.update(DEFAULT_PEERS)
        elif part in PEERS:
            chosen.add(part)
        else:
            raise ValueError(f"--peers: '{part}' is not a peer kind (known: {', '.join(PEERS)}, default, all)")
    if not chosen:
        raise ValueError("--peers: no peer given (--no-peer runs none)")
    return [k for k in PEERS if k in chosen]


def peer_label(kind):
    return PEERS[kind][0]


def peer_family(kind):
    return PEERS[kind][1]


def parse_gpus(text):
    """'1,2' -> [1, 2] (sorted, duplicates dropped); every count must be a positive integer."""
    counts = set()
    for part in text.split(","):
        part = part.strip()
        if not re.fullmatch(r"[1-9]\d*", part):
            raise ValueError(f"--gpus: '{part}' is not a positive number of GPUs")
        counts.add(int(part))
    return sorted(counts)


def parse_b_overrides(text, sizes):
    """--B: None -> {}; '32' -> every size 32; 'd24=16,d48=4' -> those sizes only."""
    if text is None:
        return {}
    text = text.strip()
    if re.fullmatch(r"\d+", text):
        return {s: int(text) for s in sizes}
    out = {}
    for part in text.split(","):
        m = re.fullmatch(r"\s*([\w:]+)\s*=\s*(\d+)\s*", part)
        if not m:
            raise ValueError(f"--B: '{part}' is neither a number nor SIZE=B")
        size = m.group(1)[len("gpt2:"):] if m.group(1).startswith("gpt2:") else m.group(1)
        if size not in sizes:
            raise ValueError(f"--B: size '{size}' is not in --sizes ({','.join(sizes)})")
        out[size] = int(m.group(2))
    return out


def resolve_plan(args):
    """[(size, start_B, T)] for the run, from --sizes, --B, --T and SIZE_DEFAULTS; checks that
    every B*T divides the total batch."""
    sizes = parse_sizes(args.sizes)
    b_over = parse_b_overrides(args.B, sizes)
    plan = []
    for size in sizes:
        default_B, default_T = SIZE_DEFAULTS.get(size, (None, None))
        B = b_over.get(size, default_B)
        T = args.T if args.T is not None else default_T
        if B is None or T is None:
            raise ValueError(f"size '{size}' has no default B/T (known: {', '.join(SIZE_DEFAULTS)}); "
                             f"give --B {size}=N and --T")
        if B < 1 or T < 1:
            raise ValueError(f"{size}: B={B} and T={T} must be >= 1")
        if args.total_batch % (B * T) != 0:
            raise ValueError(f"{size}: total batch {args.total_batch} is not a multiple of B*T = {B}*{T}")
        for g in parse_gpus(args.gpus):
            if args.total_batch % (g * B * T) != 0:
                raise ValueError(f"{size}: total batch {args.total_batch} is not a multiple of "
                                 f"GPUs*B*T = {g}*{B}*{T}")
        plan.append((size, B, T))
    if args.steps < 1 or args.warmup < 0:
        raise ValueError("--steps must be >= 1 and --warmup >= 0")
    return plan


# ================================================================================================
# recipes: discovery and build


def parse_make_database(text):
    """Recipe names from `make -pnq` output: explicit targets train_gpt_<r> and the RECIPES
    variable. Lines after '# Not a target:' are files make knows of, not rules, and are skipped."""
    found = set()
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^train_gpt_([A-Za-z0-9]+):", line)
        if m and not (i > 0 and lines[i - 1].startswith("# Not a target")):
            found.add(m.group(1))
        m = re.match(r"^RECIPES\s*:?=\s*(.*)$", line)
        if m:
            found.update(m.group(1).split())
    return found


def parse_makefile_text(text):
    """The fallback when make cannot print its database: the Makefile's own text (RECIPES
    assignments, '=' ':=' '+=' '?=', and explicit train_gpt_<r>: rules)."""
    found = set()
    for line in text.splitlines():
        m = re.match(r"^\s*RECIPES\s*(?:\+|:|\?)?=\s*([^#]*)", line)
        if m:
            found.update(m.group(1).split())
        m = re.match(r"^train_gpt_([A-Za-z0-9]+)\s*:", line)
        if m:
            found.add(m.group(1))
    return found


def filter_known(found):
    """The discovered names that are known recipes, in KNOWN_RECIPES order."""
    return [r for r in KNOWN_RECIPES if r in found]


def discover_recipes(repo):
    """Known recipes the Makefile can build."""
    try:
        res = subprocess.run(["make", "-pnq"], cwd=repo, capture_output=True, text=True, timeout=60)
        found = parse_make_database(res.stdout)
    except (OSError, subprocess.TimeoutExpired):
        found = set()
    if not found:
        with open(os.path.join(repo, "Makefile")) as f:
            found = parse_makefile_text(f.read())
    return filter_known(found)


def build_recipe(repo, recipe, log_dir):
    """make -j16 train_gpt_<recipe>. Returns (ok, last lines of the make output)."""
    cmd = ["make", "-j16", f"train_gpt_{recipe}"]
    log_path = os.path.join(log_dir, f"build_{recipe}.log")
    rc, text, timed_out = run_logged(cmd, repo, 1800, log_path)
    tail = "\n".join(text.splitlines()[-30:])
    return rc == 0 and not timed_out, tail


# ================================================================================================
# synthetic data: one llm.c token shard


def write_shard(path, num_tokens, seed=0):
    """An llm.c shard of num_tokens uniform random token ids in [0, VOCAB_SIZE):
    256 little-endian int32 header (magic, version, count), then uint16 tokens."""
    import numpy as np
    if not 0 < num_tokens < 2 ** 31:
        raise ValueError(f"shard of {num_tokens} tokens: the header's count is an int32")
    header = np.zeros(SHARD_HEADER_INTS, dtype="<i4")
    header[0], header[1], header[2] = SHARD_MAGIC, SHARD_VERSION, num_tokens
    tokens = np.random.default_rng(seed).integers(0, VOCAB_SIZE, size=num_tokens, dtype=np.uint16)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(header.tobytes())
        f.write(tokens.astype("<u2").tobytes())
    os.replace(tmp, path)


def read_shard_header(path):
    """The checks llmc/dataloader.h read_shard_header() makes: magic, version, and a file size of
    exactly 1024 + 2*N bytes. Returns N; raises ValueError naming what is wrong."""
    import numpy as np
    size = os.path.getsize(path)
    if size < SHARD_HEADER_INTS * 4:
        raise ValueError(f"{path}: {size} bytes, shorter than the header")
    header = np.fromfile(path, dtype="<i4", count=SHARD_HEADER_INTS)
    magic, version, n = int(header[0]), int(header[1]), int(header[2])
    if magic != SHARD_MAGIC:
        raise ValueError(f"{path}: magic {magic}, expected {SHARD_MAGIC}")
    if version != SHARD_VERSION:
        raise ValueError(f"{path}: version {version}, expected {SHARD_VERSION}")
    if n < 0 or size != SHARD_HEADER_INTS * 4 + 2 * n:
        raise ValueError(f"{path}: {size} bytes but the header says {n} tokens")
    return n


def shard_tokens_needed(total_batch):
    """The trainer cuts a shard into chunks of B*T tokens (+1 for the last target); B*T divides the
    total batch, so 2 * total + 1 tokens hold at least two optimizer steps' worth of chunks for any
    B. The loader wraps to the next epoch when it runs out, which costs nothing measurable."""
    return 2 * total_batch + 1


# ================================================================================================
# the trainer's output

# step %5d/%d | loss %.6f | norm %7.4f | lr %.2e | %8.2f ms | %9.0f tok/s | MFU ... | ETA ...
STEP_RE = re.compile(r"^step\s+(\d+)/(\d+)\s*\|\s*loss\s+(\S+)\s*\|\s*norm\s+(\S+)\s*\|\s*lr\s+(\S+)\s*\|"
                     r"\s*([0-9.]+)\s*ms\s*\|")
PARAMS_RE = re.compile(r"^\|\s*parameters\s*\|\s*(\d+)\s*\|")
SHAPE_RE = re.compile(r"^\|\s*L, C, NH, maxT, Vp\s*\|\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+),\s*(\d+)\s*\|")
DEVICE_RE = re.compile(r"^\|\s*device\s*\|\s*(.*?)\s*\|\s*$")
RECIPE_RE = re.compile(r"^\|\s*train_gpt\s*\|\s*recipe\s+(\S+)\s+precision\s+(\S+)")
MEM_END_RE = re.compile(r"GPU memory in use at the end:\s*([0-9.]+)\s*GiB")
OOM_RE = re.compile(r"out of (GPU )?memory", re.IGNORECASE)


def parse_trainer_output(text):
    """What the bench needs from one trainer run's stdout+stderr: the banner's parameter count,
    shape, device and recipe, every step line, and the end line's memory (None where absent)."""
    out = {"params": None, "L": None, "C": None, "NH": None, "maxT": None, "device": None,
           "recipe": None, "precision": None, "steps": [], "mem_end_gib": None}
    for line in text.splitlines():
        line = line.rstrip()
        m = STEP_RE.match(line)
        if m:
            out["steps"].append({"step": int(m.group(1)), "of": int(m.group(2)), "loss": float(m.group(3)),
                                 "norm": float(m.group(4)), "ms": float(m.group(6))})
            continue
        m = PARAMS_RE.match(line)
        if m:
            out["params"] = int(m.group(1))
            continue
        m = SHAPE_RE.match(line)
        if m:
            out["L"], out["C"], out["NH"], out["maxT"] = (int(m.group(i)) for i in range(1, 5))
            continue
        m = RECIPE_RE.match(line)
        if m:
            out["recipe"], out["precision"] = m.group(1), m.group(2)
            continue
        m = DEVICE_RE.match(line)
        if m:
            out["device"] = m.group(1)
            continue
        m = MEM_END_RE.search(line)
        if m:
            out["mem_end_gib"] = float(m.group(1))
    return out


def error_line(text):
    """The line that says why a run failed: the last 'error:' line, else the last non-empty line."""
    lines = [l.strip() for l in text.splitlines() if l.strip() and not l.startswith("$ ")]
    # "error: ..." (the trainer, nvcc's "file(12): error: ..."), then "...Error..." (Python, make)
    for pattern in (r"\berror\b\s*:", r"error"):
        hits = [l for l in lines if re.search(pattern, l, re.IGNORECASE)]
        if hits:
            return hits[-1]
    return lines[-1] if lines else "(no output)"


def is_oom(text):
    return bool(OOM_RE.search(text))


# ================================================================================================
# the numbers


def flops_per_token(N, L, C, T):
    """llm.c's count: 6 FLOPs per parameter per token (forward + backward) plus the attention
    score/value products, 6*L*C*T per token."""
    return 6.0 * N + 6.0 * L * C * T


def timed_median(step_ms, warmup):
    """Median of the per-step times after the first `warmup` steps."""
    timed = step_ms[warmup:]
    if not timed:
        raise ValueError(f"no timed steps: {len(step_ms)} step(s), {warmup} warm-up")
    return statistics.median(timed)


def peak_flops_for(gpu_name, override_tflops=None):
    if override_tflops:
        return override_tflops * 1e12
    for keys, peak in PEAK_BF16_FLOPS:
        if gpu_name and any(k in gpu_name for k in keys):
            return peak
    return None


def fill_speed(row, total_batch, warmup, peak):
    """ms/step (median), tok/s, FLOPs per token and MFU of a row that has step_ms, params, L, C, T."""
    row["ms"] = timed_median(row["step_ms"], warmup)
    row["tok_s"] = total_batch / (row["ms"] / 1000.0)
    if row.get("params") and row.get("L") and row.get("C"):
        row["flops_per_token"] = flops_per_token(row["params"], row["L"], row["C"], row["T"])
        if peak:
            row["mfu"] = 100.0 * row["flops_per_token"] * row["tok_s"] / (peak * row.get("gpus", 1))
    return row


def ratio(a, b):
    return a / b if a is not None and b else None


def row_family(row):
    """'bf16' or 'fp8' for a peer row (its kind's family), 'fp8' for our FP8-family recipes and their
    RECIPE FLAGS variants, None for our other recipes."""
    if row["kind"] == "peer":
        return PEERS.get(row.get("peer_kind"), (None, "bf16"))[1]
    return "fp8" if row["recipe"].split(" ")[0] in FP8_FAMILY_RECIPES else None


def compute_ratios(rows):
    """vs_peer = tok/s / the fastest BF16 peer's tok/s of the same size (a peer flagged eager after a
    failed compile counts as it is), for 1-GPU rows only (the peers run on one GPU); vs_fp8_peer =
    tok/s / the fastest torchao FP8 peer's, for FP8-family rows (row_family) on one GPU; vs_bf16 =
    tok/s / our bf16's at the same size and GPU count; vs_1gpu = tok/s / the same recipe's 1-GPU tok/s
    at the same size (the scaling; 1.0 for the 1-GPU row itself). Each against the rows of its own
    round (--repeat). None where either is missing."""
    best_peer, bf16, one_gpu = {}, {}, {}       # best_peer[(family, size, round)]: the fastest peer's tok/s
    for r in rows:
        if r.get("status") != "ok":
            continue
        rnd = r.get("round", 1)
        if r["kind"] == "peer":
            key = (row_family(r), r["size"], rnd)
            best_peer[key] = max(best_peer.get(key, 0.0), r["tok_s"])
        elif r["recipe"] == "bf16":
            bf16[(r["size"], r.get("gpus", 1), rnd)] = r["tok_s"]
        if r["kind"] == "ours" and r.get("gpus", 1) == 1:
            one_gpu[(r["size"], r["recipe"], rnd)] = r["tok_s"]
    for r in rows:
        ok = r.get("status") == "ok"
        g, rnd = r.get("gpus", 1), r.get("round", 1)
        r["vs_peer"] = ratio(r["tok_s"], best_peer.get(("bf16", r["size"], rnd))) if ok and g == 1 else None
        r["vs_fp8_peer"] = (ratio(r["tok_s"], best_peer.get(("fp8", r["size"], rnd)))
                            if ok and g == 1 and row_family(r) == "fp8" else None)
        r["vs_bf16"] = ratio(r["tok_s"], bf16.get((r["size"], g, rnd))) if ok else None
        r["vs_1gpu"] = (ratio(r["tok_s"], one_gpu.get((r["size"], r["recipe"], rnd)))
                        if ok and r["kind"] == "ours" else None)
    return rows


RATIO_KEYS = ("vs_peer", "vs_fp8_peer", "vs_bf16", "vs_1gpu")


def summarize_rounds(rows):
    """Per (size, recipe, GPUs), in the order of first appearance: how many rounds ran ok, the median
    ms/step and tok/s, and the median, min and max of each ratio over those rounds (None where a ratio
    has no value in any round)."""
    groups = {}
    for r in rows:
        groups.setdefault((r["size"], r["recipe"], r.get("gpus", 1)), []).append(r)
    out = []
    for (size, recipe, g), rs in groups.items():
        ok = [r for r in rs if r.get("status") == "ok"]
        s = {"size": size, "recipe": recipe, "gpus": g, "rounds": len(rs), "rounds_ok": len(ok),
             "ms": statistics.median(r["ms"] for r in ok) if ok else None,
             "tok_s": statistics.median(r["tok_s"] for r in ok) if ok else None}
        for key in RATIO_KEYS:
            vals = [r[key] for r in ok if r.get(key) is not None]
            s[key] = (statistics.median(vals), min(vals), max(vals)) if vals else None
        out.append(s)
    return out


# ================================================================================================
# running things


def kill_group(proc):
    """SIGKILL to the process group of a Popen started in a group of its own: the command and anything it
    started, nothing else."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_logged(cmd, cwd, timeout, log_path, env=None, on_start=None, on_end=None):
    """Runs cmd with stdout+stderr into log_path, in its own process group so that a timeout
    kills it and anything it started (torch.compile's compile workers). Returns (rc, text, timed_out).
    on_start(proc) / on_end(proc), if given, are called once it runs and once it has ended (a caller that
    must be able to stop it from elsewhere: dev/loss_seeds.py)."""
    with open(log_path, "w") as log:
        log.write("$ " + " ".join(quote_arg(c) for c in cmd) + "\n")
        log.flush()
        proc = subprocess.Popen(cmd, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True)
        if on_start:
            on_start(proc)
        timed_out = False
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            kill_group(proc)
            rc = proc.wait()
        finally:
            if on_end:
                on_end(proc)
    with open(log_path, errors="replace") as f:
        text = f.read()
    return rc, text, timed_out


def quote_arg(s):
    return s if s and re.fullmatch(r"[\w@%+=:,./-]+", s) else "'" + s.replace("'", "'\\''") + "'"


def parse_recipes(text):
    """--recipes: a comma list of RECIPE or RECIPE:FLAGS (trainer flags added to that row's runs, for a
    recipe's options: 'tcfp12:-tabd 1 -tfw 1'). Returns (label, recipe, flags) triples in order; the
    label, which names the row, is the recipe, or 'recipe FLAGS'."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        recipe, _, flags = item.partition(":")
        recipe, flag_list = recipe.strip(), shlex.split(flags)
        if not re.fullmatch(r"[a-z0-9_]+", recipe):
            raise ValueError(f"--recipes: '{recipe}' is not a recipe name")
        label = " ".join([recipe] + flag_list)
        if any(label == o[0] for o in out):
            raise ValueError(f"--recipes: '{label}' is listed twice")
        out.append((label, recipe, flag_list))
    if not out:
        raise ValueError("--recipes: no recipe given")
    return out


def trainer_command(recipe, size, B, T, total_batch, num_steps, shard, gpus=1, flags=()):
    """The trainer's command line, with the row's extra trainer flags at the end; with gpus > 1, one
    process per GPU through scripts/launch.sh (data parallel, -d is the total batch of all processes,
    ZeRO-1 by default)."""
    launcher = ["bash", "scripts/launch.sh", str(gpus)] if gpus > 1 else []
    return launcher + [f"./train_gpt_{recipe}", "-e", size, "-b", str(B), "-t", str(T), "-d", str(total_batch),
            "-x", str(num_steps), "-v", "0", "-s", "0", "-j", "", "-i", shard] + list(flags)


def peer_command(python, kind, size, B, T, total_batch, warmup, steps, json_out, eager):
    cmd = [python, os.path.abspath(__file__), "--peer-worker", "--peer-kind", kind, "--size", size, "--B", str(B),
           "--T", str(T), "--total-batch", str(total_batch), "--warmup", str(warmup), "--steps", str(steps),
           "--json-out", json_out]
    return cmd + (["--eager"] if eager else [])


def wheel_version(path):
    """torchao-0.18.0-py3-none-any.whl -> (0, 18, 0); () when the name has no version"""
    m = re.match(r"[A-Za-z0-9_]+-(\d+(?:\.\d+)*)", os.path.basename(path))
    return tuple(int(x) for x in m.group(1).split(".")) if m else ()


def find_torchao_wheel(spec, repo):
    """--torchao-wheel -> the wheel to install, or None for the peer python's own torchao: 'none' -> None;
    'auto' -> the highest version matching TORCHAO_WHEEL_GLOB under repo, None if there is none; else the path."""
    if spec == "none":
        return None
    if spec == "auto":
        wheels = glob.glob(os.path.join(repo, TORCHAO_WHEEL_GLOB))
        return max(wheels, key=lambda w: (wheel_version(w), w)) if wheels else None
    return os.path.abspath(spec)


def install_wheel(python, wheel, target, log_path):
    """Installs one wheel, without its dependencies and without an index (the GPU machine has no network),
    into the directory target: `python -m pip install --no-deps --no-index --target`. Where that python
    has no pip, the wheel is unpacked instead: a wheel is a zip of what --target would hold, unless it
    has a .data directory. Returns None, or the reason it failed."""
    if not os.path.isfile(wheel):
        return f"torchao wheel {wheel} not found"
    cmd = [python, "-m", "pip", "install", "--no-deps", "--no-index", "--disable-pip-version-check",
           "--target", target, wheel]
    rc, text, timed_out = run_logged(cmd, REPO_ROOT, 300, log_path)
    if rc == 0 and not timed_out:
        return None
    try:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            if any(n.split("/", 1)[0].endswith(".data") for n in names):
                return f"pip could not install {os.path.basename(wheel)} ({error_line(text)}), and it has a .data directory"
            z.extractall(target)
    except (OSError, zipfile.BadZipFile) as e:
        return f"{os.path.basename(wheel)}: pip failed ({error_line(text)}), unpacking failed ({e})"
    with open(log_path, "a") as log:
        log.write(f"pip failed; unpacked {wheel} into {target}\n")
    return None


def prepare_torchao(args, peers, work_dir, log_dir):
    """Makes torchao importable for the FP8 peers, once per bench: {"wheel": the wheel installed or None,
    "path": the directory to put first on the peers' PYTHONPATH or None, "error": why the FP8 peers
    cannot run, or None}. Without a wheel the peers import the peer python's own torchao, if it has one."""
    info = {"wheel": None, "path": None, "error": None}
    if not any(peer_family(k) == "fp8" for k in peers):
        return info
    wheel = find_torchao_wheel(args.torchao_wheel, REPO_ROOT)
    if wheel is None:
        return info
    info["wheel"] = wheel
    target = os.path.join(work_dir, "torchao_site")
    info["error"] = install_wheel(args.peer_python, wheel, target, os.path.join(log_dir, "torchao_install.log"))
    if info["error"] is None:
        # only torchao goes ahead of the standard library on PYTHONPATH: its wheel also ships a top-level
        # `test` package (torchao's tests), which there would hide the standard library's `test`
        for name in os.listdir(target):
            if name != "torchao" and not name.startswith("torchao-"):
                shutil.rmtree(os.path.join(target, name), ignore_errors=True)
        info["path"] = target
    return info


def peer_env(torchao):
    """The FP8 peers' environment: torchao's directory first on PYTHONPATH (None: inherit as it is)."""
    if not torchao or not torchao.get("path"):
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([torchao["path"]] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    return env


def with_halving(start_B, T, total_batch, attempt):
    """attempt(B) -> row. While a row says 'oom', retry with B/2 (as long as B*T still divides the
    total batch). The row returned records every B tried."""
    B, tried = start_B, []
    while True:
        row = attempt(B)
        tried.append(B)
        nb = B // 2
        if row["status"] != "oom" or nb < 1 or total_batch % (nb * T) != 0:
            break
        print(f"    out of memory at B={B}; retrying with B={nb}", flush=True)
        B = nb
    row["B_tried"] = tried
    return row


def new_row(size, recipe, kind, B, T, gpus=1, rnd=1):
    return {"size": size, "recipe": recipe, "kind": kind, "gpus": gpus, "round": rnd, "B": B, "T": T, "status": "failed", "error": None,
            "notes": [], "step_ms": [], "ms": None, "tok_s": None, "mfu": None, "flops_per_token": None,
            "params": None, "L": None, "C": None, "peak_gib": None, "loss_last": None}


def round_suffix(rnd, args):
    """The log files' round mark: none with one round, _r1, _r2, ... with --repeat"""
    return f"_r{rnd}" if args.repeat > 1 else ""


def run_ours(entry, size, B, T, args, shard, log_dir, peak, gpus=1, rnd=1):
    """One trainer run of entry = (label, recipe, flags) (on `gpus` GPUs); a row with status ok / oom /
    failed / timeout. With several GPUs the step times and memory are process 0's (a step ends for all
    at its all-gather)."""
    label, recipe, flags = entry
    row = new_row(size, label, "ours", B, T, gpus, rnd)
    n = args.warmup + args.steps
    cmd = trainer_command(recipe, size, B, T, args.total_batch, n, shard, gpus, flags)
    log_path = os.path.join(log_dir, f"{safe(size)}_{safe(label)}_B{B}" + (f"_{gpus}gpus" if gpus > 1 else "")
                            + round_suffix(rnd, args) + ".log")
    row["log"] = log_path
    rc, text, timed_out = run_logged(cmd, REPO_ROOT, args.timeout, log_path)
    parsed = parse_trainer_output(text)
    row.update(params=parsed["params"], L=parsed["L"], C=parsed["C"], device=parsed["device"],
               peak_gib=parsed["mem_end_gib"], step_ms=[s["ms"] for s in parsed["steps"]])
    if parsed["steps"]:
        row["loss_last"] = parsed["steps"][-1]["loss"]
    if timed_out:
        row["status"], row["error"] = "timeout", f"timed out after {args.timeout:.0f} s ({len(row['step_ms'])} steps done)"
    elif rc != 0:
        row["status"] = "oom" if is_oom(text) else "failed"
        row["error"] = f"exit {rc}: {error_line(text)}"
    elif len(row["step_ms"]) < n:
        row["error"] = f"only {len(row['step_ms'])} of {n} step lines in the output"
    else:
        row["status"] = "ok"
        fill_speed(row, args.total_batch, args.warmup, peak)
    return row


def run_peer(kind, size, B, T, args, log_dir, peak, rnd=1, torchao=None):
    """One run of the peer `kind` in a fresh python process; a row like run_ours'. torchao: what
    prepare_torchao returned (the FP8 peers' wheel); an FP8 peer that cannot get torchao is a row with
    status 'unavailable' and the reason, not a missing row."""
    label, family, _ = PEERS[kind]
    row = new_row(size, label, "peer", B, T, rnd=rnd)
    row["peer_kind"] = kind
    if family == "fp8" and torchao and torchao.get("error"):
        row["status"], row["error"] = "unavailable", torchao["error"]
        return row
    stem = os.path.join(log_dir, f"{safe(size)}_peer_{kind}_B{B}" + round_suffix(rnd, args))
    json_out, log_path = stem + ".json", stem + ".log"
    row["log"] = log_path
    cmd = peer_command(args.peer_python, kind, size, B, T, args.total_batch, args.warmup, args.steps, json_out,
                       args.peer_eager)
    timeout = args.peer_timeout if args.peer_timeout else args.timeout
    if os.path.exists(json_out):
        os.remove(json_out)
    rc, text, timed_out = run_logged(cmd, REPO_ROOT, timeout, log_path,
                                     env=peer_env(torchao) if family == "fp8" else None)
    res = {}
    if os.path.exists(json_out):
        with open(json_out) as f:
            res = json.load(f)
    row.update(params=res.get("params"), L=res.get("L"), C=res.get("C"), device=res.get("device"),
               step_ms=res.get("step_ms", []), peak_gib=res.get("max_reserved_gib"),
               alloc_gib=res.get("max_allocated_gib"), device_used_gib=res.get("device_used_gib"),
               compiled=res.get("compiled"), compile_error=res.get("compile_error"),
               torch_version=res.get("torch_version"), torchao_version=res.get("torchao_version"),
               loss_columns=res.get("loss_columns"), fp8_linears=res.get("fp8_linears"),
               settings=res.get("settings"))
    if res.get("losses"):
        row["loss_last"] = res["losses"][-1]
    if res.get("compile_error"):
        row["recipe"] = label + " (eager!)"   # flagged: not the protocol's peer
        row["notes"].append("torch.compile FAILED, eager fallback: " + res["compile_error"][:150])
    elif res.get("compiled") is False:
        row["recipe"] = label + " (eager)"
    if family == "fp8" and res.get("torchao_version"):
        row["notes"].append(f"torchao {res['torchao_version']}, {res.get('fp8_linears')} nn.Linear in FP8, LM head bf16")
    if timed_out:
        row["status"], row["error"] = "timeout", f"timed out after {timeout:.0f} s ({len(row['step_ms'])} steps done)"
    elif res.get("status") in ("oom", "unavailable"):
        row["status"], row["error"] = res["status"], res.get("error")
    elif rc != 0 or res.get("status") != "ok":
        row["status"] = "oom" if is_oom(res.get("error") or "") else "failed"
        row["error"] = f"exit {rc}: " + (res.get("error") or error_line(text))
    else:
        row["status"] = "ok"
        fill_speed(row, args.total_batch, args.warmup, peak)
        if row["alloc_gib"] is not None:
            row["notes"].append(f"allocated peak {row['alloc_gib']:.2f} GiB, device total − free at the end "
                                f"{row['device_used_gib']:.2f} GiB")
    return row


def safe(name):
    return re.sub(r"[^\w.-]", "_", name)


def gpu_info():
    """(name, one-line description) of GPU 0 from nvidia-smi."""
    try:
        res = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        line = res.stdout.strip().splitlines()[0] if res.returncode == 0 and res.stdout.strip() else ""
    except (OSError, subprocess.TimeoutExpired):
        line = ""
    if not line:
        return None, "unknown (nvidia-smi failed)"
    return line.split(",")[0].strip(), line


def gpu_count():
    """How many GPUs nvidia-smi lists (0 when it fails)."""
    try:
        res = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(1 for l in res.stdout.splitlines() if l.startswith("GPU ")) if res.returncode == 0 else 0


def git_revision():
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                             text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("+dirty" if dirty else "") if rev else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


# ================================================================================================
# the table


def fmt(v, spec, missing="—"):
    return missing if v is None else format(v, spec)


def render_table(rows, meta):
    """The markdown report: a header, one table, and footnotes (FLOP counts, memory, protocol)."""
    out = [f"# dev/bench: {meta['gpu']}", "",
           f"{meta['date']} · commit {meta['commit']} · total batch {meta['total_batch']:,} tokens · "
           f"{meta['warmup']} warm-up + median of {meta['steps']} timed steps · synthetic uniform tokens", ""]
    if meta["steps"] < 10:
        out += [f"**Below protocol: {meta['steps']} timed steps (the protocol asks for at least 10).**", ""]
    if meta.get("partial"):
        done, total = meta["partial"]
        out += [f"**Partial: {done} of {total} runs done when this was written; the bench had not finished "
                f"(the last run's ratios may still lack their baseline).**", ""]
    rounds = meta.get("repeat", 1)
    if rounds > 1:
        out += [f"{rounds} rounds: the whole plan ran {rounds} times over; each row's ratios are against its own "
                f"round's rows, and the table after this one gives each recipe's median over the rounds.", ""]
    round_col = ("| round ", "| ---: ") if rounds > 1 else ("", "")
    out.append("| size | recipe " + round_col[0] + "| GPUs | B | T | ms/step | tok/s | MFU % | peak GiB | vs peer | "
               "vs FP8 peer | vs bf16 | vs 1 GPU | notes |")
    out.append("| --- | --- " + round_col[1] + "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in rows:
        notes = list(r.get("notes", []))
        if r["status"] != "ok":
            notes.insert(0, f"**{r['status'].upper()}**: {r.get('error') or ''}")
        if len(r.get("B_tried", [])) > 1:
            notes.append("B tried " + "→".join(str(b) for b in r["B_tried"]))
        note = "; ".join(notes).replace("|", "\\|").replace("\n", " ")
        rc = f"| {r.get('round', 1)} " if rounds > 1 else ""
        out.append(f"| {r['size']} | {r['recipe']} {rc}| {r.get('gpus', 1)} | {r['B']} | {r['T']} | {fmt(r['ms'], '.1f')} | "
                   f"{fmt(r['tok_s'], ',.0f')} | {fmt(r['mfu'], '.1f')} | {fmt(r['peak_gib'], '.2f')} | "
                   f"{fmt(r.get('vs_peer'), '.2f')} | {fmt(r.get('vs_fp8_peer'), '.2f')} | {fmt(r.get('vs_bf16'), '.2f')} | "
                   f"{fmt(r.get('vs_1gpu'), '.2f')} | {note} |")
    out.append("")
    if rounds > 1:
        def spread(v):
            return "—" if v is None else f"{v[0]:.3f} ({v[1]:.3f}–{v[2]:.3f})"
        out += [f"Over the rounds: the median of the rounds that ran (ms/step, tok/s), and of each ratio with its "
                f"lowest and highest round in brackets (three decimals: the rows above round to two).", "",
                "| size | recipe | GPUs | rounds ok | median ms/step | median tok/s | vs peer | vs FP8 peer | vs bf16 | vs 1 GPU |",
                "| --- | --- | ---: | ---: | ---: | ---: | --- | --- | --- | --- |"]
        for g in summarize_rounds(rows):
            out.append(f"| {g['size']} | {g['recipe']} | {g['gpus']} | {g['rounds_ok']} of {g['rounds']} | {fmt(g['ms'], '.1f')} | "
                       f"{fmt(g['tok_s'], ',.0f')} | {spread(g['vs_peer'])} | {spread(g['vs_fp8_peer'])} | "
                       f"{spread(g['vs_bf16'])} | {spread(g['vs_1gpu'])} |")
        out.append("")
    peak = meta.get("peak_flops")
    out.append(f"- MFU = FLOPs per token × tok/s / {fmt(peak and peak / 1e12, '.1f', 'unknown')} TFLOP/s "
               f"(dense BF16 peak of the GPU, the trainer's figure); FLOPs per token = 6·N + 6·L·C·T, "
               f"N = all parameters (as llm.c):")
    seen = set()
    for r in rows:
        key = (r["size"], r["params"], r["T"])
        if r.get("flops_per_token") and key not in seen:
            seen.add(key)
            out.append(f"  - {r['size']} ({r['kind']}): N = {r['params']:,}, L = {r['L']}, C = {r['C']}, "
                       f"T = {r['T']} → {r['flops_per_token']:.4g} FLOPs per token")
    out.append("- Peak GiB: ours = cudaMemGetInfo total − free at the end of the run (the trainer allocates "
               "everything up front, so this is its peak), **including the CUDA context (~0.5 GiB)**; each peer = "
               "torch.cuda.max_memory_reserved(), **excluding the CUDA context**; its notes give "
               "max_memory_allocated and the device-level total − free at its end, comparable with ours.")
    out.append("- vs peer = tok/s ÷ the fastest BF16 peer's tok/s of the same size; vs FP8 peer (our fp8 rows, "
               "their variants and the torchao peers) = tok/s ÷ the fastest torchao FP8 peer's; both for 1-GPU rows "
               "(the peers run on one GPU). vs bf16 = tok/s ÷ our bf16's at the same size and GPU count; vs 1 GPU = "
               "tok/s ÷ the same recipe's 1-GPU tok/s (the data-parallel scaling; with several GPUs, tok/s is the "
               "whole job's, MFU is per GPU, ms/step and peak GiB are process 0's).")
    if any(r["kind"] == "peer" for r in rows):
        out.append("- Peers: FP32 parameters, bf16 autocast, SDPA (is_causal), fused AdamW (decay on 2-D tensors), "
                   "torch.compile, clip 1.0, TF32 allowed, timed with CUDA events. torch.compile bf16: nanoGPT's "
                   "loss, the cross-entropy over all 50,304 logits of the padded vocabulary; torch.compile bf16 sliced: over "
                   "the logits sliced to the 50,257 real tokens; torchao fp8 tensorwise / rowwise: torch.compile "
                   "bf16 with every block's nn.Linear converted by torchao.float8.convert_to_float8_training "
                   "(Float8LinearConfig.from_recipe_name), the tied LM head left in bf16.")
    starts = ", ".join(f"{k} {b}" + (f" at T = {t}" if t != 1024 else "") for k, (b, t) in SIZE_DEFAULTS.items() if k != "d6")
    out.append(f"- B: per-size starting points unless --B was given ({starts}), "
               "halved on out-of-memory for each run independently; the table gives the B used.")
    return "\n".join(out) + "\n"


# ================================================================================================
# the PyTorch peer (runs in its own process: bench.py --peer-worker ...)


class WallClockEvent:
    """Stands in for torch.cuda.Event when the worker is checked on the CPU."""

    def record(self):
        self.t = time.perf_counter()

    def elapsed_time(self, later):
        return (later.t - self.t) * 1000.0


class TorchaoUnavailable(Exception):
    """torchao cannot be imported: the FP8 peer's row says so (status 'unavailable')."""


def allow_fast_fp32_matmuls(torch):
    """What nanoGPT sets: the FP32 matmuls and convolutions a peer runs outside autocast may use TF32
    tensor cores. Returns the settings made (one this torch refuses is noted in the list, not fatal)."""
    done = []
    for name, setter in (("torch.backends.cuda.matmul.allow_tf32 = True",
                          lambda: setattr(torch.backends.cuda.matmul, "allow_tf32", True)),
                         ("torch.backends.cudnn.allow_tf32 = True",
                          lambda: setattr(torch.backends.cudnn, "allow_tf32", True)),
                         ('torch.set_float32_matmul_precision("high")',
                          lambda: torch.set_float32_matmul_precision("high"))):
        try:
            setter()
            done.append(name)
        except Exception as e:  # noqa: BLE001 - a setting this torch does not take is reported, not fatal
            done.append(f"{name} refused: {type(e).__name__}: {e}")
    return done


def fp8_linear_filter(module, fqn):
    """Which nn.Linear torchao converts to FP8 (module_filter_fn): as torchao's documented example and
    torchtitan's float8 converter, every Linear whose dimensions are multiples of 16 (what the FP8 GEMMs
    need) except the output projection. Here the output projection is no nn.Linear (the LM head is
    F.linear on the tied wte) and is never offered; 'lm_head' / 'output' are refused by name all the same."""
    import torch
    if fqn.split(".")[-1] in ("lm_head", "output"):
        return False
    if isinstance(module, torch.nn.Linear):
        return module.in_features % 16 == 0 and module.out_features % 16 == 0
    return True


def make_peer_model(kind, size, device):
    """The peer `kind`'s model on device, before torch.compile: FP32 parameters with the trainer's init,
    SDPA, the loss PEERS says; for the torchao kinds the blocks' nn.Linear swapped for torchao's Float8Linear.
    Returns (model, facts for the JSON: loss_columns, fp8_linears, torchao_version)."""
    import torch
    sys.path.insert(0, os.path.join(REPO_ROOT, "dev", "reference"))
    from gpt_reference import build_model

    spec = PEERS[kind][2]
    model = build_model(size, use_sdpa=True, seed=0, device=device, dtype=torch.float32,
                        loss_over_padded_vocab=spec["padded_loss"])
    facts = {"loss_columns": model.cfg.padded_vocab_size if spec["padded_loss"] else model.cfg.vocab_size,
             "fp8_linears": 0, "torchao_version": None}
    if spec["fp8_recipe"]:
        try:
            import torchao
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
        except Exception as e:  # noqa: BLE001 - any import failure means no FP8 peer
            raise TorchaoUnavailable(f"torchao cannot be imported ({type(e).__name__}: {e}); put its wheel in "
                                     f"{TORCHAO_WHEEL_GLOB} or pass --torchao-wheel (dev/bench/README.md)") from e
        facts["torchao_version"] = getattr(torchao, "__version__", "unknown")
        config = Float8LinearConfig.from_recipe_name(spec["fp8_recipe"])
        if not device.startswith("cuda"):      # the CPU check of this code: torchao emulates the FP8 GEMMs
            import dataclasses
            config = dataclasses.replace(config, emulate=True)
        linears_before = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
        convert_to_float8_training(model, config=config, module_filter_fn=fp8_linear_filter)
        facts["fp8_linears"] = sum(type(m).__name__ == "Float8Linear" for m in model.modules())
        if facts["fp8_linears"] != linears_before:
            raise RuntimeError(f"torchao converted {facts['fp8_linears']} of the {linears_before} nn.Linear")
    return model, facts


def peer_worker(argv):
    p = argparse.ArgumentParser(prog="bench.py --peer-worker")
    p.add_argument("--peer-worker", action="store_true")
    p.add_argument("--peer-kind", choices=sorted(PEERS), default="torch-bf16")
    p.add_argument("--size", required=True)
    p.add_argument("--B", type=int, required=True)
    p.add_argument("--T", type=int, required=True)
    p.add_argument("--total-batch", type=int, required=True)
    p.add_argument("--warmup", type=int, required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--json-out", required=True)
    p.add_argument("--eager", action="store_true")
    p.add_argument("--device", default="cuda", help="cpu: only to check this code without a GPU")
    a = p.parse_args(argv)
    result = {"status": "failed", "error": None, "peer_kind": a.peer_kind, "size": a.size, "B": a.B, "T": a.T,
              "step_ms": [], "losses": [], "compiled": not a.eager, "compile_error": None}

    def save():
        with open(a.json_out + ".tmp", "w") as f:
            json.dump(result, f, indent=1)
        os.replace(a.json_out + ".tmp", a.json_out)

    try:
        import torch
        result["torch_version"] = torch.__version__
        dev = a.device
        on_gpu = dev.startswith("cuda")
        result["device"] = torch.cuda.get_device_name(0) if on_gpu else dev
        result["settings"] = allow_fast_fp32_matmuls(torch)
        model, facts = make_peer_model(a.peer_kind, a.size, dev)
        result.update(facts)
        cfg = model.cfg
        if a.T > cfg.max_seq_len:
            raise ValueError(f"T={a.T} exceeds the model's maxT {cfg.max_seq_len}")
        params = list(model.parameters())            # wte is tied: counted once, as llm.c
        result.update(params=sum(t.numel() for t in params), L=cfg.num_layers, C=cfg.channels)
        decay = [t for t in params if t.dim() >= 2]   # weight decay on 2-D tensors only, as the trainer
        no_decay = [t for t in params if t.dim() < 2]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
        accum = a.total_batch // (a.B * a.T)
        if accum * a.B * a.T != a.total_batch:
            raise ValueError(f"total batch {a.total_batch} is not a multiple of B*T = {a.B * a.T}")

        # Uniform random tokens, made on the GPU once: a pool of distinct micro-batches reused every step.
        gen = torch.Generator(device=dev)
        gen.manual_seed(0)
        batches = []
        for _ in range(min(accum, 16)):
            buf = torch.randint(0, VOCAB_SIZE, (a.B, a.T + 1), device=dev, generator=gen)
            batches.append((buf[:, :-1].contiguous(), buf[:, 1:].contiguous()))

        fwd = model if a.eager else torch.compile(model)
        if on_gpu:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        else:   # the CPU check: a wall clock with the same record()/elapsed_time() calls
            start, end = WallClockEvent(), WallClockEvent()

        def one_step(f):
            """One optimizer step over `accum` micro-batches; (ms, mean loss) timed with CUDA events."""
            start.record()
            loss_sum = torch.zeros((), device=dev)
            for m in range(accum):
                x, y = batches[m % len(batches)]
                with torch.autocast(device_type=dev.split(":")[0], dtype=torch.bfloat16):
                    _, loss = f(x, y, return_logits=False)
                (loss / accum).backward()
                loss_sum += loss.detach()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            end.record()
            if on_gpu:
                torch.cuda.synchronize()
            return start.elapsed_time(end), (loss_sum / accum).item()

        n = a.warmup + a.steps
        while len(result["step_ms"]) < n:
            try:
                ms, loss = one_step(fwd)
            except Exception as e:  # noqa: BLE001 - a compile failure can surface as any exception type
                if is_oom(str(e)) or fwd is model:
                    raise
                # torch.compile failed: say so, fall back to eager, and start the warm-up over.
                result["compile_error"] = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
                result["compiled"] = False
                print(f"torch.compile failed ({result['compile_error']}); falling back to eager", flush=True)
                opt.zero_grad(set_to_none=True)
                fwd, result["step_ms"], result["losses"] = model, [], []
                continue
            result["step_ms"].append(ms)
            result["losses"].append(loss)
            print(f"step {len(result['step_ms'])}/{n} | loss {loss:.6f} | {ms:.2f} ms", flush=True)
            save()   # a run killed by the timeout still leaves the steps it finished

        result["status"] = "ok"
        if on_gpu:
            free_b, total_b = torch.cuda.mem_get_info()   # device-wide: includes the CUDA context
            result.update(max_reserved_gib=torch.cuda.max_memory_reserved() / GIB,
                          max_allocated_gib=torch.cuda.max_memory_allocated() / GIB,
                          device_used_gib=(total_b - free_b) / GIB)
        save()
        return 0
    except Exception as e:  # noqa: BLE001 - every failure is reported in the JSON, not dropped
        msg = f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
        if isinstance(e, TorchaoUnavailable):
            msg = str(e)
        result["status"] = "unavailable" if isinstance(e, TorchaoUnavailable) else "oom" if is_oom(str(e)) else "failed"
        result["error"] = msg[:500]
        save()
        import traceback
        traceback.print_exc()
        return 3 if result["status"] == "oom" else 1


# ================================================================================================
# main


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if "--peer-worker" in argv:
        return peer_worker(argv)
    args = build_arg_parser().parse_args(argv)
    try:
        plan = resolve_plan(args)
        gpus = parse_gpus(args.gpus)
        recipes = parse_recipes(args.recipes) if args.recipes else [(r, r, []) for r in discover_recipes(REPO_ROOT)]
        peers = parse_peers(args.peers, args.no_peer)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    available = gpu_count()
    if max(gpus) > 1 and not args.dry_run and available < max(gpus):
        print(f"error: --gpus {args.gpus} needs {max(gpus)} GPUs; nvidia-smi lists {available}", file=sys.stderr)
        return 2
    if args.repeat < 1:
        print(f"error: --repeat {args.repeat}: at least 1 round", file=sys.stderr)
        return 2
    if args.steps < 10:
        print(f"warning: {args.steps} timed steps is below the protocol's 10", file=sys.stderr)

    gpu_name, gpu_line = gpu_info()
    peak = peak_flops_for(gpu_name, args.peak_tflops)
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    meta = {"gpu": gpu_line, "date": date, "commit": git_revision(), "total_batch": args.total_batch,
            "warmup": args.warmup, "steps": args.steps, "peak_flops": peak, "gpus": gpus, "argv": argv,
            "repeat": args.repeat, "peers": peers}
    print(f"GPU: {gpu_line}\ndate: {date}\ncommit: {meta['commit']}", flush=True)

    print(f"recipes: {', '.join(e[0] for e in recipes) or '(none)'}; sizes: "
          + ", ".join(f"{s} (B={b}, T={t})" for s, b, t in plan)
          + f"; peers: {', '.join(peer_label(k) for k in peers) or '(none)'}", flush=True)

    if args.out:
        stem = os.path.splitext(args.out)[0]
        log_dir = stem + "_logs"
        os.makedirs(log_dir, exist_ok=True)
    else:
        log_dir = tempfile.mkdtemp(prefix="llmc_bench_logs_")
    work_dir = tempfile.mkdtemp(prefix="llmc_bench_")   # the synthetic shard; removed at the end
    try:
        return run_all(args, plan, recipes, meta, peak, log_dir, work_dir, peers)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


def run_all(args, plan, recipes, meta, peak, log_dir, work_dir, peers=()):
    """Shard, builds, runs, table (main's body, inside its clean-up of work_dir). peers: the peer kinds."""
    shard = os.path.join(work_dir, "synthetic_train_000000.bin")
    write_shard(shard, shard_tokens_needed(args.total_batch), seed=args.seed)
    print(f"synthetic shard: {shard} ({read_shard_header(shard):,} tokens); logs: {log_dir}", flush=True)

    if args.dry_run:
        for size, B, T in plan:
            for _, r, flags in recipes:
                for g in meta["gpus"]:
                    print("  " + " ".join(quote_arg(c) for c in trainer_command(
                        r, size, B, T, args.total_batch, args.warmup + args.steps, shard, g, flags)))
            for kind in peers:
                print("  " + " ".join(quote_arg(c) for c in peer_command(
                    args.peer_python, kind, size, B, T, args.total_batch, args.warmup, args.steps,
                    os.path.join(log_dir, f"{safe(size)}_peer_{kind}_B{B}.json"), args.peer_eager)))
        if any(peer_family(k) == "fp8" for k in peers):
            wheel = find_torchao_wheel(args.torchao_wheel, REPO_ROOT)
            print("  torchao for the FP8 peers: " + (wheel or "the peer python's own"))
        return 0

    torchao = prepare_torchao(args, peers, work_dir, log_dir)
    meta["torchao"] = {"wheel": torchao["wheel"] and os.path.basename(torchao["wheel"]), "error": torchao["error"]}
    if torchao["wheel"]:
        print(f"torchao for the FP8 peers: {torchao['wheel']}: "
              + (f"FAILED: {torchao['error']}" if torchao["error"] else f"installed in {torchao['path']}"), flush=True)

    # build every recipe; a failed build is reported in the table, the others go on
    built = {}
    for r in dict.fromkeys(e[1] for e in recipes):   # each binary once, in order
        if args.no_build:
            built[r] = (os.path.exists(os.path.join(REPO_ROOT, f"train_gpt_{r}")),
                        f"error: ./train_gpt_{r} not found (--no-build)")
            continue
        t0 = time.time()
        ok, tail = build_recipe(REPO_ROOT, r, log_dir)
        built[r] = (ok, tail)
        print(f"build train_gpt_{r}: {'ok' if ok else 'FAILED'} ({time.time() - t0:.0f} s)", flush=True)
        if not ok:
            print(tail, flush=True)

    rows = []
    rounds = args.repeat
    total_runs = rounds * (sum(len(meta["gpus"]) for _ in plan for _ in recipes) + len(peers) * len(plan))

    def checkpoint_report():
        # the report so far after every run, so that a bench cut short (a time limit, a lost machine)
        # keeps the runs it finished; the final write below drops the "partial" mark
        if args.out:
            write_report(args.out, compute_ratios([dict(r) for r in rows]), dict(meta, partial=(len(rows), total_runs)))

    for rnd in range(1, rounds + 1):
        if rounds > 1:
            print(f"=== round {rnd} of {rounds}", flush=True)
        for size, start_B, T in plan:
            for entry in recipes:
                label, r, _ = entry
                for g in meta["gpus"]:
                    if not built[r][0]:
                        row = new_row(size, label, "ours", start_B, T, g, rnd)
                        row["status"] = "not built" if args.no_build else "build failed"
                        row["error"] = error_line(built[r][1])
                        rows.append(row)
                        checkpoint_report()
                        continue
                    print(f"[{size}] {label}: {g} GPU{'s' if g > 1 else ''}, B={start_B} T={T}", flush=True)
                    row = with_halving(start_B, T, args.total_batch // g,
                                       lambda B, e=entry, size=size, T=T, g=g: run_ours(e, size, B, T, args, shard,
                                                                                    log_dir, peak, g, rnd))
                    report_row(row)
                    rows.append(row)
                    checkpoint_report()
            for kind in peers:
                print(f"[{size}] {peer_label(kind)}: B={start_B} T={T}", flush=True)
                row = with_halving(start_B, T, args.total_batch,
                                   lambda B, kind=kind, size=size, T=T: run_peer(kind, size, B, T, args, log_dir, peak,
                                                                                 rnd, torchao))
                report_row(row)
                rows.append(row)
                checkpoint_report()

    compute_ratios(rows)
    print("\n" + render_table(rows, meta))
    if args.out:
        json_path = write_report(args.out, rows, meta)
        print(f"wrote {args.out}, {json_path} and logs in {log_dir}")
    return 0 if all(r["status"] == "ok" for r in rows) else 1


def write_report(out, rows, meta):
    """The markdown table at out and the raw rows beside it (.json), each written whole: a temporary
    file renamed over the old one, so that a reader never sees half a report. Returns the JSON's path."""
    json_path = os.path.splitext(out)[0] + ".json"
    for path, text in ((out, render_table(rows, meta)), (json_path, json.dumps({"meta": meta, "rows": rows}, indent=1))):
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    return json_path


def report_row(row):
    if row["status"] == "ok":
        print(f"    B={row['B']}: {row['ms']:.1f} ms/step, {row['tok_s']:,.0f} tok/s, MFU {fmt(row['mfu'], '.1f')}%, "
              f"peak {fmt(row['peak_gib'], '.2f')} GiB, last loss {fmt(row['loss_last'], '.3f')}", flush=True)
    else:
        print(f"    B={row['B']}: {row['status'].upper()}: {row['error']} (log: {row.get('log')})", flush=True)


if __name__ == "__main__":
    sys.exit(main())
