#!/usr/bin/env python3
"""Unit tests of dev/bench/trace_gaps.py that need no GPU:

    python3 dev/bench/test_trace_gaps.py

A hand-made trace in kernel_trace.cpp's CSV layout, whose steps, overlaps and gaps are known: the step windows
between marker launches, the busy time as a union (overlapping activities counted once), the idle time split by
gap length, the longest gaps with their neighbours, and the errors (no marker, an empty file, a missing file,
another CSV: 'error: ...' and exit status 1, no traceback).
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trace_gaps  # noqa: E402
from cli_capture import run_captured  # noqa: E402

# two whole steps (markers at 0, 100,000 and 200,000 ns) and a third marker that closes the second
ROWS = [
    ("K", 0, 1_000, "sum_squares_kernel"),
    ("K", 2_000, 50_000, "gemm"),            # gap 1,000 ns (0-2 us)
    ("C", 40_000, 60_000, "memcpy"),         # overlaps gemm: busy 2,000..60,000 counted once
    ("K", 63_000, 99_000, "layernorm"),      # gap 3,000 ns (2-5 us); 1,000 ns left before the marker
    ("K", 100_000, 101_000, "sum_squares_kernel"),
    ("K", 251_000, 260_000, "gemm"),         # outside: after the last marker, not in any window
    ("K", 111_000, 190_000, "gemm"),         # gap 10,000 ns (5-20 us); unsorted on purpose
    ("K", 200_000, 201_000, "sum_squares_kernel"),  # gap 10,000 ns before it
]


def write_csv(rows):
    f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
    f.write("kind,start_ns,end_ns,stream,name\n")
    for kind, s, e, name in rows:
        f.write(f"{kind},{s},{e},7,{name}\n")
    f.close()
    return f.name


class TraceGapsTest(unittest.TestCase):
    def setUp(self):
        self.path = write_csv(ROWS)
        self.rows = trace_gaps.load(self.path)

    def tearDown(self):
        os.unlink(self.path)

    def test_windows_between_markers(self):
        self.assertEqual(trace_gaps.step_windows(self.rows, "sum_squares"), [(0, 100_000), (100_000, 200_000)])

    def test_busy_is_a_union_and_gaps_are_bucketed(self):
        busy, idle, counts, gaps, inside = trace_gaps.analyse(self.rows, 0, 100_000)
        # busy: 0-1,000, 2,000-60,000 (gemm and memcpy overlap), 63,000-99,000
        self.assertEqual(busy, 1_000 + 58_000 + 36_000)
        self.assertEqual(len(inside), 4)
        self.assertEqual(sorted(g for g, _, _ in gaps), [1_000, 1_000, 3_000])
        self.assertEqual(idle[(0, 2)], 2_000)
        self.assertEqual(counts[(0, 2)], 2)
        self.assertEqual(idle[(2, 5)], 3_000)
        self.assertEqual(busy + sum(idle.values()), 100_000)
        # the 3 us gap lies after the memcpy (the later end of the overlapping pair) and before layernorm
        g3 = [g for g in gaps if g[0] == 3_000][0]
        self.assertEqual((g3[1], g3[2]), ("memcpy", "layernorm"))

    def test_second_step(self):
        busy, idle, counts, gaps, inside = trace_gaps.analyse(self.rows, 100_000, 200_000)
        self.assertEqual(busy, 1_000 + 79_000)
        self.assertEqual(idle[(5, 20)], 20_000)
        self.assertEqual(counts[(5, 20)], 2)

    def run_main(self, argv):
        return run_captured(trace_gaps.main, argv)

    def test_report(self):
        rc, text, _ = self.run_main([self.path, "--by-kernel"])
        self.assertEqual(rc, 0)
        self.assertIn("| 1 | 0.10 | 0.10 | 0.01 | 4 |", text)
        self.assertIn("mean of steps 2-2: span 0.10 ms, busy 0.08 ms, idle 0.02 ms (20.00%)", text)
        self.assertIn("after sum_squares_kernel  before gemm", text)

    def test_no_marker(self):
        rc, _, err = self.run_main([self.path, "--marker", "adamw"])
        self.assertEqual(rc, 1)
        self.assertIn("error:", err)
        self.assertIn("no whole step", err)

    def test_empty(self):
        path = write_csv([])
        try:
            with self.assertRaises(ValueError) as e:
                trace_gaps.load(path)
            self.assertIn("no activities", str(e.exception))
            rc, _, err = self.run_main([path])
            self.assertEqual(rc, 1)
            self.assertIn("no activities", err)
        finally:
            os.unlink(path)

    def test_missing_file(self):
        rc, _, err = self.run_main(["/nonexistent/trace.csv"])
        self.assertEqual(rc, 1)
        self.assertIn("error:", err)

    def test_not_a_trace(self):
        f = tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False)
        f.write('"ID","Kernel Name","gpu__time_duration.sum"\n"0","k","5"\n')  # ncu's CSV, not the trace's
        f.close()
        bad = write_csv([("K", 0, 1_000, "sum_squares_kernel")])
        with open(bad, "a") as g:
            g.write("K,zero,10,7,gemm\n")
        try:
            rc, _, err = self.run_main([f.name])
            self.assertEqual(rc, 1)
            self.assertIn("not a kernel_trace.cpp CSV", err)
            rc, _, err = self.run_main([bad])
            self.assertEqual(rc, 1)
            self.assertIn(":3: not a row", err)
        finally:
            os.unlink(f.name)
            os.unlink(bad)

if __name__ == "__main__":
    unittest.main()
