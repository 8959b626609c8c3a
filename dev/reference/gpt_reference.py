#!/usr/bin/env python3
"""PyTorch reference for the CUDA GPT-2 trainer.

Three things live here:
  1. `GPT`, an nn.Module with exactly the trainer's architecture (pre-LN GPT-2, tied wte,
     vocab padded to Vp, loss over the first V logit columns only), buildable at any size
     from a model descriptor (`build_model("d12")`, "gpt2:d24", "gpt3:c768", or an llm.c
     checkpoint path). `use_sdpa=True` swaps the explicit masked softmax for
     F.scaled_dot_product_attention(is_causal=True) (for the bf16 / torch.compile benchmark), and
     `loss_over_padded_vocab=True` takes nanoGPT's loss over all Vp columns (the benchmark's peers).
  2. Helpers mapping the model to and from llm.c's flat parameter order (`params_to_flat`,
     `grads_to_flat`, `load_llmc_params`, `write_llmc_model`).
  3. `--write-reference`: a float64 CPU computation of logits, loss, gradients and a short
     AdamW run on a fixed batch, written as ref_model.bin + ref_state.bin for the CUDA test.
     `--check` additionally verifies the parameter count, re-reads the files and sanity-checks
     the numbers.

  4. `--boundaries q115`: the same reference under the Q1.15 true-forward boundaries of the
     trainer's q115 recipe (llmc/recipes/q115/recipe.h, SF16): every forward boundary through
     simulate_q115 (GEMM outputs through simulate_q131 first), straight-through in backward.

  5. With `--write-reference`, also a small multiple-choice eval file (ref_hellaswag.bin, the format
     dev/data/hellaswag.py writes) of random examples, and the float64 mean loss of each ending at the
     initial parameters and each example's choice (ref_hellaswag_scores.bin), for the trainer's HellaSwag
     scoring (test_gpt.cu, check hellaswag).

Usage:
  python3 dev/reference/gpt_reference.py --write-reference --out DIR [--model d12 --B 4 --T 64 --steps 10 --seed 0]
  python3 dev/reference/gpt_reference.py --write-reference --boundaries q115 --out DIR_Q115
  python3 dev/reference/gpt_reference.py --check --model d6 [--out DIR]

File formats are documented in dev/reference/README.md and at write_reference() below.
"""
import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
import hellaswag  # noqa: E402  (dev/data/hellaswag.py: the eval file's writer)

VOCAB_SIZE = 50257
PADDED_VOCAB_SIZE = 50304  # 50257 rounded up to a multiple of 128

MODEL_MAGIC = 20240326   # llm.c model file
MODEL_VERSION_FP32 = 3   # parameters stored as float32
MODEL_VERSION_BF16 = 5   # parameters stored as bfloat16 (read-only support)
STATE_MAGIC = 20241123   # ref_state.bin
STATE_VERSION = 2  # 2: the per-step batches of the trajectory follow the gradient norms
EVAL_SCORES_MAGIC = 20241124  # ref_hellaswag_scores.bin
EVAL_SCORES_VERSION = 1
EVAL_EXAMPLES = 32            # examples in ref_hellaswag.bin
HEADER_INTS = 256
NUM_HPARAMS = 16

D12_NUM_PARAMS = 124_475_904

# GPT-2 family: depth -> (channels, heads). Context 1024.
GPT2_SHAPES = {6: (384, 6), 12: (768, 12), 24: (1024, 16), 36: (1280, 20), 48: (1600, 25)}
# GPT-3 family: channels -> (depth, heads). Context 2048. Mirrors the trainer's table in
# llmc/cli.h (gpt3_presets); keep the two in sync.
GPT3_SHAPES = {768: (12, 12), 1024: (24, 16), 1536: (24, 12), 2048: (24, 16), 2560: (32, 20),
               4096: (32, 32), 5120: (40, 40), 12288: (96, 96)}


@dataclass(frozen=True)
class GPTConfig:
    max_seq_len: int = 1024              # maxT
    vocab_size: int = VOCAB_SIZE         # V
    padded_vocab_size: int = PADDED_VOCAB_SIZE  # Vp
    num_layers: int = 12                 # L
    num_heads: int = 12                  # NH
    channels: int = 768                  # C


def parse_descriptor(desc):
    """'d6|d12|d24|d36|d48', 'gpt2:dN' (same), 'gpt3:cC' -> GPTConfig. ValueError otherwise."""
    s = desc.strip()
    if s.startswith("gpt2:d"):
        s = s[len("gpt2:"):]
    if s.startswith("d") and s[1:].isdigit():
        depth = int(s[1:])
        if depth not in GPT2_SHAPES:
            raise ValueError(f"model descriptor '{desc}': GPT-2 depth must be one of "
                             f"{sorted(GPT2_SHAPES)}")
        C, NH = GPT2_SHAPES[depth]
        return GPTConfig(max_seq_len=1024, num_layers=depth, num_heads=NH, channels=C)
    if s.startswith("gpt3:c") and s[len("gpt3:c"):].isdigit():
        C = int(s[len("gpt3:c"):])
        if C not in GPT3_SHAPES:
            raise ValueError(f"model descriptor '{desc}': GPT-3 channels must be one of "
                             f"{sorted(GPT3_SHAPES)}")
        L, NH = GPT3_SHAPES[C]
        return GPTConfig(max_seq_len=2048, num_layers=L, num_heads=NH, channels=C)
    raise ValueError(f"model descriptor '{desc}' not understood (want d6|d12|d24|d36|d48, "
                     f"gpt2:dN or gpt3:cC)")


# ----------------------------------------------------------------------------------------------
# forward boundaries (the trainer's llmc/boundaries.h): where a recipe acts outside the linears


class IdentityBoundaries:
    """Every recipe but Q1.15: nothing happens at the boundaries."""
    name, code, active = "none", 0, False
    attention_residual_scale = mlp_residual_scale = logit_scale = 1.0

    def __getattr__(self, hook):  # embedding, residual, norm_output, linear_output, ...: identity
        return lambda x: x


