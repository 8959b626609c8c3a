"""dev/data/hellaswag.py: the .jsonl reader, and the eval file it writes, parsed back here independently by the
format's definition (llmc/eval_file.h reads the same layout; its own tests are in test_eval_file.cpp)."""
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
sys.path.insert(0, os.path.join(REPO, "dev", "data"))
import data_common  # noqa: E402
import hellaswag  # noqa: E402


def parse_eval_file(path):
    """[(label, context, [endings])] and the header's longest-example bytes, read by the format's definition."""
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    assert header[0] == 20240522 and header[1] == 1, header[:2]
    words = struct.unpack("<%dH" % ((len(data) - 1024) // 2), data[1024:])
    out, at = [], 0
    for i in range(header[2]):
        assert words[at] == 65535 and words[at + 2] == i
        n = words[at + 1] // 2
        label, num_endings, ctx_len = words[at + 3], words[at + 4], words[at + 5]
        k = at + 6
        ctx = list(words[k:k + ctx_len])
        k += ctx_len
        endings = []
        for _ in range(num_endings):
            endings.append(list(words[k + 1:k + 1 + words[k]]))
            k += 1 + words[k]
        assert k == at + n, (k, at, n)
        out.append((label, ctx, endings))
        at += n
    assert at == len(words)
    return out, header[3]


class WordEncoder:
    """A stand-in for the GPT-2 encoding: one token per character (its code point)."""
    def encode_ordinary(self, text):
        return [ord(c) for c in text]


EXAMPLES = [
    {"ctx": "A man sits", "endings": ["down.", "up and leaves the room.", "x", "on a chair"], "label": 3},
    {"ctx": "Q", "endings": ["a", "b", "c", "d"], "label": 0},
]


class HellaswagTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def write_jsonl(self, rows, name="val.jsonl"):
        path = os.path.join(self.dir, name)
        with open(path, "w", encoding="utf-8") as f:
            for r in rows:
                f.write((json.dumps(r) if isinstance(r, dict) else r) + "\n")
        return path

    def test_jsonl_reader(self):
        examples = hellaswag.read_jsonl(self.write_jsonl(EXAMPLES + [""]))
        self.assertEqual(examples[0], ("A man sits", EXAMPLES[0]["endings"], 3))
        self.assertEqual(len(examples), 2)
        for bad, what in [({"ctx": "a", "endings": ["b"], "label": 1}, "label 1"),
                          ({"ctx": "a", "label": 0}, "not a HellaSwag example"),
                          ("{not json", "not a HellaSwag example"),
                          ({"ctx": 3, "endings": ["b"], "label": 0}, "ctx must be text")]:
            with self.assertRaisesRegex(ValueError, what):
                hellaswag.read_jsonl(self.write_jsonl([bad]))
        with self.assertRaisesRegex(ValueError, "no examples"):
            hellaswag.read_jsonl(self.write_jsonl([]))

    def test_written_file_parses_back(self):
        tokenized = hellaswag.tokenize_examples(WordEncoder(), hellaswag.read_jsonl(self.write_jsonl(EXAMPLES)))
        # endings continue the context: tokenized with a leading space
        self.assertEqual(tokenized[0][1][0], [ord(c) for c in " down."])
        out = os.path.join(self.dir, "val.bin")
        hellaswag.write_eval_file(out, tokenized)
        parsed, longest = parse_eval_file(out)
        self.assertEqual([(lab, ctx, ends) for ctx, ends, lab in tokenized], parsed)
        first_bytes = 2 * (3 + 3 + len(tokenized[0][0]) + sum(1 + len(e) for e in tokenized[0][1]))
        self.assertEqual(longest, first_bytes)

    def test_examples_that_cannot_be_written(self):
        with self.assertRaisesRegex(ValueError, "at least one token"):
            hellaswag.encode_example(0, [1], [[2], []], 0)
        with self.assertRaisesRegex(ValueError, "16 bits"):
            hellaswag.encode_example(0, [1] * 40000, [[2]], 0)

    def test_command_line_with_gpt2_encoding(self):
        if data_common.find_local_file("encoder.json") is None or data_common.find_local_file("vocab.bpe") is None:
            self.skipTest("no local encoder.json/vocab.bpe ($LLMC_SHARED_DATA or a shared/data folder beside the checkout)")
        out = os.path.join(self.dir, "hs.bin")
        r = subprocess.run([sys.executable, os.path.join(REPO, "dev", "data", "hellaswag.py"), "--jsonl",
                            self.write_jsonl(EXAMPLES), "--out", out], capture_output=True, text=True)
        self.assertEqual(r.returncode, 0, r.stderr)
        parsed, _ = parse_eval_file(out)
        enc = data_common.get_gpt2_encoding(quiet=True)
        self.assertEqual(parsed[0][1], enc.encode_ordinary("A man sits"))
        self.assertEqual(parsed[0][2][1], enc.encode_ordinary(" up and leaves the room."))
        self.assertEqual(parsed[0][0], 3)
        # a bad file: one line, exit 1, nothing written
        bad = subprocess.run([sys.executable, os.path.join(REPO, "dev", "data", "hellaswag.py"), "--jsonl",
                              self.write_jsonl(["{oops"], "bad.jsonl"), "--out", os.path.join(self.dir, "no.bin")],
                             capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("error:", bad.stderr)
        self.assertFalse(os.path.exists(os.path.join(self.dir, "no.bin")))


if __name__ == "__main__":
    unittest.main()
