"""Export an llm.c model file to a Hugging Face GPT-2 directory.

    python3 dev/eval/export_hf.py MODEL.bin OUTDIR [--dtype bf16|fp32] [--data-dir DIR]

OUTDIR then loads with `transformers.GPT2LMHeadModel.from_pretrained(OUTDIR)` and
`AutoTokenizer.from_pretrained(OUTDIR)`, no custom code. It holds:
    config.json              GPT2Config: vocab_size = V (not the padded Vp), n_positions = maxT, n_embd = C,
                             n_layer = L, n_head = NH, tanh GELU ("gelu_new"), LayerNorm eps 1e-5, tied wte
    model.safetensors        the parameters under HF GPT-2's names (below), bf16 or fp32
    vocab.json, merges.txt   GPT-2's BPE: copies of encoder.json and vocab.bpe
    tokenizer_config.json, special_tokens_map.json   <|endoftext|> as bos, eos and unk

The model file (llmc/checkpoint.h): 256 int32 header [20240326, version, maxT, V, L, NH, C, Vp, 0...],
version 3 = float32 parameters, 5 = bfloat16; then the 16 tensors in llm.c's order, the per-layer ones
stacked over L (dev/reference/gpt_reference.py, llmc_sizes):
    wte (Vp, C)  wpe (maxT, C)  ln1w, ln1b (L, C)  qkvw (L, 3C, C)  qkvb (L, 3C)  attprojw (L, C, C)
    attprojb (L, C)  ln2w, ln2b (L, C)  fcw (L, 4C, C)  fcb (L, 4C)  fcprojw (L, C, 4C)  fcprojb (L, C)
    lnfw, lnfb (C)
llm.c's linear layers store W as (out, in) and compute y = x W^T + b. HF GPT-2's Conv1D stores W as
(in, out) and computes y = x W + b, so every 2-D layer weight is written transposed. The rows of qkv are
[q | k | v], each C wide with the heads contiguous inside, which is exactly how HF splits c_attn's output.
wte keeps only its first V rows: the padded rows Vp - V are zeros that no token reaches. lm_head is tied
to wte and not written.

bfloat16 is the upper half of a float32, so a version-5 file exports to bf16 bit for bit; a version-3
file exports to fp32 by default, and --dtype bf16 rounds it to nearest even. safetensors' numpy API has
no bfloat16, so the file is written here (the format: an 8-byte little-endian header length, a JSON
header {name: {dtype, shape, data_offsets}}, then the tensors' raw little-endian bytes, back to back).

Errors (not a model file, a truncated file, a shape GPT-2's class cannot express, missing tokenizer
files) print one line "error: ..." and exit 1 before OUTDIR exists. The files are written into
OUTDIR.tmp-<pid> and renamed to OUTDIR at the end, so OUTDIR is never half-written. An existing OUTDIR
is refused unless --force, which replaces it.
"""
import argparse
import json
import os
import shutil
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "data"))
import data_common as dc  # noqa: E402  (where encoder.json / vocab.bpe are found)

MODEL_MAGIC = 20240326
VERSION_FP32 = 3
VERSION_BF16 = 5
HEADER_INTS = 256
EOT = 50256
GPT2_VOCAB = 50257


class ExportError(Exception):
    pass


def llmc_tensor_shapes(maxT, V, L, NH, C, Vp):
    """[(name, shape)] of the 16 llm.c tensors, in file order (per-layer tensors stacked over L)."""
    return [("wte", (Vp, C)), ("wpe", (maxT, C)),
            ("ln1w", (L, C)), ("ln1b", (L, C)),
            ("qkvw", (L, 3 * C, C)), ("qkvb", (L, 3 * C)),
            ("attprojw", (L, C, C)), ("attprojb", (L, C)),
            ("ln2w", (L, C)), ("ln2b", (L, C)),
            ("fcw", (L, 4 * C, C)), ("fcb", (L, 4 * C)),
            ("fcprojw", (L, C, 4 * C)), ("fcprojb", (L, C)),
            ("lnfw", (C,)), ("lnfb", (C,))]


