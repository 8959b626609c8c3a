#!/usr/bin/env python3
"""Tests of dev/loss_seeds.py (the loss protocol over seeds) with stand-in trainers: no GPU needed.

A stand-in train_gpt_<recipe> is a small Python script that writes what the trainer writes into -o (a main.log
with the recipe and seed in its header, a final checkpoint) with losses set by its recipe and seed, records when
it ran, and fails with an "error:" line when its recipe is named "broken"."""
import contextlib
import io
import json
import os
import signal
import stat
import sys
import tempfile
import threading
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import loss_seeds  # noqa: E402

STAND_IN = r'''#!{python}
import os, sys, time
recipe = os.path.basename(sys.argv[0])[len("train_gpt_"):]
args = sys.argv[1:]
out, seed = args[args.index("-o") + 1], int(args[args.index("-sd") + 1])
t_start = time.time()
with open(os.path.join(os.path.dirname(sys.argv[0]), "calls.txt"), "a") as f:
    f.write(f"{{recipe}} {{seed}} start {{time.time()}} {{' '.join(args)}}\n")
with open(os.path.join(os.path.dirname(sys.argv[0]), "pids.txt"), "a") as f:
    f.write(f"{{os.getpid()}}\n")
if recipe == "broken":
    print("error: token id 50304 out of range in shard x.bin")
    sys.exit(1)
time.sleep(float(os.environ.get("STAND_IN_SECONDS", "0.2")))
scale = {{"bf16": (1.0, 1.0), "fp8": (1.01, 1.02)}}.get(recipe, (1.0, 1.0))
with open(os.path.join(out, "main.log"), "a") as f:   # the trainer appends to an existing main.log
    f.write(f"# recipe:{{recipe}} model:d12 B:8 T:1024 seed:{{seed}}\n")
    for s in range(1000):
        f.write(f"s:{{s}} trl:{{4.0 * scale[1]:.6f}}\n")
        if s % 50 == 0:
            f.write(f"s:{{s}} tel:{{(5.0 + 0.1 * seed) * scale[0]:.6f}}\n")
for name in ("model_00001000.bin", "state_00001000_00000.bin", "DONE_00001000"):
    open(os.path.join(out, name), "w").close()
with open(os.path.join(os.path.dirname(sys.argv[0]), "calls.txt"), "a") as f:
    f.write(f"{{recipe}} {{seed}} end {{time.time()}}\n")
with open(os.path.join(os.path.dirname(sys.argv[0]), "gpus.txt"), "a") as f:
    f.write(f"{{recipe}} {{seed}} {{os.environ.get('CUDA_VISIBLE_DEVICES', '-')}} {{t_start}} {{time.time()}}\n")
'''


def stand_ins(tmp, recipes=("bf16", "fp8")):
    for r in recipes:
        path = os.path.join(tmp, f"train_gpt_{r}")
        with open(path, "w") as f:
            f.write(STAND_IN.format(python=sys.executable))
        os.chmod(path, os.stat(path).st_mode | stat.S_IXUSR)


def calls(tmp):
    path = os.path.join(tmp, "calls.txt")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [l.split() for l in f]


def run_main(argv):
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        rc = loss_seeds.main(argv)
    return rc, out.getvalue()


