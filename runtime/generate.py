"""The generation loop: template, encode, prefill, then sample and decode one token at a time, streaming text.

It drives any model session with the runtime contract (`prefill(ids) -> logits [vocab]`,
`decode(token) -> logits [vocab]`, `reset()`, `truncate(n)`, `context_window`): the numpy reference
session of the compiler, or a compiled package's engine. With `reuse_cache`, a generation keeps what
the session's KV cache holds of its prompt (PrefixCache): a chat turn prefills only what it adds.
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Iterator, Sequence
from numbers import Integral

import numpy as np

from .sampler import Sampler
from .tokenizer import Tokenizer


class ContextWindowError(ValueError):
    """The prompt does not leave room for one generated token in the session's context window."""


class UsageError(ValueError):
    """An option value a command cannot use (checked before any work starts)."""


class PrefixCache:
    """The token ids whose keys and values a session's KV cache holds, in order: one per session
    (`PrefixCache.of(session)`), so that every generation on a session keeps it up to date.

    A new prompt keeps the longest cached prefix it shares (the cache is cut back to it with the
    session's `truncate(n)`) and prefills only the rest. Keys and values of position i depend on
    tokens 0..i alone, so the kept ones are what a fresh prefill would compute (up to the rounding
    of another kernel: chunked prefill versus one-token decode). Whatever the history as the chat
    template renders it again (an assistant reply tokenized otherwise than it was generated, an
    interrupted reply, dropped turns, a new system prompt), the prefix match reuses what is valid
    and no more. A session used directly in between (bench, perplexity) leaves a cache length that
    no longer matches, and the next generation starts afresh.

    A session call interrupted by Ctrl-C (chat) leaves the cache holding an unknown part of what it was
    given: a session that `settles` (runtime/batch.py: a batched session, whose steps end whole and whose
    length waits for them) holds a prefix of it, which the next start keeps; any other is reset.
    """

    _of: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def __init__(self):
        self.ids: list[int] = []  # (no reference to the session: it is the weak key)
        self.partial = False  # a call that would cache all of `ids` started and did not return

    @classmethod
    def of(cls, session) -> PrefixCache:
        try:
            return cls._of.setdefault(session, cls())
        except TypeError:  # a session that takes no weak references: tracked per generation only
            return cls()

    def _cached(self, session) -> list[int]:
        length = getattr(getattr(session, "cache", None), "length", -1)
        if self.partial:
            return self.ids[:length] if 0 <= length <= len(self.ids) else []
        return self.ids if len(self.ids) == length else []

    def start(self, session, ids: Sequence[int], reuse: bool = True) -> int:
        """Cut the cache back to its common prefix with `ids` (none unless `reuse`), leaving at least one
        token to prefill (the last position's logits come from a prefill); return how many are kept."""
        n = 0
        for a, b in zip(self._cached(session) if reuse else (), ids):
            if a != b:
                break
            n += 1
        n = min(n, len(ids) - 1)
        truncate = getattr(session, "truncate", None)
        keeps = getattr(getattr(session, "cache", None), "keeps", None)  # sliding-window rings forget
        if n > 0 and truncate is not None and (keeps is None or keeps(n)):
            truncate(n)
        else:
            n = 0
            session.reset()
        self.ids, self.partial = list(ids[:n]), False
        return n

    def begin(self, ids: Sequence[int]) -> None:
        """A session call that caches `ids` (those cached already, and the ones it is given) starts."""
        self.ids, self.partial = list(ids), True

    def end(self) -> None:
        self.partial = False

    def interrupted(self, session) -> None:
        """The call did not return: keep what a settling session holds (see the class), forget the rest."""
        if not getattr(session, "settles", False):
            self.ids, self.partial = [], False


def encode_prompt(tokenizer: Tokenizer, prompt: str | Sequence[dict], chat: bool = True,
                  template_kwargs: dict | None = None) -> list[int]:
    """Prompt ids: a message list always goes through the chat template; a string does when `chat` and the model has
    one. `template_kwargs`: more variables for the template (Qwen3's enable_thinking)."""
    if isinstance(prompt, str):
        if not (chat and tokenizer.chat_template):
            return tokenizer.encode(prompt, add_special_tokens=True)
        prompt = [{"role": "user", "content": prompt}]
    # The rendered template already holds the special tokens (bos, role markers) it wants.
    return tokenizer.encode(tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True,
                                                         **(template_kwargs or {})),
                            add_special_tokens=False)