def read_model(path):
    """(shape dict, version, {name: array view}) from an llm.c model file. Arrays are memory-mapped:
    '<f4' for version 3, '<u2' (bfloat16 bit patterns) for version 5."""
    if not os.path.isfile(path):
        raise ExportError(f"{path}: no such file" + (" (a directory)" if os.path.isdir(path) else ""))
    size = os.path.getsize(path)
    if size < HEADER_INTS * 4:
        raise ExportError(f"{path}: {size} bytes, shorter than the 1024-byte header of an llm.c model file")
    hdr = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if hdr[0] != MODEL_MAGIC:
        raise ExportError(f"{path}: not an llm.c model file (magic {hdr[0]}, want {MODEL_MAGIC})")
    version = int(hdr[1])
    if version not in (VERSION_FP32, VERSION_BF16):
        raise ExportError(f"{path}: model file version {version} is neither 3 (fp32) nor 5 (bf16)")
    maxT, V, L, NH, C, Vp = (int(x) for x in hdr[2:8])
    shape = dict(maxT=maxT, V=V, L=L, NH=NH, C=C, Vp=Vp)
    if min(maxT, V, L, NH, C, Vp) < 1:
        raise ExportError(f"{path}: header has a dimension < 1: {shape}")
    if V > Vp:
        raise ExportError(f"{path}: vocabulary V={V} is larger than the padded Vp={Vp}")
    if C % NH != 0:
        raise ExportError(f"{path}: n_embd C={C} is not a multiple of n_head NH={NH}; "
                          "GPT-2's attention splits C into NH equal heads")
    specs = llmc_tensor_shapes(maxT, V, L, NH, C, Vp)
    n = sum(int(np.prod(s)) for _, s in specs)
    elem = 4 if version == VERSION_FP32 else 2
    want = HEADER_INTS * 4 + n * elem
    if size != want:
        raise ExportError(f"{path}: {size} bytes, but its header ({shape}, version {version}) "
                          f"implies {want} (truncated or not this model)")
    flat = np.memmap(path, dtype="<f4" if elem == 4 else "<u2", mode="r", offset=HEADER_INTS * 4, shape=(n,))
    tensors, off = {}, 0
    for name, s in specs:
        k = int(np.prod(s))
        tensors[name] = flat[off:off + k].reshape(s)
        off += k
    return shape, version, tensors


def hf_tensors(shape, t):
    """[(HF name, array in HF layout)] from llm.c's tensors (views or small copies; any element type)."""
    V, L = shape["V"], shape["L"]
    out = [("transformer.wte.weight", t["wte"][:V]), ("transformer.wpe.weight", t["wpe"])]
    for i in range(L):
        p = f"transformer.h.{i}."
        out += [(p + "ln_1.weight", t["ln1w"][i]), (p + "ln_1.bias", t["ln1b"][i]),
                (p + "attn.c_attn.weight", t["qkvw"][i].T), (p + "attn.c_attn.bias", t["qkvb"][i]),
                (p + "attn.c_proj.weight", t["attprojw"][i].T), (p + "attn.c_proj.bias", t["attprojb"][i]),
                (p + "ln_2.weight", t["ln2w"][i]), (p + "ln_2.bias", t["ln2b"][i]),
                (p + "mlp.c_fc.weight", t["fcw"][i].T), (p + "mlp.c_fc.bias", t["fcb"][i]),
                (p + "mlp.c_proj.weight", t["fcprojw"][i].T), (p + "mlp.c_proj.bias", t["fcprojb"][i])]
    out += [("transformer.ln_f.weight", t["lnfw"]), ("transformer.ln_f.bias", t["lnfb"])]
    return out


