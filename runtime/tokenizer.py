"""Tokenizer, streaming detokenizer and chat templates, from a model's Hugging Face tokenizer files.

Everything here reads JSON and jinja text only: `tokenizer.json` through the `tokenizers` library,
`tokenizer_config.json` (special tokens, chat template), `chat_template.jinja` / `chat_template.json`
(where transformers >= 4.43 writes the template), `special_tokens_map.json` and
`generation_config.json` (the eos ids generation stops at, and the model's sampler settings). Chat templates
run in jinja2's immutable sandbox with the helpers transformers gives them, so a template renders here exactly as
`AutoTokenizer.apply_chat_template` renders it, a hostile template cannot reach Python objects, and
a runaway one stops at its limits (runtime/chat_template.py). Every file problem, template failure
and limit is a TokenizerError with a one-line message.
"""
from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from contextlib import contextmanager
from functools import cached_property
from pathlib import Path

import jinja2
from tokenizers import Tokenizer as Backend

from .chat_template import LimitedEnvironment, TemplateLimits
from .sampler import SamplingDefaults, generation_config_sampling

REPLACEMENT_CHAR = "\ufffd"


class TokenizerError(ValueError):
    """A tokenizer file that is missing or unreadable, or a chat template that fails; one-line message."""


_SURROGATE = re.compile("[\ud800-\udfff]")


def clean_text(text: str) -> str:
    """Text with every lone surrogate replaced by U+FFFD, as chat clients show undecodable input.

    Python hands over undecodable bytes of argv and of stdin (with errors=surrogateescape) as lone
    surrogates, and JSON may hold them as escapes; they cannot be encoded as UTF-8, so the tokenizer
    refuses them."""
    return _SURROGATE.sub(REPLACEMENT_CHAR, text)


def _is_panic(e: BaseException) -> bool:
    """A Rust panic inside `tokenizers` arrives as pyo3's PanicException, a BaseException."""
    return type(e).__name__ == "PanicException"


@contextmanager
def _native(what: str, hint: str):
    """Errors of the tokenizers library (plain Exceptions with a serde message) and its Rust panics
    (BaseExceptions) as one-line TokenizerErrors: `what (cause)hint`."""
    try:
        yield
    except Exception as e:
        raise TokenizerError(f"{what} ({_first_line(e)}){hint}") from None
    except BaseException as e:
        if not _is_panic(e):
            raise
        raise TokenizerError(f"{what} (the tokenizers library failed: {_first_line(e)}){hint}") from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else type(e).__name__


def _read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise TokenizerError(f"{path} is not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start}); "
                             f"re-download the model files") from None
    except OSError as e:
        raise TokenizerError(f"{path} cannot be read ({e.strerror or e})") from None


