"""Model architectures, registered by Hugging Face `architectures` and `model_type` names."""
from __future__ import annotations

from types import ModuleType

from . import gemma2, gemma3, gemma3_mm, gpt2, llama, mistral, phi3, qwen2, qwen3, smollm3

ARCHITECTURES: dict[str, ModuleType] = {
    "LlamaForCausalLM": llama,
    "MistralForCausalLM": mistral,
    "Qwen2ForCausalLM": qwen2,
    "Qwen3ForCausalLM": qwen3,
    "Gemma2ForCausalLM": gemma2,
    "Gemma3ForCausalLM": gemma3,
    "Gemma3ForConditionalGeneration": gemma3_mm,
    "Phi3ForCausalLM": phi3,
    "SmolLM3ForCausalLM": smollm3,
    "GPT2LMHeadModel": gpt2,
}
MODEL_TYPES: dict[str, ModuleType] = {"llama": llama, "mistral": mistral, "qwen2": qwen2, "qwen3": qwen3,
                                      "gemma2": gemma2, "gemma3_text": gemma3, "gemma3": gemma3_mm, "phi3": phi3,
                                      "smollm3": smollm3, "gpt2": gpt2}


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