class TestParsing(unittest.TestCase):
    def test_seeds(self):
        self.assertEqual(loss_seeds.parse_seeds("0-7"), list(range(8)))
        self.assertEqual(loss_seeds.parse_seeds("0,3,5"), [0, 3, 5])
        self.assertEqual(loss_seeds.parse_seeds("0-2, 9"), [0, 1, 2, 9])
        self.assertEqual(loss_seeds.parse_seeds("4,4,3-5"), [4, 3, 5])   # each seed once, first place kept
        for bad in ("", "a", "5-3", "1-", "-1", "1,,2", "0-100000"):
            with self.assertRaises(ValueError, msg=bad):
                loss_seeds.parse_seeds(bad)

    def test_plan_is_seed_major(self):
        recipes = [("bf16", "bf16", []), ("tcfp12 -tabd 1", "tcfp12", ["-tabd", "1"])]
        plan = loss_seeds.plan_runs(recipes, [3, 1])
        self.assertEqual([(p[0], p[3]) for p in plan], [("bf16", 3), ("tcfp12 -tabd 1", 3), ("bf16", 1), ("tcfp12 -tabd 1", 1)])
        self.assertEqual(loss_seeds.run_name("tcfp12 -tabd 1", 3), "tcfp12_-tabd_1_sd3")

    def test_dry_run_prints_the_protocol_commands(self):
        with tempfile.TemporaryDirectory() as tmp:
            rc, out = run_main(["--recipes", "bf16,tcfp12:-tabd 1 -tfw 1", "--seeds", "0-1", "--out", tmp,
                                "--bin-dir", "/bins", "--dry-run"])
            self.assertEqual(rc, 0)
            lines = out.strip().splitlines()
            self.assertEqual(len(lines), 4)
            self.assertEqual(lines[0], f"/bins/train_gpt_bf16 -o {tmp}/bf16_sd0 -sd 0")
            self.assertEqual(lines[1], f"/bins/train_gpt_tcfp12 -o {tmp}/tcfp12_-tabd_1_-tfw_1_sd0 -sd 0 -tabd 1 -tfw 1")
            self.assertEqual(calls(tmp), [])   # nothing ran

    def test_bad_arguments(self):
        with tempfile.TemporaryDirectory() as tmp:
            self.assertEqual(run_main(["--seeds", "x", "--out", tmp, "--dry-run"])[0], 2)
            self.assertEqual(run_main(["--recipes", "bf16,bf16", "--out", tmp, "--dry-run"])[0], 2)
            self.assertEqual(run_main(["--jobs", "0", "--out", tmp, "--dry-run"])[0], 2)
            self.assertEqual(run_main(["--timeout", "0", "--out", tmp, "--dry-run"])[0], 2)
            self.assertEqual(run_main(["--timeout", "nan", "--out", tmp, "--dry-run"])[0], 2)
            for bad in ("", "a", "0,", "0,0", "-1", "0;1"):
                self.assertEqual(run_main(["--gpus", bad, "--out", tmp, "--dry-run"])[0], 2, bad)
            rc, out = run_main(["--recipes", "bf16,nvfp4", "--out", os.path.join(tmp, "o"), "--bin-dir", tmp,
                                "--no-build", "--no-data"])
            self.assertEqual(rc, 2)   # no such binaries
            self.assertIn("train_gpt_bf16 is not an executable", out)


