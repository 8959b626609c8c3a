#!/usr/bin/env python3
"""kernel_table.py: the GPU time of one training step, kernel by kernel, from Nsight Compute.

    ncu --clock-control none --metrics gpu__time_duration.sum --csv --page raw \\
        ./train_gpt_fp8 -e d12 -i SHARD -j "" -b 64 -t 1024 -d 65536 -x 3 -v 0 -s 0 -o "" > fp8.csv
    python3 dev/bench/kernel_table.py fp8.csv bf16.csv [--labels fp8,bf16] [--out table.md]

ncu runs every kernel alone (serialized, each launch timed by itself), with the clocks left as they
are (--clock-control none, so that kernels run at the clocks a training run sees). The tool keeps the kernels of the run's
LAST step: from the last launch of the step's first kernel (the token embedding, `encoder_forward`, or
--step-start REGEX) to the end of the file, so that the first steps' calibration and GEMM autotuning
are left out. With -d equal to B*T (one micro-step per step) that is one micro-step plus the
optimizer. Kernels are grouped by name (templates and arguments cut off) and summed.

The table has one column per file: milliseconds (and the number of launches) per name, sorted by the
largest time in any column, and the total: for example where the FP8 recipe spends its time against
BF16's.
"""
import argparse
import csv
import re
import sys

DURATION = "gpu__time_duration.sum"


def read_launches(path):
    """[(kernel name, nanoseconds)] in launch order, from ncu --csv --page raw output."""
    with open(path, newline="") as f:
        lines = [line for line in f if line.startswith('"')]  # ncu's own messages start with '=='
    rows = list(csv.reader(lines))
    header = next((r for r in rows if r and r[0] == "ID"), None)
    if header is None or "Kernel Name" not in header or DURATION not in header:
        raise ValueError(f"{path}: no ncu raw CSV header with 'Kernel Name' and '{DURATION}'")
    name_col, time_col = header.index("Kernel Name"), header.index(DURATION)
    launches = []
    for r in rows:
        if not r or not r[0].isdigit():  # the header and ncu's units row
            continue
        launches.append((r[name_col], float(r[time_col].replace(",", ""))))
    return launches


def short_name(name):
    """A kernel's name without its return type, template arguments and parameters."""
    name = re.sub(r"\(.*", "", name)
    depth, out = 0, []
    for ch in name:  # drop <...>, nested
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    name = "".join(out).strip()
    return name.split(" ")[-1]  # 'void foo' -> 'foo'


def last_step(launches, start_regex):
    starts = [i for i, (n, _) in enumerate(launches) if re.search(start_regex, n)]
    if not starts:
        raise ValueError(f"no kernel matches the step start '{start_regex}' (--step-start)")
    return launches[starts[-1]:]


def table(columns, labels):
    """Markdown: one row per kernel name, 'ms (launches)' per column; columns: [{name: (ns, count)}]."""
    names = set()
    for c in columns:
        names |= set(c)
    order = sorted(names, key=lambda n: (-max(c.get(n, (0, 0))[0] for c in columns), n))
    out = ["| kernel | " + " | ".join(f"{l} ms (launches)" for l in labels) + " |",
           "| --- | " + " | ".join("---:" for _ in labels) + " |"]
    for n in order:
        cells = []
        for c in columns:
            ns, k = c.get(n, (0.0, 0))
            cells.append(f"{ns / 1e6:.3f} ({k})" if k else "")
        out.append(f"| `{n}` | " + " | ".join(cells) + " |")
    out.append("| total | " + " | ".join(f"**{sum(v[0] for v in c.values()) / 1e6:.3f}** ({sum(v[1] for v in c.values())})"
                                          for c in columns) + " |")
    return "\n".join(out)


def summarize(launches):
    sums = {}
    for n, ns in launches:
        key = short_name(n)
        t, k = sums.get(key, (0.0, 0))
        sums[key] = (t + ns, k + 1)
    return sums


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("csv", nargs="+", help="ncu --csv --page raw output with gpu__time_duration.sum, one per run")
    p.add_argument("--labels", default=None, help="comma-separated column names (default: the file names)")
    p.add_argument("--step-start", default=r"encoder_forward", help="regex of the first kernel of a step")
    p.add_argument("--out", default=None, help="also write the table to this file")
    args = p.parse_args(argv)
    labels = args.labels.split(",") if args.labels else args.csv
    if len(labels) != len(args.csv):
        p.error("--labels needs one name per file")
    try:
        columns = [summarize(last_step(read_launches(f), args.step_start)) for f in args.csv]
    except (OSError, ValueError) as e:  # a missing file, not ncu's CSV, no step start: say so, exit 1
        print(f"error: {e}", file=sys.stderr)
        return 1
    text = table(columns, labels)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
