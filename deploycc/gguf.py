"""GGUF import (llama.cpp's single-file format), read with the `gguf` package.

`load_model("model.gguf")` comes here: the architecture and hyper-parameters are read from the
metadata and mapped onto a Hugging Face-style config dict (so the architecture's own `from_hf`
builds the config), the tensors are renamed to Hugging Face names (llama.cpp's Q/K row permutation
undone for Llama), and the tokenizer is rebuilt as a Hugging Face `tokenizers` tokenizer.json (byte-level
BPE with the pre-tokenizer `tokenizer.ggml.pre` names, or a SentencePiece-style vocabulary as BPE with
byte fallback and merges derived from the scores) plus
tokenizer_config.json in `$DEPLOYCC_HOME/gguf-tokenizers/<sha256 of the GGUF header>`, which
becomes `LoadedModel.path` (the package writer copies tokenizer files from there).

Weights read through `GGUFWeights.read` are float32: F32/F16/BF16 as they are, block-quantized
tensors dequantized with `gguf.quants.dequantize` (the q0 path). `GGUFWeights.raw` gives the
stored blocks, which `deploycc.quantization.gguf_blocks` keeps packed.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from .errors import DeployError

# llama.cpp's `tokenizer.ggml.pre` names -> the Hugging Face pre-tokenizer they stand for.
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _BYTE_LEVEL]},
    "gpt2": _BYTE_LEVEL,
    "default": _BYTE_LEVEL,
    "llama-bpe": {"type": "Sequence", "pretokenizers": [
        {"type": "Split", "pattern": {"Regex": _LLAMA3_RE}, "behavior": "Isolated", "invert": False},
        {**_BYTE_LEVEL, "use_regex": False}]},
}

TOKENIZER_FORMAT = b"deploycc-gguf-tokenizer-1\n"

# GGUF tensor names (per block N) -> Hugging Face Llama names.
_LLAMA_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                 "output.weight": "lm_head.weight"}
_LLAMA_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")


def is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def _reader(path: Path):
    try:
        from gguf import GGUFReader
    except ImportError:  # pragma: no cover
        raise DeployError("reading GGUF needs the gguf package; pip install gguf") from None
    try:
        return GGUFReader(str(path))
    except Exception as e:  # truncated or damaged files fail in numpy/struct with many error types
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise DeployError(f"{path} is not a readable GGUF file (truncated or corrupted?): {msg}") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    v = f.contents()
    return v


def _permute_back(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's `permute` of Q/K rows (interleaved -> half-split rotary layout)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFWeights:
    """The Weights interface (names, shape, read) over a GGUF file, under Hugging Face names."""

    def __init__(self, path: Path, reader, n_head: int, n_head_kv: int):
        self.path = path
        self.reader = reader
        self.n_head, self.n_head_kv = n_head, n_head_kv
        self.tensors = {}
        for t in reader.tensors:
            hf = _hf_name(t.name)
            if hf is not None:
                self.tensors[hf] = t

    def __contains__(self, name: str) -> bool:
        return name in self.tensors

    def names(self) -> list[str]:
        return list(self.tensors)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(int(d) for d in reversed(self.tensors[name].shape))

    def qtype(self, name: str) -> str:
        return self.tensors[name].tensor_type.name

    def _heads(self, name: str) -> int | None:
        if name.endswith("q_proj.weight") or name.endswith("q_proj.bias"):
            return self.n_head
        if name.endswith("k_proj.weight") or name.endswith("k_proj.bias"):
            return self.n_head_kv
        return None

    def raw(self, name: str) -> np.ndarray:
        """The stored bytes as uint8 [rows, bytes per row] (Q/K rows already un-permuted)."""
        t = self.tensors[name]
        data = np.asarray(t.data)
        data = data.view(np.uint8).reshape(self.shape(name)[0], -1) if data.ndim >= 1 else data
        heads = self._heads(name)
        return _permute_back(data, heads) if heads else data

    def read(self, name: str) -> np.ndarray:
        from gguf import GGMLQuantizationType as Q
        from gguf.quants import dequantize

        t = self.tensors[name]
        shape = self.shape(name)
        try:
            if t.tensor_type == Q.F32:
                arr = np.asarray(t.data, np.float32).reshape(shape)
            elif t.tensor_type == Q.F16:
                arr = np.asarray(t.data).view(np.float16).reshape(shape).astype(np.float32)
            elif t.tensor_type == Q.BF16:
                arr = (np.asarray(t.data).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
            else:
                arr = dequantize(np.asarray(t.data), t.tensor_type).reshape(shape).astype(np.float32)
        except NotImplementedError:
            raise DeployError(f"{self.path}: tensor {t.name} has type {t.tensor_type.name}, which cannot be "
                              f"dequantized by this gguf package") from None
        heads = self._heads(name)
        return _permute_back(arr, heads) if heads else arr


def _hf_name(name: str) -> str | None:
    if name in _LLAMA_GLOBAL:
        return _LLAMA_GLOBAL[name]
    m = _BLOCK.match(name)
    if m and m.group(2) in _LLAMA_BLOCK:
        return f"model.layers.{m.group(1)}.{_LLAMA_BLOCK[m.group(2)]}.{m.group(3)}"
    return None


def hf_config(path: Path, reader) -> dict:
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise DeployError(f"{path}: GGUF architecture {arch!r} is not supported; supported: llama")

    def need(key):
        v = _field(reader, f"llama.{key}")
        if v is None:
            raise DeployError(f"{path}: GGUF metadata lacks llama.{key}")
        return v

    tokens = _field(reader, "tokenizer.ggml.tokens")
    hidden, heads = int(need("embedding_length")), int(need("attention.head_count"))
    vocab = len(tokens) if tokens is not None else int(need("vocab_size"))
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise DeployError(f"{path}: GGUF rope_freqs (Llama 3.1 rope scaling) is not supported yet")
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": int(need("feed_forward_length")),
        "num_hidden_layers": int(need("block_count")), "num_attention_heads": heads,
        "num_key_value_heads": int(_field(reader, "llama.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, "llama.attention.key_length", 0) or _field(reader, "llama.rope.dimension_count", 0)
                        or hidden // heads),
        "rms_norm_eps": float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_field(reader, "llama.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, "llama.context_length", 2048)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
    }
    scaling = _field(reader, "llama.rope.scaling.type")
    if scaling not in (None, "none"):
        if scaling != "linear":
            raise DeployError(f"{path}: GGUF rope scaling {scaling!r} is not supported yet")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": float(_field(reader, "llama.rope.scaling.factor"))}
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = _field(reader, f"tokenizer.ggml.{key}")
        if v is not None:
            cfg[hf] = int(v)
    return cfg


# ---- the tokenizer --------------------------------------------------------------------------

def _byte_level_json(pre: str, tokens: list[str], merges: list, added: list) -> dict:
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {tok: i for i, tok in enumerate(tokens)}, "merges": merges},
    }


def _spm_merges(vocab: dict[str, int], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a SentencePiece BPE vocabulary implies: every split of a piece into two pieces of
    the vocabulary, ranked by the merged piece's score (highest first), as transformers derives them."""
    merges = []
    for piece, score in scores.items():
        local = [(piece[:i], piece[i:], score) for i in range(1, len(piece))
                 if piece[:i] in vocab and piece[i:] in vocab]
        merges.extend(sorted(local, key=lambda x: (vocab[x[0]], vocab[x[1]])))
    merges.sort(key=lambda m: (m[2], len(m[0]), len(m[1])), reverse=True)
    return [(a, b) for a, b, _ in merges]


