"""Loading checkpoints from disk: every bad input is refused with one line that names the problem and
what to do, from the Python API (DeployError) and from the CLI (exit 1, one stderr line, no
traceback); sharded and bf16 checkpoints load and give the logits of their plain float32 twins.

Each case copies a tiny fixture checkpoint into tmp_path and damages the copy.
"""
from __future__ import annotations

import json
import re
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import deploycc
from fixtures import make_tiny

LLAMA, GPT2 = "llama-gqa1", "gpt2-odd"
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3]


def copy_tiny(tmp_path: Path, name: str = LLAMA) -> Path:
    return Path(shutil.copytree(make_tiny(name), tmp_path / name))


def edit_tensors(path: Path, edit: Callable[[dict[str, np.ndarray]], None]) -> None:
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})


def logits(source: Path) -> np.ndarray:
    return deploycc.reference_session(deploycc.load_model(str(source))).prefill(PROMPT, all_logits=True)


# ---- bad inputs: each builds a source in tmp_path and gives the regex its error must match -------

def no_such_path(tmp):
    return tmp / "no-such-model", r"model path \S*no-such-model does not exist; give a checkpoint directory or a Hugging Face repo"


def a_file(tmp):
    (tmp / "model.gguf").write_bytes(b"GGUF")
    return tmp / "model.gguf", r"model\.gguf is not a readable GGUF file \(truncated or corrupted\?\)"


def no_config(tmp):
    p = copy_tiny(tmp)
    (p / "config.json").unlink()
    return p, r"has no config\.json; is it a Hugging Face checkpoint directory\?"


def bad_json(tmp):
    p = copy_tiny(tmp)
    (p / "config.json").write_text('{"architectures": ["LlamaForCausalLM"], ')
    return p, r"config\.json is not valid JSON \(.+\); re-download the checkpoint"


def unsupported_arch(tmp):
    p = copy_tiny(tmp)
    cfg = json.loads((p / "config.json").read_text())
    (p / "config.json").write_text(json.dumps({**cfg, "architectures": ["BertForMaskedLM"], "model_type": "bert"}))
    return p, r"unsupported architecture BertForMaskedLM; supported: .*LlamaForCausalLM.*Qwen2ForCausalLM"


def missing_tensor(tmp):
    p = copy_tiny(tmp)
    edit_tensors(p, lambda t: t.pop("model.layers.1.mlp.down_proj.weight"))
    return p, r"is missing tensor model\.layers\.1\.mlp\.down_proj\.weight .*is it a complete LlamaForCausalLM checkpoint"


def wrong_shape(tmp):
    p = copy_tiny(tmp)

    def shrink(t):
        t["model.layers.0.mlp.up_proj.weight"] = t["model.layers.0.mlp.up_proj.weight"][:55].copy()

    edit_tensors(p, shrink)
    return p, (r"tensor model\.layers\.0\.mlp\.up_proj\.weight has shape \[55, 32\], but the config implies \[56, 32\]; "
               r"config\.json and the weights disagree")


def wrong_shape_conv1d(tmp):
    """GPT-2 stores Conv1D weights transposed; the message speaks of the stored layout."""
    p = copy_tiny(tmp, GPT2)

    def transpose(t):
        t["transformer.h.2.mlp.c_fc.weight"] = t["transformer.h.2.mlp.c_fc.weight"].T.copy()

    edit_tensors(p, transpose)
    return p, r"tensor transformer\.h\.2\.mlp\.c_fc\.weight has shape \[144, 36\], but the config implies \[36, 144\]"