def _stops(stop: str | Sequence[str]) -> tuple[str, ...]:
    stops = (stop,) if isinstance(stop, str) else tuple(stop)
    if not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop must be a string or a list of non-empty strings, got {stop!r}")
    return stops


def _held_back(text: str, stops: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that could still grow into a stop string."""
    for n in range(min(len(text), max(map(len, stops), default=1) - 1), 0, -1):
        if any(s.startswith(text[-n:]) for s in stops):
            return n
    return 0


def generate(session, tokenizer: Tokenizer, prompt_or_messages: str | Sequence[dict], max_tokens: int = 64,
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, repetition_penalty: float = 1.0,
             seed: int = 0, stop: str | Sequence[str] = (), chat: bool = True, stats: dict | None = None,
             reuse_cache: bool = False, ids: Sequence[int] | None = None, min_p: float = 0.0,
             grammar=None, logprobs: int | None = None, prompt_logprobs: int | None = None,
             keep_special: Sequence[int] = ()) -> Iterator[str]:
    """Stream the model's reply as text pieces.

    Generation ends at an eos token (not shown), a stop string (cut from the text), `max_tokens`, or
    a full context window. The arguments are checked, and the prompt encoded and measured against
    the context window, when this is called; the model runs as the iterator is consumed. `stats`, if
    given, is filled when the iterator finishes or is closed: prompt_tokens, prefilled_tokens (those
    not reused from `prefix`), generated (ids, eos included), finish_reason (eos | stop | length |
    context | cancelled), prefill_seconds, decode_seconds, and prefill_tok_s / decode_tok_s (session
    time only, without sampling and detokenization). With `reuse_cache`, the session's KV cache is
    kept as far as it holds the start of this prompt (PrefixCache: chat turns); otherwise it is reset.
    `ids`: the prompt as encode_prompt encoded it already (the server, which measured it). `grammar` (a
    runtime/grammar.py Grammar): every token is one the grammar allows (structured output); the reply ends at
    eos once the grammar is complete. `logprobs` (0 to 20): `stats["logprobs"]` gets, as each token is sampled
    (before its text is yielded), (token, its log probability, the `logprobs` most likely (token, log
    probability)) under the model's distribution (log-softmax of the raw logits); the eos that ends a reply is left
    out, as it is of the text. `prompt_logprobs` (0 to 20): the prompt is prefilled with every position's logits
    and `stats["prompt_logprobs"]` holds the same for each prompt token ((first token, None, None) first: nothing
    precedes it); max_tokens may then be 0 (score the prompt only). `keep_special`: special tokens whose text the
    reply keeps (Mistral's [TOOL_CALLS], which runtime/tools.py reads); the others are left out of the text.
    """
    sampler = Sampler(temperature, top_p, top_k, repetition_penalty, seed, min_p)
    stops = _stops(stop)
    least = 0 if prompt_logprobs is not None else 1
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, Integral) or max_tokens < least:
        raise ValueError(f"max_tokens must be an integer >= {least}, got {max_tokens!r}")
    for name, value in (("logprobs", logprobs), ("prompt_logprobs", prompt_logprobs)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, Integral)
                                  or not 0 <= value <= MAX_LOGPROBS):
            raise ValueError(f"{name} must be an integer from 0 to {MAX_LOGPROBS}, got {value!r}")
    ids = list(ids) if ids is not None else encode_prompt(tokenizer, prompt_or_messages, chat)
    if not ids:
        raise ValueError("the prompt encodes to no tokens; give some text")
    window = int(session.context_window)
    if len(ids) + 1 > window:
        raise ContextWindowError(f"the prompt is {len(ids)} tokens, but the context window is {window} and must also "
                                 f"hold at least one generated token; shorten the prompt or compile with a larger "
                                 f"context window")
    return _run(session, tokenizer, ids, sampler, min(int(max_tokens), window - len(ids)), int(max_tokens), stops, stats,
                reuse_cache and prompt_logprobs is None, grammar, logprobs, prompt_logprobs, keep_special)


MAX_LOGPROBS = 20


def log_softmax(logits) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    x = x - x.max()
    return x - np.log(np.exp(x).sum())


def token_logprobs(logits, token: int, top: int) -> tuple[int, float, list[tuple[int, float]]]:
    """(token, its log probability, the `top` most likely (token, log probability), most likely first)."""
    lp = log_softmax(logits)
    best = np.argpartition(-lp, top - 1)[:top] if 0 < top < lp.size else np.arange(lp.size if top else 0)
    best = best[np.argsort(-lp[best], kind="stable")]
    return int(token), float(lp[token]), [(int(i), float(lp[i])) for i in best]


def _run(session, tokenizer: Tokenizer, ids: list[int], sampler: Sampler, budget: int, max_tokens: int,
         stops: tuple[str, ...], stats: dict | None, reuse_cache: bool, grammar=None,
         logprobs: int | None = None, prompt_logprobs: int | None = None, keep_special: Sequence[int] = ()
         ) -> Iterator[str]:
    eos = set(tokenizer.eos_token_ids)
    detok = tokenizer.stream_decoder(skip_special_tokens=True, keep=keep_special)
    history = list(ids)  # the repetition penalty covers the prompt too, as in transformers
    generated: list[int] = []
    pending = ""  # decoded text not yet yielded: its end may be the start of a stop string
    reason = None
    t_prefill = t_decode = 0.0
    decodes = cached = 0
    prefix = PrefixCache.of(session)
    constraint = None
    entries: list = []
    if logprobs is not None and stats is not None:
        stats["logprobs"] = entries  # filled as tokens come (a stream sends each piece's own)
    try:
        cached = prefix.start(session, ids, reuse_cache)
        prefix.begin(ids)
        t0 = time.perf_counter()
        if prompt_logprobs is None:
            logits = session.prefill(ids[cached:])
        else:  # every position's logits (nothing reused: cached is 0)
            rows = session.prefill(ids, all_logits=True)
            logits = rows[-1]
            scored = [(int(ids[0]), None, None)] + [token_logprobs(rows[i - 1], ids[i], prompt_logprobs)
                                                    for i in range(1, len(ids))]
            if stats is not None:
                stats["prompt_logprobs"] = scored
        t_prefill = time.perf_counter() - t0
        prefix.end()
        if budget == 0:
            reason = "length"
        while reason is None:
            raw = logits
            if grammar is not None:
                if constraint is None:  # its vocabulary is the logits' (the embedding rows, maybe padded)
                    constraint = grammar.constraint(tokenizer, int(logits.size))
                logits = constraint.apply(logits)
            token = sampler.sample(logits, history)
            if constraint is not None:
                constraint.accept(token)  # the next mask computes while the session decodes this token
            generated.append(token)
            history.append(token)
            if token in eos:
                reason = "eos"
            else:
                if logprobs is not None:
                    entries.append(token_logprobs(raw, token, logprobs))
                pending += detok.put(token)
                if len(generated) == budget:
                    reason = "length" if budget == max_tokens else "context"
            if reason:
                pending += detok.flush()
            hits = [i for i in (pending.find(s) for s in stops) if i >= 0]
            if hits:
                reason, pending = "stop", pending[:min(hits)]
            keep = 0 if reason else _held_back(pending, stops)
            if len(pending) > keep:
                yield pending[:len(pending) - keep]
                pending = pending[len(pending) - keep:]
            if reason is None:
                prefix.begin(prefix.ids + [token])
                t0 = time.perf_counter()
                logits = session.decode(token)
                t_decode += time.perf_counter() - t0
                prefix.end()
                decodes += 1
    finally:
        if constraint is not None:
            constraint.close()
        if prefix.partial:
            prefix.interrupted(session)
        if stats is not None:
            prefilled = len(ids) - cached
            stats.update(prompt_tokens=len(ids), prefilled_tokens=prefilled, generated=generated,
                         finish_reason=reason or "cancelled", prefill_seconds=t_prefill, decode_seconds=t_decode,
                         prefill_tok_s=prefilled / t_prefill if t_prefill else 0.0,
                         decode_tok_s=decodes / t_decode if t_decode else 0.0)
