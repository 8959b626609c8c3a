#!/usr/bin/env python3
"""Unit tests of dev/bench/bench.py that need no GPU and no torch:

    python3 dev/bench/test_bench.py

Argument parsing, the synthetic shard (checked the way llmc/dataloader.h checks a shard), the
parser of the trainer's output on text printed with the trainer's own format strings, the
median / tok/s / MFU / ratio arithmetic, recipe discovery, the OOM retry loop, the parent side of
the peer protocol (with a stand-in for the peer process), and the table.
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402


def trainer_output(params=124475904, L=12, C=768, NH=12, maxT=1024, B=64, T=1024, accum=8,
                   step_ms=(1900.0, 880.5, 871.2, 850.9, 850.4, 850.0, 849.8, 850.2, 850.1, 849.9,
                            850.3, 850.6, 849.7, 850.0, 851.0),
                   mem_end=23.45):
    """A trainer run's stdout, printed with the format strings of train_gpt.cu's banner, step line
    and end line (so the parser is tested against what the trainer really prints)."""
    tokens = B * T * accum
    n = len(step_ms)
    lines = ["+-----------------------+----------------------------------------------------+",
             "| train_gpt             | recipe %-10s precision %-24s |" % ("bf16", "bf16"),
             "| device                | %-50s |" % "NVIDIA H100 80GB HBM3",
             "| model                 | %-50s |" % "d12",
             "| L, C, NH, maxT, Vp    | %-50s |" % ("%d, %d, %d, %d, %d" % (L, C, NH, maxT, 50304)),
             "| parameters            | %-50d |" % params,
             "| B, T, accumulation    | %-50s |" % ("%d, %d, %d (%d tokens per step)" % (B, T, accum, tokens)),
             "| GPU memory in use     | %-50s |" % "1.93 GiB of 79.19 GiB",
             "+-----------------------+----------------------------------------------------+"]
    for i, ms in enumerate(step_ms):
        tok_s = tokens / (ms / 1000.0)
        lines.append("step %5d/%d | loss %.6f | norm %7.4f | lr %.2e | %8.2f ms | %9.0f tok/s | MFU %s | ETA %s"
                     % (i + 1, n, 11.0 - 0.01 * i, 0.5123, 6e-4 * (i + 1) / 50, ms, tok_s, "%5.1f%%" % 40.2, "0m01s"))
    lines.append("average step %.2f ms, %.0f tok/s over %d steps" % (170.0, tokens / 0.170, n - 1))
    lines.append("GPU memory in use at the end: %.2f GiB" % mem_end)
    return "\n".join(lines) + "\n"


OOM_TEXT = ("error: out of GPU memory allocating activations: asked for 40.00 GiB, 12.00 GiB free of 79.19 GiB.\n"
            "       Use a smaller micro-batch (-b), recompute more in backward (-r 2), or a shorter -t.\n")


def args_for(argv):
    return bench.build_arg_parser().parse_args(argv)


class TestArguments(unittest.TestCase):
    def test_defaults(self):
        a = args_for([])
        self.assertEqual((a.sizes, a.steps, a.warmup, a.total_batch, a.no_peer), ("d12", 10, 5, 524288, False))
        self.assertIsNone(a.recipes)
        self.assertEqual(bench.resolve_plan(a), [("d12", 64, 1024)])

    def test_sizes_and_per_size_B(self):
        a = args_for(["--sizes", "d12, d24,gpt2:d36,d48,gpt3:c768,d12"])
        self.assertEqual(bench.resolve_plan(a), [("d12", 64, 1024), ("d24", 64, 1024), ("d36", 32, 1024),
                                                 ("d48", 32, 1024), ("gpt3:c768", 64, 2048)])

    def test_B_overrides(self):
        self.assertEqual(bench.parse_b_overrides("16", ["d12", "d24"]), {"d12": 16, "d24": 16})
        self.assertEqual(bench.parse_b_overrides("d24=8,gpt3:c768=4", ["d24", "gpt3:c768"]),
                         {"d24": 8, "gpt3:c768": 4})
        a = args_for(["--sizes", "d12,d24", "--B", "d24=8"])
        self.assertEqual(bench.resolve_plan(a), [("d12", 64, 1024), ("d24", 8, 1024)])
        with self.assertRaises(ValueError):
            bench.parse_b_overrides("d48=4", ["d12"])      # a size that is not being run
        with self.assertRaises(ValueError):
            bench.parse_b_overrides("lots", ["d12"])

    def test_bad_plans(self):
        with self.assertRaises(ValueError):     # 48*1024 does not divide 524288
            bench.resolve_plan(args_for(["--B", "48"]))
        with self.assertRaises(ValueError):     # no default B/T for an unlisted size
            bench.resolve_plan(args_for(["--sizes", "gpt3:c1024"]))
        self.assertEqual(bench.resolve_plan(args_for(["--sizes", "gpt3:c1024", "--B", "8", "--T", "2048"])),
                         [("gpt3:c1024", 8, 2048)])

    def test_trainer_command(self):
        cmd = bench.trainer_command("bf16", "d12", 64, 1024, 524288, 15, "/tmp/s.bin")
        self.assertEqual(cmd, ["./train_gpt_bf16", "-e", "d12", "-b", "64", "-t", "1024", "-d", "524288",
                               "-x", "15", "-v", "0", "-s", "0", "-j", "", "-i", "/tmp/s.bin"])
        self.assertEqual(bench.trainer_command("bf16", "d12", 64, 1024, 524288, 15, "/tmp/s.bin", gpus=2),
                         ["bash", "scripts/launch.sh", "2"] + cmd)

    def test_recipe_variants(self):
        self.assertEqual(bench.parse_recipes("bf16, tcfp12,tcfp12:-tabd 1 -tfw 1"),
                         [("bf16", "bf16", []), ("tcfp12", "tcfp12", []),
                          ("tcfp12 -tabd 1 -tfw 1", "tcfp12", ["-tabd", "1", "-tfw", "1"])])
        # the FP8 recipe's scaling modes side by side (doc/recipes/fp8.md)
        self.assertEqual(bench.parse_recipes("fp8,fp8:-fs current,fp8:-fs block"),
                         [("fp8", "fp8", []), ("fp8 -fs current", "fp8", ["-fs", "current"]),
                          ("fp8 -fs block", "fp8", ["-fs", "block"])])
        for bad in ("", " , ", "bf16,bf16", "tcfp12:-tabd 1,tcfp12: -tabd  1", "../x", "Bf16"):
            with self.assertRaises(ValueError, msg=bad):
                bench.parse_recipes(bad)
        cmd = bench.trainer_command("tcfp12", "d48", 8, 1024, 524288, 15, "/tmp/s.bin", flags=["-tabd", "1"])
        self.assertEqual(cmd[0], "./train_gpt_tcfp12")
        self.assertEqual(cmd[-2:], ["-tabd", "1"])
        self.assertEqual(cmd[:-2], bench.trainer_command("tcfp12", "d48", 8, 1024, 524288, 15, "/tmp/s.bin"))
        # the variant is its own row: its ratio to bf16 and its 1-GPU scaling are its own
        rows = [dict(bench.new_row("d12", "bf16", "ours", 64, 1024), status="ok", tok_s=100.0),
                dict(bench.new_row("d12", "tcfp12", "ours", 64, 1024), status="ok", tok_s=80.0),
                dict(bench.new_row("d12", "tcfp12 -tabd 1", "ours", 64, 1024), status="ok", tok_s=90.0)]
        bench.compute_ratios(rows)
        self.assertEqual([r["vs_bf16"] for r in rows], [1.0, 0.8, 0.9])
        self.assertEqual([r["vs_1gpu"] for r in rows], [1.0, 1.0, 1.0])

    def test_gpus(self):
        self.assertEqual(bench.parse_gpus("2, 1,2"), [1, 2])
        for bad in ("0", "", "1,x", "-1", "1.5"):
            with self.assertRaises(ValueError, msg=bad):
                bench.parse_gpus(bad)
        # every process gets whole micro-batches: 524288 / (2 * 64 * 1024) = 4, but / (16 * 64 * 1024) is not whole
        self.assertEqual(bench.resolve_plan(args_for(["--gpus", "1,2"])), [("d12", 64, 1024)])
        with self.assertRaises(ValueError):
            bench.resolve_plan(args_for(["--gpus", "16"]))


class TestShard(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def test_written_shard_reads_back(self):
        import numpy as np
        path = os.path.join(self.dir, "s.bin")
        n = bench.shard_tokens_needed(524288)
        self.assertEqual(n, 1048577)
        bench.write_shard(path, n, seed=1)
        self.assertEqual(bench.read_shard_header(path), n)
        self.assertEqual(os.path.getsize(path), 1024 + 2 * n)
        header = np.fromfile(path, dtype="<i4", count=256)
        self.assertEqual(list(header[:3]), [20240520, 1, n])
        self.assertTrue((header[3:] == 0).all())
        tokens = np.fromfile(path, dtype="<u2", offset=1024)
        self.assertEqual(len(tokens), n)
        self.assertLess(int(tokens.max()), 50257)
        self.assertGreater(int(tokens.max()), 50000)             # uniform over the whole vocab
        self.assertLess(abs(float(tokens.mean()) - 25128.0), 200.0)
        # the dataloader's chunk count for d12 B=64 T=1024: (N - 1) / (B*T) = 16 chunks, 2 steps
        self.assertEqual((n - 1) // (64 * 1024), 16)

    def test_reader_rejects_what_the_dataloader_rejects(self):
        path = os.path.join(self.dir, "s.bin")
        bench.write_shard(path, 1000)
        with open(path, "r+b") as f:                            # truncated by one byte
            f.truncate(1024 + 2 * 1000 - 1)
        with self.assertRaisesRegex(ValueError, "header says 1000 tokens"):
            bench.read_shard_header(path)
        bench.write_shard(path, 1000)
        with open(path, "r+b") as f:                            # wrong magic
            f.write((12345).to_bytes(4, "little"))
        with self.assertRaisesRegex(ValueError, "magic"):
            bench.read_shard_header(path)


class TestTrainerOutput(unittest.TestCase):
    def test_parse(self):
        p = bench.parse_trainer_output(trainer_output())
        self.assertEqual(p["params"], 124475904)
        self.assertEqual((p["L"], p["C"], p["NH"], p["maxT"]), (12, 768, 12, 1024))
        self.assertEqual(p["device"], "NVIDIA H100 80GB HBM3")
        self.assertEqual((p["recipe"], p["precision"]), ("bf16", "bf16"))
        self.assertEqual(len(p["steps"]), 15)
        self.assertEqual(p["steps"][0], {"step": 1, "of": 15, "loss": 11.0, "norm": 0.5123, "ms": 1900.0})
        self.assertEqual(p["steps"][-1]["ms"], 851.0)
        self.assertEqual(p["mem_end_gib"], 23.45)

    def test_wide_numbers(self):
        # a step slower than 99999 ms and a 5-digit step count widen the fixed-width fields
        text = trainer_output(step_ms=[123456.78] * 3)
        p = bench.parse_trainer_output(text.replace("step     1/3", "step 12345/99999"))
        self.assertEqual([s["ms"] for s in p["steps"]], [123456.78] * 3)
        self.assertEqual(p["steps"][0]["step"], 12345)

    def test_failed_run(self):
        text = trainer_output(step_ms=[1900.0, 880.0]).split("GPU memory in use at the end")[0] + OOM_TEXT
        p = bench.parse_trainer_output(text)
        self.assertIsNone(p["mem_end_gib"])
        self.assertTrue(bench.is_oom(text))
        self.assertTrue(bench.error_line(text).startswith("error: out of GPU memory"))
        self.assertFalse(bench.is_oom(trainer_output()))
        self.assertEqual(bench.error_line("$ ./x\nsome output\nlast words\n"), "last words")
        nvcc = "train_gpt.cu(12): error: identifier \"x\" is undefined\nmake: *** [Makefile:56: x] Error 2\n"
        self.assertIn("identifier", bench.error_line(nvcc))
        self.assertTrue(bench.is_oom("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2 GiB"))


class TestNumbers(unittest.TestCase):
    def test_flops_and_mfu(self):
        # d12 at T=1024: 6 * 124,475,904 + 6 * 12 * 768 * 1024
        self.assertEqual(bench.flops_per_token(124475904, 12, 768, 1024), 803478528.0)
        row = {"step_ms": list(bench.parse_trainer_output(trainer_output())["steps"][i]["ms"] for i in range(15)),
               "params": 124475904, "L": 12, "C": 768, "T": 1024}
        bench.fill_speed(row, 524288, 5, 989.4e12)
        # steps 6..15: 850.0 849.8 850.2 850.1 849.9 850.3 850.6 849.7 850.0 851.0 -> median 850.05
        self.assertAlmostEqual(row["ms"], 850.05)
        self.assertAlmostEqual(row["tok_s"], 524288 / 0.85005)
        self.assertAlmostEqual(row["mfu"], 100 * 803478528.0 * (524288 / 0.85005) / 989.4e12)
        self.assertAlmostEqual(row["mfu"], 50.09, places=2)

    def test_median_excludes_warmup(self):
        self.assertEqual(bench.timed_median([1000, 1000, 3, 1, 2], 2), 2)
        self.assertEqual(bench.timed_median([1000, 4, 1, 2, 3], 1), 2.5)
        with self.assertRaises(ValueError):
            bench.timed_median([1.0, 2.0], 5)

    def test_peak(self):
        self.assertEqual(bench.peak_flops_for("NVIDIA H100 80GB HBM3"), 989.4e12)
        self.assertEqual(bench.peak_flops_for("NVIDIA H200"), 989.4e12)
        self.assertEqual(bench.peak_flops_for("NVIDIA A100-SXM4-80GB"), 312e12)
        self.assertIsNone(bench.peak_flops_for("NVIDIA GeForce RTX 4090"))
        self.assertIsNone(bench.peak_flops_for(None))
        self.assertEqual(bench.peak_flops_for("anything", 500.0), 500e12)

    def test_ratios(self):
        rows = [dict(bench.new_row("d12", "bf16", "ours", 64, 1024), status="ok", tok_s=3.0e6),
                dict(bench.new_row("d12", "fp8", "ours", 64, 1024), status="ok", tok_s=4.5e6),
                dict(bench.new_row("d12", "nvfp4", "ours", 64, 1024), status="failed", error="error: boom"),
                dict(bench.new_row("d12", bench.PEER_LABEL, "peer", 32, 1024), status="ok", tok_s=2.0e6),
                dict(bench.new_row("d24", "bf16", "ours", 32, 1024), status="ok", tok_s=1.0e6)]
        bench.compute_ratios(rows)
        self.assertEqual([(r["vs_peer"], r["vs_bf16"]) for r in rows],
                         [(1.5, 1.0), (2.25, 1.5), (None, None), (1.0, 2.0 / 3.0), (None, 1.0)])

    def test_ratios_several_gpus(self):
        rows = [dict(bench.new_row("d12", "bf16", "ours", 64, 1024), status="ok", tok_s=3.0e6),
                dict(bench.new_row("d12", "bf16", "ours", 64, 1024, gpus=2), status="ok", tok_s=5.7e6),
                dict(bench.new_row("d12", "fp8", "ours", 64, 1024, gpus=2), status="ok", tok_s=7.6e6),
                dict(bench.new_row("d12", bench.PEER_LABEL, "peer", 64, 1024), status="ok", tok_s=2.0e6)]
        bench.compute_ratios(rows)
        got = [(r["vs_peer"], r["vs_bf16"], r["vs_1gpu"]) for r in rows]
        self.assertEqual(got[0], (1.5, 1.0, 1.0))
        self.assertEqual(got[1][0], None)                       # the peer ran on one GPU: no ratio
        self.assertAlmostEqual(got[1][2], 1.9)                  # the scaling
        self.assertAlmostEqual(got[2][1], 7.6 / 5.7)            # against bf16 on as many GPUs
        self.assertEqual(got[2][2], None)                       # no 1-GPU fp8 row
        self.assertEqual(got[3][2], None)
        # MFU is per GPU
        row = dict(bench.new_row("d12", "bf16", "ours", 64, 1024, gpus=2), step_ms=[500.0] * 15,
                   params=124475904, L=12, C=768)
        one = dict(bench.new_row("d12", "bf16", "ours", 64, 1024), step_ms=[1000.0] * 15,
                   params=124475904, L=12, C=768)
        bench.fill_speed(row, 524288, 5, 989.4e12)
        bench.fill_speed(one, 524288, 5, 989.4e12)
        self.assertAlmostEqual(row["mfu"], one["mfu"])


def fake_bench(tmp, *extra):
    """run_all's inputs for a bench of bf16 and fp8 in tmp (empty train_gpt_<r> files stand in for the binaries,
    --no-build, --no-peer): (args, meta, the report's path); extra: more bench.py arguments"""
    for r in ("bf16", "fp8"):
        open(os.path.join(tmp, f"train_gpt_{r}"), "w").close()
    out = os.path.join(tmp, "report.md")
    args = bench.build_arg_parser().parse_args(["--recipes", "bf16,fp8", "--no-build", "--no-peer", "--out", out, *extra])
    meta = {"gpu": "test GPU", "date": "2025-01-01 00:00 UTC", "commit": "abc", "total_batch": 524288,
            "warmup": 5, "steps": 10, "peak_flops": 989.4e12, "gpus": [1], "argv": [], "repeat": args.repeat}
    return args, meta, out


class TestRounds(unittest.TestCase):
    """--repeat: each round's ratios against its own round's rows, and the summary over the rounds"""

    @staticmethod
    def row(recipe, rnd, tok_s, kind="ours", status="ok"):
        r = dict(bench.new_row("d12", recipe, kind, 64, 1024, rnd=rnd), status=status, tok_s=tok_s)
        r["ms"] = 524288 / tok_s * 1000 if tok_s else None
        return r

    def rows(self):
        return [self.row("bf16", 1, 3.0e6), self.row("fp8", 1, 3.6e6), self.row(bench.PEER_LABEL, 1, 2.0e6, "peer"),
                self.row("bf16", 2, 2.0e6), self.row("fp8", 2, 2.5e6), self.row(bench.PEER_LABEL, 2, 1.0e6, "peer"),
                self.row("bf16", 3, 4.0e6), self.row("fp8", 3, None, status="failed"),
                self.row(bench.PEER_LABEL, 3, 2.0e6, "peer")]

    def test_ratios_against_the_same_round(self):
        rows = bench.compute_ratios(self.rows())
        self.assertAlmostEqual(rows[1]["vs_bf16"], 1.2)    # 3.6 / 3.0, not against round 2's or 3's bf16
        self.assertAlmostEqual(rows[4]["vs_bf16"], 1.25)   # 2.5 / 2.0
        self.assertAlmostEqual(rows[4]["vs_peer"], 2.5)
        self.assertAlmostEqual(rows[6]["vs_peer"], 2.0)
        self.assertIsNone(rows[7]["vs_bf16"])

    def test_summary(self):
        summary = bench.summarize_rounds(bench.compute_ratios(self.rows()))
        self.assertEqual([(g["recipe"], g["rounds"], g["rounds_ok"]) for g in summary],
                         [("bf16", 3, 3), ("fp8", 3, 2), (bench.PEER_LABEL, 3, 3)])
        bf16, fp8, peer = summary
        self.assertEqual(bf16["tok_s"], 3.0e6)                         # median of 3, 2, 4
        self.assertEqual(bf16["vs_peer"], (2.0, 1.5, 2.0))             # rounds 1.5, 2.0, 2.0: median, lowest, highest
        self.assertAlmostEqual(fp8["vs_bf16"][0], 1.225)               # median of 1.2 and 1.25
        self.assertEqual((fp8["vs_bf16"][1], fp8["vs_bf16"][2]), (1.2, 1.25))
        self.assertEqual(peer["vs_bf16"][:2], (0.5, 0.5))              # rounds 2/3, 1/2, 1/2
        self.assertAlmostEqual(peer["vs_bf16"][2], 2.0 / 3.0)
        self.assertIsNone(peer["vs_1gpu"])                             # (the peer has no scaling ratio)

    def test_render_with_rounds(self):
        rows = bench.compute_ratios(self.rows())
        meta = {"gpu": "test GPU", "date": "2025-01-01 00:00 UTC", "commit": "abc", "total_batch": 524288,
                "warmup": 5, "steps": 10, "peak_flops": 989.4e12, "repeat": 3}
        md = bench.render_table(rows, meta)
        self.assertIn("| size | recipe | round | GPUs |", md)
        self.assertIn("| d12 | fp8 | 2 | 1 | 64 | 1024 |", md)
        self.assertIn("| d12 | fp8 | 1 | 2 of 3 | ", md)
        self.assertIn("| 1.225 (1.200–1.250) |", md)
        one_round = bench.render_table(bench.compute_ratios(self.rows()[:3]), dict(meta, repeat=1))
        self.assertNotIn("round", one_round)
        self.assertNotIn("Over the rounds", one_round)

    def test_run_all_runs_the_plan_in_rounds(self):
        tmp = tempfile.mkdtemp()
        saved = bench.REPO_ROOT, bench.run_ours
        try:
            args, meta, out = fake_bench(tmp, "--repeat", "2")
            calls = []

            def fake_run_ours(entry, size, B, T, args, shard, log_dir, peak, gpus=1, rnd=1):
                calls.append((entry[1], rnd))
                ms = {("bf16", 1): 900.0, ("fp8", 1): 750.0, ("bf16", 2): 920.0, ("fp8", 2): 760.0}[(entry[1], rnd)]
                row = dict(bench.new_row(size, entry[0], "ours", B, T, gpus, rnd), status="ok", step_ms=[ms] * 15,
                           params=124475904, L=12, C=768, peak_gib=25.0)
                return bench.fill_speed(row, 524288, 5, 989.4e12)
            bench.REPO_ROOT, bench.run_ours = tmp, fake_run_ours
            self.assertEqual(bench.run_all(args, bench.resolve_plan(args), bench.parse_recipes("bf16,fp8"), meta,
                                           989.4e12, tmp, tmp), 0)
            self.assertEqual(calls, [("bf16", 1), ("fp8", 1), ("bf16", 2), ("fp8", 2)])   # interleaved, round by round
            md = open(out).read()
            self.assertIn("| d12 | fp8 | 1 | 2 of 2 | 755.0 |", md)
            self.assertIn(f"| {(900 / 750 + 920 / 760) / 2:.3f} ({900 / 750:.3f}–{920 / 760:.3f}) |", md)
            self.assertNotIn("Partial", md)
            self.assertEqual(bench.round_suffix(2, args), "_r2")
            self.assertEqual(bench.round_suffix(1, bench.build_arg_parser().parse_args([])), "")
        finally:
            bench.REPO_ROOT, bench.run_ours = saved
            shutil.rmtree(tmp)

    def test_repeat_below_one_is_refused(self):
        self.assertEqual(bench.main(["--repeat", "0", "--dry-run", "--no-peer", "--recipes", "bf16"]), 2)


class TestRecipes(unittest.TestCase):
    def test_make_database(self):
        db = textwrap.dedent("""\
            # makefile (from 'Makefile', line 10)
            RECIPES := bf16 fp8
            # Not a target:
            train_gpt_nvfp4: train_gpt.cu
            train_gpt_tcfp12: train_gpt.cu llmc/common.h
            #  recipe to execute (from 'Makefile', line 57):
            train_gpt_fp32: train_gpt.cu
            train_gpt_%: train_gpt.cu
            """)
        found = bench.parse_make_database(db)
        self.assertEqual(found, {"bf16", "fp8", "tcfp12", "fp32"})
        self.assertEqual(bench.filter_known(found), ["bf16", "fp8", "tcfp12"])   # fp32 is not a recipe

    def test_makefile_text(self):
        text = "RECIPES := bf16\nRECIPES += q115 # later\ntrain_gpt_vcast: x\n\ttrain_gpt_nvfp4: not a rule\n"
        self.assertEqual(bench.filter_known(bench.parse_makefile_text(text)), ["bf16", "q115", "vcast"])

    def test_this_repository(self):
        with open(os.path.join(bench.REPO_ROOT, "Makefile")) as f:
            self.assertIn("bf16", bench.parse_makefile_text(f.read()))
        if shutil.which("make"):
            self.assertIn("bf16", bench.discover_recipes(bench.REPO_ROOT))


class TestRuns(unittest.TestCase):
    def test_halving(self):
        calls = []

        def attempt(B):
            calls.append(B)
            return {"status": "oom" if B > 16 else "ok", "B": B}
        row = bench.with_halving(64, 1024, 524288, attempt)
        self.assertEqual((calls, row["B"], row["B_tried"], row["status"]), ([64, 32, 16], 16, [64, 32, 16], "ok"))
        row = bench.with_halving(2, 1024, 524288, lambda B: {"status": "oom", "B": B})
        self.assertEqual((row["B_tried"], row["status"]), ([2, 1], "oom"))          # stops at B = 1
        row = bench.with_halving(8, 1024, 524288, lambda B: {"status": "failed", "B": B})
        self.assertEqual(row["B_tried"], [8])                                       # only OOM retries

    def test_peer_parent_side(self):
        """run_peer with a stand-in for the peer process that writes the worker's JSON."""
        tmp = tempfile.mkdtemp()
        try:
            fake = os.path.join(tmp, "fake_peer.py")
            with open(fake, "w") as f:
                f.write(textwrap.dedent("""\
                    import json, sys
                    a = sys.argv
                    out, B = a[a.index("--json-out") + 1], int(a[a.index("--B") + 1])
                    if B > 32:
                        res = {"status": "oom", "error": "OutOfMemoryError: CUDA out of memory"}
                    else:
                        res = {"status": "ok", "params": 124475904, "L": 12, "C": 768, "device": "H100",
                               "step_ms": [60000.0] + [1400.0, 1410.0, 1390.0, 1405.0] + [1400.0] * 9 + [1420.0],
                               "losses": [11.0] * 15, "compiled": True, "compile_error": None,
                               "max_reserved_gib": 30.5, "max_allocated_gib": 28.25, "device_used_gib": 31.1}
                    json.dump(res, open(out, "w"))
                    sys.exit(3 if B > 32 else 0)
                    """))
            args = argparse.Namespace(peer_python=sys.executable, repeat=1, total_batch=524288, warmup=5, steps=10,
                                      peer_eager=False, peer_timeout=None, timeout=60)
            # point the worker command at the stand-in instead of bench.py
            real = bench.peer_command
            bench.peer_command = lambda *a, **k: [sys.executable, fake] + real(*a, **k)[2:]
            try:
                row = bench.with_halving(64, 1024, 524288,
                                         lambda B: bench.run_peer("d12", B, 1024, args, tmp, 989.4e12))
            finally:
                bench.peer_command = real
            self.assertEqual((row["status"], row["B"], row["B_tried"]), ("ok", 32, [64, 32]))
            self.assertEqual(row["ms"], 1400.0)                  # median of steps 6..15
            self.assertEqual(row["peak_gib"], 30.5)
            self.assertEqual(row["recipe"], bench.PEER_LABEL)
            self.assertIn("allocated peak 28.25 GiB", row["notes"][0])
            self.assertAlmostEqual(row["mfu"], 100 * 803478528.0 * 524288 / 1.4 / 989.4e12)
        finally:
            shutil.rmtree(tmp)


class TestPartialReport(unittest.TestCase):
    def test_a_bench_cut_short_keeps_its_finished_runs(self):
        """run_all writes the report after every run: when the second run never returns (here it raises,
        as a kill would end it), the first run's row is on disk, marked partial, with no temporary left."""
        tmp = tempfile.mkdtemp()
        saved = bench.REPO_ROOT, bench.run_ours
        try:
            args, meta, out = fake_bench(tmp)

            def fake_run_ours(entry, size, B, T, *rest):
                if entry[1] == "fp8":
                    raise KeyboardInterrupt
                row = dict(bench.new_row(size, entry[0], "ours", B, T), status="ok", step_ms=[900.0] * 15,
                           params=124475904, L=12, C=768, peak_gib=25.0)
                return bench.fill_speed(row, 524288, 5, 989.4e12)
            bench.REPO_ROOT, bench.run_ours = tmp, fake_run_ours
            with self.assertRaises(KeyboardInterrupt):
                bench.run_all(args, bench.resolve_plan(args), bench.parse_recipes("bf16,fp8"), meta, 989.4e12, tmp, tmp)
            md = open(out).read()
            self.assertIn("**Partial: 1 of 2 runs done", md)
            self.assertIn("| d12 | bf16 | 1 | 64 | 1024 | 900.0 |", md)
            self.assertNotIn("| d12 | fp8 |", md)
            saved_json = json.load(open(os.path.join(tmp, "report.json")))
            self.assertEqual([r["recipe"] for r in saved_json["rows"]], ["bf16"])
            self.assertEqual(saved_json["meta"]["partial"], [1, 2])
            self.assertFalse([f for f in os.listdir(tmp) if f.endswith(".tmp")])
        finally:
            bench.REPO_ROOT, bench.run_ours = saved
            shutil.rmtree(tmp)


class TestTable(unittest.TestCase):
    def test_render(self):
        ok = dict(bench.new_row("d12", "bf16", "ours", 64, 1024), status="ok", step_ms=[850.0] * 15,
                  params=124475904, L=12, C=768, peak_gib=23.45)
        bench.fill_speed(ok, 524288, 5, 989.4e12)
        peer = dict(bench.new_row("d12", bench.PEER_LABEL, "peer", 32, 1024), status="ok", step_ms=[1700.0] * 15,
                    params=124475904, L=12, C=768, peak_gib=30.5, B_tried=[64, 32],
                    notes=["allocated peak 28.25 GiB"])
        bench.fill_speed(peer, 524288, 5, 989.4e12)
        bad = dict(bench.new_row("d12", "fp8", "ours", 64, 1024), status="failed", error="exit 1: error: a | b")
        rows = bench.compute_ratios([ok, bad, peer])
        meta = {"gpu": "NVIDIA H100 80GB HBM3, 81559 MiB, 550.54", "date": "2025-01-01 00:00 UTC", "commit": "abc",
                "total_batch": 524288, "warmup": 5, "steps": 10, "peak_flops": 989.4e12}
        md = bench.render_table(rows, meta)
        lines = md.splitlines()
        self.assertIn("| d12 | bf16 | 1 | 64 | 1024 | 850.0 | 616,809 | 50.1 | 23.45 | 2.00 | 1.00 | 1.00 |  |", lines)
        self.assertIn("| d12 | torch.compile | 1 | 32 | 1024 | 1700.0 | 308,405 | 25.0 | 30.50 | 1.00 | 0.50 | — | "
                      "allocated peak 28.25 GiB; B tried 64→32 |", lines)
        self.assertIn("| d12 | fp8 | 1 | 64 | 1024 | — | — | — | — | — | — | — | **FAILED**: exit 1: error: a \\| b |", lines)
        self.assertIn("8.035e+08 FLOPs per token", md)
        self.assertIn("including the CUDA context", md)
        self.assertIn("excluding the CUDA context", md)
        self.assertNotIn("Below protocol", md)
        self.assertIn("Below protocol", bench.render_table(rows, dict(meta, steps=3)))
        json.dumps({"meta": meta, "rows": rows})                 # the raw JSON must serialise


if __name__ == "__main__":
    unittest.main(verbosity=2)
