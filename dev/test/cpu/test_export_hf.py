"""dev/eval/export_hf.py: an llm.c model file -> a Hugging Face GPT-2 directory (CPU, numpy, no torch).

A tiny model file with known values (version 3 fp32 and version 5 bf16) is exported and the result
checked against the source bytes: config.json, every tensor's name, shape and dtype, the transposed
Conv1D weights, the vocabulary sliced from Vp to V rows, the tokenizer files, and the refusal of bad
inputs (exit 1, one "error:" line, no OUTDIR). Then two float64 numpy forwards are compared: one over the
exported tensors with HF GPT-2's semantics (Conv1D: y = x W + b), one over the llm.c file read with the
reference's conventions (dev/reference/gpt_reference.py: nn.Linear, y = x W^T + b, logits over Vp then
the first V). Equal logits prove the mapping.
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import unittest

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
EXPORT = os.path.join(REPO, "dev", "eval", "export_hf.py")

# the tiny model: head size 4, V < Vp so the slice shows
MAXT, V, L, NH, C, VP = 8, 13, 2, 2, 8, 16


def llmc_sizes(maxT, V, L, NH, C, Vp):
    """The reference's llmc_sizes, written out again: (name, numel) in file order."""
    names = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
             "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
    return list(zip(names, [Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                            L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]))


def n_params(maxT=MAXT, V=V, L=L, NH=NH, C=C, Vp=VP):
    return sum(n for _, n in llmc_sizes(maxT, V, L, NH, C, Vp))


def header(version, maxT=MAXT, V=V, L=L, NH=NH, C=C, Vp=VP, magic=20240326):
    h = np.zeros(256, dtype="<i4")
    h[:8] = [magic, version, maxT, V, L, NH, C, Vp]
    return h.tobytes()


def make_flat(seed):
    """float32 parameters, llm.c order: LayerNorm weights near 1, the rest N(0, 0.3); the padded wte rows 0."""
    rng = np.random.default_rng(seed)
    parts = []
    for name, n in llmc_sizes(MAXT, V, L, NH, C, VP):
        a = rng.normal(0.0, 0.3, n).astype(np.float32)
        if name in ("ln1w", "ln2w", "lnfw"):
            a += 1.0
        if name == "wte":
            a.reshape(VP, C)[V:] = 0.0
        parts.append(a)
    return np.concatenate(parts)


def bf16_bits_to_f32(bits):
    return (np.asarray(bits, dtype="<u2").astype("<u4") << 16).view("<f4")


def read_safetensors(path):
    """{name: (dtype string, shape, raw bytes)} and the metadata, parsed from the format's spec."""
    with open(path, "rb") as f:
        blob = f.read()
    (hlen,) = struct.unpack("<Q", blob[:8])
    hdr = json.loads(blob[8:8 + hlen])
    data = blob[8 + hlen:]
    meta = hdr.pop("__metadata__", None)
    out, ends = {}, []
    for name, e in hdr.items():
        a, b = e["data_offsets"]
        out[name] = (e["dtype"], tuple(e["shape"]), data[a:b])
        ends.append((a, b))
    ends.sort()
    # contiguous, no gaps or overlaps, covering the whole data section
    assert ends[0][0] == 0 and ends[-1][1] == len(data), "data section not covered exactly"
    assert all(ends[i][1] == ends[i + 1][0] for i in range(len(ends) - 1)), "gap or overlap"
    return out, meta, hlen


def as_f64(entry):
    dtype, shape, raw = entry
    if dtype == "F32":
        return np.frombuffer(raw, dtype="<f4").reshape(shape).astype(np.float64)
    assert dtype == "BF16"
    return bf16_bits_to_f32(np.frombuffer(raw, dtype="<u2")).reshape(shape).astype(np.float64)


# ---- the two forwards (float64) ------------------------------------------------------------------------------

def layernorm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def attention(q, k, v, nh):
    """q, k, v: (B, T, C) -> (B, T, C); causal, heads of C/nh contiguous channels."""
    B, T, Cc = q.shape
    hs = Cc // nh
    split = lambda t: t.reshape(B, T, nh, hs).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(hs)
    s = np.where(np.triu(np.ones((T, T), bool), 1), -np.inf, s)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return (p @ v).transpose(0, 2, 1, 3).reshape(B, T, Cc)


