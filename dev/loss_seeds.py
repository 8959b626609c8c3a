#!/usr/bin/env python3
"""The loss protocol (doc/protocol.md) over several seeds, several runs at a time on one GPU, in one command.

    python3 dev/loss_seeds.py --recipes "bf16,fp8,tcfp12:-tabd 1 -tfw 1 -tfa 1" --seeds 0-7 --jobs 8 --out loss_seeds

Every recipe (the first is the baseline) runs the protocol's command once per seed,

    ./train_gpt_<recipe> -o OUT/<recipe>_sd<seed> -sd <seed> [the recipe's flags]

(the trainer's defaults are the protocol: d12, B = 8, T = 1024, 1000 steps on tiny-shakespeare), --jobs runs at
a time, in seed order with the recipes interleaved (seed 0 of every recipe, then seed 1, ...), so that a study
cut short still has its pairs. Each run keeps its main.log and stdout.txt; its final checkpoint (~1.5 GB at
d12) is deleted unless --keep-checkpoints. A run is done once OUT/<run>/status.json says exit status 0: running
the same command again runs only what is not done (a study can be spread over several device calls), and
deleting a run's directory runs it again.

At the end dev/plot_logs.py --by-seed writes OUT/report.md: the protocol's figures per run, per seed each
recipe's ratio to the baseline run of the same seed, the mean of the ratios, their sd and the 95% interval of
the mean; and OUT/curves.png where matplotlib is installed.

--baseline-logs takes the baseline's runs from stored main.log files instead of running them (a third of a
three-recipe study's GPU time; dev/baselines/ holds BF16's). That is sound only where the baseline's code has
not changed since and repeats bit for bit: BF16 does (its runs repeat bit for bit across studies); a recipe
that times its choices under -ga 1 need not.

Every recipe times a choice when a shape is first seen under -ga 1, the default (cuBLASLt's algorithms, and
TCFP-12's GEMM form), so a run on a shared GPU may choose differently from a lone run: it is then as valid, but
not bit for bit the lone run. BF16 and FP8-hybrid runs sharing the GPU only with each other have chosen as they
do alone; beside other work (a test suite) a BF16 run has not. Give -ga 0 in a recipe's flags for runs that
repeat bit for bit wherever they run.

--gpus 0,1 spreads the runs over several GPUs of one machine: --jobs runs at a time on each, every run started with
CUDA_VISIBLE_DEVICES set to the GPU of the slot it took (its status.json records it), so a two-GPU machine
halves a study's wall time.

A SIGTERM or SIGINT (Ctrl-C, or `timeout` around a device call) ends the runs in flight, which are then not done,
writes the report of what is done, and exits with 130; the next invocation runs the rest.

Exit status: 0 when every run is done and the report is written; 1 when a run failed (the report still covers
the runs that are done); 2 for bad arguments or a failed build; 130 when interrupted.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "dev", "bench"))
sys.path.insert(0, os.path.join(REPO_ROOT, "dev"))
import bench  # noqa: E402  (recipe lists, runs with a timeout, builds, error lines, GPU and git details)
import plot_logs  # noqa: E402  (the report)

DATA_FILES = ("dev/data/tinyshakespeare/tiny_shakespeare_train.bin", "dev/data/tinyshakespeare/tiny_shakespeare_val.bin")
# what llmc/checkpoint.h writes into -o, and the temporaries of an interrupted write (NAME.tmp.PID)
CHECKPOINT_PATTERNS = ("model_*.bin", "state_*.bin", "DONE_*", "model_*.bin.tmp*", "state_*.bin.tmp*")


def parse_seeds(text):
    """'0-7', '0,3,5', '0-2,9': the seeds in order, each once. Raises ValueError."""
    seeds, seen = [], set()
    for item in text.split(","):
        item = item.strip()
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", item)
        if not m:
            raise ValueError(f"--seeds: '{item}' is not N or N-M")
        lo, hi = int(m.group(1)), int(m.group(2) if m.group(2) is not None else m.group(1))
        if hi < lo:
            raise ValueError(f"--seeds: '{item}' runs backwards")
        if hi - lo >= 100000:
            raise ValueError(f"--seeds: '{item}' is more than 100,000 seeds")
        seeds += [s for s in range(lo, hi + 1) if s not in seen]
        seen.update(range(lo, hi + 1))
    return seeds


def run_name(label, seed):
    """The run's directory and report label: the recipe label made file-safe, then _sd<seed>."""
    return f"{bench.safe(label)}_sd{seed}"


def plan_runs(recipes, seeds):
    """(label, recipe, flags, seed) per run: seed-major, recipes in the order given."""
    return [(label, recipe, flags, seed) for seed in seeds for label, recipe, flags in recipes]


