"""Chat templates `compile --chat-template NAME` knows, for a model whose files have none (base models, GGUF
conversions without tokenizer.chat_template) or a wrong one; `--chat-template FILE` takes any Jinja file.

Each is its family's plain conversation format (no tools), as the families' own templates render it.
"""
from __future__ import annotations

from pathlib import Path

from .errors import DeployError

KNOWN = {
    # ChatML: SmolLM2, Qwen2/2.5 (without their default system prompt), OpenHermes, ...
    "chatml": ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
               "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
               "{% endif %}"),
    # Llama 3.x without tools or dates
    "llama3": ("{{- bos_token }}{%- for message in messages %}{{- '<|start_header_id|>' + message['role'] + "
               "'<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}{%- endfor %}"
               "{%- if add_generation_prompt %}{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{%- endif %}"),
    # Gemma 1-3: no system role (a system message opens the first user turn), the assistant is "model"
    "gemma": ("{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set first = messages[0]['content'] + "
              "'\\n\\n' %}{% set messages = messages[1:] %}{% else %}{% set first = '' %}{% endif %}"
              "{% for message in messages %}{% set role = 'model' if message['role'] == 'assistant' else "
              "message['role'] %}{{ '<start_of_turn>' + role + '\\n' + (first if loop.first else '') + "
              "message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}{% if add_generation_prompt %}"
              "{{ '<start_of_turn>model\\n' }}{% endif %}"),
}


def resolve(value: str) -> str:
    """The template text of --chat-template FILE|NAME, checked to parse and to render a short conversation."""
    path = Path(value).expanduser()
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise DeployError(f"--chat-template {value}: cannot read it ({getattr(e, 'strerror', None) or e})") from None
    elif value in KNOWN:
        text = KNOWN[value]
    else:
        raise DeployError(f"--chat-template {value}: no such file, and not a template deploycc knows "
                          f"({', '.join(sorted(KNOWN))}); give a Jinja file or one of those names")
    from .runtime.tokenizer import Tokenizer, TokenizerError

    class _NoBackend:  # rendering needs no vocabulary
        def token_to_id(self, token):
            return None

    probe = Tokenizer(_NoBackend(), {"bos_token": "<s>", "eos_token": "</s>"}, text)
    try:
        probe.apply_chat_template([{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}])
    except TokenizerError as e:
        raise DeployError(f"--chat-template {value}: {e}") from None
    return text
