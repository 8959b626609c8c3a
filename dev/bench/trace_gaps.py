"""trace_gaps.py: where a training step's GPU time goes between kernels, from a kernel_trace.cpp CSV.

The trace holds every kernel, memcpy and memset as the GPU ran it in the stream. A step is the time from one
launch of a marker kernel to the next (default: sum_squares_kernel, the gradient norm, which runs once per
optimizer step). For each step: its span, the time the GPU was busy (the union of the activities' intervals),
and the idle time split by the length of the gap it sits in. Short gaps (a few microseconds) are the cost of
one kernel ending and the next starting, which a CUDA graph or programmatic dependent launch can shorten; long
ones mean the GPU waited for the host (a synchronization, a host computation, the data loader).

    python3 dev/bench/trace_gaps.py trace.csv [--marker NAME] [--top 8] [--by-kernel]
"""
import argparse
import csv
import sys
from collections import defaultdict

GAP_BUCKETS_US = [(0, 2), (2, 5), (5, 20), (20, 100), (100, float("inf"))]


COLUMNS = ("kind", "start_ns", "end_ns", "stream", "name")


def load(path):
    """the trace's activities as (start, end, kind, name), sorted; ValueError if it is not kernel_trace's CSV"""
    rows = []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        if tuple(reader.fieldnames or ()) != COLUMNS:
            raise ValueError(f"{path}: not a kernel_trace.cpp CSV (header {reader.fieldnames}, expected {list(COLUMNS)})")
        for line, r in enumerate(reader, start=2):
            try:
                rows.append((int(r["start_ns"]), int(r["end_ns"]), r["kind"], r["name"]))
            except (TypeError, ValueError):
                raise ValueError(f"{path}:{line}: not a row of kernel_trace.cpp's CSV") from None
    if not rows:
        raise ValueError(f"{path}: no activities")
    rows.sort()
    return rows


def step_windows(rows, marker):
    starts = [s for s, _, kind, name in rows if kind == "K" and marker in name]
    return list(zip(starts, starts[1:]))


def analyse(rows, lo, hi):
    """busy time, idle by gap bucket, the gaps themselves, activities in [lo, hi)"""
    inside = [r for r in rows if lo <= r[0] < hi]
    busy = 0
    gaps = []  # (length ns, activity before, activity after)
    cur_end = lo
    prev = None
    for s, e, kind, name in inside:
        if s > cur_end:
            gaps.append((s - cur_end, prev, name))
        busy += max(0, min(e, hi) - max(s, cur_end))
        if e > cur_end:
            cur_end = e
            prev = name
    if hi > cur_end:
        gaps.append((hi - cur_end, prev, "(the next step's marker)"))
    idle = defaultdict(int)
    counts = defaultdict(int)
    for g, _, _ in gaps:
        for a, b in GAP_BUCKETS_US:
            if a * 1000 <= g < b * 1000:
                idle[(a, b)] += g
                counts[(a, b)] += 1
    return busy, idle, counts, gaps, inside


def short(name, n=70):
    return name if len(name) <= n else name[: n - 3] + "..."


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("trace", help="the CSV that build/libkernel_trace.so wrote (KERNEL_TRACE_OUT)")
    p.add_argument("--marker", default="sum_squares_kernel", help="a kernel that runs once a step (substring)")
    p.add_argument("--top", type=int, default=6, help="the longest gaps to list for the last step")
    p.add_argument("--by-kernel", action="store_true", help="the last step's time per kernel name")
    a = p.parse_args(argv)
    try:  # a missing file, not the trace's CSV, no whole step: say so, exit 1
        rows = load(a.trace)
        windows = step_windows(rows, a.marker)
        if not windows:
            raise ValueError(f"{a.trace}: fewer than two launches of a kernel named like '{a.marker}': no whole step")
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    hdr = "| step | span ms | busy ms | idle ms | activities | " + " | ".join(
        f"idle in gaps {lo}-{hi if hi != float('inf') else ''} us (n)" for lo, hi in GAP_BUCKETS_US) + " |"
    print(hdr)
    print("|" + " ---: |" * (hdr.count("|") - 1))
    totals = None
    for i, (lo, hi) in enumerate(windows):
        busy, idle, counts, gaps, inside = analyse(rows, lo, hi)
        span = hi - lo
        cells = [f"{idle[b] / 1e6:.3f} ({counts[b]})" for b in GAP_BUCKETS_US]
        print(f"| {i + 1} | {span / 1e6:.2f} | {busy / 1e6:.2f} | {(span - busy) / 1e6:.2f} | {len(inside)} | "
              + " | ".join(cells) + " |")
        if i > 0:  # the first whole step still holds autotuning and first-use costs
            t = (span, busy, len(inside))
            totals = t if totals is None else tuple(x + y for x, y in zip(totals, t))
    if totals:
        n = len(windows) - 1
        print(f"\nmean of steps 2-{len(windows)}: span {totals[0] / n / 1e6:.2f} ms, busy {totals[1] / n / 1e6:.2f} ms, "
              f"idle {(totals[0] - totals[1]) / n / 1e6:.2f} ms ({100 * (1 - totals[1] / totals[0]):.2f}%), "
              f"{totals[2] / n:.0f} activities a step")
    lo, hi = windows[-1]
    busy, idle, counts, gaps, inside = analyse(rows, lo, hi)
    print(f"\nthe last step's {a.top} longest gaps:")
    for g, before, after in sorted(gaps, key=lambda x: -x[0])[: a.top]:
        print(f"  {g / 1e3:9.1f} us  after {short(before or '(step start)')}  before {short(after)}")
    if a.by_kernel:
        per = defaultdict(lambda: [0, 0])
        for s, e, kind, name in inside:
            per[name][0] += e - s
            per[name][1] += 1
        print("\nthe last step, time per kernel (in the stream):")
        for name, (t, n) in sorted(per.items(), key=lambda x: -x[1][0]):
            print(f"  {t / 1e6:8.3f} ms {n:5d}  {short(name, 110)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