def trainer_command(bin_dir, recipe, flags, run_dir, seed):
    return [os.path.join(bin_dir, f"train_gpt_{recipe}"), "-o", run_dir, "-sd", str(seed), *flags]


class Interrupted(Exception):
    """SIGTERM or SIGINT (e.g. `timeout` around a device call): the study stops."""


# The trainers running now (their Popen objects), so that a stop can end them: each runs in a process group
# of its own (bench.run_logged), which a signal to this script does not reach.
_running = set()
_running_lock = threading.Lock()
_stopping = threading.Event()


def track(proc):
    """run_logged's on_start: a trainer that starts as the study stops is ended at once."""
    with _running_lock:
        _running.add(proc)
        if _stopping.is_set():
            bench.kill_group(proc)


def untrack(proc):
    with _running_lock:
        _running.discard(proc)


def stop_all():
    """Ends every trainer running now and keeps new ones from starting."""
    with _running_lock:
        _stopping.set()
        for proc in list(_running):
            bench.kill_group(proc)


def read_status(run_dir):
    try:
        with open(os.path.join(run_dir, "status.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def is_done(run_dir):
    st = read_status(run_dir)
    return bool(st) and st.get("rc") == 0 and os.path.isfile(os.path.join(run_dir, "main.log"))


def remove_checkpoints(run_dir):
    for pattern in CHECKPOINT_PATTERNS:
        for path in glob.glob(os.path.join(run_dir, pattern)):
            os.remove(path)


def parse_gpus(text):
    """'0,1' -> ['0', '1'] (CUDA device indices, each once). Raises ValueError."""
    gpus = [g.strip() for g in text.split(",")]
    if not gpus or any(not re.fullmatch(r"\d+", g) for g in gpus):
        raise ValueError(f"--gpus: '{text}' is not a comma list of device indices such as 0,1")
    if len(set(gpus)) != len(gpus):
        raise ValueError(f"--gpus: '{text}' names a device twice")
    return gpus


def gpu_slots(gpus, jobs):
    """The pool's slots: each GPU `jobs` times, interleaved (a study's first runs spread over every GPU), or
    None without --gpus (every run on the devices the environment gives)."""
    if gpus is None:
        return None
    slots = queue.Queue()
    for _ in range(jobs):
        for g in gpus:
            slots.put(g)
    return slots


def run_one(run, args, out_dir, slots=None):
    """Runs one (label, recipe, flags, seed) unless it is done; returns (name, status dict, skipped). With slots
    (gpu_slots), the run takes a free GPU slot for its time and sees only that GPU."""
    label, recipe, flags, seed = run
    name = run_name(label, seed)
    run_dir = os.path.join(out_dir, name)
    if is_done(run_dir):
        return name, read_status(run_dir), True
    if _stopping.is_set():
        return name, None, False
    os.makedirs(run_dir, exist_ok=True)
    if os.path.exists(os.path.join(run_dir, "main.log")):
        os.remove(os.path.join(run_dir, "main.log"))   # an unfinished run's log: the trainer would append to it
    remove_checkpoints(run_dir)                          # ... and resume from its checkpoint
    cmd = trainer_command(args.bin_dir, recipe, flags, run_dir, seed)
    gpu = slots.get() if slots is not None else None   # (the pool has exactly as many workers as slots)
    env = None
    if gpu is not None:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=gpu)
    t0 = time.time()
    try:
        rc, text, timed_out = bench.run_logged(cmd, REPO_ROOT, args.timeout, os.path.join(run_dir, "stdout.txt"),
                                               env=env, on_start=track, on_end=untrack)
    except OSError as e:
        rc, text, timed_out = 127, f"error: cannot run {cmd[0]}: {e}", False
    finally:
        if gpu is not None:
            slots.put(gpu)
    status = {"rc": rc, "timed_out": timed_out, "seconds": round(time.time() - t0, 1), "label": label,
              "seed": seed, "command": " ".join(bench.quote_arg(c) for c in cmd)}
    if gpu is not None:
        status["gpu"] = int(gpu)
    if _stopping.is_set() and rc != 0:
        status["error"] = "stopped: the study was interrupted"
    elif rc != 0 or timed_out:
        status["rc"] = rc if rc != 0 else 124
        status["error"] = (f"timed out after {args.timeout:.0f} s" if timed_out else
                           bench.error_line(text) or f"exit status {rc}")
    elif not args.keep_checkpoints:
        remove_checkpoints(run_dir)
    with open(os.path.join(run_dir, "status.json.tmp"), "w") as f:
        json.dump(status, f, indent=1)
    os.replace(os.path.join(run_dir, "status.json.tmp"), os.path.join(run_dir, "status.json"))
    return name, status, False


def reuse_baseline(pattern, label, seeds, out_dir):
    """--baseline-logs: the baseline's main.log of every seed from files named by pattern ('{seed}' replaced by
    the seed) instead of runs: each is copied to OUT/<baseline>_sd<seed>/main.log with a status.json that names
    its source, so the study counts it done. Returns the seeds whose file is missing (their runs then run)."""
    missing = []
    for seed in seeds:
        src = pattern.replace("{seed}", str(seed))
        run_dir = os.path.join(out_dir, run_name(label, seed))
        if is_done(run_dir):
            continue
        if not os.path.isfile(src):
            missing.append(seed)
            continue
        os.makedirs(run_dir, exist_ok=True)
        shutil.copyfile(src, os.path.join(run_dir, "main.log"))
        with open(os.path.join(run_dir, "status.json"), "w") as f:
            json.dump({"rc": 0, "timed_out": False, "label": label, "seed": seed, "reused_from": os.path.abspath(src)},
                      f, indent=1)
    return missing


def prepare_data():
    """The tiny-shakespeare shards the trainer reads by default; made by dev/data/tinyshakespeare.py if missing."""
    if all(os.path.isfile(os.path.join(REPO_ROOT, p)) for p in DATA_FILES):
        return True
    res = subprocess.run([sys.executable, os.path.join(REPO_ROOT, "dev", "data", "tinyshakespeare.py")], cwd=REPO_ROOT)
    return res.returncode == 0


def write_report(runs, out_dir, header=None):
    """plot_logs --by-seed over the runs that are done, baseline first, into OUT/report.md, after a header line
    (GPU, date, commit, command) when one is given. Returns plot_logs' exit status."""
    done = [(run_name(label, seed), label, seed) for label, _, _, seed in runs
            if is_done(os.path.join(out_dir, run_name(label, seed)))]
    if not done:
        print("no run is done: no report", file=sys.stderr)
        return 1
    baseline = runs[0][0]
    done.sort(key=lambda d: d[1] != baseline)   # plot_logs takes the first run's configuration as the baseline
    argv = [os.path.join(out_dir, name) for name, _, _ in done]
    argv += ["--labels", ",".join(name for name, _, _ in done), "--by-seed", "--table", os.path.join(out_dir, "report.md")]
    try:
        import matplotlib  # noqa: F401
        argv += ["--out", os.path.join(out_dir, "curves.png")]
    except ImportError:
        print("matplotlib is not installed: no curves.png")
    rc = plot_logs.main(argv)
    path = os.path.join(out_dir, "report.md")
    if rc == 0 and header and os.path.isfile(path):
        with open(path) as f:
            table = f.read()
        with open(path, "w") as f:
            f.write(f"# Loss protocol over seeds\n\n{header}\n\n{table}")
    return rc


def build_arg_parser():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--recipes", default="bf16,fp8",
                   help="comma list of RECIPE or RECIPE:FLAGS, the first the baseline (default bf16,fp8)")
    p.add_argument("--seeds", default="0-7", help="seeds: N, N-M, comma lists (default 0-7)")
    p.add_argument("--jobs", type=int, default=8, help="runs at a time on the GPU, or on each of --gpus (default 8)")
    p.add_argument("--gpus", default=None,
                   help="comma list of CUDA device indices to spread the runs over, --jobs on each (e.g. 0,1); "
                   "default: the devices the environment gives, --jobs in all")
    p.add_argument("--out", required=True, help="directory of the runs and the report")
    p.add_argument("--timeout", type=float, default=3600.0, help="seconds per run (default 3600)")
    p.add_argument("--no-build", action="store_true", help="use the existing train_gpt_<recipe> binaries")
    p.add_argument("--no-data", action="store_true", help="do not make the tiny-shakespeare shards if missing")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's final checkpoint")
    p.add_argument("--baseline-logs", metavar="PATTERN",
                   help="take the baseline's runs from these main.log files, '{seed}' standing for the seed "
                   "(e.g. 'dev/baselines/bf16_d12_sd{seed}.log'), instead of running them; only "
                   "sound where the baseline's code is unchanged and repeats bit for bit (BF16 does)")
    p.add_argument("--bin-dir", default=REPO_ROOT, help="where the train_gpt_<recipe> binaries are (default: the repo)")
    p.add_argument("--dry-run", action="store_true", help="print the commands and exit")
    return p