class TestStudy(unittest.TestCase):
    def test_runs_in_parallel_and_reports_the_ratios(self):
        with tempfile.TemporaryDirectory() as tmp:
            stand_ins(tmp)
            out_dir = os.path.join(tmp, "study")
            rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "0-2", "--jobs", "6", "--out", out_dir,
                                "--bin-dir", tmp, "--no-build", "--no-data"])
            self.assertEqual(rc, 0, out)
            c = calls(tmp)
            starts = sorted(float(x[3]) for x in c if x[2] == "start")
            ends = sorted(float(x[3]) for x in c if x[2] == "end")
            self.assertEqual(len(starts), 6)
            self.assertLess(starts[-1], ends[0], "with 6 jobs all six runs overlap")
            for x in c:
                if x[2] == "start":   # the protocol's command: -o and -sd, nothing else for these recipes
                    self.assertEqual(x[4:], ["-o", os.path.join(out_dir, f"{x[0]}_sd{x[1]}"), "-sd", x[1]])
            for name in ("bf16_sd0", "fp8_sd2"):
                d = os.path.join(out_dir, name)
                self.assertEqual(sorted(os.listdir(d)), ["main.log", "status.json", "stdout.txt"])  # checkpoint removed
                with open(os.path.join(d, "status.json")) as f:
                    st = json.load(f)
                self.assertEqual(st["rc"], 0)
                self.assertFalse(st["timed_out"])
            with open(os.path.join(out_dir, "report.md")) as f:
                report = f.read()
            self.assertTrue(report.startswith("# Loss protocol over seeds\n"))
            self.assertIn("commit", report.splitlines()[2])
            self.assertIn("6 of 6 runs done", report)
            # fp8's val losses are 1.01x and its train losses 1.02x bf16's at every seed: ratios without spread
            self.assertIn("| fp8 | 1.0100 / 1.0200 | 1.0100 / 1.0200 | 1.0100 / 1.0200 | 1.0100 (0.0000) / 1.0200 (0.0000) | "
                          "1.0100-1.0100 / 1.0200-1.0200 |", report)
            self.assertIn("| bf16 | 3 | 5.1000 | 4.0000 |", report)

            # the same command again: everything is done, nothing runs
            n = len(calls(tmp))
            rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "0-2", "--out", out_dir, "--bin-dir", tmp,
                                "--no-build", "--no-data"])
            self.assertEqual(rc, 0, out)
            self.assertEqual(len(calls(tmp)), n)
            self.assertEqual(out.count("done before, skipped"), 6)
            # one more seed: only its two runs
            rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "0-3", "--out", out_dir, "--bin-dir", tmp,
                                "--no-build", "--no-data"])
            self.assertEqual(rc, 0, out)
            self.assertEqual(sorted((x[0], x[1]) for x in calls(tmp)[n:] if x[2] == "start"), [("bf16", "3"), ("fp8", "3")])

    def test_runs_spread_over_gpus(self):
        with tempfile.TemporaryDirectory() as tmp:
            stand_ins(tmp)
            out_dir = os.path.join(tmp, "study")
            os.environ["STAND_IN_SECONDS"] = "0.4"
            try:
                rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "0-3", "--jobs", "2", "--gpus", "3,1",
                                    "--out", out_dir, "--bin-dir", tmp, "--no-build", "--no-data"])
            finally:
                del os.environ["STAND_IN_SECONDS"]
            self.assertEqual(rc, 0, out)
            self.assertIn("2 at a time on each of GPUs 3,1", out)
            with open(os.path.join(tmp, "gpus.txt")) as f:
                runs = [(l.split()[0], l.split()[1], l.split()[2], float(l.split()[3]), float(l.split()[4])) for l in f]
            self.assertEqual(len(runs), 8)
            self.assertEqual({r[2] for r in runs}, {"3", "1"})   # every run saw exactly one of the GPUs named
            for g in ("3", "1"):
                # never more than --jobs runs at a time on one GPU, and that many at once at some point
                spans = [(r[3], r[4]) for r in runs if r[2] == g]
                most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
                self.assertEqual(most, 2, g)
            for recipe, seed, g, _, _ in runs:
                with open(os.path.join(out_dir, f"{recipe}_sd{seed}", "status.json")) as f:
                    self.assertEqual(json.load(f)["gpu"], int(g))
            # without --gpus the runs keep the environment's devices and record none
            rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "4", "--out", out_dir, "--bin-dir", tmp,
                                "--no-build", "--no-data"])
            self.assertEqual(rc, 0, out)
            with open(os.path.join(out_dir, "fp8_sd4", "status.json")) as f:
                self.assertNotIn("gpu", json.load(f))

    def test_an_unfinished_run_starts_over(self):
        with tempfile.TemporaryDirectory() as tmp:
            stand_ins(tmp, ("bf16",))
            out_dir = os.path.join(tmp, "study")
            d = os.path.join(out_dir, "bf16_sd0")
            os.makedirs(d)
            with open(os.path.join(d, "main.log"), "w") as f:   # a run cut off: a log, a checkpoint, no status
                f.write("# recipe:bf16 seed:0\ns:0 trl:9.0\n")
            open(os.path.join(d, "model_00000500.bin"), "w").close()
            open(os.path.join(d, "DONE_00000500"), "w").close()
            rc, out = run_main(["--recipes", "bf16", "--seeds", "0", "--out", out_dir, "--bin-dir", tmp,
                                "--no-build", "--no-data"])
            self.assertEqual(rc, 0, out)
            with open(os.path.join(d, "main.log")) as f:
                log = f.read()
            self.assertEqual(log.count("# recipe:"), 1)   # not appended to the old log
            self.assertNotIn("trl:9.0", log)
            self.assertFalse(os.path.exists(os.path.join(d, "model_00000500.bin")))  # nor resumed from its checkpoint

    def test_a_failed_run(self):
        with tempfile.TemporaryDirectory() as tmp:
            stand_ins(tmp, ("bf16", "fp8", "broken"))
            out_dir = os.path.join(tmp, "study")
            argv = ["--recipes", "bf16,broken,fp8", "--seeds", "0-1", "--out", out_dir, "--bin-dir", tmp,
                    "--no-build", "--no-data", "--keep-checkpoints"]
            rc, out = run_main(argv)
            self.assertEqual(rc, 1)
            self.assertIn("broken_sd0: FAILED (error: token id 50304 out of range in shard x.bin)", out)
            with open(os.path.join(out_dir, "broken_sd1", "status.json")) as f:
                self.assertEqual(json.load(f)["rc"], 1)
            self.assertIn("model_00001000.bin", os.listdir(os.path.join(out_dir, "fp8_sd1")))  # --keep-checkpoints
            with open(os.path.join(out_dir, "report.md")) as f:
                report = f.read()
            self.assertIn("4 of 6 runs done", report)
            self.assertIn("| fp8 | 1.0100 / 1.0200 | 1.0100 / 1.0200 |", report)   # the report covers what is done
            n = len(calls(tmp))
            self.assertEqual(run_main(argv)[0], 1)   # again: the failed runs run again, the others not
            self.assertEqual(sorted((x[0], x[1]) for x in calls(tmp)[n:]), [("broken", "0"), ("broken", "1")])

    def test_baseline_logs_are_reused(self):
        with tempfile.TemporaryDirectory() as tmp:
            stand_ins(tmp, ("fp8",))   # no bf16 binary: a baseline taken whole from stored logs does not need one
            out_dir, stored = os.path.join(tmp, "study"), os.path.join(tmp, "stored")
            os.makedirs(stored)
            with open(os.path.join(stored, "bf16_0.log"), "w") as f:
                f.write("# recipe:bf16 seed:0\n" + "".join(f"s:{s} trl:4.0\n" for s in range(1000)) +
                        "".join(f"s:{s} tel:5.0\n" for s in range(0, 1000, 50)))
            rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "0", "--out", out_dir, "--bin-dir", tmp,
                                "--no-build", "--no-data", "--baseline-logs", os.path.join(stored, "bf16_{seed}.log")])
            self.assertEqual(rc, 0, out)
            self.assertEqual([(c[0], c[1]) for c in calls(tmp) if c[2] == "start"], [("fp8", "0")])
            rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "0-1", "--out", out_dir, "--bin-dir", tmp, "--dry-run",
                                "--baseline-logs", os.path.join(stored, "bf16_{seed}.log")])
            self.assertEqual(out.splitlines()[0], f"# bf16_sd0: from {os.path.join(stored, 'bf16_0.log')}")
            self.assertEqual(out.splitlines()[2], f"{tmp}/train_gpt_bf16 -o {out_dir}/bf16_sd1 -sd 1")  # no file: runs

    def test_baseline_logs_where_some_are_missing(self):
        with tempfile.TemporaryDirectory() as tmp:
            stand_ins(tmp)
            out_dir, stored = os.path.join(tmp, "study"), os.path.join(tmp, "stored")
            os.makedirs(stored)
            for seed in (0, 1):   # stored bf16 logs for seeds 0 and 1 (not 2), val 5.0 + 0.1 seed as the stand-in's
                with open(os.path.join(stored, f"bf16_{seed}.log"), "w") as f:
                    f.write(f"# recipe:bf16 seed:{seed}\n" + "".join(f"s:{s} trl:4.0\n" for s in range(1000)) +
                            "".join(f"s:{s} tel:{5.0 + 0.1 * seed}\n" for s in range(0, 1000, 50)))
            rc, out = run_main(["--recipes", "bf16,fp8", "--seeds", "0-2", "--out", out_dir, "--bin-dir", tmp,
                                "--no-build", "--no-data", "--baseline-logs", os.path.join(stored, "bf16_{seed}.log")])
            self.assertEqual(rc, 0, out)
            self.assertIn("no file for seeds 2", out)
            started = sorted((c[0], c[1]) for c in calls(tmp) if c[2] == "start")
            self.assertEqual(started, [("bf16", "2"), ("fp8", "0"), ("fp8", "1"), ("fp8", "2")])
            with open(os.path.join(out_dir, "bf16_sd1", "status.json")) as f:
                self.assertTrue(json.load(f)["reused_from"].endswith("bf16_1.log"))
            with open(os.path.join(out_dir, "report.md")) as f:
                self.assertIn("| fp8 | 1.0100 / 1.0200 | 1.0100 / 1.0200 | 1.0100 / 1.0200 |", f.read())
            self.assertEqual(run_main(["--out", out_dir, "--baseline-logs", "x.log", "--dry-run"])[0], 2)  # no {seed}

    def test_a_stop_ends_the_runs_in_flight(self):
        """SIGTERM (what `timeout` sends): the trainers running end, no new one starts, exit status 130; the next
        invocation runs them all again"""
        with tempfile.TemporaryDirectory() as tmp:
            stand_ins(tmp)
            out_dir = os.path.join(tmp, "study")
            argv = ["--recipes", "bf16,fp8", "--seeds", "0-3", "--jobs", "2", "--out", out_dir, "--bin-dir", tmp,
                    "--no-build", "--no-data"]
            os.environ["STAND_IN_SECONDS"] = "60"
            timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
            try:
                timer.start()
                rc, out = run_main(argv)
            finally:
                timer.cancel()
                del os.environ["STAND_IN_SECONDS"]
            self.assertEqual(rc, 130, out)
            self.assertIn("interrupted", out)
            with open(os.path.join(tmp, "pids.txt")) as f:
                pids = [int(l) for l in f]
            self.assertEqual(len(pids), 2)   # two jobs were running; none started after the stop
            for pid in pids:
                with self.assertRaises(ProcessLookupError):
                    os.kill(pid, 0)          # ended (and reaped), not left running on the GPU
            with open(os.path.join(out_dir, "bf16_sd0", "status.json")) as f:
                st = json.load(f)
            self.assertNotEqual(st["rc"], 0)
            self.assertIn("interrupted", st["error"])
            self.assertEqual(signal.getsignal(signal.SIGTERM), signal.SIG_DFL)   # the handler is put back
            rc, out = run_main(argv)        # next time: all eight run (the two stopped ones again)
            self.assertEqual(rc, 0, out)
            self.assertEqual(len([c for c in calls(tmp) if c[2] == "start"]), 10)


if __name__ == "__main__":
    unittest.main()
