#!/usr/bin/env python3
"""Unit tests of dev/bench/scaling_report.py (no GPU): the parser on lines printed with the trainer's own
format strings, the medians and scaling arithmetic, the per-GPU memory from nvidia-smi samples, the loss
comparison, and the refusals.

    python3 dev/bench/test_scaling_report.py
"""
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scaling_report as sr  # noqa: E402


def trainer_log(losses, step_ms, tokens_per_step=524288, val=None, mem_end=None):
    """stdout of a run, with train_gpt.cu's step-line, val-line and end-line formats"""
    lines = ["| B, T, accumulation    | %-50s |" % ("64, 1024, 8 (%d tokens per step)" % tokens_per_step)]
    if val is not None:
        lines.append("val loss %.6f (step %d, %d batches)" % (val[1], val[0], 20))
    n = len(losses)
    for i, (loss, ms) in enumerate(zip(losses, step_ms)):
        tok_s = tokens_per_step / (ms / 1000.0)
        lines.append("step %5d/%d | loss %.6f | norm %7.4f | lr %.2e | %8.2f ms | %9.0f tok/s | MFU %s | ETA %s"
                     % (i + 1, n, loss, 1.5, 6e-4, ms, tok_s, " 44.0%", "1m 2s"))
    lines.append("average step 100.00 ms, 5242880 tok/s over %d steps" % (n - 1))
    if mem_end is not None:
        lines.append("GPU memory in use at the end: %.2f GiB" % mem_end)
    return "\n".join(lines) + "\n"


class ScalingReportTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.dir.cleanup()

    def write(self, name, text):
        path = os.path.join(self.dir.name, name)
        with open(path, "w") as f:
            f.write(text)
        return path

    def test_parse_log_reads_every_step_val_and_memory(self):
        path = self.write("a.log", trainer_log([10.9, 9.5, 8.25], [2000.0, 400.0, 401.0], val=(3, 7.125), mem_end=20.5))
        run = sr.parse_log(path)
        self.assertEqual(run["losses"], {1: 10.9, 2: 9.5, 3: 8.25})
        self.assertEqual(run["ms"][1], 2000.0)
        self.assertAlmostEqual(run["tok_s"][2], 524288 / 0.4, delta=1.0)
        self.assertEqual(run["val"], {3: 7.125})
        self.assertEqual(run["mem_end"], 20.5)

    def test_parse_log_without_steps_is_an_error(self):
        path = self.write("failed.log", "error: out of memory\n")
        with self.assertRaises(ValueError):
            sr.parse_log(path)

    def test_parse_log_without_the_banner_is_an_error(self):
        text = trainer_log([10.0, 9.0], [300.0, 260.0]).split("\n", 1)[1] # the banner row dropped
        with self.assertRaises(ValueError):
            sr.parse_log(self.write("no_banner.log", text))

    def test_parse_smi_keeps_the_largest_sample_per_gpu(self):
        path = self.write("smi.csv", "0, 1024\n1, 2048\n0, 40960\n1, 512\ngarbage line\n2, [N/A]\n")
        self.assertEqual(sr.parse_smi(path), {0: 40.0, 1: 2.0})
        self.assertEqual(sr.parse_smi("-"), {})

    def test_scaling_efficiency_and_loss_differences(self):
        # 1 GPU: 1000 ms/step after a slow first step; 4 GPUs: 260 ms -> 3.846x, 96.2%
        one = self.write("one.log", trainer_log([10.0, 9.0, 8.0, 7.0], [5000.0, 1000.0, 1000.0, 1000.0]))
        four = self.write("four.log", trainer_log([10.0, 9.0, 8.5, 6.75], [3000.0, 260.0, 260.0, 260.0]))
        runs = [{"recipe": "bf16", "gpus": 4, "log": sr.parse_log(four), "smi": {0: 20.0, 1: 19.5, 2: 19.5, 3: 19.5}},
                {"recipe": "bf16", "gpus": 1, "log": sr.parse_log(one), "smi": {0: 21.0}}]
        rows, comparisons = sr.summarize(runs, skip=1)
        self.assertEqual(rows[0]["ms"], 260.0)
        self.assertAlmostEqual(rows[0]["scaling"], 1000.0 / 260.0, places=4)
        self.assertAlmostEqual(rows[0]["efficiency"], 1000.0 / 260.0 / 4, places=4)
        self.assertEqual(rows[1]["scaling"], 1.0)
        self.assertEqual(rows[0]["mem_gpus"], [20.0, 19.5, 19.5, 19.5])
        (c,) = comparisons
        self.assertEqual(c["identical"], 2)
        self.assertEqual(c["worst_step"], 3)
        self.assertAlmostEqual(c["diffs"][3], 0.5)
        self.assertAlmostEqual(c["diffs"][4], -0.25)
        text = sr.markdown(rows, comparisons, skip=1)
        self.assertIn("| bf16 | 4 | 4 | 260.0 |", text)
        self.assertIn("96.2%", text)
        self.assertIn("5.00e-01 (3)", text)

    def test_a_recipe_without_a_one_gpu_run_is_refused(self):
        four = self.write("four.log", trainer_log([10.0, 9.0], [300.0, 260.0]))
        with self.assertRaises(ValueError):
            sr.summarize([{"recipe": "fp8", "gpus": 4, "log": sr.parse_log(four), "smi": {}}], skip=0)

    def test_main_writes_the_report(self):
        one = self.write("one.log", trainer_log([10.0, 9.0, 8.0], [900.0, 1000.0, 1000.0], mem_end=21.0))
        two = self.write("two.log", trainer_log([10.0, 9.0, 8.0], [600.0, 500.0, 500.0], mem_end=20.0))
        out = os.path.join(self.dir.name, "report.md")
        sr.main(["--run", "bf16", "1", one, "-", "--run", "bf16", "2", two, "-", "--skip", "1", "--out", out])
        with open(out) as f:
            text = f.read()
        self.assertIn("| bf16 | 2 | 3 | 500.0 |", text)
        self.assertIn("2.00×", text)
        self.assertIn("100.0%", text)


if __name__ == "__main__":
    unittest.main()