Q115_OVERFLOW_THRESHOLD = float(np.float32(0.999))  # the trainer's float 0.999f


def simulate_fixed(x, scale):
    """simulate_q115 (scale 2^15) / simulate_q131 (2^31) of llmc/formats/number_formats.h: clamp to +-0.999,
    scale, round to nearest with ties to even (torch.round), scale back."""
    return torch.round(x.clamp(-Q115_OVERFLOW_THRESHOLD, Q115_OVERFLOW_THRESHOLD) * scale) / scale


def straight_through(x, q):
    """q in the forward pass, gradient 1 (also where q clamped): the trainer's BF16 backward"""
    return x + (q - x).detach()


class Q115Boundaries:
    """SF16 true-forward, as llmc/recipes/q115/recipe.h: logit scale 1, residual scales 1."""
    name, code, active = "q115", 1, True
    attention_residual_scale = mlp_residual_scale = logit_scale = 1.0

    def quantize(self, x):                     # simulate_q115
        return straight_through(x, simulate_fixed(x, 2.0**15))

    def linear_output(self, x):                # a forward GEMM: simulate_q131, then simulate_q115
        return straight_through(x, simulate_fixed(simulate_fixed(x, 2.0**31), 2.0**15))

    embedding = residual = norm_output = softmax_output = gelu_input = gelu_output = quantize
    attention_output = linear_output

    def attention_scores(self, x):             # the score GEMM's output, read through simulate_q115
        return self.quantize(self.linear_output(x))

    def logits(self, x):                       # the LM head's output, read through simulate_q115
        return self.quantize(self.linear_output(x))


BOUNDARIES = {"none": IdentityBoundaries, "q115": Q115Boundaries}


# ----------------------------------------------------------------------------------------------
# model


class Block(nn.Module):
    """One pre-LayerNorm transformer block."""

    def __init__(self, cfg, use_sdpa, bd=None):
        super().__init__()
        self.bd = bd or IdentityBoundaries()
        assert not (use_sdpa and self.bd.active), "boundaries need the explicit softmax"
        C = cfg.channels
        assert C % cfg.num_heads == 0, "channels must be divisible by heads"
        self.num_heads = cfg.num_heads
        self.use_sdpa = use_sdpa
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.attproj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def attention(self, x):
        B, T, C = x.shape
        NH = self.num_heads
        hs = C // NH
        bd = self.bd
        q, k, v = bd.linear_output(self.qkv(x)).split(C, dim=-1)  # [q | k | v] along the last dim
        q = q.view(B, T, NH, hs).transpose(1, 2)          # (B, NH, T, hs)
        k = k.view(B, T, NH, hs).transpose(1, 2)
        v = v.view(B, T, NH, hs).transpose(1, 2)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # scale 1/sqrt(hs)
        elif bd.active:
            # the raw scores (expansion scale 1) through the boundary, then 1/sqrt(hs)
            scores = bd.attention_scores(torch.matmul(q, k.transpose(-2, -1))) * (1.0 / math.sqrt(hs))
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)
            scores = scores.masked_fill(future, float("-inf"))
            y = bd.attention_output(torch.matmul(bd.softmax_output(torch.softmax(scores, dim=-1)), v))
        else:
            scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(hs))
            future = torch.ones(T, T, dtype=torch.bool, device=x.device).triu(diagonal=1)
            scores = scores.masked_fill(future, float("-inf"))
            y = torch.matmul(torch.softmax(scores, dim=-1), v)
        y = y.transpose(1, 2).reshape(B, T, C)
        return bd.linear_output(self.attproj(y))

    def forward(self, x):
        bd = self.bd
        if not bd.active:
            x = x + self.attention(self.ln1(x))
            x = x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))
            return x
        x = bd.residual(x + bd.attention_residual_scale * self.attention(bd.norm_output(self.ln1(x))))
        h = bd.linear_output(self.fc(bd.norm_output(self.ln2(x))))
        g = bd.gelu_output(F.gelu(bd.gelu_input(h), approximate="tanh"))
        x = bd.residual(x + bd.mlp_residual_scale * bd.linear_output(self.fcproj(g)))
        return x


