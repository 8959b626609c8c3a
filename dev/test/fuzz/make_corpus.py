#!/usr/bin/env python3
"""make_corpus.py: writes the fuzz harnesses' seed corpora, dev/test/fuzz/corpus/<harness>/, a few valid and
near-valid inputs each (the formats are described in llmc/dataloader.h, checkpoint.h and tokenizer.h).
The committed corpus is its output; run it again after changing it: python3 dev/test/fuzz/make_corpus.py"""
import os
import struct
import sys

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


def write(harness, name, data):
    d = os.path.join(OUT, harness)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def header(*fields):
    """a 1024-byte header of 256 little-endian int32, the first ones given"""
    h = list(fields) + [0] * (256 - len(fields))
    return struct.pack("<256i", *h)


# token shards: magic 20240520, version 1, token count; then uint16 tokens
def shard(tokens, magic=20240520, version=1, count=None):
    n = len(tokens) if count is None else count
    return header(magic, version, n) + struct.pack("<%dH" % len(tokens), *tokens)


toks = [(i * 7919) % 50257 for i in range(40)]
write("shard", "valid_40_tokens.bin", shard(toks))
write("shard", "valid_2_tokens.bin", shard([50256, 11]))
write("shard", "token_past_vocab.bin", shard(toks[:20] + [50257] + toks[21:]))
write("shard", "count_past_end.bin", shard(toks, count=41))
write("shard", "negative_count.bin", shard(toks, count=-1))
write("shard", "version_2.bin", shard(toks, version=2))
write("shard", "header_only.bin", shard([]))


# model files: magic 20240326, version 3 (fp32) or 5 (bf16), maxT, V, L, NH, C, Vp; then the parameters
def num_parameters(maxT, V, L, NH, C, Vp):
    return Vp * C + maxT * C + L * (12 * C * C + 13 * C) + 2 * C


def model(version, shape, extra=0):
    n = num_parameters(*shape)
    return header(20240326, version, *shape) + bytes(n * (4 if version == 3 else 2) + extra)


write("model_header", "fp32_tiny.bin", model(3, (1, 1, 1, 1, 1, 1)))
write("model_header", "bf16_small.bin", model(5, (2, 3, 1, 2, 2, 4)))
write("model_header", "bf16_one_byte_long.bin", model(5, (2, 3, 1, 2, 2, 4), extra=1))
write("model_header", "c_not_divisible_by_nh.bin", header(20240326, 5, 2, 3, 1, 3, 2, 4))
write("model_header", "huge_shape.bin", header(20240326, 5, 2**31 - 1, 50257, 2**31 - 1, 1, 2**30, 50304))
write("model_header", "header_cut.bin", header(20240326, 3, 1, 1, 1, 1, 1, 1)[:1000])


# state files: magic 20241122, version, step, rank, processes, recipe[32], sections, reserved; then per
# section name[32] + uint64 length + bytes; then the checksum. The harness's first byte picks its mode: odd
# = it writes the checksum itself (so these need none), even = the file as it is (FNV-1a files, version 1).
def name32(s):
    return s.encode().ljust(32, b"\0")


def state(version, sections, step=10, rank=0, nprocs=1, recipe="bf16", count=None):
    n = len(sections) if count is None else count
    out = struct.pack("<IIqii", 20241122, version, step, rank, nprocs) + name32(recipe) + struct.pack("<II", n, 0)
    for name, data in sections:
        out += name32(name) + struct.pack("<Q", len(data)) + data
    return out


def fnv1a(data):
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


secs = [("dataloader", bytes(range(24))), ("rng", bytes(32)), ("adam_m", b"\1\2\3\4")]
write("state", "v2_sections_checksum_by_harness.bin", b"\x01" + state(2, secs) + bytes(8))
write("state", "v2_no_sections_checksum_by_harness.bin", b"\x01" + state(2, []) + bytes(8))
write("state", "v2_duplicate_section.bin", b"\x01" + state(2, secs + [secs[0]]) + bytes(8))
write("state", "v2_count_past_end.bin", b"\x01" + state(2, secs, count=5) + bytes(8))
body = state(1, secs)
write("state", "v1_fnv_valid.bin", b"\x00" + body + struct.pack("<Q", fnv1a(body)))
write("state", "v1_fnv_bad_checksum.bin", b"\x00" + body + struct.pack("<Q", fnv1a(body) ^ 1))


