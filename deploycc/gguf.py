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
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .errors import DeployError
from .loaded import LoadedModel, check_config

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

# GGUF tensor names (per block N) -> Hugging Face names, per llama.cpp architecture (gguf's
# constants.TENSOR_NAMES, as convert_hf_to_gguf.py writes them).
_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
           "output.weight": "lm_head.weight"}
_LLAMA_BLOCK = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}
_QK_NORM = {"attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm"}
_GEMMA_BLOCK = {**_LLAMA_BLOCK, **_QK_NORM, "post_attention_norm": "post_attention_layernorm",
                "ffn_norm": "pre_feedforward_layernorm", "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3_BLOCK = {"attn_qkv": "self_attn.qkv_proj", "attn_output": "self_attn.o_proj", "ffn_up": "mlp.gate_up_proj",
               "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


@dataclass(frozen=True)
class Arch:
    """What a llama.cpp architecture name stands for here."""
    hf: str  # the Hugging Face architecture
    model_type: str
    block: dict  # GGUF block tensor -> HF module
    permuted: bool = False  # convert_hf_to_gguf permuted the Q/K rows (Llama only)
    norms_plus_one: bool = False  # convert_hf_to_gguf stored Gemma's RMSNorm weights w as 1 + w


ARCHS = {"llama": Arch("LlamaForCausalLM", "llama", _LLAMA_BLOCK, permuted=True),
         "qwen2": Arch("Qwen2ForCausalLM", "qwen2", _LLAMA_BLOCK),
         "qwen3": Arch("Qwen3ForCausalLM", "qwen3", {**_LLAMA_BLOCK, **_QK_NORM}),
         "gemma2": Arch("Gemma2ForCausalLM", "gemma2", _GEMMA_BLOCK, norms_plus_one=True),
         "gemma3": Arch("Gemma3ForCausalLM", "gemma3_text", _GEMMA_BLOCK, norms_plus_one=True),
         "phi3": Arch("Phi3ForCausalLM", "phi3", _PHI3_BLOCK),
         # convert_hf_to_gguf's SmolLM3Model is its LlamaModel: Q/K permuted; llama.cpp skips rotation on every
         # 4th layer as transformers' default no_rope_layer_interval does
         "smollm3": Arch("SmolLM3ForCausalLM", "smollm3", _LLAMA_BLOCK, permuted=True)}
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
    from .gguf_scan import scan

    scan(path)  # counts, lengths, types, UTF-8 and tensor ranges, before the reader trusts them
    try:
        return GGUFReader(str(path))
    except MemoryError:  # not a damaged file's symptom to hide: the scan bounds what the reader allocates
        raise
    except Exception as e:  # whatever the scan missed fails in numpy/struct with many error types
        msg = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
        raise DeployError(f"{path} is not a readable GGUF file (truncated or corrupted?): {msg}") from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except MemoryError:
        raise
    except Exception as e:  # the reader decodes lazily; the scan has checked the UTF-8, this is a backstop
        raise DeployError(f"{_name(reader)}: GGUF metadata {key} cannot be read ({type(e).__name__}); "
                          f"re-download or re-convert it") from None


def _name(reader) -> str:
    """The file a reader reads (its memory map knows), for messages."""
    return str(getattr(reader.data, "filename", None) or "GGUF file")


# Value types of the metadata a loader reads (GGUF stores any integer width; a float is not a count).
_INT_TYPES = {0, 1, 2, 3, 4, 5, 10, 11}
_FLOAT_TYPES = {6, 12} | _INT_TYPES


def _typed(reader, key: str, kinds: set[int], words: str, default=None, array: bool = False):
    """The field's contents if its GGUF value type is one of `kinds` (arrays: the element type), else a
    DeployError naming the key; `default` where it is absent."""
    f = reader.fields.get(key)
    if f is None:
        return default
    types = [int(t) for t in f.types]
    if array:  # [ARRAY, element type], or [ARRAY] alone for an empty array
        ok = types[:1] == [9] and (len(types) == 1 or (len(types) == 2 and types[1] in kinds))
    else:
        ok = len(types) == 1 and types[0] in kinds
    if not ok:
        raise DeployError(f"{_name(reader)}: GGUF metadata {key} must be {'an array of ' if array else ''}{words}; "
                          f"the file is damaged or was converted wrongly")
    return _field(reader, key)


def _int(reader, key, default=None):
    return _typed(reader, key, _INT_TYPES, "an integer", default)


def _float(reader, key, default=None):
    return _typed(reader, key, _FLOAT_TYPES, "a number", default)


def _str(reader, key, default=None):
    return _typed(reader, key, {8}, "a string", default)


def _bool(reader, key, default=None):
    return _typed(reader, key, {7}, "true or false", default)


def _permute_back(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo convert_hf_to_gguf's `permute` of Q/K rows (interleaved -> half-split rotary layout)."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


class GGUFWeights:
    """The Weights interface (names, shape, read) over a GGUF file, under Hugging Face names."""

    def __init__(self, path: Path, reader, n_head: int, n_head_kv: int, arch: Arch = ARCHS["llama"]):
        self.path = path
        self.reader = reader
        self.n_head, self.n_head_kv = n_head, n_head_kv
        self.permuted = arch.permuted
        self.tensors = {}
        for t in reader.tensors:
            hf = _hf_name(t.name, arch)
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
        if not self.permuted:
            return None
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
        except (ValueError, TypeError) as e:  # a size the scan let through that numpy cannot reshape
            raise DeployError(f"{self.path}: tensor {t.name} cannot be read ({str(e)[:120]}); "
                              f"re-download or re-convert it") from None
        heads = self._heads(name)
        return _permute_back(arr, heads) if heads else arr


def _hf_name(name: str, arch: Arch) -> str | None:
    if name in _GLOBAL:
        return _GLOBAL[name]
    m = _BLOCK.match(name)
    if m and m.group(2) in arch.block:
        return f"model.layers.{m.group(1)}.{arch.block[m.group(2)]}.{m.group(3)}"
    return None


# Config keys -> the GGUF metadata they come from (for messages about a file's metadata), "{arch}" for the
# file's architecture.
GGUF_KEYS = {"num_hidden_layers": "{arch}.block_count", "hidden_size": "{arch}.embedding_length",
             "intermediate_size": "{arch}.feed_forward_length", "num_attention_heads": "{arch}.attention.head_count",
             "num_key_value_heads": "{arch}.attention.head_count_kv", "head_dim": "{arch}.attention.key_length",
             "vocab_size": "the vocabulary size (tokenizer.ggml.tokens)", "max_position_embeddings": "{arch}.context_length",
             "rms_norm_eps": "{arch}.attention.layer_norm_rms_epsilon", "rope_theta": "{arch}.rope.freq_base",
             "rope_scaling.factor": "{arch}.rope.scaling.factor", "sliding_window": "{arch}.attention.sliding_window",
             "partial_rotary_factor": "{arch}.rope.dimension_count / {arch}.attention.key_length"}


def gguf_keys(arch: str) -> dict[str, str]:
    return {k: v.replace("{arch}", arch) for k, v in GGUF_KEYS.items()}


def gguf_names(message: str, arch: str = "llama") -> str:
    """A config-level message in the GGUF file's own key names."""
    keys = gguf_keys(arch)
    return re.sub(r"\b(" + "|".join(map(re.escape, sorted(keys, key=len, reverse=True))) + r")\b",
                  lambda m: keys[m.group(1)], message)


def _arch(path: Path, reader) -> tuple[str, Arch]:
    name = _str(reader, "general.architecture")
    if name not in ARCHS:
        raise DeployError(f"{path}: GGUF architecture {name!r} is not supported; supported: {', '.join(ARCHS)}")
    return name, ARCHS[name]


def hf_config(path: Path, reader) -> dict:
    """The metadata as a Hugging Face config dict. Only types are checked here (a count must be an
    integer, ...); sizes and ranges are the architecture's from_hf's business, as for config.json.
    What llama.cpp does not store is what its own loader assumes (Gemma's attention scale and local
    rotary base, Gemma 3's five local layers to one global)."""
    name, arch = _arch(path, reader)

    def need(key, read=_int):
        v = read(reader, f"{name}.{key}")
        if v is None:
            raise DeployError(f"{path}: GGUF metadata lacks {name}.{key}")
        return v

    def opt(key, read=_int, default=None):
        return read(reader, f"{name}.{key}", default)

    tokens = _typed(reader, "tokenizer.ggml.tokens", {8}, "strings", array=True)
    hidden, heads = need("embedding_length"), need("attention.head_count")
    vocab = len(tokens) if tokens is not None else need("vocab_size")
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise DeployError(f"{path}: GGUF rope_freqs (Llama 3.1 rope scaling) is not supported yet")
    head_dim = opt("attention.key_length") or (opt("rope.dimension_count") if name == "llama" else None)
    cfg = {
        "architectures": [arch.hf], "model_type": arch.model_type,
        "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": need("feed_forward_length"),
        "num_hidden_layers": need("block_count"), "num_attention_heads": heads,
        "num_key_value_heads": opt("attention.head_count_kv", default=heads),
        "head_dim": head_dim or None,
        "rms_norm_eps": opt("attention.layer_norm_rms_epsilon", _float, 1e-5 if name in ("llama", "phi3") else 1e-6),
        "rope_theta": opt("rope.freq_base", _float, 10000.0),
        "max_position_embeddings": opt("context_length", default=2048),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
    }
    scaling = opt("rope.scaling.type", _str)
    if scaling not in (None, "none") and name != "phi3":
        if scaling != "linear":
            raise DeployError(f"{path}: GGUF rope scaling {scaling!r} is not supported yet")
        cfg["rope_scaling"] = {"rope_type": "linear", "factor": opt("rope.scaling.factor", _float)}
    window = opt("attention.sliding_window")
    if window:
        cfg["sliding_window"] = window
    if name.startswith("gemma"):
        _gemma_config(cfg, name, opt)
    if name == "phi3":
        _phi3_config(path, reader, cfg, opt, names)
    for key, hf in (("bos_token_id", "bos_token_id"), ("eos_token_id", "eos_token_id"),
                    ("padding_token_id", "pad_token_id")):
        v = _int(reader, f"tokenizer.ggml.{key}")
        if v is not None:
            cfg[hf] = v
    return cfg


def _gemma_config(cfg: dict, name: str, opt) -> None:
    # llama.cpp's Gemma scales attention by key_length ** -0.5 but for the 27B models (46 layers of Gemma 2,
    # 62 of Gemma 3), whose query_pre_attn_scalar is hidden_size / heads; it alternates local and global
    # layers (Gemma 2) or has five local to one global (Gemma 3) unless the file says otherwise.
    big = cfg["num_hidden_layers"] == {"gemma2": 46, "gemma3": 62}[name]
    head_dim = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    cfg.update(query_pre_attn_scalar=cfg["hidden_size"] // cfg["num_attention_heads"] if big else head_dim,
               hidden_activation="gelu_pytorch_tanh",
               attn_logit_softcapping=opt("attn_logit_softcapping", _float),
               final_logit_softcapping=opt("final_logit_softcapping", _float))
    pattern = opt("attention.sliding_window_pattern")
    if pattern:
        cfg["sliding_window_pattern"] = pattern
    if name == "gemma3":
        cfg["rope_local_base_freq"] = opt("rope.freq_base_swa", _float, 10000.0)


def _phi3_config(path: Path, reader, cfg: dict, opt, names: set) -> None:
    """LongRoPE's factors are tensors (rope_factors_short/long.weight); the rotated part of each head is
    rope.dimension_count."""
    head_dim = cfg["head_dim"] or cfg["hidden_size"] // cfg["num_attention_heads"]
    dims = opt("rope.dimension_count")
    if dims and dims != head_dim:
        cfg["partial_rotary_factor"] = dims / head_dim
    if "rope_factors_short.weight" in names or "rope_factors_long.weight" in names:
        factors = {}
        for which in ("short", "long"):
            t = next((t for t in reader.tensors if t.name == f"rope_factors_{which}.weight"), None)
            if t is None:
                raise DeployError(f"{path}: GGUF has rope_factors_{'long' if which == 'short' else 'short'}.weight "
                                  f"but not rope_factors_{which}.weight; re-convert the model")
            factors[f"{which}_factor"] = [float(x) for x in np.asarray(t.data, np.float32).reshape(-1)]
        orig = opt("rope.scaling.original_context_length")
        if orig is None:
            raise DeployError(f"{path}: GGUF metadata lacks phi3.rope.scaling.original_context_length, which "
                              f"LongRoPE needs; re-convert the model")
        cfg["rope_scaling"] = {"rope_type": "longrope", **factors, "original_max_position_embeddings": orig}
        attn = opt("rope.scaling.attn_factor", _float)
        if attn is not None:
            cfg["rope_scaling"]["attention_factor"] = attn


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
    scores = _typed(reader, "tokenizer.ggml.scores", _FLOAT_TYPES, "numbers", array=True) or [0.0] * len(tokens)
    if len(scores) != len(tokens):
        raise DeployError(f"{_name(reader)}: GGUF tokenizer.ggml.scores has {len(scores)} entries for {len(tokens)} "
                          f"tokens; re-convert the model")
    unk = tokens[int(ids["unk_token"])] if ids.get("unk_token") is not None else None
    tok = Tokenizer(models.BPE(vocab=vocab, merges=_spm_merges(vocab, dict(zip(tokens, scores))), unk_token=unk,
                               fuse_unk=True, byte_fallback=True, dropout=None))
    prefix = _bool(reader, "tokenizer.ggml.add_space_prefix", True)
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first" if prefix else "never",
                                                 split=False)
    steps = [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
    if prefix:
        steps.append(decoders.Strip(content=" ", left=1))
    tok.decoder = decoders.Sequence(steps)
    return json.loads(tok.to_str())


def _vocabulary(path: Path, reader) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges "a b") of the metadata, each checked for type and length."""
    tokens = _typed(reader, "tokenizer.ggml.tokens", {8}, "strings", array=True)
    if not tokens:
        raise DeployError(f"{path}: GGUF metadata lacks tokenizer.ggml.tokens (the vocabulary); re-convert the model")
    types = _typed(reader, "tokenizer.ggml.token_type", _INT_TYPES, "integers", array=True)
    types = [1] * len(tokens) if types is None else types
    if len(types) != len(tokens):
        raise DeployError(f"{path}: GGUF tokenizer.ggml.token_type has {len(types)} entries for {len(tokens)} tokens; "
                          f"re-convert the model")
    merges = _typed(reader, "tokenizer.ggml.merges", {8}, "strings", array=True) or []
    bad = next((m for m in merges if " " not in m), None)
    if bad is not None:
        raise DeployError(f"{path}: GGUF merge {bad[:40]!r} is not two tokens separated by a space; re-convert the model")
    return tokens, types, merges


def tokenizer_files(path: Path, reader) -> dict[str, str]:
    """tokenizer.json, tokenizer_config.json (and chat_template.jinja, generation_config.json) as text."""
    model = _str(reader, "tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise DeployError(f"{path}: GGUF tokenizer model {model!r} is not supported yet "
                          f"(supported: byte-level BPE 'gpt2', SentencePiece-style 'llama')")
    pre = _str(reader, "tokenizer.ggml.pre", "default")
    if model == "gpt2" and pre not in PRE_TOKENIZERS:
        raise DeployError(f"{path}: GGUF pre-tokenizer {pre!r} is not known; known: {', '.join(sorted(PRE_TOKENIZERS))}")
    tokens, types, merges = _vocabulary(path, reader)
    merges = [m.split(" ", 1) for m in merges]
    special = {"bos_token": "bos_token_id", "eos_token": "eos_token_id", "unk_token": "unknown_token_id",
               "pad_token": "padding_token_id"}
    ids = {k: _token_id(path, reader, v, len(tokens)) for k, v in special.items()}
    # CONTROL (3) and USER_DEFINED (4) tokens are added tokens; the control ones are special.
    added = [{"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": types[i] == 3 or i in {int(v) for v in ids.values() if v is not None}}
             for i, tok in enumerate(tokens) if types[i] in (3, 4)]
    if model == "llama":
        tj = _sentencepiece_json(reader, tokens, types, ids)
        tj["added_tokens"] = added
        add_bos = _bool(reader, "tokenizer.ggml.add_bos_token", True)  # llama.cpp's default for SentencePiece
    else:
        add_bos = _bool(reader, "tokenizer.ggml.add_bos_token", False)
        tj = _byte_level_json(pre, tokens, merges, added)
    if add_bos and ids["bos_token"] is not None:
        bos = tokens[int(ids["bos_token"])]
        tj["post_processor"] = {"type": "TemplateProcessing",
                                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                                "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                                         {"Sequence": {"id": "B", "type_id": 1}}],
                                "special_tokens": {bos: {"id": bos, "ids": [int(ids["bos_token"])], "tokens": [bos]}}}
    arch = _str(reader, "general.architecture")
    tc = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": _int(reader, f"{arch}.context_length", 2048),
          "clean_up_tokenization_spaces": False}
    for k, v in ids.items():
        if v is not None and 0 <= int(v) < len(tokens):
            tc[k] = tokens[int(v)]
    files = {"tokenizer.json": json.dumps(tj, ensure_ascii=False)}
    template = _str(reader, "tokenizer.chat_template")
    if template:
        tc["chat_template"] = template
        files["chat_template.jinja"] = template
    files["tokenizer_config.json"] = json.dumps(tc, ensure_ascii=False, indent=2)
    gen = {k: ids[t] for k, t in (("bos_token_id", "bos_token"), ("eos_token_id", "eos_token"), ("pad_token_id", "pad_token"))
           if ids[t] is not None}
    if gen:
        files["generation_config.json"] = json.dumps(gen, indent=2)
    return files


def _token_id(path: Path, reader, key: str, n_tokens: int) -> int | None:
    v = _int(reader, f"tokenizer.ggml.{key}")
    if v is not None and not 0 <= v < n_tokens:
        raise DeployError(f"{path}: GGUF tokenizer.ggml.{key} is {v}, outside the vocabulary of {n_tokens} tokens; "
                          f"re-convert the model")
    return v


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
    from .models import lookup

    path = Path(path)
    reader = _reader(path)
    hf = hf_config(path, reader)
    name, gguf_arch = _arch(path, reader)
    arch = lookup(hf)
    try:
        config = arch.Config.from_hf(hf, **overrides)
    except KeyError as e:
        raise DeployError(f"{path}: GGUF metadata lacks {gguf_names(str(e.args[0]), name)}; re-convert the model") from None
    except ValueError as e:
        raise DeployError(f"{path}: {gguf_names(str(e), name)}; the GGUF metadata is wrong, re-convert the model") from None
    if gguf_arch.norms_plus_one:
        config.norms_plus_one = False  # the file holds 1 + w: Gemma's weight_map adds nothing
    weights = GGUFWeights(path, reader, config.num_attention_heads, config.num_key_value_heads, gguf_arch)
    check_config(str(path), arch, config, weights, "the GGUF metadata and tensors disagree; re-convert the model",
                 gguf_keys(name))
    model = LoadedModel(path, hf, arch, config, weights, source or str(path))
    model.check()  # every tensor present with its shape, before the tokenizer is built
    model.path = tokenizer_dir(path, reader)  # the package writer copies tokenizer files from here
    return model