class GPT(nn.Module):
    """loss_over_padded_vocab=False (the trainer's loss): the softmax runs over the first V logit
    columns. True (nanoGPT's loss, for the speed bench's peers): it runs over all Vp columns, so the
    padded columns take probability mass and their wte rows get gradient; the cross-entropy kernel
    then reads the LM head's output whole instead of a strided slice of it."""

    def __init__(self, cfg, use_sdpa=False, boundaries=None, loss_over_padded_vocab=False):
        super().__init__()
        self.cfg = cfg
        self.use_sdpa = use_sdpa
        self.bd = boundaries or IdentityBoundaries()
        assert not (loss_over_padded_vocab and self.bd.active), "boundaries define the loss over V columns"
        self.loss_over_padded_vocab = loss_over_padded_vocab
        self.wte = nn.Embedding(cfg.padded_vocab_size, cfg.channels)
        self.wpe = nn.Embedding(cfg.max_seq_len, cfg.channels)
        self.blocks = nn.ModuleList([Block(cfg, use_sdpa, self.bd) for _ in range(cfg.num_layers)])
        self.lnf = nn.LayerNorm(cfg.channels, eps=1e-5)

    def forward(self, idx, targets=None, return_logits=True):
        """idx, targets: (B, T) int64. Returns (logits (B, T, Vp) or None, mean loss or None).
        With boundaries the logits are the LM head's output through the logits boundary (what the
        trainer stores in evaluation), and the loss reads them times the logit scale."""
        B, T = idx.shape
        assert T <= self.cfg.max_seq_len, f"T={T} exceeds max_seq_len={self.cfg.max_seq_len}"
        bd = self.bd
        pos = torch.arange(T, device=idx.device)
        x = bd.embedding(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        x = bd.norm_output(self.lnf(x))
        logits = bd.logits(F.linear(x, self.wte.weight))  # tied, all Vp columns
        loss = None
        if targets is not None and self.loss_over_padded_vocab:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
        elif targets is not None:
            V = self.cfg.vocab_size
            z = logits[..., :V] if bd.logit_scale == 1.0 else bd.logit_scale * logits[..., :V]
            loss = F.cross_entropy(z.reshape(-1, V), targets.reshape(-1))
        return (logits if return_logits else None), loss

    def token_losses(self, idx, targets):
        """(B, T) cross-entropy of every position, read from the logits as forward's loss reads them (the
        trainer's per-position losses, acts.losses)."""
        logits, _ = self(idx)
        V = self.cfg.vocab_size
        z = logits[..., :V] if self.bd.logit_scale == 1.0 else self.bd.logit_scale * logits[..., :V]
        return F.cross_entropy(z.reshape(-1, V), targets.reshape(-1), reduction="none").view(targets.shape)

    @torch.no_grad()
    def init_weights(self, seed=0):
        """The trainer's init, drawn from one generator in parameter order (see module doc).
        Deterministic for a given device; the reference files are made on the CPU."""
        dev = self.wte.weight.device
        g = torch.Generator(device=dev)
        g.manual_seed(seed)
        std = 0.02
        proj_std = 0.02 / math.sqrt(2 * self.cfg.num_layers)
        self.wte.weight.normal_(0.0, std, generator=g)
        self.wte.weight[self.cfg.vocab_size:].zero_()     # padded rows: drawn, then zeroed
        self.wpe.weight.normal_(0.0, std, generator=g)
        for blk in self.blocks:
            blk.ln1.weight.fill_(1.0)
            blk.ln1.bias.zero_()
            blk.qkv.weight.normal_(0.0, std, generator=g)
            blk.qkv.bias.zero_()
            blk.attproj.weight.normal_(0.0, proj_std, generator=g)
            blk.attproj.bias.zero_()
            blk.ln2.weight.fill_(1.0)
            blk.ln2.bias.zero_()
            blk.fc.weight.normal_(0.0, std, generator=g)
            blk.fc.bias.zero_()
            blk.fcproj.weight.normal_(0.0, proj_std, generator=g)
            blk.fcproj.bias.zero_()
        self.lnf.weight.fill_(1.0)
        self.lnf.bias.zero_()


# ----------------------------------------------------------------------------------------------
# llm.c flat parameter order

LLMC_NAMES = ["wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
              "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb"]
DECAYED = {"wte", "wpe", "qkvw", "attprojw", "fcw", "fcprojw"}   # the 2-D tensors
LN_WEIGHTS = {"ln1w", "ln2w", "lnfw"}


def llmc_sizes(cfg):
    """[(name, numel)] of the 16 llm.c tensors, in file order."""
    Vp, C, L, maxT = cfg.padded_vocab_size, cfg.channels, cfg.num_layers, cfg.max_seq_len
    return list(zip(LLMC_NAMES, [
        Vp * C, maxT * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
        L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C]))


def llmc_offsets(cfg):
    """{name: (offset, numel)} into the flat parameter vector."""
    out, off = {}, 0
    for name, n in llmc_sizes(cfg):
        out[name] = (off, n)
        off += n
    return out


def num_params(cfg):
    return sum(n for _, n in llmc_sizes(cfg))


def llmc_tensors(model):
    """[(name, [tensor per layer or the single tensor])] in llm.c order (Parameters, not copies)."""
    b = model.blocks
    return [
        ("wte", [model.wte.weight]), ("wpe", [model.wpe.weight]),
        ("ln1w", [x.ln1.weight for x in b]), ("ln1b", [x.ln1.bias for x in b]),
        ("qkvw", [x.qkv.weight for x in b]), ("qkvb", [x.qkv.bias for x in b]),
        ("attprojw", [x.attproj.weight for x in b]), ("attprojb", [x.attproj.bias for x in b]),
        ("ln2w", [x.ln2.weight for x in b]), ("ln2b", [x.ln2.bias for x in b]),
        ("fcw", [x.fc.weight for x in b]), ("fcb", [x.fc.bias for x in b]),
        ("fcprojw", [x.fcproj.weight for x in b]), ("fcprojb", [x.fcproj.bias for x in b]),
        ("lnfw", [model.lnf.weight]), ("lnfb", [model.lnf.bias]),
    ]


@torch.no_grad()
def params_to_flat(model):
    """All parameters as one 1-D tensor in llm.c order (model's dtype and device)."""
    return torch.cat([t.reshape(-1) for _, ts in llmc_tensors(model) for t in ts])


@torch.no_grad()
def grads_to_flat(model):
    """All gradients (zeros where .grad is None) as one 1-D tensor in llm.c order."""
    return torch.cat([(t.grad if t.grad is not None else torch.zeros_like(t)).reshape(-1)
                      for _, ts in llmc_tensors(model) for t in ts])


@torch.no_grad()
def flat_to_params(model, flat):
    """Copy a 1-D llm.c-ordered vector (any dtype/device, numpy or torch) into the model."""
    if isinstance(flat, np.ndarray):
        flat = torch.from_numpy(flat)
    n = num_params(model.cfg)
    if flat.numel() != n:
        raise ValueError(f"flat parameter vector has {flat.numel()} elements, model needs {n}")
    off = 0
    for _, ts in llmc_tensors(model):
        for t in ts:
            k = t.numel()
            t.copy_(flat[off:off + k].view(t.shape).to(device=t.device, dtype=t.dtype))
            off += k


def read_llmc_header(path):
    """(GPTConfig, version) from an llm.c model file header; ValueError if it is not one."""
    hdr = np.fromfile(path, dtype="<i4", count=HEADER_INTS)
    if hdr.size != HEADER_INTS or hdr[0] != MODEL_MAGIC:
        raise ValueError(f"{path}: not an llm.c model file (bad magic)")
    version = int(hdr[1])
    if version not in (MODEL_VERSION_FP32, MODEL_VERSION_BF16):
        raise ValueError(f"{path}: unsupported llm.c model version {version} (want 3 or 5)")
    cfg = GPTConfig(max_seq_len=int(hdr[2]), vocab_size=int(hdr[3]), num_layers=int(hdr[4]),
                    num_heads=int(hdr[5]), channels=int(hdr[6]), padded_vocab_size=int(hdr[7]))
    return cfg, version


def read_llmc_params(path):
    """(GPTConfig, float32 numpy vector of all parameters) from an llm.c model file."""
    cfg, version = read_llmc_header(path)
    n = num_params(cfg)
    elem = 4 if version == MODEL_VERSION_FP32 else 2
    want = HEADER_INTS * 4 + n * elem
    have = os.path.getsize(path)
    if have != want:
        raise ValueError(f"{path}: size {have} bytes, header implies {want}")
    if version == MODEL_VERSION_FP32:
        flat = np.fromfile(path, dtype="<f4", count=n, offset=HEADER_INTS * 4)
    else:  # bfloat16 = upper 16 bits of a float32
        raw = np.fromfile(path, dtype="<u2", count=n, offset=HEADER_INTS * 4)
        flat = (raw.astype(np.uint32) << 16).view(np.float32)
    return cfg, flat


def load_llmc_params(model, path):
    """Load an llm.c model file (version 3 fp32 or 5 bf16) into `model`; shapes must match."""
    cfg, flat = read_llmc_params(path)
    if cfg != model.cfg:
        raise ValueError(f"{path}: file shape {cfg} does not match the model's {model.cfg}")
    flat_to_params(model, flat)
    return model


def atomic_write(path, chunks):
    """Write byte-like chunks / numpy arrays to `path` via a temp name in the same dir + os.replace."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".", suffix=".tmp", dir=d)
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)              # mkstemp makes 0600; give the usual permissions
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                if isinstance(c, np.ndarray):
                    c.tofile(f)
                else:
                    f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def llmc_model_header(cfg):
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:8] = [MODEL_MAGIC, MODEL_VERSION_FP32, cfg.max_seq_len, cfg.vocab_size,
               cfg.num_layers, cfg.num_heads, cfg.channels, cfg.padded_vocab_size]
    return hdr


def write_llmc_model(path, cfg, flat):
    """Write an llm.c version-3 (float32) model file from a flat llm.c-ordered vector."""
    flat = flat.detach().cpu().numpy() if torch.is_tensor(flat) else np.asarray(flat)
    flat = np.ascontiguousarray(flat, dtype="<f4")
    assert flat.size == num_params(cfg)
    atomic_write(path, [llmc_model_header(cfg), flat])


def build_model(descriptor, use_sdpa=False, seed=0, device="cpu", dtype=torch.float32, init=True,
                loss_over_padded_vocab=False):
    """GPT of the given size with the trainer's init (seeded), or loaded from an llm.c .bin.

    descriptor: "d6|d12|d24|d36|d48", "gpt2:dN", "gpt3:cC", or a path to an llm.c model file.
    init=False leaves the parameters uninitialized (allocated only) -- use when loading weights.
    loss_over_padded_vocab: see GPT (False, the trainer's loss, for everything but the bench's peers).
    """
    path = None
    if descriptor.endswith(".bin"):
        path = descriptor
        cfg, _ = read_llmc_header(path)
    else:
        cfg = parse_descriptor(descriptor)
    with torch.device("meta"):                 # skip nn.Linear's own (wasted) default init
        model = GPT(cfg, use_sdpa=use_sdpa, loss_over_padded_vocab=loss_over_padded_vocab)
    model = model.to_empty(device=device)
    if path is not None:
        load_llmc_params(model, path)
    elif init:
        model.init_weights(seed)
    return model.to(dtype=dtype)


# ----------------------------------------------------------------------------------------------
# reference state


@dataclass(frozen=True)
class OptConfig:
    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1
    grad_clip: float = 1.0


@torch.no_grad()
def perturb_flat(flat, cfg, seed):
    """In place on a float32 flat vector: LayerNorm weights 1 + N(0, 0.1); LayerNorm biases and
    all Linear biases N(0, 0.02); wte/wpe and the Linear weights untouched. One generator
    (seed), one draw per llm.c tensor, in llm.c order."""
    g = torch.Generator().manual_seed(seed)
    for name, (off, n) in llmc_offsets(cfg).items():
        if name in DECAYED:
            continue
        z = torch.randn(n, generator=g, dtype=flat.dtype)
        if name in LN_WEIGHTS:
            flat[off:off + n] = 1.0 + 0.1 * z
        else:
            flat[off:off + n] = 0.02 * z


def make_tokens(n, V, gen):
    """n tokens: a random half of the positions uniform in [0, V), the other half in [0, 64)."""
    wide = torch.randint(0, V, (n,), generator=gen)
    narrow = torch.randint(0, 64, (n,), generator=gen)
    pick_narrow = torch.zeros(n, dtype=torch.bool)
    pick_narrow[torch.randperm(n, generator=gen)[: n // 2]] = True
    return torch.where(pick_narrow, narrow, wide)


def state_header(B, T, cfg, nsteps, nparams, boundaries_code=0):
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:9] = [STATE_MAGIC, STATE_VERSION, B, T, cfg.vocab_size, cfg.padded_vocab_size, nsteps,
               nparams, boundaries_code]
    return hdr


def compute_reference(cfg, B, T, nsteps, seed, opt=OptConfig(), verify_adamw=True, log=print,
                      boundaries="none"):
    """Returns a dict of everything written to the two files (numpy arrays, float32/int32)."""
    torch.use_deterministic_algorithms(True)
    if T > cfg.max_seq_len:
        raise ValueError(f"T={T} exceeds max_seq_len={cfg.max_seq_len}")
    nparams = num_params(cfg)
    if nparams >= 2**31:
        raise ValueError(f"{nparams} parameters do not fit the int32 header field")
    t0 = time.time()

    # float32 init + perturbation; the file holds exactly these values, and the float64 run
    # starts from them (float32 -> float64 is exact).
    bd = BOUNDARIES[boundaries]()
    with torch.device("meta"):
        model = GPT(cfg, use_sdpa=False, boundaries=bd)
    model = model.to_empty(device="cpu")
    model.init_weights(seed)
    flat32 = params_to_flat(model)
    perturb_flat(flat32, cfg, seed + 1)
    flat_to_params(model, flat32)
    model = model.double()
    model.train()

    gen = torch.Generator().manual_seed(seed + 2)
    inputs = make_tokens(B * T, cfg.vocab_size, gen).view(B, T)   # inputs first,
    targets = make_tokens(B * T, cfg.vocab_size, gen).view(B, T)  # then targets
    # The training trajectory takes a fresh batch every step, as training does (step 0's batch is the
    # one above). Repeating one batch instead memorises it: the gradient norm then spikes to ~50 and
    # the loss jumps, which amplified the BF16 build's rounding noise about 40x over 10 steps.
    step_inputs, step_targets = [inputs], [targets]
    for _ in range(1, nsteps):
        step_inputs.append(make_tokens(B * T, cfg.vocab_size, gen).view(B, T))
        step_targets.append(make_tokens(B * T, cfg.vocab_size, gen).view(B, T))
    t_init = time.time() - t0
    log(f"init: {t_init:.2f}s ({nparams:,} parameters, B={B} T={T})")

    params = [p for _, ts in llmc_tensors(model) for p in ts]
    assert len(params) == len(list(model.parameters()))
    decay = [p for p in params if p.dim() == 2]
    no_decay = [p for p in params if p.dim() != 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opt.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=opt.lr, betas=(opt.beta1, opt.beta2), eps=opt.eps, foreach=False)

    # Our own AdamW, run alongside torch's on the same (clipped) gradients, to assert that
    # torch.optim.AdamW does exactly this (the CUDA trainer implements this formula):
    #   t = step (1-based); g = clipped gradient
    #   m = b1 m + (1-b1) g;  v = b2 v + (1-b2) g^2
    #   p -= lr * ( (m/(1-b1^t)) / (sqrt(v/(1-b2^t)) + eps) + wd * p )
    # with wd = weight_decay for the 2-D tensors (wte, wpe, qkvw, attprojw, fcw, fcprojw), else 0.
    # Gradient clipping (torch.nn.utils.clip_grad_norm_): norm = sqrt(sum of g^2 over ALL
    # parameters); g *= min(1, clip / (norm + 1e-6)).
    if verify_adamw:
        shadow = [(p.detach().clone(), torch.zeros_like(p), torch.zeros_like(p),
                   opt.weight_decay if p.dim() == 2 else 0.0) for p in params]
        biggest = max(p.numel() for p in params)
        scratch = (torch.empty(biggest, dtype=torch.float64), torch.empty(biggest, dtype=torch.float64))

    losses = np.zeros(nsteps, dtype=np.float64)
    norms = np.zeros(nsteps, dtype=np.float64)
    out = {}
    t_fb = t_opt = 0.0
    max_adamw_diff = 0.0
    for k in range(max(nsteps, 1)):
        ta = time.time()
        optimizer.zero_grad(set_to_none=False)
        x = step_inputs[k] if k < nsteps else inputs
        y = step_targets[k] if k < nsteps else targets
        logits, loss = model(x, y, return_logits=(k == 0))
        loss.backward()
        t_fb += time.time() - ta
        if k == 0:
            out["logits"] = logits.detach().to(torch.float32).numpy().reshape(-1)
            out["loss"] = float(loss.item())
            out["grads64"] = grads_to_flat(model)
            del logits
        if k >= nsteps:
            break
        tb = time.time()
        my_norm = math.sqrt(sum(float(torch.dot(p.grad.view(-1), p.grad.view(-1))) for p in params))
        norm = float(torch.nn.utils.clip_grad_norm_(params, opt.grad_clip, foreach=False))
        assert abs(my_norm - norm) <= 1e-12 * max(norm, 1.0), (my_norm, norm)
        losses[k] = float(loss.item())
        norms[k] = norm
        if verify_adamw:
            t = k + 1
            bc1 = 1.0 - opt.beta1 ** t
            bc2 = 1.0 - opt.beta2 ** t
            with torch.no_grad():
                for p, (sp, m, v, wd) in zip(params, shadow):
                    g = p.grad
                    m.mul_(opt.beta1).add_(g, alpha=1.0 - opt.beta1)
                    v.mul_(opt.beta2).addcmul_(g, g, value=1.0 - opt.beta2)
                    denom = torch.div(v, bc2, out=scratch[0][:v.numel()].view(v.shape))
                    denom.sqrt_().add_(opt.eps)
                    upd = torch.div(m, bc1, out=scratch[1][:m.numel()].view(m.shape))
                    upd.div_(denom)
                    if wd != 0.0:
                        upd.add_(sp, alpha=wd)
                    sp.sub_(upd, alpha=opt.lr)
        optimizer.step()
        if verify_adamw:
            with torch.no_grad():
                for p, (sp, _, _, _) in zip(params, shadow):
                    diff = torch.sub(p, sp, out=scratch[0][:p.numel()].view(p.shape))
                    max_adamw_diff = max(max_adamw_diff, float(diff.abs_().max()))
        t_opt += time.time() - tb
    if verify_adamw:
        # parameters are O(1e-2..1), updates O(lr); allow only float64 rounding differences
        assert max_adamw_diff < 1e-12, f"torch AdamW differs from the documented formula: {max_adamw_diff}"
    log(f"forward+backward: {t_fb:.2f}s total ({t_fb / max(nsteps, 1):.2f}s/step), "
        f"clip+AdamW(+check): {t_opt:.2f}s")
    if verify_adamw:
        log(f"AdamW matches the documented formula: max |p_torch - p_ours| = {max_adamw_diff:.3e}")

    grads64 = out.pop("grads64")
    padded = grads64[: cfg.padded_vocab_size * cfg.channels].view(cfg.padded_vocab_size, -1)[cfg.vocab_size:]
    assert bool((padded == 0).all()), "padded wte rows received gradient"
    out["grads"] = grads64.to(torch.float32).numpy()
    out["grad_max_abs"] = {name: float(grads64[off:off + n].abs().max())
                           for name, (off, n) in llmc_offsets(cfg).items()}
    del grads64
    out.update(cfg=cfg, B=B, T=T, nsteps=nsteps, nparams=nparams, opt=opt, boundaries=bd,
               params=flat32.numpy().astype("<f4"),
               inputs=inputs.numpy().reshape(-1).astype("<i4"),
               targets=targets.numpy().reshape(-1).astype("<i4"),
               losses=losses.astype("<f4"), grad_norms=norms.astype("<f4"),
               step_inputs=np.concatenate([t.numpy().reshape(-1) for t in step_inputs]).astype("<i4")
               if nsteps else np.zeros(0, "<i4"),
               step_targets=np.concatenate([t.numpy().reshape(-1) for t in step_targets]).astype("<i4")
               if nsteps else np.zeros(0, "<i4"),
               losses64=losses, norms64=norms)
    return out


def make_eval_examples(cfg, T, seed, count=EVAL_EXAMPLES):
    """`count` multiple-choice examples for the trainer's HellaSwag scoring, from their own generator (seed + 3, so
    nothing else the reference draws changes): contexts of 1 to 40 tokens, endings of 3 to 24 (each context and
    ending within T), tokens as make_tokens draws them; four endings, but two and three in every eighth
    example (so several examples share a batch of 4 rows in other ways than HellaSwag's); a random label.
    Returns (context, [endings], label) triples of int lists."""
    gen = torch.Generator().manual_seed(seed + 3)

    def draw(lo, hi):  # an integer in [lo, hi]
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    out = []
    for i in range(count):
        num_endings = 4 if i % 8 else (2 if i % 16 == 0 else 3)
        ctx_len = draw(1, min(40, T - 3))
        ctx = make_tokens(ctx_len, cfg.vocab_size, gen).tolist()
        endings = [make_tokens(draw(3, min(24, T - ctx_len)), cfg.vocab_size, gen).tolist() for _ in range(num_endings)]
        out.append((ctx, endings, draw(0, num_endings - 1)))
    return out


@torch.no_grad()
def compute_eval_reference(ref, T, seed, log=print):
    """The eval examples (make_eval_examples) and, in float64 at the reference's initial parameters (ref["params"],
    the ones ref_model.bin holds) and boundaries, the mean cross-entropy of each ending's tokens given the context
    (position len(context) + i - 1 predicts ending token i) and each example's choice, the ending of the lowest
    mean loss (the first of equal ones). Adds eval_examples, eval_losses (float64 per ending, in file order) and
    eval_choices to ref."""
    t0 = time.time()
    cfg = ref["cfg"]
    with torch.device("meta"):
        model = GPT(cfg, use_sdpa=False, boundaries=ref["boundaries"])
    model = model.to_empty(device="cpu")
    flat_to_params(model, ref["params"])
    model = model.double().eval()
    examples = make_eval_examples(cfg, T, seed)
    losses, choices = [], []
    for ctx, endings, _ in examples:
        # (the rows end at the example's longest: the model is causal, so what the trainer's rows hold beyond
        # that, up to T, changes nothing at the positions scored)
        length = len(ctx) + max(len(e) for e in endings)
        x = torch.zeros(len(endings), length, dtype=torch.int64)
        y = torch.zeros(len(endings), length, dtype=torch.int64)
        for r, e in enumerate(endings):
            row = torch.tensor(ctx + e, dtype=torch.int64)
            x[r, :len(row)] = row
            y[r, :len(row) - 1] = row[1:]
        per_position = model.token_losses(x, y)
        means = [float(per_position[r, len(ctx) - 1:len(ctx) - 1 + len(e)].mean()) for r, e in enumerate(endings)]
        losses += means
        choices.append(min(range(len(means)), key=lambda k: (means[k], k)))
    ref.update(eval_examples=examples, eval_losses=np.array(losses, dtype="<f8"),
               eval_choices=np.array(choices, dtype="<i4"))
    margins, k = [], 0
    for _, endings, _ in examples:
        best, second = sorted(losses[k:k + len(endings)])[:2]
        margins.append(second - best)
        k += len(endings)
    log(f"eval examples: {len(examples)} ({len(losses)} endings) in {time.time() - t0:.2f}s; margin between the best "
        f"and the second ending: min {min(margins):.4f}, median {float(np.median(margins)):.4f}")


def write_eval_reference(ref, out_dir):
    """ref_hellaswag.bin: the eval examples in llm.c's eval file format (dev/data/hellaswag.py's writer).
    ref_hellaswag_scores.bin: int32[256] header (20241124, 1, examples, endings in all, boundaries, 0...),
                      float64[endings] the mean loss of each ending (examples in order, their endings in order),
                      int32[examples] each example's choice. Little-endian, no padding."""
    hellaswag.write_eval_file(os.path.join(out_dir, "ref_hellaswag.bin"), ref["eval_examples"])
    hdr = np.zeros(HEADER_INTS, dtype="<i4")
    hdr[:5] = [EVAL_SCORES_MAGIC, EVAL_SCORES_VERSION, len(ref["eval_examples"]), ref["eval_losses"].size,
               ref["boundaries"].code]
    atomic_write(os.path.join(out_dir, "ref_hellaswag_scores.bin"), [hdr, ref["eval_losses"], ref["eval_choices"]])


