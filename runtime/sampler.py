"""Next-token sampling from one row of logits, with the logit processors of Hugging Face generate.

Order as in transformers: repetition penalty, then temperature, then top-k, then top-p (nucleus), then
min-p (on the temperature-scaled distribution, as transformers' MinPLogitsWarper; llama.cpp applies it before
the temperature). Temperature 0 means greedy (argmax after the repetition penalty). A seeded numpy Generator
makes sampling reproducible: the same seed, logits and history give the same tokens.

`resolve_sampling` is the one place that decides the settings `run`, `chat` and `serve` use: what the user gave,
else the model's generation_config.json, else a fallback (llama.cpp's llama-cli defaults for run and chat,
OpenAI's for serve).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np


def _real(v) -> bool:
    return isinstance(v, Real) and not isinstance(v, bool)


def _finite(v) -> bool:
    try:
        return _real(v) and math.isfinite(v)
    except OverflowError:  # an int beyond a float's range (a JSON file may hold one)
        return False


def _integer(v) -> bool:
    return isinstance(v, Integral) and not isinstance(v, bool)


class Sampler:
    def __init__(self, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                 repetition_penalty: float = 1.0, seed: int = 0, min_p: float = 0.0):
        if not (_finite(temperature) and temperature >= 0):
            raise ValueError(f"temperature must be a finite number >= 0 (0 means greedy), got {temperature!r}")
        if not (_real(top_p) and 0 < top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1], got {top_p!r}")
        if not _integer(top_k) or top_k < 0:
            raise ValueError(f"top_k must be an integer >= 0 (0 means no top-k filtering), got {top_k!r}")
        if not (_real(min_p) and 0 <= min_p <= 1):
            raise ValueError(f"min_p must be in [0, 1] (0 means no min-p filtering), got {min_p!r}")
        if not (_finite(repetition_penalty) and repetition_penalty > 0):
            raise ValueError(f"repetition_penalty must be a finite number > 0 (1 means none), got {repetition_penalty!r}")
        if not _integer(seed) or seed < 0:
            raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
        self.temperature = float(temperature)
        self.top_p = float(top_p)
        self.top_k = int(top_k)
        self.min_p = float(min_p)
        self.repetition_penalty = float(repetition_penalty)
        self.rng = np.random.default_rng(int(seed))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sample(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        """One token id from logits [vocab]; `history` is the ids the repetition penalty applies to."""
        x = np.asarray(logits).reshape(-1)
        if np.isnan(x).any():
            raise ValueError("logits contain NaN; the model produced invalid output")
        if self.greedy and self.repetition_penalty == 1.0:  # no copy: float32 -> float64 keeps the order exactly
            return int(np.argmax(x))
        x = x.astype(np.float64)  # a copy: the penalty and temperature below write into it
        if self.repetition_penalty != 1.0 and len(history):
            seen = np.unique(np.asarray(history, dtype=np.int64))
            s = x[seen]
            x[seen] = np.where(s < 0, s * self.repetition_penalty, s / self.repetition_penalty)
        if self.greedy:
            return int(np.argmax(x))
        x /= self.temperature
        if 0 < self.top_k < x.size:
            cand = np.argpartition(-x, self.top_k - 1)[:self.top_k]
        else:
            cand = np.arange(x.size)
        cand = cand[np.argsort(-x[cand], kind="stable")]
        if not np.isfinite(x[cand[0]]):
            raise ValueError("logits have no finite maximum; cannot sample")
        p = np.exp(x[cand] - x[cand[0]])
        p /= p.sum()
        if self.top_p < 1.0:
            # Keep the smallest head of the sorted distribution whose mass reaches top_p (at least one token).
            keep = (np.cumsum(p) - p) < self.top_p
            cand, p = cand[keep], p[keep] / p[keep].sum()
        if self.min_p > 0.0:
            # Keep the tokens at least min_p times as likely as the most likely one (p[0], sorted first).
            keep = p >= self.min_p * p[0]
            cand, p = cand[keep], p[keep] / p[keep].sum()
        cdf = np.cumsum(p)
        i = int(np.searchsorted(cdf, self.rng.random() * cdf[-1], side="right"))
        return int(cand[min(i, cand.size - 1)])


# ---- which settings: the user's, the model's, or a fallback ---------------------------------------

SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
GENERATION_CONFIG = "generation_config.json"


@dataclass(frozen=True)
class SamplingDefaults:
    """A whole set of sampler settings and where it comes from: a model's generation_config.json, or what a command
    falls back to for a model that sets none."""
    name: str
    temperature: float
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repetition_penalty: float = 1.0


# llama.cpp's common_params_sampling, what llama-cli and llama-server sample with: temp 0.80, top_k 40,
# top_p 0.95, min_p 0.05, penalty_repeat 1.00
LLAMA_CLI = SamplingDefaults("llama.cpp's defaults", 0.8, top_p=0.95, top_k=40, min_p=0.05)
# OpenAI's API: temperature 1, top_p 1; it has no top_k, min_p or repetition penalty (off)
OPENAI = SamplingDefaults("OpenAI's defaults", 1.0)


@dataclass(frozen=True)
class Sampling:
    """Resolved sampler settings; `sources` says where each came from (field, source)."""
    temperature: float
    top_p: float
    top_k: int
    min_p: float
    repetition_penalty: float
    sources: tuple[tuple[str, str], ...]

    def options(self) -> dict:
        """generate's keyword arguments."""
        return {f: getattr(self, f) for f in SAMPLING_FIELDS}

    def to_json(self) -> dict:
        return {**self.options(), "from": dict(self.sources)}

    def describe(self) -> str:
        """`temperature 0.7, top_p 0.9, top_k 50, min_p 0, repetition_penalty 1.05 (from generation_config.json)`.
        Greedy names what it depends on alone: `greedy, temperature 0, repetition_penalty 1 (from ...)`."""
        greedy = self.temperature == 0
        fields = ("temperature", "repetition_penalty") if greedy else SAMPLING_FIELDS
        where: dict[str, list[str]] = {}
        for f, source in self.sources:
            if f in fields:
                where.setdefault(source, []).append(f)
        values = ("greedy, " if greedy else "") + ", ".join(f"{f} {getattr(self, f):g}" for f in fields)
        origin = (f"from {next(iter(where))}" if len(where) == 1 else
                  "; ".join(f"{', '.join(fs)} from {source}" for source, fs in where.items()))
        return f"{values} ({origin})"


