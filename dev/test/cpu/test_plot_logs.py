"""Unit tests for dev/plot_logs.py (no GPU): parsing main.log, the protocol summary, the table, and the FP8
quantization telemetry ("s:STEP lq:..." lines): parsing, its summary, and the --telemetry plot."""
import contextlib
import io
import math
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
import plot_logs  # noqa: E402


def write_log(lines):
    fd, path = tempfile.mkstemp(suffix=".log")
    with os.fdopen(fd, "w") as f:
        f.write("\n".join(lines) + "\n")
    return path


def lq(step, name, amax, scale=1.0e4, sat=0.0, ftz=0.0):
    """One telemetry line as the trainer writes it (amax may be a string such as "nan")."""
    amax = amax if isinstance(amax, str) else f"{amax:.6e}"
    return f"s:{step} lq:{name} amax:{amax} scale:{scale:.6e} sat:{sat:.6e} ftz:{ftz:.6e}"


def fp8_log(layers=2, steps=(0, 10, 20)):
    """A small fp8 run: train and val losses, the recipe's metadata lines, and telemetry for every tensor
    at each of steps. At the last step l1.fc.x has the largest sat, l0.fcproj.dy the largest ftz and
    l1.qkv.dy a nan amax."""
    lines = ["# recipe:fp8 precision:bf16 model:d2 params:1000 B:4 T:64 tokens_per_step:256",
             "# fp8: E4M3 forward / E5M2 backward, delayed scaling, history 16"]
    last = steps[-1]
    for s in range(last + 1):
        lines.append(f"s:{s} trl:{5 - 0.1 * s:.6f} lr:6.0e-04 norm:1.0")
        if s in steps:
            lines.append(f"s:{s} tel:{5.5 - 0.1 * s:.6f}")
            for l in range(layers):
                for linear in ("qkv", "attproj", "fc", "fcproj"):
                    for role in ("w", "x", "dy"):
                        name = f"l{l}.{linear}.{role}"
                        sat = 3e-4 if (s == last and name == "l1.fc.x") else 1e-5 * (l + 1)
                        ftz = 0.25 if (s == last and name == "l0.fcproj.dy") else 1e-3
                        amax = "nan" if (s == last and name == "l1.qkv.dy") else 0.01 * (l + 1) * (1 + s)
                        lines.append(lq(s, name, amax, sat=sat, ftz=ftz))
    return lines


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

    def test_skipped_updates_are_not_train_losses(self):
        # the trainer's lines for a step whose update was skipped (NaN/Inf loss or norm, -sl/-sg spikes) and
        # its end-of-run summary: no train loss, no NaN in the curve, the metadata parse survives them
        path = write_log(["s:0 trl:5.0 lr:1e-4 norm:1.0", "s:1 skip:nan-loss loss:nan lr:1e-4 norm:1.0",
                          "s:2 skip:nan-grad loss:4.9 lr:1e-4 norm:-nan",
                          "s:3 skip:loss-spike loss:9.5 lr:1e-4 norm:1.2 z:7.2500", "s:4 trl:4.8 lr:1e-4 norm:1.0",
                          "# updates skipped: 3 of 5 steps (nan-loss 1, nan-grad 1, loss-spike 1, grad-spike 0)"])
        train, val, _ = plot_logs.parse_main_log(path)
        self.assertEqual(train, {0: 5.0, 4: 4.8})
        self.assertEqual(val, {})

    def test_table_ratios(self):
        a = {"min_val": 5.0, "min_val_step": 300, "train_301_350": 4.0, "train_last50": 3.0, "last_val": 6.0, "last_val_step": 1000}
        b = dict(a, min_val=5.5, train_301_350=4.4)
        lines = plot_logs.report([("bf16", a), ("fp8", b)])
        self.assertIn("| fp8 | 5.5000 (300)", lines[3])
        self.assertTrue(lines[3].endswith(" 1.1000 | 1.1000 |"), lines[3])

    def test_hellaswag_accuracy(self):
        # "s:STEP eval:ACC" (-h 1): parsed beside the losses, which it leaves alone; a resumed step keeps the last
        lines = ["# recipe:bf16", "s:0 tel:11.0", "s:0 eval:0.250100", "s:0 trl:10.5 lr:1e-4 norm:1.0",
                 "s:100 tel:6.0", "s:100 eval:0.270000", "s:200 tel:5.5", "s:200 eval:0.300000", "s:200 eval:0.310000",
                 "s:300 tel:5.4", "s:300 eval:0.290000"]
        path = write_log(lines)
        self.assertEqual(plot_logs.parse_eval(path), {0: 0.2501, 100: 0.27, 200: 0.31, 300: 0.29})
        train, val, _ = plot_logs.parse_main_log(path)
        self.assertEqual((train, val), ({0: 10.5}, {0: 11.0, 100: 6.0, 200: 5.5, 300: 5.4}))
        self.assertEqual(plot_logs.parse_eval(write_log(["s:0 tel:5.0"])), {})
        s = plot_logs.summarize_eval(plot_logs.parse_eval(path))
        self.assertEqual((s["last_eval"], s["last_eval_step"], s["max_eval"], s["max_eval_step"]), (0.29, 300, 0.31, 200))
        # the table: the two columns only when a run has the accuracy
        a = dict(plot_logs.summarize(train, val), **s)
        lines = plot_logs.report([("bf16", a), ("fp8", plot_logs.summarize(train, val))])
        self.assertIn("HellaSwag at end (step) | highest HellaSwag (step) |", lines[0])
        self.assertTrue(lines[2].endswith("| 0.2900 (300) | 0.3100 (200) |"), lines[2])
        self.assertTrue(lines[3].endswith("| n/a (n/a) | n/a (n/a) |"), lines[3])
        self.assertNotIn("HellaSwag", plot_logs.report([("bf16", plot_logs.summarize(train, val))])[0])
        # the CLI: the table and a PNG with the accuracy's panel
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "curves.png")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(plot_logs.main([path, "--out", png]), 0)
            self.assertIn("| 0.2900 (300) | 0.3100 (200) |", out.getvalue())
            self.assertGreater(os.path.getsize(png), 10000)

    def test_split_seed(self):
        self.assertEqual(plot_logs.split_seed("bf16 sd0", {}), ("bf16", 0))
        self.assertEqual(plot_logs.split_seed("tcfp12_fast_sd12", {"seed": "3"}), ("tcfp12_fast", 12))
        self.assertEqual(plot_logs.split_seed("fp8 seed 2", {}), ("fp8", 2))
        self.assertEqual(plot_logs.split_seed("fp8", {"seed": "7"}), ("fp8", 7))
        self.assertEqual(plot_logs.split_seed("sd0", {}), ("sd0", None))  # a label that is only a marker names no config
        self.assertEqual(plot_logs.split_seed("d12", {}), ("d12", None))

    def test_seed_report(self):
        def summ(v, t):
            return {"min_val": v, "train_301_350": t}
        entries = [("bf16", 0, summ(5.0, 4.0)), ("bf16", 1, summ(4.0, 2.0)),
                   ("fp8", 1, summ(4.4, 2.2)), ("fp8", 0, summ(4.5, 4.4)), ("nvfp4", 0, summ(5.5, 4.0))]
        lines = plot_logs.seed_report(entries)
        self.assertIn("| run | seed 0 | seed 1 | mean of the ratios (sd) | 95% interval of the mean |", lines)
        # fp8: ratios 0.9 and 1.1 (val), 1.1 and 1.1 (train): means 1.0 and 1.1, sample sd 0.1414 and 0; the
        # interval is mean -/+ t(0.975, 1) sd / sqrt(2) = 12.706 * 0.1 = 1.2706 (val), and zero wide (train)
        self.assertIn("| fp8 | 0.9000 / 1.1000 | 1.1000 / 1.1000 | 1.0000 (0.1414) / 1.1000 (0.0000) | "
                      "-0.2706-2.2706 / 1.1000-1.1000 |", lines)
        # nvfp4 has seed 0 only: seed 1 is n/a, and one ratio has no sd and no interval
        self.assertIn("| nvfp4 | 1.1000 / 1.0000 | n/a / n/a | 1.1000 / 1.0000 | n/a / n/a |", lines)
        self.assertIn("| bf16 | 2 | 4.5000 | 3.0000 |", lines)
        self.assertIn("| fp8 | 2 | 4.4500 | 3.3000 |", lines)
        with self.assertRaises(ValueError):
            plot_logs.seed_report(entries + [("fp8", 1, summ(1.0, 1.0))])
        with self.assertRaises(ValueError):
            plot_logs.seed_report([("bf16", None, summ(1.0, 1.0))])

    def test_seed_curves(self):
        def run(level, steps=range(4)):
            return {s: level + 0.1 * s for s in steps}, {0: level, 2: level * 0.5}
        entries = [("bf16", 0, *run(4.0)), ("bf16", 1, *run(2.0)),
                   ("fp8", 0, *run(4.4)), ("fp8", 1, *run(2.4, range(3)))]   # fp8 seed 1 logged steps 0-2 only
        curves = plot_logs.seed_curves(entries, smooth=2)
        self.assertEqual([(c, sd) for c, sd, _ in curves], [("bf16", [0, 1]), ("fp8", [0, 1])])
        bf16, fp8 = curves[0][2], curves[1][2]
        # bf16's mean train loss 3.0, 3.1, 3.2, 3.3, then the trailing mean of 2: 3.0, 3.05, 3.15, 3.25
        self.assertEqual(bf16["train"][0], [0, 1, 2, 3])
        for got, want in zip(bf16["train"][1], [3.0, 3.05, 3.15, 3.25]):
            self.assertAlmostEqual(got, want)
        self.assertEqual(fp8["train"][0], [0, 1, 2])   # the steps every seed logged
        self.assertEqual(bf16["val"], ([0, 2], [3.0, 1.5]))
        self.assertNotIn("ratio", bf16)                 # the baseline has no ratio to itself
        steps, mean, lo, hi = fp8["ratio"]             # val ratios: seed 0 4.4 / 4 = 1.1, seed 1 2.4 / 2 = 1.2
        self.assertEqual(steps, [0, 2])
        for got, want in zip((mean[0], lo[0], hi[0], mean[1]), (1.15, 1.1, 1.2, 1.15)):
            self.assertAlmostEqual(got, want)
        self.assertEqual(len(fp8["val_runs"]), 2)
        self.assertEqual([round(v, 6) for v in plot_logs.moving_average([1.0, 2.0, 3.0, 4.0], 3)], [1.0, 1.5, 2.0, 3.0])

    def test_cli_by_seed_png(self):
        with tempfile.TemporaryDirectory() as d:
            logs = []
            for recipe, level in (("bf16", 5.0), ("fp8", 5.1)):
                for seed in range(3):
                    lines = [f"# recipe:{recipe} seed:{seed}"] + [f"s:{s} trl:{level - s / 200}" for s in range(400)]
                    logs.append(write_log(lines + [f"s:{s} tel:{level + seed / 10 + s / 1000}" for s in range(0, 400, 50)]))
            png = os.path.join(d, "seeds.png")
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(plot_logs.main(logs + ["--by-seed", "--out", png]), 0)
            self.assertGreater(os.path.getsize(png), 10000)

    def test_t975_and_interval(self):
        self.assertEqual(plot_logs.t975(1), 12.706)
        self.assertEqual(plot_logs.t975(7), 2.365)
        self.assertEqual(plot_logs.t975(30), 2.042)
        # beyond the table: the expansion, against the exact t(0.975, 40) = 2.0211 and t(0.975, 120) = 1.9799
        self.assertAlmostEqual(plot_logs.t975(40), 2.0211, delta=0.001)
        self.assertAlmostEqual(plot_logs.t975(120), 1.9799, delta=0.001)
        self.assertLess(plot_logs.t975(31), plot_logs.t975(30))  # decreasing across the table's end
        with self.assertRaises(ValueError):
            plot_logs.t975(0)
        self.assertIsNone(plot_logs.mean_interval95([1.0]))
        # three values 1, 2, 3: mean 2, sd 1, half width t(0.975, 2) / sqrt(3) = 4.303 / 1.7320508 = 2.48434
        lo, hi = plot_logs.mean_interval95([1.0, 2.0, 3.0])
        self.assertAlmostEqual(lo, 2.0 - 2.48434, places=4)
        self.assertAlmostEqual(hi, 2.0 + 2.48434, places=4)

    def test_cli_by_seed_from_labels_and_metadata(self):
        def run(recipe, seed, val, meta_seed=True):
            head = f"# recipe:{recipe} B:8 T:1024" + (f" seed:{seed}" if meta_seed else "")
            return write_log([head] + [f"s:{s} trl:{val - 1.0}" for s in range(400)] + [f"s:300 tel:{val}"])
        logs = [run("bf16", 0, 5.0), run("bf16", 1, 4.0), run("fp8", 0, 5.5), run("fp8", 1, 4.2)]
        out = io.StringIO()
        with contextlib.redirect_stdout(out):  # labels from the metadata (the recipe), seeds from the metadata
            self.assertEqual(plot_logs.main(logs + ["--by-seed"]), 0)
        self.assertIn("| fp8 | 1.1000 / 1.1250 | 1.0500 / 1.0667 | 1.0750 (0.0354) / 1.0958 (0.0412) | "
                      "0.7573-1.3927 / 0.7252-1.4664 |", out.getvalue())
        unseeded = [run("bf16", 0, 5.0, False), run("fp8", 0, 5.5, False)]
        with contextlib.redirect_stdout(io.StringIO()):  # seeds from the labels
            self.assertEqual(plot_logs.main(unseeded + ["--by-seed", "--labels", "bf16 sd0,fp8 sd0"]), 0)
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            self.assertEqual(plot_logs.main(unseeded + ["--by-seed"]), 1)  # no seed anywhere

    def test_cli_rejects_a_log_without_losses(self):
        path = write_log(["# only metadata"])
        self.assertEqual(plot_logs.main([path]), 1)

    def test_parse_telemetry_values(self):
        path = write_log(["# recipe:fp8 precision:bf16", "# fp8: E4M3 forward / E5M2 backward",
                          "s:0 trl:5.0 lr:6.0e-04 norm:1.0",
                          "s:100 lq:l3.fc.dy amax:1.234560e-02 scale:4.646e+06 sat:0.000000e+00 ftz:1.250000e-03",
                          "s:100 lq:l0.qkv.w amax:2.5e-01 scale:1.792e+03 sat:2.0e-05 ftz:0.0",
                          "s:200 lq:l3.fc.dy amax:2.0e-02 scale:3.0e+06 sat:1.0e-06 ftz:5.0e-04"])
        tel = plot_logs.parse_telemetry(path)
        self.assertEqual(set(tel), {(3, "fc", "dy"), (0, "qkv", "w")})
        self.assertEqual(tel[(3, "fc", "dy")][100], {"amax": 1.23456e-2, "scale": 4.646e6, "sat": 0.0, "ftz": 1.25e-3})
        self.assertEqual(tel[(3, "fc", "dy")][200]["sat"], 1.0e-6)
        self.assertEqual(sorted(tel[(3, "fc", "dy")]), [100, 200])
        self.assertEqual(tel[(0, "qkv", "w")][100]["scale"], 1792.0)

    def test_telemetry_resumed_run_keeps_the_last_value(self):
        path = write_log([lq(10, "l1.attproj.x", 0.5), lq(20, "l1.attproj.x", 0.6),
                          "# recipe:fp8 (resumed)", lq(20, "l1.attproj.x", 0.7, sat=0.125), lq(30, "l1.attproj.x", 0.8)])
        tel = plot_logs.parse_telemetry(path)[(1, "attproj", "x")]
        self.assertEqual(sorted(tel), [10, 20, 30])
        self.assertEqual(tel[20]["amax"], 0.7)
        self.assertEqual(tel[20]["sat"], 0.125)

    def test_telemetry_nonfinite_amax_and_bad_lines(self):
        path = write_log([lq(5, "l0.fc.dy", "nan"), lq(5, "l0.fc.x", "-nan"), lq(5, "l0.fc.w", "inf"),
                          "s:5 lq:garbage amax:1.0", "s:5 lq:lx.fc.w amax:1.0", "s:5 lq:l0.fc.w2 amax:oops"])
        tel = plot_logs.parse_telemetry(path)
        self.assertTrue(math.isnan(tel[(0, "fc", "dy")][5]["amax"]))
        self.assertTrue(math.isnan(tel[(0, "fc", "x")][5]["amax"]))
        self.assertEqual(tel[(0, "fc", "w")][5]["amax"], math.inf)
        self.assertEqual(set(tel), {(0, "fc", "dy"), (0, "fc", "x"), (0, "fc", "w")})
        step, summary = plot_logs.telemetry_summary(tel)
        self.assertEqual(step, 5)
        self.assertEqual(summary["dy"]["nonfinite"], ["l0.fc.dy"])
        self.assertEqual(summary["w"]["nonfinite"], ["l0.fc.w"])

    def test_losses_unaffected_by_telemetry(self):
        lines = fp8_log()
        train, val, meta = plot_logs.parse_main_log(write_log(lines))
        plain = [l for l in lines if " lq:" not in l]
        self.assertNotEqual(len(plain), len(lines))
        self.assertEqual((train, val), plot_logs.parse_main_log(write_log(plain))[:2])
        self.assertEqual(len(train), 21)
        self.assertEqual(sorted(val), [0, 10, 20])
        self.assertAlmostEqual(train[20], 3.0, places=6)
        self.assertEqual(meta["recipe"], "fp8")
        self.assertEqual(plot_logs.parse_telemetry(write_log(plain)), {})

    def test_telemetry_summary_names_the_worst_tensor(self):
        tel = plot_logs.parse_telemetry(write_log(fp8_log()))
        self.assertEqual(len(tel), 2 * 4 * 3)
        step, summary = plot_logs.telemetry_summary(tel)
        self.assertEqual(step, 20)
        self.assertEqual(summary["x"]["sat"], (3e-4, "l1.fc.x"))
        self.assertEqual(summary["dy"]["ftz"], (0.25, "l0.fcproj.dy"))
        self.assertEqual(summary["w"]["sat"], (2e-5, "l1.qkv.w"))  # a tie between layer 1's linears: the first
        self.assertEqual(summary["dy"]["nonfinite"], ["l1.qkv.dy"])
        zero = plot_logs.telemetry_summary({(0, "fc", "w"): {1: {"amax": 1.0, "sat": 0.0, "ftz": 0.0}}})[1]
        self.assertEqual(zero["w"]["sat"], (0.0, None))

    def test_cli_telemetry_writes_a_png_and_prints_the_summary(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "main.log"), "w") as f:
                f.write("\n".join(fp8_log()) + "\n")
            png = os.path.join(d, "quant.png")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                rc = plot_logs.main([d, "--telemetry", png])
            self.assertEqual(rc, 0)
            with open(png, "rb") as f:
                data = f.read()
            self.assertGreater(len(data), 1000)
            self.assertEqual(data[:8], b"\x89PNG\r\n\x1a\n")
            text = out.getvalue()
            self.assertIn("last telemetry step 20, 24 tensors", text)
            self.assertRegex(text, r"x +: max sat 3\.000e-04 \(l1\.fc\.x\)")
            self.assertRegex(text, r"dy: max sat .* max ftz 2\.500e-01 \(l0\.fcproj\.dy\).*non-finite amax in 1: l1\.qkv\.dy")

    def test_cli_telemetry_one_png_per_run_with_telemetry(self):
        with tempfile.TemporaryDirectory() as d:
            bf16 = write_log(["# recipe:bf16", "s:0 trl:5.0", "s:1 trl:4.9", "s:1 tel:5.1"])
            a, b = write_log(fp8_log()), write_log(fp8_log(layers=3, steps=(0, 5)))
            png = os.path.join(d, "quant.png")
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(plot_logs.main([bf16, a, b, "--telemetry", png]), 0)
            self.assertEqual(sorted(os.listdir(d)), ["quant_run2.png", "quant_run3.png"])
            self.assertGreater(os.path.getsize(os.path.join(d, "quant_run3.png")), 1000)

    def test_boundary_telemetry_parse_summary_and_png(self):
        lines = ["# recipe:q115", "s:0 trl:10.9", "s:0 tel:10.9"]
        for step, clamp in ((0, 0.25), (100, 0.75)):
            lines += [f"s:{step} lq:q115.norm clamp:{clamp} ftz:1e-5 amax:5.5",
                      f"s:{step} lq:q115.logits clamp:0.5 ftz:0 amax:nan"]
        path = write_log(lines)
        tel = plot_logs.parse_boundary_telemetry(path)
        self.assertEqual(sorted(tel), ["logits", "norm"])
        self.assertEqual(tel["norm"][100], {"clamp": 0.75, "ftz": 1e-5, "amax": 5.5})
        self.assertTrue(math.isnan(tel["logits"][0]["amax"]))
        text = "\n".join(plot_logs.boundary_telemetry_lines("q115", path, tel))
        self.assertRegex(text, r"norm +2\.500e-01 -> 7\.500e-01")
        with tempfile.TemporaryDirectory() as d:
            png = os.path.join(d, "b.png")
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                self.assertEqual(plot_logs.main([path, "--telemetry", png]), 0)
            self.assertEqual(os.listdir(d), ["b.png"])
            self.assertGreater(os.path.getsize(png), 1000)
            self.assertIn("Boundary telemetry q115", out.getvalue())
        self.assertEqual(plot_logs.parse_telemetry(path), {})  # not FP8 telemetry

    def test_cli_telemetry_without_telemetry_fails(self):
        with tempfile.TemporaryDirectory() as d:
            path = write_log(["# recipe:bf16", "s:0 trl:5.0", "s:0 tel:5.2"])
            png = os.path.join(d, "quant.png")
            err = io.StringIO()
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
                rc = plot_logs.main([path, "--telemetry", png])
            self.assertNotEqual(rc, 0)
            self.assertIn("no run has FP8 quantization telemetry", err.getvalue())
            self.assertFalse(os.path.exists(png))
            with contextlib.redirect_stdout(io.StringIO()):
                self.assertEqual(plot_logs.main([path]), 0)  # without --telemetry the same log is fine


if __name__ == "__main__":
    unittest.main()
