"""Sources for the checkpoint catalogue and the loader fuzzers: copies of the tiny fixtures with a
config.json or a safetensors header made bad on purpose, and tiny Llama GGUF files written with the
`gguf` package's GGUFWriter (every metadata key the loader reads, F32 tensors, a byte-level BPE
vocabulary of a few tokens) so that a valid one loads in milliseconds.
"""
from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import numpy as np

from fixtures import make_tiny

TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "c", "ab", "abc", "\u0120", "\u0120a"]
TYPES = [3, 3, 3] + [1] * (len(TOKENS) - 3)
MERGES = ["a b", "ab c", "\u0120 a"]
HIDDEN, INTER, HEADS, KV_HEADS, HEAD_DIM = 16, 24, 2, 1, 8
NAME_MARK = "NAME-TO-PATCH-0123"  # general.name, replaced byte for byte to make a non-UTF-8 string


def copy_tiny(tmp: Path, name: str = "llama-gqa1") -> Path:
    dst = tmp / name
    if not dst.exists():
        shutil.copytree(make_tiny(name), dst)
    return dst


def config(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def edit_config(path: Path, drop: tuple[str, ...] = (), **changes) -> Path:
    cfg = {k: v for k, v in config(path).items() if k not in drop}
    cfg.update(changes)
    (path / "config.json").write_text(json.dumps(cfg))
    return path


def safetensors_file(path: Path, header, data: bytes = b"", length: int | None = None) -> Path:
    """A safetensors file with this header (a dict is JSON-encoded, bytes are written as they are)."""
    raw = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def llama_tensors(layers: int, rng) -> dict[str, np.ndarray]:
    """GGUF-named F32 tensors of a tiny Llama (GGUF stores Q/K rows permuted; random data need not care)."""
    def w(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    out = {"token_embd.weight": w(len(TOKENS), HIDDEN), "output_norm.weight": 1 + w(HIDDEN),
           "output.weight": w(len(TOKENS), HIDDEN)}
    for n in range(layers):
        b = f"blk.{n}."
        out.update({b + "attn_q.weight": w(HEADS * HEAD_DIM, HIDDEN), b + "attn_k.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
                    b + "attn_v.weight": w(KV_HEADS * HEAD_DIM, HIDDEN), b + "attn_output.weight": w(HIDDEN, HEADS * HEAD_DIM),
                    b + "ffn_gate.weight": w(INTER, HIDDEN), b + "ffn_up.weight": w(INTER, HIDDEN),
                    b + "ffn_down.weight": w(HIDDEN, INTER), b + "attn_norm.weight": 1 + w(HIDDEN),
                    b + "ffn_norm.weight": 1 + w(HIDDEN)})
    return out


GGUF_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


def tiny_gguf(path: Path, layers: int = 2, block_count: int | None = None, with_tensors: bool = True,
              seed: int = 0, chat_template: str | None = GGUF_TEMPLATE) -> Path:
    """A tiny Llama GGUF; block_count (default: layers) may disagree with the tensors written; chat_template None:
    the file has none (tokenizer.chat_template is left out)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(NAME_MARK)
    w.add_block_count(layers if block_count is None else block_count)
    w.add_context_length(64)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTER)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(TOKENS)
    w.add_token_types(TYPES)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    if chat_template is not None:
        w.add_chat_template(chat_template)
    if with_tensors:
        for name, arr in llama_tensors(layers, np.random.default_rng(seed)).items():
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def non_utf8_name(path: Path) -> Path:
    """The GGUF at `path` with its general.name bytes replaced by bytes that are not UTF-8."""
    data = path.read_bytes()
    mark = NAME_MARK.encode()
    assert data.count(mark) == 1
    path.write_bytes(data.replace(mark, b"\xff\xfe\xc3(" + b"\x80" * (len(mark) - 4)))
    return path