# tokenizer files: magic 20240328, version, vocab, eot (version 2); then per token uint8 length + bytes
def tokenizer(version, pieces, eot=None, vocab=None):
    v = len(pieces) if vocab is None else vocab
    e = len(pieces) - 1 if eot is None else eot
    h = struct.pack("<4I", 20240328, version, v, e) + bytes(1024 - 16)
    return h + b"".join(bytes([len(p)]) + p for p in pieces)


pieces = [b"a", b"bc", b"\n", b" hello", b"\xe2\x82", b"<|endoftext|>"]
write("tokenizer", "v2_valid.bin", tokenizer(2, pieces))
write("tokenizer", "v2_one_token.bin", tokenizer(2, [b"x"]))
write("tokenizer", "v1_eot_past_vocab.bin", tokenizer(1, pieces))
write("tokenizer", "huge_vocab.bin", tokenizer(2, pieces, vocab=0xFFFFFFFF))
write("tokenizer", "empty_token.bin", tokenizer(2, [b"a", b"", b"cde"], eot=0))
write("tokenizer", "trailing_byte.bin", tokenizer(2, pieces) + b"\7")


# command lines: the first byte picks the recipe flag table (0 none, 1 bf16, 2 fp8, 3 nvfp4, 4 q115,
# 5 tcfp12, 6 vcast, 7 example); then NUL-separated arguments; "%NAME=VALUE" sets an environment variable
def cli(table, *args):
    return bytes([table]) + b"\0".join(a.encode() for a in args)


write("cli", "defaults.bin", cli(0))
write("cli", "batch.bin", cli(1, "-b", "4", "-t", "64", "-d", "1024", "-x", "10", "-l", "3e-4", "-k", "wsd"))
write("cli", "overflow.bin", cli(0, "-b", "1073741824", "-t", "1073741824", "-pn", "16", "-pr", "0", "-pf", "/tmp",
                                 "-d", "5"))
write("cli", "processes.bin", cli(1, "-pn", "4", "-pr", "3", "-ps", "host:1234", "-pi", "tcp", "-z", "0", "-d", "65536"))
write("cli", "launcher_env.bin", cli(1, "%LLMC_WORLD_SIZE=2", "%LLMC_RANK=1", "%LLMC_LOCAL_RANK=1", "-pf", "/tmp"))
write("cli", "slurm_env.bin", cli(0, "%SLURM_NTASKS=8", "%SLURM_PROCID=x", "-b", "2"))
write("cli", "fp8.bin", cli(2, "-fh", "16", "-fm", "2", "-o", "out", "-lq", "10"))
write("cli", "nvfp4.bin", cli(3, "-rht", "0", "-b", "2"))
write("cli", "q115.bin", cli(4, "-lq", "5", "-o", "out", "-Q", "115"))
write("cli", "tcfp12.bin", cli(5, "-tb", "32", "-tsrr", "1"))
write("cli", "vcast.bin", cli(6, "-qw", "mxfp8e4m3", "-t", "128"))
write("cli", "example.bin", cli(7, "-wf", "e5m2", "-y", "1", "-o", "dir"))
write("cli", "bad_values.bin", cli(1, "-b", "4x", "-l", "nan", "-sd", "-1", "-e", "gpt3:c7"))

# multiple-choice eval files (llmc/eval_file.h): magic 20240522, version 1, examples, longest example's bytes;
# per example a uint16 run: 65535, its bytes, its index, label, endings, context length, context, endings
def eval_example(index, label, context, endings):
    body = [label, len(endings), len(context), *context]
    for e in endings:
        body += [len(e), *e]
    return [65535, 2 * (3 + len(body)), index, *body]


def eval_file(examples, count=None, longest=None):
    runs = [eval_example(i, *ex) for i, ex in enumerate(examples)]
    longest = max(2 * len(r) for r in runs) if longest is None else longest
    words = [w for r in runs for w in r]
    return header(20240522, 1, len(runs) if count is None else count, longest) + struct.pack("<%dH" % len(words), *words)


two = [(1, [10, 11], [[1], [2, 3], [4], [5]]), (0, [7], [[50256], [8], [9, 9], [1]])]
write("eval_file", "two_examples.bin", eval_file(two))
write("eval_file", "one_long.bin", eval_file([(3, list(range(40)), [[1] * 20, [2] * 24, [3], [4] * 10])]))
write("eval_file", "claims_more.bin", eval_file(two, count=3))
write("eval_file", "longest_too_small.bin", eval_file(two, longest=8))
write("eval_file", "token_past_vocab.bin", eval_file([(0, [60000], [[1], [2]])]))
print("wrote the seed corpora under", OUT, file=sys.stderr)
