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
    archs = hf_config.get("architectures")
    if isinstance(archs, list) and archs:
        for arch in archs:
            if isinstance(arch, str) and arch in ARCHITECTURES:
                return ARCHITECTURES[arch]
        return None
    model_type = hf_config.get("model_type")
    return MODEL_TYPES.get(model_type) if isinstance(model_type, str) else None


def name(hf_config: dict) -> str:
    """The architecture a config names, for messages (whatever types its keys hold)."""
    archs = hf_config.get("architectures")
    if isinstance(archs, list) and archs:
        return str(archs[0])[:100]
    return str(hf_config.get("model_type", "unknown"))[:100]
