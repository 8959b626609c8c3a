#!/usr/bin/env python3
"""Unit tests of dev/bench/bench.py that need no GPU and no torch:

    python3 dev/bench/test_bench.py

Argument parsing (the peer selection too), the synthetic shard (checked the way llmc/dataloader.h
checks a shard), the parser of the trainer's output on text printed with the trainer's own format
strings, the median / tok/s / MFU / ratio arithmetic (against the fastest BF16 peer and the fastest
FP8 peer), recipe discovery, the OOM retry loop, the parent side of the peer protocol (with a
stand-in for the peer process), torchao's wheel, and the table. Where torch is importable, the peer
worker also runs on the CPU at a tiny size.
"""
import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import zipfile

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


BF16_PEER = bench.peer_label("torch-bf16")


def peer_row(kind, tok_s, size="d12", rnd=1, status="ok", B=64):
    """An ok (or failed) row of the peer `kind`, as run_peer makes it."""
    r = dict(bench.new_row(size, bench.peer_label(kind), "peer", B, 1024, rnd=rnd), status=status, tok_s=tok_s,
             peer_kind=kind)
    r["ms"] = 524288 / tok_s * 1000 if tok_s else None
    return r


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


class TestPeerSelection(unittest.TestCase):
    def test_default_and_no_peer(self):
        self.assertEqual(bench.parse_peers(None), ["torch-bf16", "torchao-fp8-tensorwise", "torchao-fp8-rowwise"])
        self.assertNotIn("torch-bf16-sliced", bench.parse_peers(None))        # asked for only
        self.assertEqual(bench.parse_peers(None, no_peer=True), [])
        self.assertEqual(bench.parse_peers("all,torch-bf16", no_peer=True), [])   # --no-peer skips them all
        a = args_for(["--no-peer"])
        self.assertEqual(bench.parse_peers(a.peers, a.no_peer), [])
        self.assertEqual(args_for([]).torchao_wheel, "auto")

    def test_lists(self):
        self.assertEqual(bench.parse_peers("torch-bf16-sliced, torch-bf16"), ["torch-bf16", "torch-bf16-sliced"])
        self.assertEqual(bench.parse_peers("default,torch-bf16-sliced"), list(bench.PEERS))
        self.assertEqual(bench.parse_peers("all"), list(bench.PEERS))
        self.assertEqual(bench.parse_peers("torchao-fp8-rowwise"), ["torchao-fp8-rowwise"])
        for bad in ("", " , ", "torch", "fp8", "torch-bf16,nanogpt"):
            with self.assertRaises(ValueError, msg=bad):
                bench.parse_peers(bad)
        self.assertEqual(bench.main(["--peers", "nanogpt", "--dry-run", "--recipes", "bf16"]), 2)

    def test_labels_and_families(self):
        self.assertEqual([bench.peer_label(k) for k in bench.PEERS],
                         ["torch.compile bf16", "torch.compile bf16 sliced", "torchao fp8 tensorwise",
                          "torchao fp8 rowwise"])
        self.assertEqual([bench.peer_family(k) for k in bench.PEERS], ["bf16", "bf16", "fp8", "fp8"])
        # the nanoGPT peers compute the loss over the padded vocabulary; only the sliced one does not
        self.assertEqual([spec["padded_loss"] for _, _, spec in bench.PEERS.values()], [True, False, True, True])
        self.assertEqual([spec["fp8_recipe"] for _, _, spec in bench.PEERS.values()],
                         [None, None, "tensorwise", "rowwise"])

    def test_peer_command(self):
        cmd = bench.peer_command("py", "torchao-fp8-rowwise", "d12", 64, 1024, 524288, 5, 10, "/tmp/o.json", False)
        self.assertEqual(cmd[0], "py")
        self.assertEqual(cmd[2:5], ["--peer-worker", "--peer-kind", "torchao-fp8-rowwise"])
        self.assertNotIn("--eager", cmd)
        self.assertEqual(bench.peer_command("py", "torch-bf16", "d12", 64, 1024, 524288, 5, 10, "o", True)[-1], "--eager")