def _sentencepiece_json(reader, tokens: list[str], types: list[int], ids: dict) -> dict:
    """A SentencePiece-style (Llama 1/2, Mistral) vocabulary as a `tokenizers` BPE with byte fallback."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {tok: i for i, tok in enumerate(tokens)}
    scores = _field(reader, "tokenizer.ggml.scores") or [0.0] * len(tokens)
    unk = tokens[int(ids["unk_token"])] if ids.get("unk_token") is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(vocab, dict(zip(tokens, scores))), unk_token=unk,
                               fuse_unk=True, byte_fallback=True, dropout=None))
    prefix = bool(_field(reader, "tokenizer.ggml.add_space_prefix", True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first" if prefix else "never",
                                                 split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return json.loads(tok.to_str())


def tokenizer_files(path: Path, reader) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json (and chat_template.jinja, generation_config.json) as text."""
    model = _field(reader, "tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise DeployError(f"{path}: GGUF tokenizer model {model!r} is not supported yet "
                          f"(supported: byte-level BPE 'gpt2', SentencePiece-style 'llama')")
    pre = _field(reader, "tokenizer.ggml.pre", "default")
    if model == "gpt2" and pre not in PRE_TOKENIZERS:
        raise DeployError(f"{path}: GGUF pre-tokenizer {pre!r} is not known; known: {', '.join(sorted(PRE_TOKENIZERS))}")
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    types = list(_field(reader, "tokenizer.ggml.token_type", [1] * len(tokens)))
    merges = [m.split(" ", 1) for m in (_field(reader, "tokenizer.ggml.merges") or [])]
    special = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
               "pad_token": "padding_token_id"}
    ids = {k: _field(reader, f"tokenizer.ggml.{v}") for k, v in special.items()}
    # CONTROL (3) and USER_DEFINED (4) tokens are added tokens; the control ones are special.
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3 or i in {int(v) for v in ids.values() if v is not None}}
             for i, tok in enumerate(tokens) if types[i] in (3, 4)]
    if model == "llama":
        tj = _sentencepiece_json(reader, tokens, types, ids)
        tj["added_tokens"] = added
        add_bos = _field(reader, "tokenizer.ggml.add_bos_token", True)  # llama.cpp's default for SentencePiece
    else:
        add_bos = _field(reader, "tokenizer.ggml.add_bos_token", False)
        tj = _byte_level_json(pre, tokens, merges, added)
    if add_bos and ids["bos_token"] is not None:
        bos = tokens[int(ids["bos_token"])]
        tj["post_processor"] = {"type": "TemplateProcessing",
                                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                         {"Sequence": {"id": "B", "type_id": 1}}],
                                "special_tokens": {bos: {"id": bos, "ids": [int(ids["bos_token"])], "tokens": [bos]}}}
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": int(_field(reader, "llama.context_length", 2048)),
          "clean_up_tokenization_spaces": False}
    for k, v in ids.items():
        if v is not None and 0 <= int(v) < len(tokens):
            tc[k] = tokens[int(v)]
    files = {"tokenizer.json": json.dumps(tj, ensure_ascii=False)}
    template = _field(reader, "tokenizer.chat_template")
    if template:
        tc["chat_template"] = template
        files["chat_template.jinja"] = template
    files["tokenizer_config.json"] = json.dumps(tc, ensure_ascii=False, indent=2)
    gen = {k: int(_field(reader, f"tokenizer.ggml.{g}")) for k, g in
           (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"), ("pad_token_id", "padding_token_id"))
           if _field(reader, f"tokenizer.ggml.{g}") is not None}
    if gen:
        files["generation_config.json"] = json.dumps(gen, indent=2)
    return files


def _home() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME", Path.home() / ".cache" / "deploycc"))


def tokenizer_dir(path: Path, reader) -> Path:
    """The cache directory holding this GGUF's tokenizer files (written once, atomically)."""
    h = hashlib.sha256(TOKENIZER_FORMAT)  # a new format never reuses files an older one wrote
    with open(path, "rb") as f:
        h.update(f.read(int(reader.data_offset)))
    out = _home() / "gguf-tokenizers" / h.hexdigest()[:32]
    if (out / "tokenizer_config.json").exists():
        return out
    files = tokenizer_files(path, reader)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".tmp-"))
    try:
        for name, text in files.items():
            (tmp / name).write_text(text, encoding="utf-8")
        try:
            tmp.rename(out)
        except OSError:  # another process won the race
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def load_gguf(path: Path, source: str = "", **overrides):
    from .hub import LoadedModel
    from .models import lookup

    path = Path(path)
    reader = _reader(path)
    hf = hf_config(path, reader)
    arch = lookup(hf)
    try:
        config = arch.Config.from_hf(hf, **overrides)
    except (KeyError, ValueError) as e:
        raise DeployError(f"{path}: {e}") from None
    weights = GGUFWeights(path, reader, hf["num_attention_heads"], hf["num_key_value_heads"])
    model = LoadedModel(tokenizer_dir(path, reader), hf, arch, config, weights, source or str(path))
    model.check()
    return model
