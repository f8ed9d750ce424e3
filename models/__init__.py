"""Model architectures, registered by Hugging Face `architectures` and `model_type` names."""
from __future__ import annotations

from types import ModuleType

from . import gpt2, llama, qwen2

ARCHITECTURES: dict[str, ModuleType] = {
    "LlamaForCausalLM": llama,
    "MistralForCausalLM": llama,
    "Qwen2ForCausalLM": qwen2,
    "GPT2LMHeadModel": gpt2,
}
MODEL_TYPES: dict[str, ModuleType] = {"llama": llama, "mistral": llama, "qwen2": qwen2, "gpt2": gpt2}


def supported() -> list[str]:
    return sorted(ARCHITECTURES)


def lookup(hf_config: dict) -> ModuleType | None:
    for arch in hf_config.get("architectures") or []:
        if arch in ARCHITECTURES:
            return ARCHITECTURES[arch]
    if hf_config.get("architectures"):
        return None
    return MODEL_TYPES.get(hf_config.get("model_type", ""))