class TestTorchaoWheel(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def make_wheel(self, name, data_dir=False):
        path = os.path.join(self.dir, name)
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("torchao/__init__.py", "__version__ = 'test'\n")
            z.writestr("test/__init__.py", "")          # torchao's wheel ships its tests as a top-level package
            z.writestr("torchao-0.18.0.dist-info/METADATA", "Name: torchao\nVersion: 0.18.0\n")
            if data_dir:
                z.writestr("torchao-0.18.0.data/scripts/x", "")
        return path

    def test_find(self):
        wheels = os.path.join(self.dir, ".deps", "wheels")
        self.assertIsNone(bench.find_torchao_wheel("auto", self.dir))             # none there: the peer python's own
        os.makedirs(wheels)
        for v in ("0.9.0", "0.18.0", "0.17.0"):
            open(os.path.join(wheels, f"torchao-{v}-py3-none-any.whl"), "w").close()
        self.assertEqual(os.path.basename(bench.find_torchao_wheel("auto", self.dir)), "torchao-0.18.0-py3-none-any.whl")
        self.assertIsNone(bench.find_torchao_wheel("none", self.dir))
        self.assertEqual(bench.find_torchao_wheel("x.whl", self.dir), os.path.abspath("x.whl"))
        self.assertEqual(bench.wheel_version("torchao-0.18.0-py3-none-any.whl"), (0, 18, 0))

    def test_install_unpacks_where_pip_fails(self):
        wheel = self.make_wheel("torchao-0.18.0-py3-none-any.whl")
        target = os.path.join(self.dir, "site")
        log = os.path.join(self.dir, "install.log")
        # a "python" that fails every command stands in for one without pip
        self.assertIsNone(bench.install_wheel(shutil.which("false"), wheel, target, log))
        self.assertTrue(os.path.isfile(os.path.join(target, "torchao", "__init__.py")))
        self.assertTrue(os.path.isdir(os.path.join(target, "torchao-0.18.0.dist-info")))
        self.assertIn("unpacked", open(log).read())
        bad = self.make_wheel("torchao-0.1.0-py3-none-any.whl", data_dir=True)
        self.assertIn(".data directory", bench.install_wheel(shutil.which("false"), bad, target, log))
        self.assertIn("not found", bench.install_wheel(shutil.which("false"), os.path.join(self.dir, "no.whl"), target, log))

    def test_prepare_and_env(self):
        args = argparse.Namespace(torchao_wheel=self.make_wheel("torchao-0.18.0-py3-none-any.whl"),
                                  peer_python=shutil.which("false"))
        self.assertEqual(bench.prepare_torchao(args, ["torch-bf16"], self.dir, self.dir),   # no FP8 peer: nothing
                         {"wheel": None, "path": None, "error": None})
        info = bench.prepare_torchao(args, bench.DEFAULT_PEERS, self.dir, self.dir)
        self.assertIsNone(info["error"])
        self.assertEqual(info["path"], os.path.join(self.dir, "torchao_site"))
        # only torchao and its metadata stay: a top-level `test` there would hide the standard library's
        self.assertEqual(sorted(os.listdir(info["path"])), ["torchao", "torchao-0.18.0.dist-info"])
        saved = os.environ.get("PYTHONPATH")
        try:
            os.environ["PYTHONPATH"] = "/elsewhere"
            self.assertEqual(bench.peer_env(info)["PYTHONPATH"], info["path"] + os.pathsep + "/elsewhere")
            del os.environ["PYTHONPATH"]
            self.assertEqual(bench.peer_env(info)["PYTHONPATH"], info["path"])
        finally:
            if saved is not None:
                os.environ["PYTHONPATH"] = saved
        self.assertIsNone(bench.peer_env({"wheel": None, "path": None, "error": None}))
        args.torchao_wheel = os.path.join(self.dir, "missing.whl")
        self.assertIn("not found", bench.prepare_torchao(args, bench.DEFAULT_PEERS, self.dir, self.dir)["error"])


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
                dict(bench.new_row("d12", BF16_PEER, "peer", 32, 1024), status="ok", tok_s=2.0e6),
                dict(bench.new_row("d24", "bf16", "ours", 32, 1024), status="ok", tok_s=1.0e6)]
        bench.compute_ratios(rows)
        self.assertEqual([(r["vs_peer"], r["vs_bf16"]) for r in rows],
                         [(1.5, 1.0), (2.25, 1.5), (None, None), (1.0, 2.0 / 3.0), (None, 1.0)])

    def test_ratios_against_the_fastest_peers(self):
        """vs peer against the fastest BF16 peer (the sliced one too, when it runs), vs FP8 peer against the
        fastest torchao peer, for FP8-family rows only: our fp8, its variants and the torchao peers"""
        rows = [dict(bench.new_row("d12", "bf16", "ours", 64, 1024), status="ok", tok_s=3.0e6),
                dict(bench.new_row("d12", "fp8", "ours", 64, 1024), status="ok", tok_s=4.5e6),
                dict(bench.new_row("d12", "fp8 -x 1", "ours", 64, 1024), status="ok", tok_s=3.6e6),
                dict(bench.new_row("d12", "tcfp12", "ours", 64, 1024), status="ok", tok_s=4.0e6),
                peer_row("torch-bf16", 2.5e6), peer_row("torch-bf16-sliced", 2.0e6),
                peer_row("torchao-fp8-tensorwise", 3.0e6), peer_row("torchao-fp8-rowwise", 2.4e6)]
        bench.compute_ratios(rows)
        got = [(r["vs_peer"], r["vs_fp8_peer"]) for r in rows]
        self.assertEqual(got, [(1.2, None), (1.8, 1.5), (1.44, 1.2), (1.6, None),
                               (1.0, None), (0.8, None), (1.2, 1.0), (0.96, 0.8)])
        self.assertEqual(bench.row_family(rows[2]), "fp8")
        self.assertIsNone(bench.row_family(rows[3]))
        # a failed torchao peer does not count; the other one is the best
        rows[6]["status"] = "unavailable"
        bench.compute_ratios(rows)
        self.assertEqual(rows[1]["vs_fp8_peer"], 4.5 / 2.4)
        self.assertIsNone(rows[6]["vs_fp8_peer"])
        # no FP8 peer ran: no ratio, and vs peer is unchanged
        bench.compute_ratios(rows[:6])
        self.assertEqual((rows[1]["vs_peer"], rows[1]["vs_fp8_peer"]), (1.8, None))
        # no BF16 peer ran: no vs peer
        bench.compute_ratios(rows[:4] + rows[6:])
        self.assertEqual((rows[1]["vs_peer"], rows[1]["vs_fp8_peer"]), (None, 4.5 / 2.4))

    def test_ratios_several_gpus(self):
        rows = [dict(bench.new_row("d12", "bf16", "ours", 64, 1024), status="ok", tok_s=3.0e6),
                dict(bench.new_row("d12", "bf16", "ours", 64, 1024, gpus=2), status="ok", tok_s=5.7e6),
                dict(bench.new_row("d12", "fp8", "ours", 64, 1024, gpus=2), status="ok", tok_s=7.6e6),
                dict(bench.new_row("d12", BF16_PEER, "peer", 64, 1024), status="ok", tok_s=2.0e6)]
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
        return [self.row("bf16", 1, 3.0e6), self.row("fp8", 1, 3.6e6), self.row(BF16_PEER, 1, 2.0e6, "peer"),
                self.row("bf16", 2, 2.0e6), self.row("fp8", 2, 2.5e6), self.row(BF16_PEER, 2, 1.0e6, "peer"),
                self.row("bf16", 3, 4.0e6), self.row("fp8", 3, None, status="failed"),
                self.row(BF16_PEER, 3, 2.0e6, "peer")]

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
                         [("bf16", 3, 3), ("fp8", 3, 2), (BF16_PEER, 3, 3)])
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

    def test_fp8_peer_over_the_rounds(self):
        rows = [self.row("fp8", 1, 3.6e6), peer_row("torchao-fp8-tensorwise", 3.0e6, rnd=1),
                peer_row("torchao-fp8-rowwise", 2.0e6, rnd=1),
                self.row("fp8", 2, 2.5e6), peer_row("torchao-fp8-tensorwise", 2.0e6, rnd=2),
                peer_row("torchao-fp8-rowwise", 2.5e6, rnd=2)]
        summary = {g["recipe"]: g for g in bench.summarize_rounds(bench.compute_ratios(rows))}
        self.assertEqual(summary["fp8"]["vs_fp8_peer"], (1.1, 1.0, 1.2))        # 3.6/3.0, 2.5/2.5 (the faster each round)
        self.assertEqual(summary["torchao fp8 rowwise"]["vs_fp8_peer"][1:], (2.0 / 3.0, 1.0))
        self.assertIsNone(summary["fp8"]["vs_peer"])                            # no BF16 peer ran
        md = bench.render_table(rows, {"gpu": "g", "date": "d", "commit": "c", "total_batch": 524288, "warmup": 5,
                                       "steps": 10, "peak_flops": None, "repeat": 2})
        self.assertIn("| vs peer | vs FP8 peer | vs bf16 | vs 1 GPU |", md)
        self.assertIn("| d12 | fp8 | 1 | 2 of 2 | ", md)
        self.assertIn("| — | 1.100 (1.000–1.200) | — |", md)

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
                                         lambda B: bench.run_peer("torch-bf16", "d12", B, 1024, args, tmp, 989.4e12))
            finally:
                bench.peer_command = real
            self.assertEqual((row["status"], row["B"], row["B_tried"]), ("ok", 32, [64, 32]))
            self.assertEqual(row["ms"], 1400.0)                  # median of steps 6..15
            self.assertEqual(row["peak_gib"], 30.5)
            self.assertEqual(row["recipe"], BF16_PEER)
            self.assertIn("allocated peak 28.25 GiB", row["notes"][0])
            self.assertAlmostEqual(row["mfu"], 100 * 803478528.0 * 524288 / 1.4 / 989.4e12)
        finally:
            shutil.rmtree(tmp)