def hparams_array(opt):
    hp = np.zeros(NUM_HPARAMS, dtype="<f4")
    hp[:6] = [opt.lr, opt.beta1, opt.beta2, opt.eps, opt.weight_decay, opt.grad_clip]
    return hp


def write_reference(ref, out_dir):
    """ref_model.bin: int32[256] header (20240326, 3, maxT, V, L, NH, C, Vp, 0...),
                      float32[num_params] perturbed initial parameters in llm.c order.
    ref_state.bin:    int32[256] header (20241123, 2, B, T, V, Vp, nsteps, num_params, boundaries,
                      0...) (boundaries: 0 none, 1 Q1.15 true-forward),
                      float32[16] (lr, beta1, beta2, eps, weight_decay, grad_clip, 0...),
                      int32[B*T] inputs, int32[B*T] targets, float32[B*T*Vp] logits,
                      float32 loss, float32[num_params] grads, float32[nsteps] losses,
                      float32[nsteps] grad_norms, int32[nsteps*B*T] step inputs,
                      int32[nsteps*B*T] step targets (step k trains on batch k; batch 0 is the
                      inputs/targets above).  All little-endian, no padding."""
    os.makedirs(out_dir, exist_ok=True)
    cfg = ref["cfg"]
    write_llmc_model(os.path.join(out_dir, "ref_model.bin"), cfg, ref["params"])
    atomic_write(os.path.join(out_dir, "ref_state.bin"), [
        state_header(ref["B"], ref["T"], cfg, ref["nsteps"], ref["nparams"], ref["boundaries"].code),
        hparams_array(ref["opt"]),
        ref["inputs"], ref["targets"],
        np.ascontiguousarray(ref["logits"], dtype="<f4"),
        np.array([ref["loss"]], dtype="<f4"),
        np.ascontiguousarray(ref["grads"], dtype="<f4"),
        ref["losses"], ref["grad_norms"],
        ref["step_inputs"], ref["step_targets"],
    ])