def generation_config_sampling(config: dict) -> SamplingDefaults | None:
    """The sampler settings of a model's generation_config.json, all of them or none. A file that sets any of
    temperature, top_p, top_k, min_p, repetition_penalty (null: unset), or `do_sample: false`, is the model's
    sampler: what it leaves out is off (temperature 1, as transformers), as vLLM reads the file; one that sets none
    leaves the sampler to the command's fallback. `do_sample: false` is greedy (temperature 0); its
    repetition_penalty still applies, as transformers applies it to greedy search. Without do_sample the fields
    apply as they stand, as MLC and vLLM read them (transformers, whose do_sample defaults to false, would decode
    greedily and warn). A value the sampler refuses is a ValueError."""
    fields = {f: config[f] for f in SAMPLING_FIELDS if config.get(f) is not None}
    do_sample = config.get("do_sample")
    if do_sample is not None and not isinstance(do_sample, bool):
        raise ValueError(f"do_sample should be true or false, not {do_sample!r:.40}")
    Sampler(**fields)
    if not fields and do_sample is not False:
        return None
    if do_sample is False:
        fields["temperature"] = 0.0
    return SamplingDefaults(GENERATION_CONFIG, **{"temperature": 1.0, **fields})


def resolve_sampling(given: dict, model: SamplingDefaults | None, fallback: SamplingDefaults,
                     given_from: str = "the command line") -> Sampling:
    """Each setting from `given` (the user's; None: not given), else from the model's settings
    (generation_config_sampling), else, for a model that sets none, from `fallback`. A given temperature 0 without
    a given repetition penalty is plain greedy, the argmax of the logits, whatever penalty the model sets."""
    given = {f: given[f] for f in SAMPLING_FIELDS if given.get(f) is not None}
    if given.get("temperature") == 0 and "repetition_penalty" not in given:
        given["repetition_penalty"] = 1.0
    base = model or fallback
    values = {f: given.get(f, getattr(base, f)) for f in SAMPLING_FIELDS}
    sources = [(f, given_from if f in given else base.name) for f in SAMPLING_FIELDS]
    Sampler(**values)
    return Sampling(float(values["temperature"]), float(values["top_p"]), int(values["top_k"]), float(values["min_p"]),
                    float(values["repetition_penalty"]), tuple(sources))