def truncated(tmp):
    p = copy_tiny(tmp)
    data = (p / "model.safetensors").read_bytes()
    (p / "model.safetensors").write_bytes(data[: len(data) * 2 // 3])
    return p, r"model\.safetensors is corrupted or truncated: tensor \S+ needs bytes .*; re-download it"


def empty_file(tmp):
    p = copy_tiny(tmp)
    (p / "model.safetensors").write_bytes(b"")
    return p, r"model\.safetensors is corrupted: too short for a safetensors header; re-download it"


def garbage(tmp):
    p = copy_tiny(tmp)
    (p / "model.safetensors").write_bytes(np.random.default_rng(0).bytes(4096))
    return p, r"model\.safetensors is corrupted: header length \d+ exceeds the file; re-download it"


def garbage_header(tmp):
    p = copy_tiny(tmp)
    junk = b"\xff\xfe not json \x00" * 4
    (p / "model.safetensors").write_bytes(struct.pack("<Q", len(junk)) + junk + bytes(64))
    return p, r"model\.safetensors is corrupted: its header is not valid JSON; re-download it"


def header_not_object(tmp):
    p = copy_tiny(tmp)
    head = b"[1, 2, 3]"
    (p / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head)
    return p, r"model\.safetensors is corrupted: its header is not a JSON object; re-download it"


def bad_header_entry(tmp):
    p = copy_tiny(tmp)
    head = json.dumps({"w": {"dtype": "F32", "shape": ["a"], "data_offsets": [0, 4]}}).encode()
    (p / "model.safetensors").write_bytes(struct.pack("<Q", len(head)) + head + bytes(4))
    return p, r"model\.safetensors is corrupted: bad header entry for w; re-download it"


def missing_shard(tmp):
    p = shard(copy_tiny(tmp), 2)
    (p / "model-00002-of-00002.safetensors").unlink()
    return p, r"is missing shard model-00002-of-00002\.safetensors named in model\.safetensors\.index\.json"


def bad_index(tmp):
    p = shard(copy_tiny(tmp), 2)
    (p / "model.safetensors.index.json").write_text('{"metadata": {}}')
    return p, r"model\.safetensors\.index\.json is not a valid safetensors index; re-download the checkpoint"


def only_pickle(tmp):
    p = copy_tiny(tmp)
    (p / "model.safetensors").unlink()
    (p / "pytorch_model.bin").write_bytes(b"\x80\x02}q\x00.")  # never opened, so never unpickled
    return p, r"has no \.safetensors weights \(pickled \.bin checkpoints are not loaded.*convert them to safetensors\)"


CASES = {f.__name__: f for f in [no_such_path, a_file, no_config, bad_json, unsupported_arch, missing_tensor,
                                  wrong_shape, wrong_shape_conv1d, truncated, empty_file, garbage, garbage_header,
                                  header_not_object, bad_header_entry, missing_shard, bad_index, only_pickle]}


@pytest.mark.parametrize("case", CASES)
def test_api_error(tmp_path, case):
    source, pattern = CASES[case](tmp_path)
    with pytest.raises(deploycc.DeployError, match=pattern) as e:
        deploycc.load_model(str(source))
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("case", CASES)
def test_cli_error(tmp_path, case):
    source, pattern = CASES[case](tmp_path)
    r = subprocess.run([sys.executable, "-m", "deploycc", "inspect", str(source)], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 1, (r.returncode, r.stderr)
    assert "Traceback" not in r.stderr and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr
    assert re.search(pattern, lines[0]), lines[0]


def test_unsupported_architecture_lists_every_supported_one(tmp_path):
    from deploycc.models import supported

    source, _ = unsupported_arch(tmp_path)
    with pytest.raises(deploycc.DeployError) as e:
        deploycc.load_model(str(source))
    assert str(e.value).endswith("supported: " + ", ".join(supported()))


# ---- layouts that must load -------------------------------------------------------------------

def shard(path: Path, n: int) -> Path:
    """Split model.safetensors into n shards with an index, as transformers' save_pretrained does."""
    tensors = load_file(path / "model.safetensors")
    names = sorted(tensors)
    weight_map, total = {}, 0
    for i in range(n):
        fname = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: tensors[k] for k in names[i::n]}
        save_file(part, path / fname, metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, fname))
        total += sum(a.nbytes for a in part.values())
    (path / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2))
    (path / "model.safetensors").unlink()
    return path


@pytest.mark.parametrize("name", [LLAMA, GPT2])
def test_sharded_checkpoint_gives_identical_logits(tmp_path, name):
    sharded = shard(copy_tiny(tmp_path, name), 3)
    model = deploycc.load_model(str(sharded))
    assert len(model.weights.files) == 3
    assert np.array_equal(logits(sharded), logits(make_tiny(name)))


def test_bf16_checkpoint_matches_float32_of_rounded_weights(tmp_path):
    import torch
    import transformers as tf
    from safetensors.torch import load_file as load_torch
    from safetensors.torch import save_file as save_torch

    src = make_tiny(LLAMA)
    bf16, rounded = copy_tiny(tmp_path / "bf16"), copy_tiny(tmp_path / "f32")
    weights = {k: v.to(torch.bfloat16) for k, v in load_torch(src / "model.safetensors").items()}
    save_torch(weights, bf16 / "model.safetensors", metadata={"format": "pt"})
    save_torch({k: v.float() for k, v in weights.items()}, rounded / "model.safetensors", metadata={"format": "pt"})

    model = deploycc.load_model(str(bf16))
    assert {e.dtype for f in model.weights.files for e in f.entries.values()} == {"BF16"}
    got = logits(bf16)
    # bf16 -> f32 widening is exact, so the reference sees the very same float32 weights.
    assert np.array_equal(got, logits(rounded))
    hf = tf.AutoModelForCausalLM.from_pretrained(bf16, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        ref = hf(torch.tensor([PROMPT])).logits[0].numpy()
    assert np.abs(got - ref).max() <= 1e-4
