"""Shared helpers for the dataset scripts: find local files, build the GPT-2 encoding, write
llm.c-format token shards and the tokenizer file.

Token shard (read by llmc/dataloader.h), little-endian:
    256 x int32 header: [0] = 20240520 (magic), [1] = 1 (version), [2] = N (token count), rest 0
    N x uint16 token ids
Tokenizer file (read by llmc/tokenizer.h), little-endian:
    256 x uint32 header: [0] = 20240328 (magic), [1] = 2 (version), [2] = vocab size, [3] = EOT id, rest 0
    per token id in order: uint8 length L (1..255), then L raw bytes

All outputs are written to a temporary name next to the target and renamed into place, so an
interrupted run never leaves a half-written file under the real name.
"""
import os
import sys

import numpy as np

SHARD_MAGIC = 20240520
SHARD_VERSION = 1
TOKENIZER_MAGIC = 20240328
TOKENIZER_VERSION = 2
HEADER_INTS = 256
GPT2_VOCAB = 50257
GPT2_EOT = 50256

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def candidate_dirs(data_dir=None):
    """Where local inputs are looked for, in order: --data-dir, $LLMC_SHARED_DATA,
    <repo>/../shared/data, <repo>/shared/data."""
    dirs = []
    if data_dir:
        dirs.append(data_dir)
    env = os.environ.get("LLMC_SHARED_DATA")
    if env:
        dirs.append(env)
    dirs.append(os.path.join(os.path.dirname(REPO_ROOT), "shared", "data"))
    dirs.append(os.path.join(REPO_ROOT, "shared", "data"))
    return dirs


def find_local_file(name, data_dir=None):
    """First existing `name` in candidate_dirs(), or None."""
    for d in candidate_dirs(data_dir):
        p = os.path.join(d, name)
        if os.path.isfile(p):
            return p
    return None


# GPT-2's pre-tokenization regex (the one in OpenAI's gpt-2 encoder.py and tiktoken's "gpt2"):
# English contractions, runs of letters / digits / other symbols each with an optional leading
# space, and whitespace runs, where a run followed by a non-space gives up its last space to it.
GPT2_PAT_STR = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""


def gpt2_pat_str():
    # Prefer tiktoken's own copy so we tokenize exactly as tiktoken.get_encoding("gpt2") does
    # (newer versions spell the same pattern with possessive quantifiers, for speed).
    try:
        from tiktoken_ext.openai_public import r50k_pat_str
        return r50k_pat_str
    except Exception:
        return GPT2_PAT_STR


def get_gpt2_encoding(data_dir=None, quiet=False):
    """tiktoken's GPT-2 encoding, built from local encoder.json + vocab.bpe when they can be found
    (offline), else downloaded by tiktoken."""
    import tiktoken
    import tiktoken.load

    for d in candidate_dirs(data_dir):
        enc_json = os.path.join(d, "encoder.json")
        vocab_bpe = os.path.join(d, "vocab.bpe")
        if os.path.isfile(enc_json) and os.path.isfile(vocab_bpe):
            ranks = tiktoken.load.data_gym_to_mergeable_bpe_ranks(
                vocab_bpe_file=vocab_bpe, encoder_json_file=enc_json)
            enc = tiktoken.Encoding(
                name="gpt2",
                pat_str=gpt2_pat_str(),
                mergeable_ranks=ranks,
                special_tokens={"<|endoftext|>": GPT2_EOT},
            )
            if not quiet:
                print(f"GPT-2 BPE from {d}")
            break
    else:
        dirs = candidate_dirs(data_dir)
        print("encoder.json/vocab.bpe not found locally; asking tiktoken to download GPT-2's BPE")
        try:
            enc = tiktoken.get_encoding("gpt2")
        except Exception as e:  # offline: one line that says where to put the files, not a traceback
            reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
            sys.exit(f"error: GPT-2's encoder.json and vocab.bpe are in none of {dirs}, and downloading them failed "
                     f"({reason}); put them in a folder and pass --data-dir DIR or set LLMC_SHARED_DATA=DIR")
    if enc.n_vocab != GPT2_VOCAB or enc.eot_token != GPT2_EOT:
        sys.exit(f"error: unexpected GPT-2 encoding (vocab {enc.n_vocab}, eot {enc.eot_token})")
    return enc


def atomic_write(path, chunks):
    """Write the bytes-like objects in `chunks` to path via a temp file + os.replace."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


# GPT-2's BPE files, where tiktoken's "gpt2" encoding downloads them from
GPT2_BPE_URLS = {
    "encoder.json": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/encoder.json",
    "vocab.bpe": "https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/vocab.bpe",
}


def user_cache_dir(name):
    """$XDG_CACHE_HOME/llmc/<name>, else ~/.cache/llmc/<name>."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "llmc", name)


def download_gpt2_bpe(dest_dir):
    """encoder.json and vocab.bpe in dest_dir, fetched where missing through tiktoken's download cache (so a
    machine that has tokenized with tiktoken's "gpt2" before fetches nothing). Returns (encoder.json, vocab.bpe);
    raises whatever the download raises when offline."""
    import tiktoken.load

    paths = []
    for name in ("encoder.json", "vocab.bpe"):
        path = os.path.join(dest_dir, name)
        if not os.path.isfile(path):
            atomic_write(path, [tiktoken.load.read_file_cached(GPT2_BPE_URLS[name])])
        paths.append(path)
    return tuple(paths)


def write_datafile(path, tokens):
    """Write a token shard. tokens: any int sequence / array with values in [0, 65535]."""
    toks = np.asarray(tokens)
    if toks.size and (toks.min() < 0 or toks.max() >= 2**16):
        raise ValueError(f"{path}: token ids must fit in uint16")
    toks = toks.astype("<u2", copy=False)
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[0] = SHARD_MAGIC
    header[1] = SHARD_VERSION
    header[2] = len(toks)
    atomic_write(path, [header.tobytes(), toks.tobytes()])
    print(f"wrote {len(toks):,} tokens to {path}")


def write_tokenizer(enc, path):
    """Write the decoder table for ids 0..n_vocab-1 (the last one is <|endoftext|>)."""
    header = np.zeros(HEADER_INTS, dtype="<u4")
    header[0] = TOKENIZER_MAGIC
    header[1] = TOKENIZER_VERSION
    header[2] = enc.n_vocab
    header[3] = enc.eot_token
    parts = [header.tobytes()]
    for i in range(enc.n_vocab):
        b = enc.decode_single_token_bytes(i)
        if not 0 < len(b) < 256:
            raise ValueError(f"token {i} is {len(b)} bytes; the format allows 1..255")
        parts.append(bytes([len(b)]))
        parts.append(b)
    atomic_write(path, parts)
    print(f"wrote the {enc.n_vocab}-token GPT-2 tokenizer to {path}")