class TestFP8Peers(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp()

    def tearDown(self):
        shutil.rmtree(self.dir)

    def args(self):
        return argparse.Namespace(peer_python=sys.executable, repeat=1, total_batch=524288, warmup=5, steps=10,
                                  peer_eager=False, peer_timeout=None, timeout=60)

    def test_a_wheel_that_did_not_install_is_a_row(self):
        row = bench.run_peer("torchao-fp8-rowwise", "d12", 64, 1024, self.args(), self.dir, 989.4e12,
                             torchao={"wheel": "w.whl", "path": None, "error": "torchao wheel w.whl not found"})
        self.assertEqual((row["status"], row["error"], row["recipe"]),
                         ("unavailable", "torchao wheel w.whl not found", "torchao fp8 rowwise"))
        # a BF16 peer does not need torchao and is not held back by it
        self.assertEqual(bench.with_halving(64, 1024, 524288, lambda B: row)["B_tried"], [64])   # no OOM retries

    def test_a_worker_without_torchao_is_a_row(self):
        """The worker's JSON says 'unavailable' (torchao would not import): the row keeps it, with the reason,
        and gets the FP8 peers' PYTHONPATH"""
        fake = os.path.join(self.dir, "fake_peer.py")
        with open(fake, "w") as f:
            f.write(textwrap.dedent("""\
                import json, os, sys
                a = sys.argv
                out = a[a.index("--json-out") + 1]
                json.dump({"status": "unavailable", "peer_kind": a[a.index("--peer-kind") + 1],
                           "error": "torchao cannot be imported (ModuleNotFoundError: No module named 'torchao')",
                           "pythonpath": os.environ.get("PYTHONPATH")}, open(out, "w"))
                print("PYTHONPATH=" + str(os.environ.get("PYTHONPATH")))
                sys.exit(1)
                """))
        real = bench.peer_command
        bench.peer_command = lambda *a, **k: [sys.executable, fake] + real(*a, **k)[2:]
        try:
            row = bench.run_peer("torchao-fp8-tensorwise", "d12", 64, 1024, self.args(), self.dir, 989.4e12,
                                 torchao={"wheel": "w.whl", "path": "/x/torchao_site", "error": None})
        finally:
            bench.peer_command = real
        self.assertEqual(row["status"], "unavailable")
        self.assertIn("No module named 'torchao'", row["error"])
        self.assertEqual(row["peer_kind"], "torchao-fp8-tensorwise")
        self.assertIn("PYTHONPATH=/x/torchao_site", open(row["log"]).read())
        self.assertIn("_peer_torchao-fp8-tensorwise_B64", row["log"])
        rows = bench.compute_ratios([dict(bench.new_row("d12", "fp8", "ours", 64, 1024), status="ok", tok_s=4.0e6),
                                     peer_row("torch-bf16", 2.0e6), row])
        md = bench.render_table(rows, {"gpu": "g", "date": "d", "commit": "c", "total_batch": 524288, "warmup": 5,
                                       "steps": 10, "peak_flops": 989.4e12})
        self.assertIn("| d12 | torchao fp8 tensorwise | 1 | 64 | 1024 | — | — | — | — | — | — | — | — | "
                      "**UNAVAILABLE**: torchao cannot be imported (ModuleNotFoundError: No module named 'torchao') |", md)
        self.assertIn("| d12 | fp8 | 1 | 64 | 1024 | — | 4,000,000 | — | — | 2.00 | — | — | 1.00 |  |", md)

    def test_run_all_runs_every_peer(self):
        """run_all runs each selected peer per size after our recipes, each kind with its own row"""
        saved = bench.REPO_ROOT, bench.run_ours, bench.run_peer
        try:
            args, meta, out = fake_bench(self.dir)
            args.no_peer, args.torchao_wheel = False, "none"
            calls = []

            def fake_run_ours(entry, size, B, T, args, shard, log_dir, peak, gpus=1, rnd=1):
                row = dict(bench.new_row(size, entry[0], "ours", B, T, gpus, rnd), status="ok",
                           step_ms=[{"bf16": 900.0, "fp8": 600.0}[entry[1]]] * 15, params=124475904, L=12, C=768)
                return bench.fill_speed(row, 524288, 5, 989.4e12)

            def fake_run_peer(kind, size, B, T, args, log_dir, peak, rnd=1, torchao=None):
                calls.append((kind, torchao))
                ms = {"torch-bf16": 1000.0, "torchao-fp8-tensorwise": 800.0, "torchao-fp8-rowwise": 900.0}[kind]
                row = dict(bench.new_row(size, bench.peer_label(kind), "peer", B, T, rnd=rnd), status="ok",
                           peer_kind=kind, step_ms=[ms] * 15, params=124475904, L=12, C=768)
                return bench.fill_speed(row, 524288, 5, 989.4e12)
            bench.REPO_ROOT, bench.run_ours, bench.run_peer = self.dir, fake_run_ours, fake_run_peer
            peers = bench.parse_peers(None)
            self.assertEqual(bench.run_all(args, bench.resolve_plan(args), bench.parse_recipes("bf16,fp8"), meta,
                                           989.4e12, self.dir, self.dir, peers), 0)
            self.assertEqual([k for k, _ in calls], peers)
            self.assertEqual(calls[0][1], {"wheel": None, "path": None, "error": None})
            md = open(out).read()
            self.assertIn("| d12 | fp8 | 1 | 64 | 1024 | 600.0 | 873,813 | 71.0 | — | 1.67 | 1.33 | 1.50 | 1.00 |  |", md)
            self.assertIn("| d12 | torchao fp8 rowwise | 1 | 64 | 1024 | 900.0 | 582,542 | 47.3 | — | 1.11 | 0.89 | 1.00 | — |  |", md)
            saved_json = json.load(open(os.path.join(self.dir, "report.json")))
            self.assertEqual([r.get("peer_kind") for r in saved_json["rows"]], [None, None] + peers)
            self.assertAlmostEqual(saved_json["rows"][1]["vs_fp8_peer"], 800.0 / 600.0)
            self.assertEqual(saved_json["meta"]["torchao"], {"wheel": None, "error": None})
        finally:
            bench.REPO_ROOT, bench.run_ours, bench.run_peer = saved


HAVE_TORCH = importlib.util.find_spec("torch") is not None


@unittest.skipUnless(HAVE_TORCH, "torch is not installed: the peer's model and worker are checked where it is")
class TestPeerOnCPU(unittest.TestCase):
    """The peers' own code on the CPU: the padded-vocabulary loss of the reference model, and the worker
    (eager) at d6 for one step of each kind."""

    def test_padded_vocab_loss(self):
        import torch
        import torch.nn.functional as F
        sys.path.insert(0, os.path.join(bench.REPO_ROOT, "dev", "reference"))
        from gpt_reference import GPT, GPTConfig
        cfg = GPTConfig(max_seq_len=8, vocab_size=10, padded_vocab_size=16, num_layers=1, num_heads=2, channels=8)
        torch.manual_seed(0)
        sliced, padded = GPT(cfg, use_sdpa=True), GPT(cfg, use_sdpa=True, loss_over_padded_vocab=True)
        padded.load_state_dict(sliced.state_dict())
        x, y = torch.randint(0, 10, (2, 8)), torch.randint(0, 10, (2, 8))
        logits, loss = padded(x, y)
        self.assertEqual(logits.shape[-1], 16)
        self.assertTrue(torch.allclose(loss, F.cross_entropy(logits.reshape(-1, 16), y.reshape(-1))))
        _, loss_sliced = sliced(x, y)
        self.assertTrue(torch.allclose(loss_sliced, F.cross_entropy(logits[..., :10].reshape(-1, 10), y.reshape(-1))))
        self.assertGreater(float(loss), float(loss_sliced))       # the padded columns take probability mass
        loss.backward()
        loss_sliced.backward()
        self.assertTrue(bool(padded.wte.weight.grad[10:].abs().sum() > 0))   # they are trained
        self.assertTrue(bool((sliced.wte.weight.grad[10:] == 0).all()))

    def run_worker(self, kind):
        tmp = tempfile.mkdtemp()
        try:
            out = os.path.join(tmp, "peer.json")
            cmd = bench.peer_command(sys.executable, kind, "d6", 1, 16, 16, 0, 1, out, True) + ["--device", "cpu"]
            subprocess.run(cmd, capture_output=True, timeout=600)
            with open(out) as f:
                return json.load(f)
        finally:
            shutil.rmtree(tmp)

    def test_worker_bf16_peers(self):
        for kind, columns in (("torch-bf16", 50304), ("torch-bf16-sliced", 50257)):
            res = self.run_worker(kind)
            self.assertEqual((res["status"], res["loss_columns"], res["fp8_linears"]), ("ok", columns, 0), res.get("error"))
            self.assertEqual(len(res["step_ms"]), 1)
            self.assertLess(abs(res["losses"][0] - 10.83), 0.3)   # about ln(50257) at the init
            self.assertIn('torch.set_float32_matmul_precision("high")', res["settings"])

    def test_worker_fp8_peer(self):
        """with torchao: its Float8Linear in every block's four nn.Linear (emulated on the CPU); without it:
        the row's reason"""
        res = self.run_worker("torchao-fp8-tensorwise")
        if importlib.util.find_spec("torchao") is None:
            self.assertEqual(res["status"], "unavailable")
            self.assertIn("torchao cannot be imported", res["error"])
        else:
            self.assertEqual((res["status"], res["fp8_linears"], res["loss_columns"]), ("ok", 24, 50304), res.get("error"))


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
        peer = dict(bench.new_row("d12", BF16_PEER, "peer", 32, 1024), status="ok", step_ms=[1700.0] * 15,
                    params=124475904, L=12, C=768, peak_gib=30.5, B_tried=[64, 32],
                    notes=["allocated peak 28.25 GiB"])
        bench.fill_speed(peer, 524288, 5, 989.4e12)
        bad = dict(bench.new_row("d12", "fp8", "ours", 64, 1024), status="failed", error="exit 1: error: a | b")
        rows = bench.compute_ratios([ok, bad, peer])
        meta = {"gpu": "NVIDIA H100 80GB HBM3, 81559 MiB, 550.54", "date": "2025-01-01 00:00 UTC", "commit": "abc",
                "total_batch": 524288, "warmup": 5, "steps": 10, "peak_flops": 989.4e12}
        md = bench.render_table(rows, meta)
        lines = md.splitlines()
        self.assertIn("| size | recipe | GPUs | B | T | ms/step | tok/s | MFU % | peak GiB | vs peer | vs FP8 peer | vs bf16 | "
                      "vs 1 GPU | notes |", lines)
        self.assertIn("| d12 | bf16 | 1 | 64 | 1024 | 850.0 | 616,809 | 50.1 | 23.45 | 2.00 | — | 1.00 | 1.00 |  |", lines)
        self.assertIn("| d12 | torch.compile bf16 | 1 | 32 | 1024 | 1700.0 | 308,405 | 25.0 | 30.50 | 1.00 | — | 0.50 | — | "
                      "allocated peak 28.25 GiB; B tried 64→32 |", lines)
        self.assertIn("| d12 | fp8 | 1 | 64 | 1024 | — | — | — | — | — | — | — | — | **FAILED**: exit 1: error: a \\| b |", lines)
        self.assertIn("8.035e+08 FLOPs per token", md)
        self.assertIn("including the CUDA context", md)
        self.assertIn("excluding the CUDA context", md)
        self.assertNotIn("Below protocol", md)
        self.assertIn("Below protocol", bench.render_table(rows, dict(meta, steps=3)))
        json.dumps({"meta": meta, "rows": rows})                 # the raw JSON must serialise


if __name__ == "__main__":
    unittest.main(verbosity=2)
