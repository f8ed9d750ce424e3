"""Grammar-constrained decoding: each next token restricted to those a grammar allows (structured output).

    g = Grammar.json_schema(schema)            # or Grammar.json_object(), Grammar.text(lark_or_gbnf)
    c = g.constraint(tokenizer, vocab_size)    # one per sequence: the parser state of its output so far
    logits = c.apply(logits)                   # tokens the grammar refuses get -inf (a copy)
    c.accept(token)                            # the sampled token moves the parser on, and the next mask starts

The engine is llguidance (Microsoft's Rust parser behind llama.cpp's and guidance's grammars): on this runtime's
vocabularies its mask costs tens of microseconds a token, it compiles a JSON schema lazily in about a millisecond,
and it depends on nothing (xgrammar, the alternative MLC and vLLM use, needs torch, transformers and triton in a
package's runtime). benchmarks/grammar_mask.py measures both; docs/serving.md has the figures. The mask is a
bitmask filled on a worker thread, submitted before the model's step for this token, so the two can overlap (how
much depends on the library releasing the GIL, which this project has not measured); it is applied to the logits
with numpy, never a Python loop over the vocabulary.

JSON is generated in one layout, `{"key": value, "key": [1, 2]}` (json.dumps' separators, no other whitespace):
a small model given free whitespace can spend its whole budget on it.
"""
from __future__ import annotations

import json
import threading
import weakref
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

INSTALL = "pip install llguidance (or deploycc[structured])"
# the JSON layout (llguidance's JsonCompileOptions): Python's json.dumps separators and no other whitespace
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
MAX_SCHEMA_BYTES = 1 << 20


class GrammarError(ValueError):
    """A grammar or schema the engine cannot use, or the engine missing (one line)."""


def _lib():
    try:
        import llguidance
    except ImportError:
        raise GrammarError(f"structured output needs the llguidance package: {INSTALL}") from None
    return llguidance


class Grammar:
    """A grammar in llguidance's form, checked when it is made (an error names what is wrong)."""

    def __init__(self, definition: str, what: str):
        self.definition, self.what = definition, what
        err = _lib().LLMatcher.validate_grammar(definition)
        if err:
            raise GrammarError(f"{what}: {_first_line(err)}")

    @classmethod
    def json_schema(cls, schema, what: str = "the JSON schema") -> Grammar:
        if not isinstance(schema, (dict, bool)):
            raise GrammarError(f"{what} must be a JSON object, got {type(schema).__name__}")
        text = json.dumps(schema)
        if len(text) > MAX_SCHEMA_BYTES:
            raise GrammarError(f"{what} is {len(text)} bytes; the limit is {MAX_SCHEMA_BYTES}")
        try:
            definition = _lib().LLMatcher.grammar_from_json_schema(text, defaults=JSON_LAYOUT)
        except ValueError as e:
            raise GrammarError(f"{what}: {_first_line(str(e))}") from None
        return cls(definition, what)

    @classmethod
    def json_object(cls) -> Grammar:
        """Any JSON object (OpenAI's `response_format: {"type": "json_object"}`)."""
        return cls.json_schema({"type": "object"}, "a JSON object")

    @classmethod
    def text(cls, source: str, what: str = "the grammar") -> Grammar:
        """A Lark grammar (llguidance's syntax) or a GBNF one (llama.cpp's), told apart by the library."""
        lib = _lib()
        try:
            definition = lib.grammar_from("grammar", source)
        except Exception as e:  # the GBNF converter raises its own error type
            raise GrammarError(f"{what}: {_first_line(str(e))}") from None
        return cls(definition, what)

    def constraint(self, tokenizer, vocab_size: int) -> Constraint:
        """A fresh parser state for one sequence whose logits have `vocab_size` entries."""
        lib = _lib()
        matcher = lib.LLMatcher(_vocabulary(tokenizer, vocab_size), self.definition, log_level=0)
        if matcher.is_error():
            raise GrammarError(f"{self.what}: {_first_line(matcher.get_error())}")
        return Constraint(matcher, vocab_size)


def _first_line(text: str) -> str:
    return " ".join(str(text).split("\n")[0].split())[:300]


# llguidance's view of a tokenizer takes about a second to build (every token's bytes): one per tokenizer and size
_VOCABULARIES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def _vocabulary(tokenizer, vocab_size: int):
    with _LOCK:
        per = _VOCABULARIES.setdefault(tokenizer, {})
        if vocab_size not in per:
            per[vocab_size] = _lib().LLTokenizer(tokenizer.backend.to_str(), n_vocab=int(vocab_size),
                                                 eos_token=list(tokenizer.eos_token_ids) or None)
        return per[vocab_size]


_POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="deploycc-grammar")


class Constraint:
    """One sequence's parser state and the mask of its next token (runtime/generate.py applies it)."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher, self.vocab_size = matcher, vocab_size
        self.words = np.zeros((vocab_size + 31) // 32, np.int32)
        self.pending: Future | None = None
        self.prefetch()

    def prefetch(self) -> None:
        """Start computing the next mask (in the library's thread, while the caller runs the model's step)."""
        self.pending = _POOL.submit(self.matcher.unsafe_compute_mask_ptr, self.words.ctypes.data, self.words.nbytes)

    def allowed(self) -> np.ndarray:
        """bool [vocab_size]: the tokens the grammar allows next."""
        if self.pending is not None:
            self.pending.result()
            self.pending = None
        if self.matcher.is_error():
            raise GrammarError(f"the output no longer fits the grammar: {_first_line(self.matcher.get_error())}")
        bits = np.unpackbits(self.words.view(np.uint8), bitorder="little")[:self.vocab_size]
        return bits.astype(bool)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """The logits with every token the grammar refuses at -inf (a new array)."""
        x = np.asarray(logits, dtype=np.float32).reshape(-1)
        ok = self.allowed()
        if x.size != self.vocab_size:
            raise GrammarError(f"logits have {x.size} entries, the grammar's vocabulary {self.vocab_size}")
        if not ok.any():
            raise GrammarError("the grammar allows no next token")
        return np.where(ok, x, np.float32(-np.inf))

    def accept(self, token: int) -> None:
        """The sampled token: the parser moves on and the next mask starts computing (once the output is complete
        it allows only the end of sequence)."""
        if not self.matcher.consume_token(int(token)):
            raise GrammarError(f"token {token} does not fit the grammar: {_first_line(self.matcher.get_error())}")
        self.prefetch()

    @property
    def complete(self) -> bool:
        """The output is a whole sentence of the grammar and nothing may follow."""
        return self.matcher.is_stopped()

    def close(self) -> None:
        if self.pending is not None:
            self.pending.result()
            self.pending = None