def read_state(path):
    """Parse ref_state.bin into a dict of numpy arrays (independent of the writer's code path)."""
    raw = open(path, "rb").read()
    hdr = np.frombuffer(raw, dtype="<i4", count=HEADER_INTS)
    if hdr[0] != STATE_MAGIC or hdr[1] != STATE_VERSION:
        raise ValueError(f"{path}: bad magic/version {hdr[0]}/{hdr[1]}")
    B, T, V, Vp, nsteps, nparams = (int(x) for x in hdr[2:8])
    if int(hdr[8]) not in (c.code for c in BOUNDARIES.values()) or any(int(x) != 0 for x in hdr[9:]):
        raise ValueError(f"{path}: unknown boundaries code {int(hdr[8])} or nonzero reserved header ints")
    st = {"B": B, "T": T, "V": V, "Vp": Vp, "nsteps": nsteps, "nparams": nparams}
    off = HEADER_INTS * 4
    for name, dt, n in [("hparams", "<f4", NUM_HPARAMS), ("inputs", "<i4", B * T),
                        ("targets", "<i4", B * T), ("logits", "<f4", B * T * Vp),
                        ("loss", "<f4", 1), ("grads", "<f4", nparams),
                        ("losses", "<f4", nsteps), ("grad_norms", "<f4", nsteps),
                        ("step_inputs", "<i4", nsteps * B * T), ("step_targets", "<i4", nsteps * B * T)]:
        st[name] = np.frombuffer(raw, dtype=dt, count=n, offset=off)
        off += 4 * n
    if off != len(raw):
        raise ValueError(f"{path}: {len(raw)} bytes, layout implies {off}")
    return st


