"""Data-parallel scaling from trainer logs: tok/s, scaling against 1 GPU, per-GPU memory, losses.

    python3 dev/bench/scaling_report.py --run bf16 1 bf16_1gpu.log bf16_1gpu_smi.csv \\
        --run bf16 4 bf16_4gpu.log bf16_4gpu_smi.csv [--skip 10] [--out report.md] [--plot losses.png]

Each --run is RECIPE GPUS LOG SMI: LOG is process 0's standard output (the "step i/n | loss ..." lines,
"val loss ...", "GPU memory in use at the end: ..."), SMI a file of `nvidia-smi --query-gpu=index,memory.used
--format=csv,noheader,nounits -lms 500` sampled during the run ("-" for none). Every recipe needs a 1-GPU run:

- ms/step and tok/s: medians over the steps after the first --skip (warm-up, autotuning); the job's tok/s
  is the trainer's (all processes' tokens);
- scaling = tok/s on N GPUs / tok/s on 1 GPU; efficiency = scaling / N;
- memory: the largest memory.used seen on each GPU the run used (whole device, CUDA context included),
  and process 0's own end-of-run figure;
- losses: each N-GPU run's training losses against its recipe's 1-GPU run, step by step.
"""
import argparse
import os
import re
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (its parser of the trainer's output)

TOKENS_RE = re.compile(r"\((\d+) tokens per step\)")  # the banner's "B, T, accumulation" row
VAL_RE = re.compile(r"^val loss (\S+) \(step (\d+)")


def parse_log(path):
    """{'losses': {step: loss}, 'ms': {step: ms}, 'tok_s': {step: tok/s}, 'val': {step: loss}, 'mem_end': GiB or None}:
    the step lines and the end line through bench.parse_trainer_output, tok/s = the banner's tokens per step / ms."""
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        text = f.read()
    out = bench.parse_trainer_output(text)
    if not out["steps"]:
        raise ValueError(f"{path}: no 'step i/n | loss ...' lines (did the run fail?)")
    m = TOKENS_RE.search(text)
    if not m:
        raise ValueError(f"{path}: no '(N tokens per step)' in the banner")
    tokens = int(m.group(1))
    run = {"losses": {}, "ms": {}, "tok_s": {}, "val": {}, "mem_end": out["mem_end_gib"]}
    for st in out["steps"]:
        run["losses"][st["step"]] = st["loss"]
        run["ms"][st["step"]] = st["ms"]
        run["tok_s"][st["step"]] = tokens / (st["ms"] / 1000.0)
    for line in text.splitlines():
        m = VAL_RE.match(line)
        if m:
            run["val"][int(m.group(2))] = float(m.group(1))
    return run


def parse_smi(path):
    """{gpu index: largest memory.used in GiB} from nvidia-smi's 'index, MiB' lines; {} for '-'."""
    peak = {}
    if path == "-":
        return peak
    with open(path, "r", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) != 2:
                continue
            try:
                idx, mib = int(parts[0]), float(parts[1])
            except ValueError:
                continue
            peak[idx] = max(peak.get(idx, 0.0), mib / 1024.0)
    return peak


def timed(values, skip):
    """the values of the steps after the first `skip` (all of them when there are no more)"""
    later = [v for s, v in sorted(values.items()) if s > skip]
    return later if later else [v for _, v in sorted(values.items())]


def summarize(runs, skip):
    """runs: list of dicts with recipe, gpus, log (parsed), smi (parsed). Returns table rows and loss comparisons."""
    rows, comparisons = [], []
    one_gpu = {r["recipe"]: r for r in runs if r["gpus"] == 1}
    for r in runs:
        if r["recipe"] not in one_gpu:
            raise ValueError(f"recipe {r['recipe']}: no 1-GPU run to compare with")
        log = r["log"]
        ms = statistics.median(timed(log["ms"], skip))
        tok_s = statistics.median(timed(log["tok_s"], skip))
        base = one_gpu[r["recipe"]]
        base_tok_s = statistics.median(timed(base["log"]["tok_s"], skip))
        scaling = tok_s / base_tok_s
        used = sorted(r["smi"].items())
        row = {
            "recipe": r["recipe"], "gpus": r["gpus"], "steps": max(log["losses"]), "ms": ms, "tok_s": tok_s,
            "scaling": scaling, "efficiency": scaling / r["gpus"],
            "mem_gpus": [g for _, g in used], "mem_end": log["mem_end"],
            "final_loss": log["losses"][max(log["losses"])],
            "val": log["val"][max(log["val"])] if log["val"] else None,
        }
        rows.append(row)
        if r["gpus"] != 1:
            common = sorted(set(log["losses"]) & set(base["log"]["losses"]))
            diffs = {s: log["losses"][s] - base["log"]["losses"][s] for s in common}
            worst = max(common, key=lambda s: abs(diffs[s]))
            comparisons.append({
                "recipe": r["recipe"], "gpus": r["gpus"], "steps": len(common), "diffs": diffs, "worst_step": worst,
                "identical": sum(1 for s in common if diffs[s] == 0.0),
                "base_losses": base["log"]["losses"], "losses": log["losses"],
            })
    return rows, comparisons


def fmt_gib(x):
    return "—" if x is None else f"{x:.2f}"


def markdown(rows, comparisons, skip):
    out = ["| recipe | GPUs | steps | ms/step | tok/s | scaling | efficiency | peak GiB per GPU (nvidia-smi) "
           "| process 0 GiB at the end | last loss | val loss |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: |"]
    for r in rows:
        mem = " / ".join(f"{g:.2f}" for g in r["mem_gpus"]) if r["mem_gpus"] else "not sampled"
        val = "—" if r["val"] is None else f"{r['val']:.4f}"
        out.append(f"| {r['recipe']} | {r['gpus']} | {r['steps']} | {r['ms']:.1f} | {r['tok_s']:,.0f} | "
                   f"{r['scaling']:.2f}× | {100 * r['efficiency']:.1f}% | {mem} | {fmt_gib(r['mem_end'])} | "
                   f"{r['final_loss']:.4f} | {val} |")
    out.append("")
    out.append(f"ms/step and tok/s: medians of steps {skip + 1} on; scaling = tok/s ÷ the same recipe's 1-GPU tok/s; "
               "efficiency = scaling ÷ GPUs.")
    out.append("")
    if comparisons:
        out.append("| recipe | GPUs vs 1 | steps compared | identical | largest \\|Δloss\\| (step) | Δ at steps "
                   + ", ".join(str(s) for s in (1, 10, 50, 100, 200)) + " |")
        out.append("| --- | --- | ---: | ---: | --- | --- |")
        for c in comparisons:
            at = ", ".join(f"{c['diffs'][s]:+.2e}" if s in c["diffs"] else "—" for s in (1, 10, 50, 100, 200))
            w = c["worst_step"]
            out.append(f"| {c['recipe']} | {c['gpus']} vs 1 | {c['steps']} | {c['identical']} | "
                       f"{abs(c['diffs'][w]):.2e} ({w}) | {at} |")
        out.append("")
    return "\n".join(out)


def plot(comparisons, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for c in comparisons:
        steps = sorted(c["base_losses"])
        axes[0].plot(steps, [c["base_losses"][s] for s in steps], label=f"{c['recipe']} 1 GPU")
        steps = sorted(c["losses"])
        axes[0].plot(steps, [c["losses"][s] for s in steps], "--", label=f"{c['recipe']} {c['gpus']} GPUs")
        steps = sorted(c["diffs"])
        axes[1].plot(steps, [c["diffs"][s] for s in steps], label=f"{c['recipe']}: {c['gpus']} GPUs − 1 GPU")
    axes[0].set_xlabel("step")
    axes[0].set_ylabel("training loss")
    axes[0].legend()
    axes[1].set_xlabel("step")
    axes[1].set_ylabel("loss difference")
    axes[1].axhline(0.0, color="gray", linewidth=0.5)
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", nargs=4, action="append", required=True, metavar=("RECIPE", "GPUS", "LOG", "SMI"))
    ap.add_argument("--skip", type=int, default=10, help="warm-up steps left out of the medians (default 10)")
    ap.add_argument("--out", default=None, help="also write the tables to this Markdown file")
    ap.add_argument("--plot", default=None, help="the losses and their differences to this PNG")
    args = ap.parse_args(argv)
    runs = []
    for recipe, gpus, log, smi in args.run:
        if not gpus.isdigit() or int(gpus) < 1:
            ap.error(f"--run {recipe} {gpus}: GPUS must be a positive number")
        try:
            runs.append({"recipe": recipe, "gpus": int(gpus), "log": parse_log(log), "smi": parse_smi(smi)})
        except (OSError, ValueError) as e:
            sys.exit(f"error: {e}")
    try:
        rows, comparisons = summarize(runs, args.skip)
    except ValueError as e:
        sys.exit(f"error: {e}")
    text = markdown(rows, comparisons, args.skip)
    print(text)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    if args.plot and comparisons:
        plot(comparisons, args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
