"""Tokenizer, streaming detokenizer and chat templates, from a model's Hugging Face tokenizer files.

Everything here reads JSON and jinja text only: `tokenizer.json` through the `tokenizers` library,
`tokenizer_config.json` (special tokens, chat template), `chat_template.jinja` / `chat_template.json`
(where transformers >= 4.43 writes the template), `special_tokens_map.json` and
`generation_config.json` (the eos ids generation stops at). Chat templates run in jinja2's immutable
sandbox with the helpers transformers gives them, so a template renders here exactly as
`AutoTokenizer.apply_chat_template` renders it, and a hostile template cannot reach Python objects.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import cached_property
from pathlib import Path

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as Backend

REPLACEMENT_CHAR = "\ufffd"


class TokenizerError(ValueError):
    """A tokenizer file that is missing or unreadable, or a chat template that fails; one-line message."""


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path} is not valid JSON ({_first_line(e)}); re-download the model files") from None
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} should hold a JSON object, not {type(data).__name__}")
    return data


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json spells it: a string or a serialized AddedToken."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _pick_template(value, source: Path) -> str | None:
    """`chat_template` is a string, or a list of {"name", "template"} of which we take "default"."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        return named.get("default")
    raise TokenizerError(f"{source}: chat_template should be a string or a list of named templates")


class Tokenizer:
    """Text <-> token ids, plus what generation needs: eos ids and the chat template."""

    def __init__(self, backend, config: dict | None = None, chat_template: str | None = None,
                 eos_token_ids: Sequence[int] = ()):
        self.backend = backend  # a tokenizers.Tokenizer
        self.config = dict(config or {})
        self.chat_template = chat_template
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        ids = list(eos_token_ids)
        eos = self.backend.token_to_id(self.eos_token) if self.eos_token else None
        if eos is not None:
            ids.append(eos)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in ids))

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.exists():
            raise TokenizerError(f"{path} has no tokenizer.json (only fast-tokenizer files are supported; "
                                 f"convert with transformers' AutoTokenizer(...).save_pretrained)")
        try:
            backend = Backend.from_file(str(tj))
        except Exception as e:  # the Rust side raises plain Exception with a serde message
            raise TokenizerError(f"{tj} could not be loaded ({_first_line(e)}); re-download the model files") from None
        config = _read_json(path / "tokenizer_config.json")
        for key, value in _read_json(path / "special_tokens_map.json").items():
            config.setdefault(key, value)
        template = _pick_template(config.get("chat_template"), path / "tokenizer_config.json")
        if template is None and (path / "chat_template.jinja").exists():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        if template is None:
            ct = path / "chat_template.json"
            template = _pick_template(_read_json(ct).get("chat_template"), ct)
        eos = _read_json(path / "generation_config.json").get("eos_token_id")
        eos_ids = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return cls(backend, config, template, eos_ids)

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def stream_decoder(self, skip_special_tokens: bool = True) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens)

    # ---- chat templates ----------------------------------------------------------------------

    @cached_property
    def _compiled_template(self):
        if not self.chat_template:
            raise TokenizerError("this model has no chat template (tokenizer_config.json has no chat_template "
                                 "and there is no chat_template.jinja); pass plain text with chat=False")
        try:
            return _jinja_env().from_string(self.chat_template)
        except jinja2.TemplateSyntaxError as e:
            raise TokenizerError(f"the model's chat template does not parse: {e.message} (line {e.lineno})") from None

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The conversation as the model's template renders it (the text already holds its special tokens)."""
        template = self._compiled_template
        special = {k: _token_text(v) for k, v in self.config.items() if k.endswith("_token") and _token_text(v)}
        context = {**special, "messages": list(messages), "add_generation_prompt": add_generation_prompt,
                   "tools": None, "documents": None, **kwargs}
        try:
            return template.render(**context)
        except jinja2.TemplateError as e:
            raise TokenizerError(f"chat template error: {_first_line(e)}") from None


# ---- the jinja environment of transformers' chat templates ----------------------------------------

def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # transformers' tojson, not jinja's: no HTML escaping of <>&', and non-ASCII kept as is.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks; render its body."""

    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.Scope(body).set_lineno(lineno)


def _jinja_env() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_GenerationBlock, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


# ---- streaming detokenization -----------------------------------------------------------------

class StreamDecoder:
    """Incremental detokenization: feed ids one at a time, get the text they add.

    Decoding one token alone is wrong twice over: a byte-level BPE token may hold part of a UTF-8
    character (decoded as U+FFFD until the rest arrives), and SentencePiece decoders drop the
    leading space of the first token they see. So each step decodes a window that starts a few
    tokens back (`prefix`..end) and emits what it adds over the window's already-emitted part
    (`prefix`..`read`), holding everything back while the text ends in U+FFFD. This is the
    technique of vLLM's `detokenize_incrementally` and TGI's `decode_token`; the concatenated pieces
    equal `decode(all ids)`.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # window start: tokens before it are done with
        self.read = 0  # tokens before it have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def put(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        done = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        if len(text) > len(done) and not text.endswith(REPLACEMENT_CHAR):
            self.prefix, self.read = self.read, len(self.ids)
            return text[len(done):]
        return ""

    def flush(self) -> str:
        """The held-back rest (an incomplete character at the very end comes out as U+FFFD)."""
        done = self._decode(self.ids[self.prefix:self.read])
        text = self._decode(self.ids[self.prefix:])
        self.prefix = self.read = len(self.ids)
        return text[len(done):] if len(text) > len(done) else ""