def print_summary(ref, log=print):
    cfg = ref["cfg"]
    log(f"model L={cfg.num_layers} C={cfg.channels} NH={cfg.num_heads} maxT={cfg.max_seq_len} "
        f"V={cfg.vocab_size} Vp={cfg.padded_vocab_size} params={ref['nparams']:,}")
    log(f"initial loss: {ref['loss']:.10f}  (ln V = {math.log(cfg.vocab_size):.6f})")
    log(f"initial grad norm: {ref['norms64'][0]:.10f}" if ref["nsteps"] else "no steps")
    log("step  loss            grad_norm (pre-clip)")
    for k in range(ref["nsteps"]):
        log(f"{k:4d}  {ref['losses64'][k]:.10f}  {ref['norms64'][k]:.10f}")
    log("max |grad| per tensor at init:")
    for name, v in ref["grad_max_abs"].items():
        log(f"  {name:9s} {v:.6e}")


# ----------------------------------------------------------------------------------------------
# self-test


def run_checks(ref, out_dir, log=print):
    """--check: parameter count, file round trip, loss sanity, reload + recompute, sdpa parity."""
    ok = True

    def check(cond, what):
        nonlocal ok
        log(("PASS " if cond else "FAIL ") + what)
        ok = ok and bool(cond)

    # 1. parameter count of d12, from the module itself (meta: no memory) and from the table
    d12 = parse_descriptor("d12")
    with torch.device("meta"):
        m = GPT(d12)
    n_mod = sum(p.numel() for p in m.parameters())
    check(n_mod == D12_NUM_PARAMS and num_params(d12) == D12_NUM_PARAMS,
          f"d12 parameter count {n_mod:,} == {D12_NUM_PARAMS:,}")
    # every descriptor parses and its module agrees with the llm.c size table
    for d in ["d6", "d24", "d36", "d48", "gpt2:d12", "gpt3:c768"]:
        c = parse_descriptor(d)
        with torch.device("meta"):
            mm = GPT(c)
        check(sum(p.numel() for p in mm.parameters()) == num_params(c),
              f"{d}: module size == llm.c table size ({num_params(c):,})")

    cfg = ref["cfg"]
    # 2. ref_model.bin round trip
    mpath = os.path.join(out_dir, "ref_model.bin")
    hdr = np.fromfile(mpath, dtype="<i4", count=HEADER_INTS)
    check(list(hdr[:8]) == [MODEL_MAGIC, 3, cfg.max_seq_len, cfg.vocab_size, cfg.num_layers,
                            cfg.num_heads, cfg.channels, cfg.padded_vocab_size]
          and not hdr[8:].any(), "ref_model.bin header")
    check(os.path.getsize(mpath) == 1024 + 4 * ref["nparams"], "ref_model.bin size")
    params = np.fromfile(mpath, dtype="<f4", offset=1024)
    check(np.array_equal(params.view("<u4"), ref["params"].view("<u4")),
          "ref_model.bin parameters bit-identical")
    Vp, C, V = cfg.padded_vocab_size, cfg.channels, cfg.vocab_size
    check(not params[V * C:Vp * C].any(), "padded wte rows are zero in the file")

    # 3. ref_state.bin round trip
    st = read_state(os.path.join(out_dir, "ref_state.bin"))
    check((st["B"], st["T"], st["V"], st["Vp"], st["nsteps"], st["nparams"]) ==
          (ref["B"], ref["T"], V, Vp, ref["nsteps"], ref["nparams"]), "ref_state.bin header")
    check(np.array_equal(st["hparams"], hparams_array(ref["opt"])), "hyperparameters")
    for name in ["inputs", "targets", "logits", "grads", "losses", "grad_norms", "step_inputs", "step_targets"]:
        a, b = st[name], np.asarray(ref[name])
        check(a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32)),
              f"ref_state.bin {name} bit-identical")
    check(st["loss"][0] == np.float32(ref["loss"]), "ref_state.bin loss")
    check(ref["nsteps"] == 0 or st["losses"][0] == st["loss"][0], "losses[0] == loss")
    check(st["inputs"].min() >= 0 and st["inputs"].max() < V and
          st["targets"].min() >= 0 and st["targets"].max() < V, "tokens in [0, V)")
    n_dup = st["inputs"].size - np.unique(st["inputs"]).size
    check(n_dup > 0, f"inputs contain repeated tokens ({n_dup} repeats)")
    check(not st["grads"][V * C:Vp * C].any(), "padded wte rows have zero gradient")
    check(abs(float(st["loss"][0]) - math.log(V)) < 0.5,
          f"initial loss {float(st['loss'][0]):.4f} within 0.5 of ln V = {math.log(V):.4f}")
    check(np.all(np.isfinite(st["grads"])) and np.all(np.isfinite(st["logits"])), "finite")
    check(all(st["grads"][o:o + n].any() for _, (o, n) in llmc_offsets(cfg).items()),
          "every tensor has a nonzero gradient")

    # 4. reload the file through load_llmc_params (eager + sdpa) and recompute in float64
    B, T = st["B"], st["T"]
    x = torch.from_numpy(st["inputs"].astype(np.int64)).view(B, T)
    y = torch.from_numpy(st["targets"].astype(np.int64)).view(B, T)
    losses = {}
    for sdpa in (False, True):
        m = build_model(mpath, use_sdpa=sdpa, dtype=torch.float64)
        check(np.array_equal(params_to_flat(m).to(torch.float32).numpy().view("<u4"),
                             params.view("<u4")), f"load_llmc_params/params_to_flat round trip (sdpa={sdpa})")
        with torch.no_grad():
            logits, loss = m(x, y)
        losses[sdpa] = float(loss)
        if not sdpa:
            lg = logits.to(torch.float32).numpy().reshape(-1)
            check(np.array_equal(lg, st["logits"]), "recomputed logits == stored logits")
        del m, logits
    check(np.float32(losses[False]) == st["loss"][0], "recomputed loss == stored loss")
    check(abs(losses[True] - losses[False]) < 1e-10,
          f"sdpa loss == explicit-softmax loss (diff {abs(losses[True] - losses[False]):.2e})")
    log("CHECK " + ("PASSED" if ok else "FAILED"))
    return ok


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--write-reference", action="store_true", help="compute and write ref files")
    ap.add_argument("--check", action="store_true",
                    help="write the reference (to --out, or a temp dir) and self-test it")
    ap.add_argument("--out", default=None, help="output directory (default dev/reference/out)")
    ap.add_argument("--model", default="d12", help="model descriptor (default d12)")
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--T", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--boundaries", choices=sorted(BOUNDARIES), default="none",
                    help="forward boundaries of the recipe to mirror (q115: the Q1.15 true-forward recipe)")
    ap.add_argument("--threads", type=int, default=0, help="torch CPU threads (0 = torch default)")
    ap.add_argument("--no-verify-adamw", action="store_true",
                    help="skip running our AdamW alongside torch's (saves time and memory)")
    args = ap.parse_args(argv)
    if not (args.write_reference or args.check):
        ap.error("nothing to do: pass --write-reference and/or --check")
    if args.B <= 0 or args.T <= 0 or args.steps < 0:
        ap.error("--B and --T must be positive, --steps non-negative")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        cfg = parse_descriptor(args.model)
    except ValueError as e:
        ap.error(str(e))

    out_dir = args.out
    tmpdir = None
    if out_dir is None:
        if args.write_reference:
            out_dir = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                   "out" if args.boundaries == "none" else f"out_{args.boundaries}")
        else:
            tmpdir = tempfile.TemporaryDirectory(prefix="gpt_reference_check_")
            out_dir = tmpdir.name

    t0 = time.time()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; model {args.model}; "
          f"out {out_dir}")
    if args.check and args.boundaries != "none":
        ap.error("--check verifies the plain reference; use it without --boundaries")
    ref = compute_reference(cfg, args.B, args.T, args.steps, args.seed,
                            verify_adamw=not args.no_verify_adamw, boundaries=args.boundaries)
    compute_eval_reference(ref, args.T, args.seed)
    t1 = time.time()
    write_reference(ref, out_dir)
    write_eval_reference(ref, out_dir)
    t2 = time.time()
    print(f"wrote {os.path.join(out_dir, 'ref_model.bin')}, ref_state.bin, ref_hellaswag.bin and "
          f"ref_hellaswag_scores.bin in {t2 - t1:.2f}s")
    print_summary(ref)
    print(f"compute: {t1 - t0:.2f}s, total: {time.time() - t0:.2f}s")
    ok = True
    if args.check:
        tc = time.time()
        ok = run_checks(ref, out_dir)
        print(f"check: {time.time() - tc:.2f}s")
    if tmpdir is not None:
        tmpdir.cleanup()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