def forward_hf(st, cfg, idx):
    """GPT2LMHeadModel's forward over the exported tensors: Conv1D is x @ W + b, lm_head = wte (V, C)."""
    g = lambda n: as_f64(st[n])  # noqa: E731
    T = idx.shape[1]
    x = g("transformer.wte.weight")[idx] + g("transformer.wpe.weight")[:T]
    C_, nh = cfg["n_embd"], cfg["n_head"]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        h = layernorm(x, g(p + "ln_1.weight"), g(p + "ln_1.bias"), cfg["layer_norm_epsilon"])
        qkv = h @ g(p + "attn.c_attn.weight") + g(p + "attn.c_attn.bias")
        q, k, v = qkv[..., :C_], qkv[..., C_:2 * C_], qkv[..., 2 * C_:]
        x = x + attention(q, k, v, nh) @ g(p + "attn.c_proj.weight") + g(p + "attn.c_proj.bias")
        h = layernorm(x, g(p + "ln_2.weight"), g(p + "ln_2.bias"), cfg["layer_norm_epsilon"])
        m = gelu_tanh(h @ g(p + "mlp.c_fc.weight") + g(p + "mlp.c_fc.bias"))
        x = x + m @ g(p + "mlp.c_proj.weight") + g(p + "mlp.c_proj.bias")
    x = layernorm(x, g("transformer.ln_f.weight"), g("transformer.ln_f.bias"), cfg["layer_norm_epsilon"])
    return x @ g("transformer.wte.weight").T


def forward_llmc(flat, idx):
    """The reference model's forward over llm.c's flat vector: nn.Linear is x @ W^T + b with W (out, in);
    the logits use all Vp rows of wte, then keep the first V columns."""
    p, off = {}, 0
    for name, n in llmc_sizes(MAXT, V, L, NH, C, VP):
        p[name] = flat[off:off + n].astype(np.float64)
        off += n
    wte, wpe = p["wte"].reshape(VP, C), p["wpe"].reshape(MAXT, C)
    layer = lambda name, l, *shape: p[name].reshape(L, *shape)[l]  # noqa: E731
    T = idx.shape[1]
    x = wte[idx] + wpe[:T]
    for l in range(L):
        h = layernorm(x, layer("ln1w", l, C), layer("ln1b", l, C))
        qkv = h @ layer("qkvw", l, 3 * C, C).T + layer("qkvb", l, 3 * C)
        q, k, v = np.split(qkv, 3, axis=-1)
        x = x + attention(q, k, v, NH) @ layer("attprojw", l, C, C).T + layer("attprojb", l, C)
        h = layernorm(x, layer("ln2w", l, C), layer("ln2b", l, C))
        m = gelu_tanh(h @ layer("fcw", l, 4 * C, C).T + layer("fcb", l, 4 * C))
        x = x + m @ layer("fcprojw", l, C, 4 * C).T + layer("fcprojb", l, C)
    x = layernorm(x, p["lnfw"].reshape(C), p["lnfb"].reshape(C))
    return (x @ wte.T)[..., :V]


# ---- the tests -----------------------------------------------------------------------------------------------

