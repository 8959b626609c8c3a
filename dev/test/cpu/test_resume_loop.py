"""scripts/resume_loop.sh against a fake trainer (CPU, bash, no GPU).

The fake trainer records its arguments, one line per run, and fails (exit 3) on its first FAILS runs, then
exits 0. The loop must rerun it with -y 1 appended after a failure, exit 0 once it succeeds, give up with
the trainer's status after MAX_RESTARTS restarts, and stop on SIGTERM without restarting. The run scripts
must all go through the loop; scripts/quickstart.sh refuses an unknown RECIPE.
"""
import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
LOOP = os.path.join(REPO, "scripts", "resume_loop.sh")

FAKE_TRAINER = """#!/usr/bin/env bash
# records "$@" as one line; fails with status 3 on the first $FAILS runs
echo "$*" >> "$CALLS"
n=$(wc -l < "$CALLS")
sleep "${FAKE_SLEEP:-0}"
[[ $n -le $FAILS ]] && exit 3
exit 0
"""


class ResumeLoop(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="test_resume_loop_")
        self.trainer = os.path.join(self.tmp, "fake_trainer.sh")
        with open(self.trainer, "w") as f:
            f.write(FAKE_TRAINER)
        os.chmod(self.trainer, 0o755)
        self.calls = os.path.join(self.tmp, "calls.txt")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def env(self, fails, **extra):
        env = dict(os.environ, CALLS=self.calls, FAILS=str(fails), RESTART_DELAY="0", STARTUP_SECONDS="0")
        env.pop("MAX_RESTARTS", None)
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def loop(self, fails, *args, **extra):
        return subprocess.run(["bash", LOOP, self.trainer, *args], capture_output=True, text=True,
                              env=self.env(fails, **extra), timeout=60)

    def recorded(self):
        if not os.path.exists(self.calls):
            return []
        with open(self.calls) as f:
            return f.read().splitlines()

    def test_restarts_until_success_with_resume_flag(self):
        r = self.loop(2, "-o", "log dir", "-n", "100", "-y", "0")
        self.assertEqual(r.returncode, 0, r.stderr)
        calls = self.recorded()
        self.assertEqual(len(calls), 3)   # two failures, then the successful run
        for c in calls:
            # the flags as given, then -y 1 last (it wins over the -y 0 before it)
            self.assertEqual(c, "-o log dir -n 100 -y 0 -y 1")
        self.assertEqual(r.stderr.count("restart "), 2)
        self.assertIn("restart 2 of 20", r.stderr)   # MAX_RESTARTS defaults to 20

    def test_success_first_time_runs_once(self):
        r = self.loop(0, "-x", "5")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(self.recorded(), ["-x 5 -y 1"])

    def test_gives_up_after_max_restarts(self):
        r = self.loop(5, "-x", "5", MAX_RESTARTS=2)
        self.assertEqual(r.returncode, 3, r.stderr)   # the trainer's own status
        self.assertEqual(len(self.recorded()), 3)    # the first run and 2 restarts
        self.assertIn("giving up", r.stderr)

    def test_max_restarts_zero_runs_once(self):
        r = self.loop(1, MAX_RESTARTS=0)
        self.assertEqual(r.returncode, 3)
        self.assertEqual(self.recorded(), ["-y 1"])

    def test_a_first_start_that_fails_at_once_is_not_restarted(self):
        r = self.loop(3, STARTUP_SECONDS=30)
        self.assertEqual(r.returncode, 3)
        self.assertEqual(len(self.recorded()), 1)
        self.assertIn("not a crash; not restarting", r.stderr)
        # a first run that lasted longer than STARTUP_SECONDS is a crash: restarted
        os.remove(self.calls)
        r = self.loop(1, STARTUP_SECONDS=1, FAKE_SLEEP=2)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(len(self.recorded()), 2)

    def test_waits_restart_delay_between_runs(self):
        start = time.monotonic()
        r = self.loop(1, RESTART_DELAY=1)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertGreaterEqual(time.monotonic() - start, 1.0)
        self.assertEqual(len(self.recorded()), 2)

    def test_bad_settings_and_usage(self):
        r = self.loop(0, MAX_RESTARTS="many")
        self.assertEqual(r.returncode, 2)
        self.assertIn("error: MAX_RESTARTS", r.stderr)
        self.assertEqual(self.loop(0, STARTUP_SECONDS="-1").returncode, 2)
        self.assertEqual(self.recorded(), [])
        r = subprocess.run(["bash", LOOP], capture_output=True, text=True)
        self.assertEqual(r.returncode, 2)
        self.assertIn("usage", r.stderr)

    def test_sigterm_stops_without_restart(self):
        p = subprocess.Popen(["bash", LOOP, self.trainer], env=self.env(5, FAKE_SLEEP=1),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(0.4)
        p.send_signal(signal.SIGTERM)   # to the loop only; it stops once the running trainer returns
        _, err = p.communicate(timeout=30)
        self.assertEqual(p.returncode, 143, err)
        self.assertEqual(len(self.recorded()), 1)
        self.assertIn("not restarting", err)

    def test_run_scripts_go_through_the_loop(self):
        scripts = sorted(glob.glob(os.path.join(REPO, "scripts", "run_*.sh")))
        names = [os.path.basename(s) for s in scripts]
        for want in ("run_gpt2_124M.sh", "run_gpt2_350M.sh", "run_gpt2_774M.sh", "run_gpt2_1558M.sh",
                     "run_gpt3_125M.sh"):
            self.assertIn(want, names)
        for s in scripts:
            with open(s) as f:
                text = f.read()
            self.assertIn("exec bash scripts/resume_loop.sh ", text, s)
            self.assertNotIn(" -y 1", text.split("exec bash scripts/resume_loop.sh", 1)[1], s)  # the loop adds it
            for flag in (" -o ", " -n ", " -nk "):
                self.assertIn(flag, text, f"{s}: {flag.strip()}")
            # scripts/setup_run.sh's launcher and HellaSwag (-h 1), passed before the caller's flags (which may
            # say -h 0)
            self.assertIn('source "$(dirname "$0")/setup_run.sh"', text, s)
            self.assertIn('exec bash scripts/resume_loop.sh "${launch[@]}" ', text, s)
            self.assertIn(' "${hellaswag[@]}" "$@"', text, s)
            r = subprocess.run(["bash", "-n", s], capture_output=True, text=True)
            self.assertEqual(r.returncode, 0, f"{s}: {r.stderr}")

    def test_quickstart_refuses_an_unknown_recipe(self):
        # before installing, tokenizing or building anything: one line that lists the recipes
        r = subprocess.run(["bash", os.path.join(REPO, "scripts", "quickstart.sh")], capture_output=True, text=True,
                           env={**os.environ, "RECIPE": "bogus"}, timeout=60)
        self.assertEqual(r.returncode, 1, r.stderr)
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("error: RECIPE=bogus is not a recipe; the recipes: "), lines[0])
        for recipe in ("bf16", "fp8", "nvfp4"):
            self.assertIn(f" {recipe}", lines[0])
        self.assertEqual(r.stdout, "")

    def test_setup_run(self):
        # sourced from a script in a stand-in checkout: it moves to the checkout's root, and sets launch from NPROC
        # and hellaswag from the eval file's presence
        root = os.path.join(self.tmp, "checkout")
        os.makedirs(os.path.join(root, "scripts"))
        shutil.copy(os.path.join(REPO, "scripts", "setup_run.sh"), os.path.join(root, "scripts", "setup_run.sh"))
        with open(os.path.join(root, "scripts", "show.sh"), "w") as f:
            f.write('source "$(dirname "$0")/setup_run.sh"\n'
                    'echo "$PWD|${launch[*]}|${hellaswag[*]}"\n')

        def show(**env):
            r = subprocess.run(["bash", os.path.join(root, "scripts", "show.sh")], capture_output=True, text=True,
                               cwd=self.tmp, env={**{k: v for k, v in os.environ.items() if k != "NPROC"}, **env})
            self.assertEqual(r.returncode, 0, r.stderr)
            return r.stdout.strip().split("|")
        here, launch, hs = show()
        self.assertEqual(os.path.realpath(here), os.path.realpath(root))
        self.assertEqual((launch, hs), ("", ""))
        os.makedirs(os.path.join(root, "dev", "data", "hellaswag"))
        open(os.path.join(root, "dev", "data", "hellaswag", "hellaswag_val.bin"), "wb").close()
        _, launch, hs = show(NPROC="4")
        self.assertEqual((launch, hs), ("bash scripts/launch.sh 4", "-h 1"))


if __name__ == "__main__":
    unittest.main()
