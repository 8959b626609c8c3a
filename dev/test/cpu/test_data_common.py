"""dev/data/data_common.py's GPT-2 encoding when neither the local BPE files nor the network are there (CPU).

Offline and without encoder.json / vocab.bpe in any folder data_common looks in, the data scripts must stop with
one line that says where to put the files (--data-dir, LLMC_SHARED_DATA), not a traceback from tiktoken's
download. The folders and the download are replaced here: no network is used, and the checks hold on a machine
that has the files or network access.
"""
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "dev", "data"))
import data_common as dc  # noqa: E402

# a child python that sees no local BPE files and whose tiktoken download fails, then runs SCRIPT's main()
CHILD = """
import sys
sys.path.insert(0, {data!r})
import data_common as dc
dc.candidate_dirs = lambda data_dir=None: [{empty!r}]
import tiktoken
def no_network(name):
    raise ConnectionError("Max retries exceeded with url: /gpt-2/encodings/main/vocab.bpe\\nsecond line")
tiktoken.get_encoding = no_network
import {module} as script
sys.argv = [{module!r}] + {args!r}
script.main()
"""


class OfflineWithoutBpe(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.empty = os.path.join(self.tmp.name, "empty")
        os.makedirs(self.empty)

    def tearDown(self):
        self.tmp.cleanup()

    def run_script(self, module, args):
        code = CHILD.format(data=os.path.join(REPO, "dev", "data"), empty=self.empty, module=module, args=args)
        return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)

    def check_one_line(self, r):
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertNotIn("Traceback", r.stderr)
        lines = [l for l in r.stderr.splitlines() if l.strip()]
        self.assertEqual(len(lines), 1, r.stderr)
        self.assertTrue(lines[0].startswith("error: GPT-2's encoder.json and vocab.bpe"), lines[0])
        for needle in ("--data-dir", "LLMC_SHARED_DATA", self.empty, "Max retries exceeded"):
            self.assertIn(needle, lines[0])
        self.assertNotIn("second line", lines[0])

    def test_tinyshakespeare(self):
        out = os.path.join(self.tmp.name, "out")
        r = self.run_script("tinyshakespeare", ["--out-dir", out, "--tokenizer-out", os.path.join(out, "tok.bin")])
        self.check_one_line(r)
        self.assertFalse(os.path.exists(os.path.join(out, "tiny_shakespeare_train.bin")))

    def test_fineweb_local_dir(self):
        src = os.path.join(self.tmp.name, "docs")
        os.makedirs(src)
        with open(os.path.join(src, "a.jsonl"), "w") as f:
            f.write('{"text": "hello world"}\n')
        out = os.path.join(self.tmp.name, "shards")
        r = self.run_script("fineweb", ["--local-dir", src, "--out-dir", out])
        self.check_one_line(r)

    def test_in_process(self):
        import tiktoken
        saved_dirs, saved_get = dc.candidate_dirs, tiktoken.get_encoding

        def unreachable(name):
            raise OSError("unreachable")
        try:
            dc.candidate_dirs = lambda data_dir=None: [self.empty]
            tiktoken.get_encoding = unreachable
            with self.assertRaises(SystemExit) as cm:
                dc.get_gpt2_encoding(quiet=True)
            self.assertIn("--data-dir DIR or set LLMC_SHARED_DATA=DIR", str(cm.exception.code))
            self.assertIn("unreachable", str(cm.exception.code))
        finally:
            dc.candidate_dirs, tiktoken.get_encoding = saved_dirs, saved_get


if __name__ == "__main__":
    unittest.main()