def _read_json(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        data = json.loads(_read_text(path))
    except (json.JSONDecodeError, RecursionError) as e:
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
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        value = named.get("default")
    if value is None or isinstance(value, str):
        return value
    raise TokenizerError(f"{source}: chat_template should be a string or a list of named templates "
                         f"({{\"name\": ..., \"template\": STRING}}), not {type(value).__name__}")


def _eos_ids(value, source: Path) -> list[int]:
    ids = [] if value is None else [value] if isinstance(value, int) else value
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise TokenizerError(f"{source}: eos_token_id should be a token id or a list of token ids, not {value!r:.80}")
    return ids


def _load_backend(tj: Path):
    with _native(f"{tj} could not be loaded", "; re-download the model files"):
        backend = Backend.from_file(str(tj))
    # As transformers does for every call that asks for neither: padding or truncation stored in the
    # file would change every prompt (and a huge fixed padding length makes encode abort).
    backend.no_padding()
    backend.no_truncation()
    if backend.post_processor is not None:
        _check_processor(json.loads(backend.post_processor.__getstate__()), tj)
    return backend


def _check_processor(spec, where: Path) -> None:
    """A TemplateProcessing must define every special token its templates use, with as many ids as tokens:
    the tokenizers library accepts such a file and panics in the first encode."""
    if isinstance(spec, list):
        for item in spec:
            _check_processor(item, where)
        return
    if not isinstance(spec, dict):
        return
    if spec.get("type") == "TemplateProcessing":
        specials = spec.get("special_tokens") or {}
        for piece in (spec.get("single") or []) + (spec.get("pair") or []):
            name = piece.get("SpecialToken", {}).get("id") if isinstance(piece, dict) else None
            if name is not None and name not in specials:
                raise TokenizerError(f"{where}: the post-processor's template uses the special token {name!r:.40}, "
                                     f"which it does not define; re-download the model files")
        for name, entry in specials.items():
            if len(entry.get("ids", [])) != len(entry.get("tokens", [])):
                raise TokenizerError(f"{where}: the post-processor's special token {name!r:.40} has "
                                     f"{len(entry.get('ids', []))} ids for {len(entry.get('tokens', []))} tokens")
    for value in spec.values():
        _check_processor(value, where)


def _processor_ids(spec) -> list[int]:
    """Token ids a post-processor inserts (TemplateProcessing's special_tokens, Bert/Roberta's cls and sep)."""
    out: list[int] = []
    if isinstance(spec, dict):
        for key, value in spec.items():
            if key == "ids" and isinstance(value, list):
                out += [i for i in value if isinstance(i, int)]
            elif key in ("cls", "sep") and isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
                out.append(value[1])
            else:
                out += _processor_ids(value)
    elif isinstance(spec, list):
        for value in spec:
            out += _processor_ids(value)
    return out


class Tokenizer:
    """Text <-> token ids, plus what generation needs: eos ids, the chat template, and the sampler settings of
    the model's generation_config.json (`generation_sampling`, runtime/sampler.py: generation_config_sampling)."""

    def __init__(self, backend, config: dict | None = None, chat_template: str | None = None,
                 eos_token_ids: Sequence[int] = (), limits: TemplateLimits | None = None,
                 generation_sampling: SamplingDefaults | None = None):
        self.backend = backend  # a tokenizers.Tokenizer
        self.generation_sampling = generation_sampling
        self.config = dict(config or {})
        self.chat_template = chat_template
        self.limits = limits or TemplateLimits()
        self.bos_token = _token_text(self.config.get("bos_token"))
        self.eos_token = _token_text(self.config.get("eos_token"))
        ids = list(eos_token_ids)
        eos = self.backend.token_to_id(self.eos_token) if self.eos_token else None
        if eos is not None:
            ids.append(eos)
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(int(i) for i in ids))

    @classmethod
    def from_dir(cls, path: str | Path, vocab_size: int | None = None, limits: TemplateLimits | None = None
                 ) -> Tokenizer:
        """The tokenizer of a model or package directory; with `vocab_size` (the model's embedding rows),
        checked to produce no id the model cannot embed."""
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise TokenizerError(f"{path} has no tokenizer.json (only fast-tokenizer files are supported; "
                                 f"convert with transformers' AutoTokenizer(...).save_pretrained)")
        backend = _load_backend(tj)
        config = _read_json(path / "tokenizer_config.json")
        for key, value in _read_json(path / "special_tokens_map.json").items():
            config.setdefault(key, value)
        template = _pick_template(config.get("chat_template"), path / "tokenizer_config.json")
        if template is None and (path / "chat_template.jinja").is_file():
            template = _read_text(path / "chat_template.jinja")
        if template is None:
            ct = path / "chat_template.json"
            template = _pick_template(_read_json(ct).get("chat_template"), ct)
        gc = path / "generation_config.json"
        generation = _read_json(gc)
        try:
            sampling = generation_config_sampling(generation)
        except ValueError as e:
            raise TokenizerError(f"{gc}: {e}") from None
        tok = cls(backend, config, template, _eos_ids(generation.get("eos_token_id"), gc), limits, sampling)
        if vocab_size is not None:
            tok.check_vocab(int(vocab_size), str(tj))
        return tok

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @cached_property
    def max_token_chars(self) -> int:
        """The most characters of text one token stands for, bounded by its longest vocabulary entry (byte-level
        entries have a character per byte, SentencePiece ones a character per character): a text of more than
        n times this many characters surely encodes to more than n tokens."""
        return max((len(t) for t in self.backend.get_vocab(with_added_tokens=True)), default=1) or 1

    def check_vocab(self, vocab_size: int, where: str) -> None:
        """Every id this tokenizer can produce (its vocabulary, added and special tokens, the ids its
        post-processor inserts) must be < `vocab_size`, the model's embedding rows: a larger id reads
        past the embedding table (NaN logits, or garbage) instead of failing."""
        vocab = self.backend.get_vocab(with_added_tokens=True)
        token, top = max(vocab.items(), key=lambda kv: kv[1], default=("", -1))
        processor = self.backend.post_processor
        if processor is not None:
            extra = _processor_ids(json.loads(processor.__getstate__()))
            if extra and max(extra) > top:
                token, top = "(inserted by the post-processor)", max(extra)
        if top >= vocab_size:
            raise TokenizerError(f"{where}: the tokenizer has token id {top} ({token!r:.40}), but the model's vocabulary "
                                 f"has {vocab_size} entries (ids 0..{vocab_size - 1}); use the tokenizer that came "
                                 f"with the model")

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        with _native("the tokenizer could not encode the text", "; is tokenizer.json intact?"):
            return self.backend.encode(clean_text(text), add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        with _native("the tokenizer could not decode token ids", "; is tokenizer.json intact?"):
            return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def stream_decoder(self, skip_special_tokens: bool = True, keep: Iterable[int] = ()) -> StreamDecoder:
        return StreamDecoder(self, skip_special_tokens, keep)

    # ---- chat templates ----------------------------------------------------------------------

    @cached_property
    def _compiled_template(self):
        if not self.chat_template:
            raise TokenizerError("this model has no chat template (tokenizer_config.json has no chat_template "
                                 "and there is no chat_template.jinja); pass plain text with chat=False")
        env = LimitedEnvironment(self.limits)
        try:
            return env, env.from_string(self.chat_template)
        except jinja2.TemplateSyntaxError as e:
            raise TokenizerError(f"the model's chat template does not parse: {_first_line(e)} (line {e.lineno})") from None
        except (RecursionError, MemoryError):
            raise TokenizerError("the model's chat template is too deeply nested to compile") from None
        except Exception as e:  # jinja turns some misplaced tags ({% break %} outside a loop) into invalid Python
            raise TokenizerError(f"the model's chat template does not compile: {type(e).__name__}: "
                                 f"{_first_line(e)}") from None

    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The conversation as the model's template renders it (the text already holds its special tokens)."""
        env, template = self._compiled_template
        special = {k: _token_text(v) for k, v in self.config.items() if k.endswith("_token") and _token_text(v)}
        context = {**special, "messages": list(messages), "add_generation_prompt": add_generation_prompt,
                   "tools": None, "documents": None, **kwargs}
        try:
            return env.render(template, context)
        except jinja2.TemplateError as e:  # raise_exception, undefined attributes, sandbox refusals, the limits
            raise TokenizerError(f"chat template error: {_first_line(e)}") from None
        except RecursionError:
            raise TokenizerError("chat template error: it recursed too deeply") from None
        except MemoryError:
            raise TokenizerError("chat template error: it ran out of memory") from None
        except Exception as e:  # the template's own mistakes: 1 + 'a', a missing key, int('x'), ...
            raise TokenizerError(f"chat template error: {type(e).__name__}: {_first_line(e)}") from None


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

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = True, keep: Iterable[int] = ()):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.keep = frozenset(int(i) for i in keep)  # special tokens written out all the same (Mistral's [TOOL_CALLS])
        self.ids: list[int] = []
        self.prefix = 0  # window start: tokens before it are done with
        self.read = 0  # tokens before it have been emitted

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def put(self, token_id: int) -> str:
        if int(token_id) in self.keep:  # the text so far, then the token's own
            text = self.flush() + self.tokenizer.decode([int(token_id)], skip_special_tokens=False)
            self.ids.append(int(token_id))
            self.prefix = self.read = len(self.ids)
            return text
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
