"""Unit tests for dev/plot_logs.py (no GPU): parsing main.log, the protocol summary, the table."""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import plot_logs  # noqa: E402


def write_log(lines):
    fd, path = tempfile.mkstemp(suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


class PlotLogsTest(unittest.TestCase):
    def test_parse_and_summary(self):
        # train step s is update s+1; train loss = 10 - 0.01*(s+1); val every 100 with a minimum at 300
        lines = ["# recipe:bf16 precision:bf16 model:d12"]
        for s in range(0, 1000):
            lines.append(f"s:{s} trl:{10 - 0.01 * (s + 1):.6f} lr:6.0e-04 norm:1.0")
        vals = {0: 11.0, 100: 6.0, 200: 5.5, 300: 5.0, 400: 5.2, 1000: 6.5}
        for s, v in vals.items():
            lines.append(f"s:{s} tel:{v}")
        path = write_log(lines)
        train, val, meta = plot_logs.parse_main_log(path)
        self.assertEqual(meta["recipe"], "bf16")
        self.assertEqual(len(train), 1000)
        s = plot_logs.summarize(train, val)
        self.assertEqual((s["min_val"], s["min_val_step"]), (5.0, 300))
        self.assertEqual((s["last_val"], s["last_val_step"]), (6.5, 1000))
        # updates 301..350 -> mean of 10 - 0.01*u over u in 301..350 = 10 - 0.01*325.5
        self.assertAlmostEqual(s["train_301_350"], 10 - 3.255, places=6)
        self.assertAlmostEqual(s["train_last50"], 10 - 0.01 * 975.5, places=6)

    def test_resumed_run_keeps_the_last_value(self):
        path = write_log(["s:0 trl:5.0", "s:1 trl:4.0", "s:1 trl:3.5", "s:2 tel:9.0", "s:2 tel:8.0"])
        train, val, _ = plot_logs.parse_main_log(path)
        self.assertEqual(train[1], 3.5)
        self.assertEqual(val[2], 8.0)

    def test_table_ratios(self):
        a = {"min_val": 5.0, "min_val_step": 300, "train_301_350": 4.0, "train_last50": 3.0, "last_val": 6.0, "last_val_step": 1000}
        b = dict(a, min_val=5.5, train_301_350=4.4)
        lines = plot_logs.report([("bf16", a), ("fp8", b)])
        self.assertIn("| fp8 | 5.5000 (300)", lines[3])
        self.assertTrue(lines[3].endswith(" 1.1000 | 1.1000 |"), lines[3])

    def test_cli_rejects_a_log_without_losses(self):
        path = write_log(["# only metadata"])
        self.assertEqual(plot_logs.main([path]), 1)


if __name__ == "__main__":
    unittest.main()
