#!/usr/bin/env python3
"""plot_logs.py: the loss protocol's report from trainer main.log files.

    python3 dev/plot_logs.py RUN_DIR_OR_MAIN_LOG [...] [--labels a,b] [--out curves.png] [--table out.md]

For each run prints (and with --table writes as markdown) what doc/protocol.md asks for: the lowest
validation loss and its step, the train loss averaged over steps 301-350, the train loss averaged
over the last 50 steps, and the validation loss at the last step; with two or more runs, each
figure's ratio to the first run (the baseline, e.g. BF16). Draws every run's train and validation
curves on one PNG (--out). main.log lines: "s:STEP trl:LOSS ..." (train) and "s:STEP tel:LOSS" (val);
lines starting with '#' are metadata ("# recipe:bf16 ...").
"""
import argparse
import os
import sys


def parse_main_log(path):
    """Returns (train {step: loss}, val {step: loss}, meta {key: value}). A resumed run appends to its
    main.log; a step logged twice keeps the last value (the resumed run's)."""
    train, val, meta = {}, {}, {}
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                for item in line[1:].split():
                    if ":" in item:
                        k, v = item.split(":", 1)
                        meta[k] = v
                continue
            fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
            if "s" not in fields:
                continue
            step = int(fields["s"])
            if "trl" in fields:
                train[step] = float(fields["trl"])
            if "tel" in fields:
                val[step] = float(fields["tel"])
    return train, val, meta


def mean_over(d, lo, hi):
    """Mean of d[step] for lo <= step <= hi (steps as the trainer prints them, 1-based); None if none."""
    # main.log's train step s is the (s+1)-th update, printed as "step s+1" by the trainer
    vals = [v for s, v in d.items() if lo <= s + 1 <= hi]
    return sum(vals) / len(vals) if vals else None


def summarize(train, val):
    out = {}
    if val:
        best_step = min(val, key=lambda s: (val[s], s))
        out["min_val"], out["min_val_step"] = val[best_step], best_step
        last = max(val)
        out["last_val"], out["last_val_step"] = val[last], last
    out["train_301_350"] = mean_over(train, 301, 350)
    if train:
        n = max(train) + 1
        out["train_last50"] = mean_over(train, n - 49, n)
    return out


def fmt(x, nd=4):
    return "n/a" if x is None else f"{x:.{nd}f}"


def report(runs):
    """runs: list of (label, summary). Returns markdown lines."""
    base = runs[0][1]
    lines = ["| run | lowest val loss (step) | train loss 301-350 | train loss last 50 | val loss at end (step) |"
             + (" val vs first | train 301-350 vs first |" if len(runs) > 1 else ""),
             "| --- | --- | --- | --- | --- |" + (" --- | --- |" if len(runs) > 1 else "")]
    for label, s in runs:
        row = (f"| {label} | {fmt(s.get('min_val'))} ({s.get('min_val_step', 'n/a')}) | {fmt(s.get('train_301_350'))} | "
               f"{fmt(s.get('train_last50'))} | {fmt(s.get('last_val'))} ({s.get('last_val_step', 'n/a')}) |")
        if len(runs) > 1:
            def ratio(k):
                a, b = s.get(k), base.get(k)
                return "n/a" if a is None or not b else f"{a / b:.4f}"
            row += f" {ratio('min_val')} | {ratio('train_301_350')} |"
        lines.append(row)
    return lines


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="run directories (with main.log) or main.log files; the first is the baseline")
    ap.add_argument("--labels", help="comma-separated labels (default: the recipe in each log, else the path)")
    ap.add_argument("--out", help="PNG with the train and validation curves of all runs")
    ap.add_argument("--table", help="write the summary table (markdown) here")
    args = ap.parse_args(argv)
    labels = args.labels.split(",") if args.labels else []
    if labels and len(labels) != len(args.runs):
        ap.error(f"--labels has {len(labels)} names for {len(args.runs)} runs")
    runs, curves = [], []
    for i, r in enumerate(args.runs):
        path = os.path.join(r, "main.log") if os.path.isdir(r) else r
        if not os.path.isfile(path):
            print(f"error: {path} not found", file=sys.stderr)
            return 1
        train, val, meta = parse_main_log(path)
        if not train and not val:
            print(f"error: {path} has no 's:STEP trl:' or 's:STEP tel:' lines", file=sys.stderr)
            return 1
        label = labels[i] if labels else meta.get("recipe", r)
        runs.append((label, summarize(train, val)))
        curves.append((label, train, val))
    lines = report(runs)
    print("\n".join(lines))
    if args.table:
        with open(args.table, "w") as f:
            f.write("\n".join(lines) + "\n")
    if args.out:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(9, 5.5))
        for k, (label, train, val) in enumerate(curves):
            color = f"C{k % 10}"
            st = sorted(train)
            ax.plot([s + 1 for s in st], [train[s] for s in st], color=color, alpha=0.35, lw=0.8)
            sv = sorted(val)
            ax.plot(sv, [val[s] for s in sv], color=color, marker="o", ms=3, lw=1.6, label=f"{label} (val)")
        ax.set_xlabel("step")
        ax.set_ylabel("loss (faint: train, markers: validation)")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.out, dpi=120)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
