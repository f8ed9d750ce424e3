"""Continuous batching over a page pool: Orca's iteration-level scheduling on vLLM's paged KV cache.

    batcher = Batcher(Engine.load(pkg, paged=True), max_num_sequences=8)
    session = batcher.session()     # one per request; the runtime session contract (prefill, decode, reset)
    for piece in generate(session, tokenizer, prompt, ...): ...
    session.close()                 # its pages go back to the pool at once

Each request runs the ordinary generation loop (runtime/generate.py: template, sampler with its own
parameters and seed, stop strings, streaming text) in its own thread; its session's prefill and decode
hand their tokens to the batcher and wait for their logits. The batcher's thread runs one batched step
(the package's `step` function) at a time over every sequence that has work: requests join and leave the
batch at every step, decodes go first (one token each), and prompts fill the rest of the step's token
budget (the prefill chunk), so a long prompt is prefilled in chunks between other sequences' decodes.

Pages are taken as a sequence grows and returned when it ends. A new sequence first shares the cached pages
of its prompt's longest known prefix (prefix caching, runtime/kvcache.py), then is admitted while fewer
than max_num_sequences hold pages and the available pages hold the rest of its prompt; a running one that
needs a page when none is available takes the pages of the sequence admitted last, which is recomputed from
its tokens (and the cached pages) when its turn comes again (vLLM's preemption by recomputation). Every row
of a step is computed by the same kernels whatever else is in the step, so a request's greedy output is the
same alone or in any batch (to the bit where the kernels are batch invariant: the cpu target's integer ones).
"""
from __future__ import annotations

import threading
import time

import numpy as np


class Sequence:
    """A session's tokens and where their keys and values are: ids[:cached] are in the pages."""

    def __init__(self):
        self.ids: list[int] = []
        self.cached = 0
        self.pages: list[int] = []
        self.keys: list[bytes] = []  # the prefix-cache keys of its leading full pages (registered or shared)
        self.want = False  # ids[cached:] wait for a step (the logits of the last are asked for)
        self.busy = False  # in the step that runs now
        self.closed = False
        self.done = threading.Event()
        self.logits: np.ndarray | None = None
        self.error: str | None = None
        self.all_logits = False  # its steps return every token's logits (rows), not only the last one's
        self.rows: list[np.ndarray] = []