class ExportHF(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="test_export_hf_")
        # a stand-in GPT-2 BPE (the real one is not needed to check that it is copied)
        cls.data = os.path.join(cls.tmp, "data")
        os.makedirs(cls.data)
        with open(os.path.join(cls.data, "encoder.json"), "w") as f:
            json.dump({"a": 0, "b": 1, "ab": 2, "<|endoftext|>": 50256}, f)
        with open(os.path.join(cls.data, "vocab.bpe"), "w") as f:
            f.write("#version: 0.2\na b\n")
        cls.flat32 = make_flat(1)
        # plant bf16 rounding cases in wte row 0: ties go to even, above a tie rounds up
        cls.flat32[:4] = np.array([1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, 1.0 + 2.0 ** -8 + 2.0 ** -20, -2.5],
                                  dtype=np.float32)
        cls.rounded = np.array([1.0, 1.0 + 2.0 ** -6, 1.0 + 2.0 ** -7, -2.5])
        cls.fp32_path = cls.write_model("fp32.bin", header(3) + cls.flat32.astype("<f4").tobytes())
        # the bf16 file: bit patterns of the rounded float32 values (so bf16 -> fp32 is exact)
        u = cls.flat32.view("<u4")
        cls.bits16 = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
        cls.flat16 = bf16_bits_to_f32(cls.bits16)
        cls.bf16_path = cls.write_model("bf16.bin", header(5) + cls.bits16.tobytes())
        cls.idx = np.random.default_rng(2).integers(0, V, size=(3, MAXT))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp, ignore_errors=True)

    @classmethod
    def write_model(cls, name, data):
        path = os.path.join(cls.tmp, name)
        with open(path, "wb") as f:
            f.write(data)
        return path

    def run_export(self, model, outdir, *extra, data_dir=None):
        return subprocess.run([sys.executable, EXPORT, model, outdir, "--data-dir", data_dir or self.data, *extra],
                              capture_output=True, text=True)

    def export_ok(self, model, name, *extra):
        out = os.path.join(self.tmp, name)
        r = self.run_export(model, out, *extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        return out

    def load(self, outdir):
        with open(os.path.join(outdir, "config.json")) as f:
            cfg = json.load(f)
        st, meta, hlen = read_safetensors(os.path.join(outdir, "model.safetensors"))
        return cfg, st, meta, hlen

    def expected_names_shapes(self):
        want = {"transformer.wte.weight": (V, C), "transformer.wpe.weight": (MAXT, C),
                "transformer.ln_f.weight": (C,), "transformer.ln_f.bias": (C,)}
        for i in range(L):
            p = f"transformer.h.{i}."
            want.update({p + "ln_1.weight": (C,), p + "ln_1.bias": (C,), p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
                         p + "attn.c_attn.weight": (C, 3 * C), p + "attn.c_attn.bias": (3 * C,),
                         p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
                         p + "mlp.c_fc.weight": (C, 4 * C), p + "mlp.c_fc.bias": (4 * C,),
                         p + "mlp.c_proj.weight": (4 * C, C), p + "mlp.c_proj.bias": (C,)})
        return want

    def check_config(self, cfg, torch_dtype):
        want = dict(vocab_size=V, n_positions=MAXT, n_embd=C, n_layer=L, n_head=NH, activation_function="gelu_new",
                    layer_norm_epsilon=1e-5, tie_word_embeddings=True, architectures=["GPT2LMHeadModel"],
                    model_type="gpt2", bos_token_id=50256, eos_token_id=50256, torch_dtype=torch_dtype)
        for k, v in want.items():
            self.assertEqual(cfg[k], v, k)

    def check_tensors(self, st, dtype, src):
        """Every tensor against the source parameters `src` (float32, llm.c order), exactly."""
        self.assertEqual({n: s for n, (_, s, _) in st.items()}, self.expected_names_shapes())
        self.assertNotIn("lm_head.weight", st)
        for n, (d, _, _) in st.items():
            self.assertEqual(d, dtype, n)
        p, off = {}, 0
        for name, n in llmc_sizes(MAXT, V, L, NH, C, VP):
            p[name] = src[off:off + n].astype(np.float64)
            off += n
        eq = lambda name, want: np.testing.assert_array_equal(as_f64(st[name]), want, err_msg=name)  # noqa: E731
        eq("transformer.wte.weight", p["wte"].reshape(VP, C)[:V])
        eq("transformer.wpe.weight", p["wpe"].reshape(MAXT, C))
        eq("transformer.ln_f.weight", p["lnfw"])
        eq("transformer.ln_f.bias", p["lnfb"])
        for i in range(L):
            h = f"transformer.h.{i}."
            eq(h + "ln_1.weight", p["ln1w"].reshape(L, C)[i])
            eq(h + "ln_1.bias", p["ln1b"].reshape(L, C)[i])
            eq(h + "ln_2.weight", p["ln2w"].reshape(L, C)[i])
            eq(h + "ln_2.bias", p["ln2b"].reshape(L, C)[i])
            eq(h + "attn.c_attn.weight", p["qkvw"].reshape(L, 3 * C, C)[i].T)
            eq(h + "attn.c_attn.bias", p["qkvb"].reshape(L, 3 * C)[i])
            eq(h + "attn.c_proj.weight", p["attprojw"].reshape(L, C, C)[i].T)
            eq(h + "attn.c_proj.bias", p["attprojb"].reshape(L, C)[i])
            eq(h + "mlp.c_fc.weight", p["fcw"].reshape(L, 4 * C, C)[i].T)
            eq(h + "mlp.c_fc.bias", p["fcb"].reshape(L, 4 * C)[i])
            eq(h + "mlp.c_proj.weight", p["fcprojw"].reshape(L, C, 4 * C)[i].T)
            eq(h + "mlp.c_proj.bias", p["fcprojb"].reshape(L, C)[i])
        # one element by hand: c_attn.weight[in=1, out=5] of layer 1 is qkvw[layer 1][row 5][column 1]
        qkv_off = sum(n for name, n in llmc_sizes(MAXT, V, L, NH, C, VP)[:4])
        self.assertEqual(as_f64(st["transformer.h.1.attn.c_attn.weight"])[1, 5],
                         float(src[qkv_off + 1 * 3 * C * C + 5 * C + 1]))

    def check_forward(self, cfg, st, src):
        hf = forward_hf(st, cfg, self.idx)
        ref = forward_llmc(src, self.idx)
        self.assertEqual(hf.shape, (3, MAXT, V))
        np.testing.assert_allclose(hf, ref, rtol=0, atol=1e-6)
        self.assertGreater(np.abs(ref).max(), 0.1)  # not a trivially zero comparison

    def test_fp32_file_exports_fp32(self):
        out = self.export_ok(self.fp32_path, "out_fp32")
        cfg, st, meta, hlen = self.load(out)
        self.assertEqual(meta, {"format": "pt"})
        self.assertEqual((8 + hlen) % 8, 0)
        self.check_config(cfg, "float32")
        self.check_tensors(st, "F32", self.flat32)
        self.check_forward(cfg, st, self.flat32)
        # the file also reads with the safetensors package (an independent parser)
        try:
            from safetensors.numpy import load_file
        except ImportError:
            self.skipTest("safetensors not installed (pip install safetensors)")
        loaded = load_file(os.path.join(out, "model.safetensors"))
        self.assertEqual(set(loaded), set(st))
        for n, a in loaded.items():
            np.testing.assert_array_equal(a.astype(np.float64), as_f64(st[n]), err_msg=n)

    def test_bf16_file_exports_bf16_bit_exact(self):
        out = self.export_ok(self.bf16_path, "out_bf16")
        cfg, st, _, _ = self.load(out)
        self.check_config(cfg, "bfloat16")
        self.check_tensors(st, "BF16", self.flat16)
        self.check_forward(cfg, st, self.flat16)
        # wte's raw bytes are the file's first V*C bf16 values
        self.assertEqual(st["transformer.wte.weight"][2], self.bits16[:V * C].tobytes())
        # the safetensors package accepts the header (its numpy side cannot make bf16 arrays, so only the
        # names, metadata and the checks it makes on opening: dtypes, shapes against byte ranges, no gaps)
        try:
            from safetensors import safe_open
        except ImportError:
            self.skipTest("safetensors not installed (pip install safetensors)")
        with safe_open(os.path.join(out, "model.safetensors"), framework="np") as f:
            self.assertEqual(set(f.keys()), set(st))
            self.assertEqual(f.metadata(), {"format": "pt"})

    def test_bf16_file_to_fp32(self):
        out = self.export_ok(self.bf16_path, "out_bf16_fp32", "--dtype", "fp32")
        cfg, st, _, _ = self.load(out)
        self.check_config(cfg, "float32")
        self.check_tensors(st, "F32", self.flat16)

    def test_fp32_file_to_bf16_rounds_to_nearest_even(self):
        out = self.export_ok(self.fp32_path, "out_fp32_bf16", "--dtype", "bf16")
        cfg, st, _, _ = self.load(out)
        self.check_config(cfg, "bfloat16")
        self.check_tensors(st, "BF16", self.flat16)
        np.testing.assert_array_equal(as_f64(st["transformer.wte.weight"])[0, :4], self.rounded)

    def test_tokenizer_files(self):
        out = self.export_ok(self.fp32_path, "out_tok")
        for src, dst in (("encoder.json", "vocab.json"), ("vocab.bpe", "merges.txt")):
            with open(os.path.join(self.data, src), "rb") as a, open(os.path.join(out, dst), "rb") as b:
                self.assertEqual(a.read(), b.read(), dst)
        with open(os.path.join(out, "special_tokens_map.json")) as f:
            special = json.load(f)
        with open(os.path.join(out, "tokenizer_config.json")) as f:
            tok = json.load(f)
        for k in ("bos_token", "eos_token", "unk_token"):
            self.assertEqual(special[k], "<|endoftext|>")
            self.assertEqual(tok[k], "<|endoftext|>")
        self.assertEqual(tok["tokenizer_class"], "GPT2Tokenizer")
        self.assertEqual(tok["model_max_length"], MAXT)
        self.assertEqual(sorted(os.listdir(out)), ["config.json", "merges.txt", "model.safetensors",
                                                   "special_tokens_map.json", "tokenizer_config.json", "vocab.json"])

    def test_no_tokenizer(self):
        out = self.export_ok(self.fp32_path, "out_notok", "--no-tokenizer")
        self.assertEqual(sorted(os.listdir(out)), ["config.json", "model.safetensors"])

    def refused(self, model, what, outname, *extra, data_dir=None):
        out = os.path.join(self.tmp, outname)
        r = self.run_export(model, out, *extra, data_dir=data_dir)
        self.assertEqual(r.returncode, 1, f"{what}: {r.stdout} {r.stderr}")
        lines = r.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, f"{what}: {r.stderr}")
        self.assertTrue(lines[0].startswith("error: "), f"{what}: {r.stderr}")
        leftovers = [n for n in os.listdir(self.tmp) if n.startswith(outname + ".tmp-")]
        self.assertEqual(leftovers, [], what)
        return out, lines[0]

    def test_bad_inputs_refused(self):
        good = header(3) + self.flat32.astype("<f4").tobytes()
        cases = {
            "text file": b"hello, this is not a model\n" * 100,
            "empty file": b"",
            "header only, truncated": good[:1000],
            "truncated parameters": good[:-4],
            "trailing bytes": good + b"\0\0\0\0",
            "wrong magic": header(3, magic=20240520) + good[1024:],
            "version 4": header(4) + good[1024:],
            "V > Vp": header(3, V=VP + 1) + good[1024:],
            # C=9, NH=2: a self-consistent file whose width does not split into equal heads
            "C not a multiple of NH": header(3, C=9) + np.zeros(n_params(C=9), "<f4").tobytes(),
            "zero layers": header(3, L=0) + good[1024:],
        }
        for i, (what, data) in enumerate(cases.items()):
            path = self.write_model(f"bad{i}.bin", data)
            out, _ = self.refused(path, what, f"out_bad{i}")
            self.assertFalse(os.path.exists(out), what)
        out, msg = self.refused(os.path.join(self.tmp, "missing.bin"), "missing file", "out_missing")
        self.assertFalse(os.path.exists(out))
        # OUTDIR's parent directory is not created
        _, msg = self.refused(self.fp32_path, "missing parent of OUTDIR", os.path.join("no_parent", "out"))
        self.assertIn("no such directory", msg)
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "no_parent")))
        # no tokenizer files anywhere they are looked for: the two scripts copied into a stand-in repository
        # without a shared/data folder beside it, with $LLMC_SHARED_DATA unset and an empty --data-dir
        fake = os.path.join(self.tmp, "norepo", "repo")
        for sub, name in (("eval", "export_hf.py"), ("data", "data_common.py")):
            os.makedirs(os.path.join(fake, "dev", sub), exist_ok=True)
            shutil.copy(os.path.join(REPO, "dev", sub, name), os.path.join(fake, "dev", sub, name))
        empty = os.path.join(self.tmp, "empty")
        os.makedirs(empty, exist_ok=True)
        out = os.path.join(self.tmp, "out_notokfiles")
        # (and no download: LLMC_NO_DOWNLOAD=1; the download itself is test_tokenizer_download below)
        env = {k: v for k, v in os.environ.items() if k != "LLMC_SHARED_DATA"}
        env["LLMC_NO_DOWNLOAD"] = "1"
        r = subprocess.run([sys.executable, os.path.join(fake, "dev", "eval", "export_hf.py"), self.fp32_path, out,
                            "--data-dir", empty], capture_output=True, text=True, env=env)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertRegex(r.stderr, r"^error: .*encoder.json.*--data-dir.*\n$")
        self.assertFalse(os.path.exists(out))
        self.assertEqual([n for n in os.listdir(self.tmp) if n.startswith("out_notokfiles")], [])

    def test_tokenizer_download(self):
        # no local copy: find_tokenizer downloads into the user's cache (here a stand-in download), or says why not
        sys.path.insert(0, os.path.dirname(EXPORT))
        import export_hf
        empty = os.path.join(self.tmp, "empty_dl")
        os.makedirs(empty, exist_ok=True)
        saved = (export_hf.dc.find_local_file, export_hf.dc.download_gpt2_bpe, os.environ.get("LLMC_NO_DOWNLOAD"))
        asked = []

        def fetched(dest):
            asked.append(dest)
            return os.path.join(dest, "encoder.json"), os.path.join(dest, "vocab.bpe")

        def offline(dest):
            raise OSError("no network")
        try:
            export_hf.dc.find_local_file = lambda name, data_dir=None: None
            os.environ.pop("LLMC_NO_DOWNLOAD", None)
            export_hf.dc.download_gpt2_bpe = fetched
            enc, bpe = export_hf.find_tokenizer(empty)
            self.assertEqual(asked, [export_hf.dc.user_cache_dir("gpt2_bpe")])
            self.assertEqual(os.path.basename(enc), "encoder.json")
            self.assertEqual(os.path.basename(bpe), "vocab.bpe")
            export_hf.dc.download_gpt2_bpe = offline
            with self.assertRaisesRegex(export_hf.ExportError, r"downloading them failed \(OSError\).*--data-dir"):
                export_hf.find_tokenizer(empty)
            os.environ["LLMC_NO_DOWNLOAD"] = "1"
            asked.clear()
            export_hf.dc.download_gpt2_bpe = fetched
            with self.assertRaisesRegex(export_hf.ExportError, r"not found \(looked in [^)]*\); pass --data-dir"):
                export_hf.find_tokenizer(empty)
            self.assertEqual(asked, [])
        finally:
            export_hf.dc.find_local_file, export_hf.dc.download_gpt2_bpe = saved[0], saved[1]
            if saved[2] is None:
                os.environ.pop("LLMC_NO_DOWNLOAD", None)
            else:
                os.environ["LLMC_NO_DOWNLOAD"] = saved[2]

    def test_download_gpt2_bpe_writes_once(self):
        # the two files from tiktoken's download cache (a stand-in for it here), written once, then read from disk
        import tiktoken.load
        sys.path.insert(0, os.path.dirname(EXPORT))
        import export_hf
        dest = os.path.join(self.tmp, "bpe_cache")
        urls = []

        def read_file_cached(url, expected_hash=None):
            urls.append(url)
            return b"contents of " + url.rsplit("/", 1)[1].encode()
        saved = tiktoken.load.read_file_cached
        try:
            tiktoken.load.read_file_cached = read_file_cached
            enc, bpe = export_hf.dc.download_gpt2_bpe(dest)
            again = export_hf.dc.download_gpt2_bpe(dest)
        finally:
            tiktoken.load.read_file_cached = saved
        self.assertEqual((enc, bpe), again)
        self.assertEqual(urls, [export_hf.dc.GPT2_BPE_URLS["encoder.json"], export_hf.dc.GPT2_BPE_URLS["vocab.bpe"]])
        with open(enc, "rb") as f:
            self.assertEqual(f.read(), b"contents of encoder.json")
        with open(bpe, "rb") as f:
            self.assertEqual(f.read(), b"contents of vocab.bpe")
        self.assertEqual(sorted(os.listdir(dest)), ["encoder.json", "vocab.bpe"])

    def test_existing_outdir_refused_and_force_replaces(self):
        out = os.path.join(self.tmp, "out_exists")
        os.makedirs(out)
        with open(os.path.join(out, "keep"), "w") as f:
            f.write("x")
        _, msg = self.refused(self.fp32_path, "existing OUTDIR", "out_exists")
        self.assertIn("--force", msg)
        self.assertTrue(os.path.exists(os.path.join(out, "keep")))
        self.export_ok(self.fp32_path, "out_exists", "--force")
        self.assertFalse(os.path.exists(os.path.join(out, "keep")))
        self.assertTrue(os.path.exists(os.path.join(out, "model.safetensors")))


if __name__ == "__main__":
    unittest.main()