def f32_to_bf16_bits(x):
    """float32 array -> bfloat16 bit patterns ('<u2'), rounded to nearest, ties to even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    rounded = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16).astype("<u2")
    return np.where(np.isnan(x), np.uint16(0x7FC0), rounded).astype("<u2")


def convert(a, version, dtype):
    """A tensor read from the model file, as the bytes-ready contiguous array of the output dtype."""
    if version == VERSION_BF16:
        if dtype == "bf16":
            return np.ascontiguousarray(a, dtype="<u2")
        return (np.asarray(a, dtype="<u2").astype("<u4") << 16).view("<f4")   # exact
    if dtype == "fp32":
        return np.ascontiguousarray(a, dtype="<f4")
    return f32_to_bf16_bits(np.asarray(a, dtype="<f4"))


def write_safetensors(path, named, version, dtype):
    """Write [(name, llm.c-typed array)] as a safetensors file of `dtype`, one tensor at a time."""
    st_dtype, elem = ("BF16", 2) if dtype == "bf16" else ("F32", 4)
    header, off = {"__metadata__": {"format": "pt"}}, 0
    for name, a in named:
        nbytes = int(np.prod(a.shape)) * elem
        header[name] = {"dtype": st_dtype, "shape": list(a.shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * (-len(hjson) % 8)   # pad the header with spaces so the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for _, a in named:
            f.write(convert(a, version, dtype).tobytes())


def hf_config(shape, dtype):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": shape["V"],
        "n_positions": shape["maxT"],
        "n_ctx": shape["maxT"],
        "n_embd": shape["C"],
        "n_layer": shape["L"],
        "n_head": shape["NH"],
        "n_inner": None,                      # 4 * n_embd, as llm.c's MLP
        "activation_function": "gelu_new",    # the tanh approximation of GELU, as llm.c
        "layer_norm_epsilon": 1e-5,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,   # llm.c trains without dropout
        "scale_attn_weights": True,           # scores / sqrt(head size), as llm.c
        "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": True,
        "bos_token_id": EOT,
        "eos_token_id": EOT,
        "use_cache": True,
        "torch_dtype": "bfloat16" if dtype == "bf16" else "float32",
    }


def find_tokenizer(data_dir):
    """GPT-2's encoder.json and vocab.bpe: local copies (--data-dir, $LLMC_SHARED_DATA, a shared/data folder beside
    the checkout), else downloaded into ~/.cache/llmc/gpt2_bpe (not with LLMC_NO_DOWNLOAD=1)."""
    enc_json = dc.find_local_file("encoder.json", data_dir)
    vocab_bpe = dc.find_local_file("vocab.bpe", data_dir)
    if enc_json is not None and vocab_bpe is not None:
        return enc_json, vocab_bpe
    where = ", ".join(dc.candidate_dirs(data_dir))
    why = ""
    if os.environ.get("LLMC_NO_DOWNLOAD") != "1":
        try:
            return dc.download_gpt2_bpe(dc.user_cache_dir("gpt2_bpe"))
        except Exception as e:  # noqa: BLE001 - offline shows as any of several exception types
            why = f"; downloading them failed ({type(e).__name__})"
    raise ExportError(f"GPT-2's encoder.json and vocab.bpe not found (looked in {where}){why}; "
                      "pass --data-dir DIR or --no-tokenizer")


def write_tokenizer_files(outdir, enc_json, vocab_bpe, maxT):
    shutil.copyfile(enc_json, os.path.join(outdir, "vocab.json"))
    shutil.copyfile(vocab_bpe, os.path.join(outdir, "merges.txt"))
    eot = "<|endoftext|>"
    special = {"bos_token": eot, "eos_token": eot, "unk_token": eot}
    tok_config = dict(special, tokenizer_class="GPT2Tokenizer", model_max_length=maxT,
                      add_prefix_space=False, add_bos_token=False)
    for name, obj in (("tokenizer_config.json", tok_config), ("special_tokens_map.json", special)):
        with open(os.path.join(outdir, name), "w") as f:
            json.dump(obj, f, indent=2)
            f.write("\n")


def export(model_path, outdir, dtype=None, data_dir=None, tokenizer=True, force=False):
    shape, version, tensors = read_model(model_path)
    if dtype is None:
        dtype = "bf16" if version == VERSION_BF16 else "fp32"
    outdir = outdir.rstrip("/") or outdir
    if os.path.exists(outdir) and not force:
        raise ExportError(f"{outdir} exists (pass --force to replace it)")
    parent = os.path.dirname(os.path.abspath(outdir))
    if not os.path.isdir(parent):
        raise ExportError(f"{parent}: no such directory (OUTDIR's parent must exist)")
    tok = find_tokenizer(data_dir) if tokenizer else None
    tmp = f"{outdir}.tmp-{os.getpid()}"
    try:
        os.mkdir(tmp)
        write_safetensors(os.path.join(tmp, "model.safetensors"), hf_tensors(shape, tensors), version, dtype)
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf_config(shape, dtype), f, indent=2)
            f.write("\n")
        if tok:
            write_tokenizer_files(tmp, *tok, shape["maxT"])
        if os.path.exists(outdir):   # --force
            shutil.rmtree(outdir)
        os.rename(tmp, outdir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if tok and shape["V"] != GPT2_VOCAB:
        print(f"warning: V={shape['V']} is not GPT-2's {GPT2_VOCAB}; the copied GPT-2 tokenizer does not "
              "match this vocabulary", file=sys.stderr)
    return shape, version, dtype


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="llm.c model file (version 3 fp32 or 5 bf16)")
    ap.add_argument("outdir", help="output directory (must not exist; written as OUTDIR.tmp-<pid>, then renamed)")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default=None,
                    help="parameter type written (default: the model file's, bf16 for version 5, fp32 for 3)")
    ap.add_argument("--data-dir", default=None,
                    help="directory with encoder.json and vocab.bpe (else $LLMC_SHARED_DATA, a shared/data folder beside the "
                         "checkout, or a download into ~/.cache/llmc/gpt2_bpe)")
    ap.add_argument("--no-tokenizer", action="store_true", help="write only config.json and model.safetensors")
    ap.add_argument("--force", action="store_true", help="replace an existing OUTDIR")
    args = ap.parse_args()
    try:
        shape, version, dtype = export(args.model, args.outdir, args.dtype, args.data_dir,
                                       not args.no_tokenizer, args.force)
    except (ExportError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(1)
    s = shape
    print(f"exported {args.model} (version {version}, L={s['L']} NH={s['NH']} C={s['C']} V={s['V']} "
          f"maxT={s['maxT']}) to {args.outdir} as {dtype}")


if __name__ == "__main__":
    main()
