"""dev/data/fineweb.py's FineWeb-Edu naming and a --local-dir run (CPU, no network).

The names are llm.c's: --edu sample-10BT -> dev/data/edu_fineweb10B/edu_fineweb_{val,train}_NNNNNN.bin, read
from HuggingFaceFW/fineweb-edu. A --edu --local-dir run over a small .jsonl written here must produce
exactly those shard files, holding <|endoftext|> + the GPT-2 tokens of each document in order. The run
needs GPT-2's encoder.json / vocab.bpe where dev/data/data_common.py looks (--data-dir,
$LLMC_SHARED_DATA, a shared/data folder beside the checkout); without them it is skipped, saying so.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(REPO, "dev", "data"))
import data_common as dc  # noqa: E402
import fineweb  # noqa: E402

SCRIPT = os.path.join(REPO, "dev", "data", "fineweb.py")
DATA = os.path.join(REPO, "dev", "data")


def read_shard(path):
    hdr = np.fromfile(path, dtype="<i4", count=256)
    assert hdr[0] == dc.SHARD_MAGIC and hdr[1] == dc.SHARD_VERSION, path
    toks = np.fromfile(path, dtype="<u2", offset=1024)
    assert len(toks) == hdr[2], path
    return toks


class FinewebNames(unittest.TestCase):
    def test_layouts(self):
        cases = {
            (False, "sample-10BT"): ("HuggingFaceFW/fineweb", "fineweb10B", "fineweb"),
            (False, "sample-100BT"): ("HuggingFaceFW/fineweb", "fineweb100B", "fineweb"),
            (True, "sample-10BT"): ("HuggingFaceFW/fineweb-edu", "edu_fineweb10B", "edu_fineweb"),
            (True, "sample-100BT"): ("HuggingFaceFW/fineweb-edu", "edu_fineweb100B", "edu_fineweb"),
            (True, "CC-MAIN-2024-10"): ("HuggingFaceFW/fineweb-edu", "edu_fineweb_CC-MAIN-2024-10", "edu_fineweb"),
        }
        for (edu, name), (dataset, out, prefix) in cases.items():
            self.assertEqual(fineweb.dataset_layout(edu, name), (dataset, os.path.join(DATA, out), prefix))

    def test_shard_names(self):
        self.assertEqual(fineweb.shard_name("edu_fineweb", 0), "edu_fineweb_val_000000.bin")
        self.assertEqual(fineweb.shard_name("edu_fineweb", 1), "edu_fineweb_train_000001.bin")
        self.assertEqual(fineweb.shard_name("fineweb", 12), "fineweb_train_000012.bin")

    def test_the_run_scripts_read_these_names(self):
        # the 1558M script trains on FineWeb-Edu 100B, as llm.c's does
        with open(os.path.join(REPO, "scripts", "run_gpt2_1558M.sh")) as f:
            text = f.read()
        self.assertIn("dev/data/edu_fineweb100B/edu_fineweb_train_*.bin", text)
        self.assertIn("dev/data/edu_fineweb100B/edu_fineweb_val_*.bin", text)


class FinewebEduLocalRun(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="test_fineweb_edu_")

    def tearDown(self):
        shutil.rmtree(self.tmp, ignore_errors=True)

    def run_script(self, *args):
        return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True)

    def test_argument_errors(self):
        r = self.run_script("--edu", "--shard-size", "0")
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("error: --shard-size must be >= 1", r.stderr)
        r = self.run_script("--edu", "--local-dir", os.path.join(self.tmp, "missing"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("is not a directory", r.stderr)

    def test_edu_local_run_writes_edu_shards(self):
        if dc.find_local_file("encoder.json") is None or dc.find_local_file("vocab.bpe") is None:
            self.skipTest("GPT-2's encoder.json / vocab.bpe not found locally ($LLMC_SHARED_DATA or a shared/data folder beside the checkout)")
        src = os.path.join(self.tmp, "src")
        os.makedirs(src)
        docs = [f"Document {i}: photosynthesis turns light into chemical energy, step {i}." for i in range(12)]
        with open(os.path.join(src, "part.jsonl"), "w") as f:
            for d in docs:
                f.write(json.dumps({"text": d, "score": 3.5}) + "\n")
        out = os.path.join(self.tmp, "edu_out")
        r = self.run_script("--edu", "--local-dir", src, "--out-dir", out, "--shard-size", "64", "--workers", "1",
                            "--tokenizer-out", os.path.join(self.tmp, "tok.bin"))
        self.assertEqual(r.returncode, 0, r.stderr)
        enc = dc.get_gpt2_encoding(quiet=True)
        stream = np.concatenate([[dc.GPT2_EOT] + enc.encode_ordinary(d) for d in docs]).astype(np.uint16)
        nshards = -(-len(stream) // 64)
        self.assertGreaterEqual(nshards, 3)
        want = [fineweb.shard_name("edu_fineweb", i) for i in range(nshards)]
        self.assertEqual(sorted(os.listdir(out)), sorted(want))
        self.assertEqual(want[0], "edu_fineweb_val_000000.bin")
        got = np.concatenate([read_shard(os.path.join(out, n)) for n in want])
        np.testing.assert_array_equal(got, stream)
        self.assertTrue(os.path.isfile(os.path.join(self.tmp, "tok.bin")))


if __name__ == "__main__":
    unittest.main()