class Batcher:
    def __init__(self, engine, max_num_sequences: int | None = None, gather_seconds: float = 0.002):
        """gather_seconds: how long a step waits for running sequences that are sampling their next token."""
        if not getattr(engine, "paged", False):
            raise ValueError("the batcher needs an engine loaded with paged=True")
        self.engine, self.cache = engine, engine.cache
        limit = self.cache.sequences
        n = limit if max_num_sequences is None else max_num_sequences
        if not 1 <= n <= limit:
            raise ValueError(f"max_num_sequences must be 1..{limit}, the batch this package was compiled for; "
                             f"got {n}")
        self.max_num_sequences, self.gather = n, gather_seconds
        self.context_window = engine.context_window
        self.cond = threading.Condition()
        self.live: list[Sequence] = []  # sequences with tokens, in order of arrival
        self.stats = {"steps": 0, "tokens": 0, "preempted": 0, "batch": 0, "prefix_tokens": 0}
        self.stopped = False
        self.thread = threading.Thread(target=self._loop, name="deploycc-batcher", daemon=True)
        self.thread.start()

    def session(self) -> BatchSession:
        return BatchSession(self)

    def close(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    @property
    def running(self) -> int:
        """Sequences that hold pages."""
        return sum(1 for s in self.live if s.pages)

    # ---- what sessions call -------------------------------------------------------------------------
    def run(self, seq: Sequence) -> np.ndarray:
        """Compute ids[cached:] of `seq` in coming steps; the last one's logits."""
        with self.cond:
            if self.stopped:
                raise RuntimeError("the batcher has stopped")
            seq.done.clear()
            seq.want, seq.error = True, None
            if seq not in self.live:
                self.live.append(seq)
            self.cond.notify_all()
        try:
            seq.done.wait()
        except BaseException:  # Ctrl-C in chat: what is cached stays, the rest is forgotten
            self.abandon(seq)
            raise
        if seq.error is not None:
            raise RuntimeError(seq.error)
        return seq.logits

    def abandon(self, seq: Sequence) -> None:
        """Stop computing `seq`'s tokens: no further step takes them, and the ids that no step computed are
        forgotten (now, or when the step it is in ends), so that ids[:cached] stays exactly what the pages hold."""
        with self.cond:
            seq.want = False
            if not seq.busy:
                del seq.ids[seq.cached:]

    def settle(self, seq: Sequence) -> None:
        """Wait until `seq` is in no running step."""
        with self.cond:
            while seq.busy:
                self.cond.wait()

    def release(self, seq: Sequence, closing: bool = False) -> None:
        """Forget what `seq` cached: its pages go back now, or (closing) after the step it is in."""
        with self.cond:
            seq.closed = seq.closed or closing
            if seq.busy and closing:
                return
            while seq.busy:  # an abandoned step (Ctrl-C): its pages are written when it ends
                self.cond.wait()
            self._free(seq)
            seq.want = False
            if seq in self.live:
                self.live.remove(seq)
            self.cond.notify_all()

    def truncate(self, seq: Sequence, n: int) -> None:
        """Keep the first n cached tokens of `seq` (a chat's next turn shares them) and the pages they are on."""
        with self.cond:
            while seq.busy:
                self.cond.wait()
            if not 0 <= n <= seq.cached:
                raise ValueError(f"cannot keep {n} positions of a sequence holding {seq.cached}")
            keep = n // self.cache.page_size  # whole pages: one that is shared or registered is never rewritten
            self.cache.give(seq.pages[keep:])
            seq.pages, seq.keys, seq.ids = seq.pages[:keep], seq.keys[:keep], seq.ids[:n]
            seq.cached = keep * self.cache.page_size

    def _free(self, seq: Sequence) -> None:
        """Give `seq`'s pages back: nothing of it is cached any more (its ids stay, to compute again, rows too)."""
        self.cache.give(seq.pages)
        seq.pages, seq.keys, seq.cached, seq.rows = [], [], 0, []

    def _share(self, seq: Sequence) -> None:
        """A sequence without pages takes the cached pages of its longest known prefix (at least its last token
        is left to compute: its logits are what the step returns); one that wants every token's logits takes none."""
        full = 0 if seq.all_logits else (len(seq.ids) - 1) // self.cache.page_size
        seq.keys = self.cache.keys(seq.ids, full)
        seq.pages = self.cache.share(seq.keys)
        seq.keys = seq.keys[:len(seq.pages)]
        seq.cached = len(seq.pages) * self.cache.page_size

    def _register(self, seq: Sequence) -> None:
        """Register the pages `seq` filled: full pages of known tokens, for later sequences to share."""
        full = seq.cached // self.cache.page_size
        if full > len(seq.keys):
            size = self.cache.page_size
            new = self.cache.keys(seq.ids[len(seq.keys) * size:], full - len(seq.keys), seq.keys[-1] if seq.keys
                                  else b"")
            for j, key in enumerate(new, len(seq.keys)):
                self.cache.register(key, seq.pages[j])
            seq.keys += new

    # ---- the batcher's thread -----------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.cond:
                while not self.stopped and not any(s.want for s in self.live):
                    self.cond.wait()
                if self.stopped:
                    for s in self.live:
                        s.error = "the batcher has stopped"
                        s.done.set()
                    return
                deadline = time.monotonic() + self.gather
                while any(s.pages and not s.want for s in self.live) and time.monotonic() < deadline:
                    self.cond.wait(max(0.0, deadline - time.monotonic()))
                plan = self._schedule()
                for s, _, _ in plan:
                    s.busy = True
                if not plan:  # every sequence with work waits for pages or a place: until a session moves
                    self.cond.wait(0.05)
                    continue
            self._step(plan)

    def _schedule(self) -> list[tuple[Sequence, int, int]]:
        """(sequence, first position, tokens) of the next step: decodes first, then prompts, in order of
        arrival, within the step's token budget and sequence count."""
        budget, plan = self.engine.prefill_chunk, []
        order = sorted((s for s in self.live if s.want), key=lambda s: (len(s.ids) - s.cached > 1, self.live.index(s)))
        for s in order:
            if len(plan) == self.cache.sequences or budget == 0:
                break
            if not s.pages:  # a new or preempted sequence: admitted while there is room for all of its tokens
                if self.running >= self.max_num_sequences:
                    continue
                self._share(s)
                if self.cache.pages_for(len(s.ids)) - len(s.pages) > self.cache.available:
                    self._free(s)
                    continue
                self.stats["prefix_tokens"] += s.cached
            n = min(len(s.ids) - s.cached, budget)
            need = self.cache.pages_for(s.cached + n) - len(s.pages)
            while need > self.cache.available and self._preempt_after(s, plan):
                pass
            if need > self.cache.available:
                continue
            s.pages += self.cache.take(need)
            plan.append((s, s.cached, n))
            budget -= n
        return plan

    def _preempt_after(self, s: Sequence, plan: list) -> bool:
        """Give the pages of the sequence admitted last (after s, not in this step) back; False if none."""
        chosen = {id(x) for x, _, _ in plan}
        for victim in reversed(self.live[self.live.index(s) + 1:]):
            if victim.pages and id(victim) not in chosen:
                self._free(victim)  # recomputed from its ids when admitted again
                self.stats["preempted"] += 1
                return True
        return False

    def _step(self, plan: list[tuple[Sequence, int, int]]) -> None:
        ids = [t for s, start, n in plan for t in s.ids[start:start + n]]
        error, logits = None, None
        every = any(s.all_logits for s, _, _ in plan)  # step_all: each token's logits, its sequence's rows
        ends = np.cumsum([n for _, _, n in plan])
        try:
            args = (ids, [s.pages for s, _, _ in plan], [start for _, start, _ in plan], [n for _, _, n in plan])
            logits = self.engine.step(*args, all_logits=True) if every else self.engine.step(*args)
        except Exception as e:  # noqa: BLE001 - the sequences of a failed step get the error, the batcher goes on
            error = str(e) or type(e).__name__
        with self.cond:
            self.stats["steps"] += 1
            self.stats["tokens"] += len(ids)
            self.stats["batch"] = len(plan)
            for b, (s, start, n) in enumerate(plan):
                s.busy = False
                if s.closed:
                    self._free(s)
                    if s in self.live:
                        self.live.remove(s)
                    continue
                if error is not None:
                    s.want, s.error = False, error
                    self._free(s)
                    s.done.set()
                    continue
                s.cached = start + n
                self._register(s)
                if every:
                    if s.all_logits:
                        s.rows.append(logits[ends[b] - n:ends[b]])
                    last = logits[ends[b] - 1]
                else:
                    last = logits[b]
                if not s.want:  # abandoned while this step ran
                    del s.ids[s.cached:]
                elif s.cached == len(s.ids):
                    s.want, s.logits = False, last
                    s.done.set()
            self.cond.notify_all()


class BatchSession:
    """One request's view of the batcher, with the runtime session contract that runtime/generate.py drives:
    prefill(ids) and decode(token) return the last position's logits, reset() forgets the cache, truncate(n)
    keeps its first n positions. It is also its own `cache` view for PrefixCache (length, keeps): a chat's
    turns reuse what the pool holds of the conversation."""

    def __init__(self, batcher: Batcher):
        self.batcher = batcher
        self.seq = Sequence()
        self.context_window = batcher.context_window
        self.on_prefill = None  # called after each prefill or decode returns

    @property
    def cache(self) -> BatchSession:
        return self

    @property
    def length(self) -> int:
        """The positions cached, once no step computes more of them (after an interrupted prefill or decode)."""
        self.batcher.settle(self.seq)
        return self.seq.cached

    # An interrupted prefill or decode leaves the cache holding a prefix of what was given (runtime/generate.py:
    # PrefixCache keeps it), where an engine's own interrupted step may leave it half written.
    settles = True

    def keeps(self, n: int) -> bool:
        return 0 <= n <= self.length

    def truncate(self, n: int) -> None:
        self.batcher.truncate(self.seq, n)

    def prefill(self, ids, all_logits: bool = False) -> np.ndarray:
        """The last position's logits, or with `all_logits` (a sequence with nothing cached) every position's."""
        ids = [int(t) for t in ids]
        if not ids:
            raise ValueError("prefill needs at least one token")
        if len(self.seq.ids) + len(ids) > self.context_window:
            raise ValueError(f"{len(self.seq.ids)} cached + {len(ids)} new tokens exceed the context window of "
                             f"{self.context_window}")
        if all_logits and self.seq.ids:
            raise ValueError("every position's logits need a fresh sequence (reset first)")
        self.seq.ids += ids
        self.seq.all_logits, self.seq.rows = all_logits, []
        try:
            logits = self.batcher.run(self.seq)
            if all_logits:
                logits = np.concatenate(self.seq.rows)
        finally:
            self.seq.all_logits, self.seq.rows = False, []
        if self.on_prefill is not None:  # its tokens' pages are in the pool (the server's n choices wait for it)
            self.on_prefill()
        return logits

    def decode(self, token_id: int) -> np.ndarray:
        return self.prefill([int(token_id)])

    def reset(self) -> None:
        self.batcher.release(self.seq)
        self.seq.ids = []

    def close(self) -> None:
        """The request is over: its pages go back to the pool (after the step it is in, if any)."""
        self.batcher.release(self.seq, closing=True)


def session_of(engine):
    """The session that generation (run, chat) drives on a loaded engine: a paged engine's batch of one, so a
    reply is the same tokens as the server's (the same batched step), else the engine itself."""
    return Batcher(engine, 1).session() if getattr(engine, "paged", False) else engine