def main(argv=None):
    args = build_arg_parser().parse_args(argv)
    _stopping.clear()
    try:
        recipes = bench.parse_recipes(args.recipes)
        seeds = parse_seeds(args.seeds)
        gpus = parse_gpus(args.gpus) if args.gpus is not None else None
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.jobs < 1:
        print("error: --jobs must be at least 1", file=sys.stderr)
        return 2
    if not args.timeout > 0:
        print(f"error: --timeout {args.timeout}: must be a positive number of seconds", file=sys.stderr)
        return 2
    if args.baseline_logs is not None and "{seed}" not in args.baseline_logs:
        print("error: --baseline-logs must contain '{seed}'", file=sys.stderr)
        return 2
    out_dir = os.path.abspath(args.out)
    runs = plan_runs(recipes, seeds)
    if args.dry_run:
        if gpus:
            print(f"# spread over GPUs {','.join(gpus)}, {args.jobs} at a time on each (CUDA_VISIBLE_DEVICES set per run)")
        for label, recipe, flags, seed in runs:
            stored = args.baseline_logs.replace("{seed}", str(seed)) if args.baseline_logs is not None else None
            if label == recipes[0][0] and stored is not None and os.path.isfile(stored):
                print(f"# {run_name(label, seed)}: from {stored}")
                continue
            cmd = trainer_command(args.bin_dir, recipe, flags, os.path.join(out_dir, run_name(label, seed)), seed)
            print(" ".join(bench.quote_arg(c) for c in cmd))
        return 0
    os.makedirs(out_dir, exist_ok=True)
    if args.baseline_logs is not None:
        missing = reuse_baseline(args.baseline_logs, recipes[0][0], seeds, out_dir)
        if missing:
            print(f"--baseline-logs: no file for seeds {', '.join(map(str, missing))}: those {recipes[0][0]} runs run")
    # the binaries the runs still to do need (a baseline taken whole from stored logs needs none)
    needed = dict.fromkeys(recipe for label, recipe, _, seed in runs
                           if not is_done(os.path.join(out_dir, run_name(label, seed))))
    if not args.no_build:
        for recipe in needed:
            ok, tail = bench.build_recipe(REPO_ROOT, recipe, out_dir)
            if not ok:
                print(f"error: make train_gpt_{recipe} failed:\n{tail}", file=sys.stderr)
                return 2
    for recipe in needed:
        if not os.access(os.path.join(args.bin_dir, f"train_gpt_{recipe}"), os.X_OK):
            print(f"error: {os.path.join(args.bin_dir, f'train_gpt_{recipe}')} is not an executable "
                  f"(make train_gpt_{recipe}, or drop --no-build)", file=sys.stderr)
            return 2
    if not args.no_data and not prepare_data():
        print("error: the tiny-shakespeare shards are missing and dev/data/tinyshakespeare.py failed", file=sys.stderr)
        return 2
    gpu = bench.gpu_info()[1]
    where = f"{args.jobs} at a time" + (f" on each of GPUs {','.join(gpus)}" if gpus else "")
    print(f"{len(runs)} runs ({len(recipes)} recipes x {len(seeds)} seeds), {where}; GPU: {gpu}; "
          f"commit {bench.git_revision()}", flush=True)
    failed, interrupted = 0, False

    def on_signal(signum, frame):
        raise Interrupted()
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    slots = gpu_slots(gpus, args.jobs)
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs * (len(gpus) if gpus else 1))
    try:
        futures = [pool.submit(run_one, run, args, out_dir, slots) for run in runs]
        for fut in concurrent.futures.as_completed(futures):
            name, st, skipped = fut.result()
            if skipped:
                print(f"  {name}: done before, skipped", flush=True)
            elif st is None:
                continue
            elif st["rc"] == 0:
                print(f"  {name}: ok, {st['seconds']:.0f} s", flush=True)
            else:
                failed += 1
                print(f"  {name}: FAILED ({st['error']}); see {os.path.join(out_dir, name, 'stdout.txt')}", flush=True)
    except Interrupted:
        interrupted = True
        print("interrupted: stopping the runs in flight; they are not done and run again next time", flush=True)
        stop_all()
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    done = sum(is_done(os.path.join(out_dir, run_name(label, seed))) for label, _, _, seed in runs)
    header = (f"{gpu} · {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} · commit {bench.git_revision()} · "
              f"`python3 dev/loss_seeds.py {' '.join(bench.quote_arg(a) for a in (argv if argv is not None else sys.argv[1:]))}`"
              f" · {done} of {len(runs)} runs done")
    rc = write_report(runs, out_dir, header)
    if rc == 0:
        print(f"report: {os.path.join(out_dir, 'report.md')} ({done} of {len(runs)} runs done)")
    if interrupted:
        return 130
    return 1 if failed or rc or done < len(runs) else 0


if __name__ == "__main__":
    sys.exit(main())
