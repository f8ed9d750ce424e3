"""The sampler: greedy, seeded reproducibility, top-k / top-p / min-p filtering, repetition penalty, argument checks;
and the settings run, chat and serve sample with: the user's, else generation_config.json's, else a fallback."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import require_module

from deploycc.runtime.sampler import LLAMA_CLI, OPENAI, Sampler, generation_config_sampling, resolve_sampling


def logits(seed: int = 0, vocab: int = 1000) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * 3).astype(np.float32)


def draws(sampler: Sampler, x: np.ndarray, n: int = 200) -> list[int]:
    return [sampler.sample(x) for _ in range(n)]


def test_greedy_is_argmax():
    for seed in range(5):
        x = logits(seed)
        assert Sampler().sample(x) == int(np.argmax(x))
        assert Sampler(temperature=0.0, top_p=0.5, top_k=3, seed=seed).sample(x) == int(np.argmax(x))


def test_seed_reproducible_and_seeds_differ():
    x = logits(1)
    a = draws(Sampler(temperature=1.0, seed=7), x)
    assert a == draws(Sampler(temperature=1.0, seed=7), x)
    assert a != draws(Sampler(temperature=1.0, seed=8), x)
    assert len(set(a)) > 20  # a flat-ish distribution: sampling really samples


def test_top_k_one_and_tiny_top_p_are_greedy():
    for seed in range(5):
        x = logits(seed)
        best = int(np.argmax(x))
        assert set(draws(Sampler(temperature=1.5, top_k=1, seed=seed), x, 50)) == {best}
        assert set(draws(Sampler(temperature=1.5, top_p=1e-6, seed=seed), x, 50)) == {best}


def test_top_k_keeps_the_k_largest():
    x = logits(2)
    top5 = set(np.argsort(-x)[:5].tolist())
    got = set(draws(Sampler(temperature=5.0, top_k=5, seed=0), x, 500))
    assert got == top5


def test_top_p_keeps_the_nucleus():
    x = np.log(np.array([0.5, 0.3, 0.15, 0.05]))
    assert set(draws(Sampler(temperature=1.0, top_p=0.75, seed=0), x, 500)) == {0, 1}
    assert set(draws(Sampler(temperature=1.0, top_p=0.85, seed=0), x, 500)) == {0, 1, 2}
    assert set(draws(Sampler(temperature=1.0, top_p=1.0, seed=0), x, 2000)) == {0, 1, 2, 3}


def test_sampling_follows_the_distribution():
    p = np.array([0.6, 0.3, 0.1])
    counts = np.bincount(draws(Sampler(temperature=1.0, seed=3), np.log(p), 5000), minlength=3) / 5000
    np.testing.assert_allclose(counts, p, atol=0.03)


def test_repetition_penalty_as_in_transformers():
    torch = require_module("torch")
    transformers = require_module("transformers")
    x = logits(4, 50)
    history = [3, 7, 7, 11, int(np.argmax(x)), int(np.argmin(x))]
    proc = transformers.RepetitionPenaltyLogitsProcessor(1.7)
    expected = proc(torch.tensor([history]), torch.tensor(x[None])).numpy()[0]
    # Greedy after the penalty is argmax of the penalized logits; the top token was penalized away.
    got = Sampler(repetition_penalty=1.7).sample(x, history)
    assert got == int(np.argmax(expected)) != int(np.argmax(x))


def test_repetition_penalty_effect():
    x = np.array([2.0, 1.9, -1.0, -1.05])
    assert Sampler().sample(x, [0]) == 0
    assert Sampler(repetition_penalty=1.2).sample(x, [0]) == 1  # 2.0 / 1.2 < 1.9
    y = np.array([-1.0, -1.05, -3.0])
    assert Sampler(repetition_penalty=1.2).sample(y, [0]) == 1  # -1.0 * 1.2 < -1.05
    assert Sampler(repetition_penalty=0.5).sample(np.array([1.0, 1.5]), [0]) == 0  # < 1 rewards repeats


def min_p_reference(x: np.ndarray, temperature: float, min_p: float, top_p: float = 1.0) -> np.ndarray:
    """The distribution sampled from, in numpy: softmax of x / temperature, top-p's smallest head reaching top_p,
    then the tokens at least min_p times as likely as the most likely one, renormalized."""
    p = np.exp((x - x.max()) / temperature)
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    head = order[:int(np.searchsorted(np.cumsum(p[order]), top_p)) + 1] if top_p < 1 else order
    q = np.zeros_like(p)
    q[head] = p[head]
    q[q < min_p * p.max()] = 0
    return q / q.sum()


@pytest.mark.parametrize("temperature, min_p, top_p", [(1.0, 0.1, 1.0), (0.7, 0.05, 1.0), (1.3, 0.2, 1.0),
                                                       (1.0, 0.1, 0.9)])
def test_min_p_follows_numpy(temperature, min_p, top_p):
    x = logits(6, 60) / 2
    want = min_p_reference(x, temperature, min_p, top_p)
    assert 3 < np.count_nonzero(want) < 50  # the case filters something, and keeps several tokens
    n = 8000
    got = np.bincount(draws(Sampler(temperature=temperature, min_p=min_p, top_p=top_p, seed=1), x, n),
                      minlength=x.size) / n
    assert set(np.flatnonzero(got)) <= set(np.flatnonzero(want))  # nothing below the threshold is ever drawn
    np.testing.assert_allclose(got, want, atol=0.02)


def test_min_p_as_in_transformers():
    torch = require_module("torch")
    transformers = require_module("transformers")
    x = logits(7, 80) / 2
    scaled = transformers.TemperatureLogitsWarper(0.8)(None, torch.tensor(x[None], dtype=torch.float64))
    kept = torch.isfinite(transformers.MinPLogitsWarper(0.05)(None, scaled)).numpy()[0]
    drawn = set(draws(Sampler(temperature=0.8, min_p=0.05, seed=2), x, 5000))
    assert drawn == set(np.flatnonzero(kept).tolist())


def test_input_not_modified_and_float32_ok():
    x = logits(5)
    before = x.copy()
    Sampler(temperature=0.7, top_k=10, top_p=0.9, repetition_penalty=1.3).sample(x, [1, 2, 3])
    np.testing.assert_array_equal(x, before)


def test_masked_logits():
    x = np.full(10, -np.inf, dtype=np.float32)
    x[4] = 0.0
    assert set(draws(Sampler(temperature=1.0, seed=0), x, 20)) == {4}
    with pytest.raises(ValueError, match="NaN"):
        Sampler().sample(np.array([0.0, np.nan]))
    with pytest.raises(ValueError, match="no finite maximum"):
        Sampler(temperature=1.0).sample(np.full(3, -np.inf))


@pytest.mark.parametrize("kwargs, message", [
    (dict(temperature=-0.1), "temperature must be a finite number >= 0"),
    (dict(temperature=float("nan")), "temperature must be a finite number >= 0"),
    (dict(temperature="hot"), "temperature must be"),
    (dict(top_p=0.0), r"top_p must be in \(0, 1\]"),
    (dict(top_p=1.5), r"top_p must be in \(0, 1\]"),
    (dict(top_k=-1), "top_k must be an integer >= 0"),
    (dict(top_k=2.5), "top_k must be an integer >= 0"),
    (dict(min_p=-0.1), r"min_p must be in \[0, 1\]"),
    (dict(min_p=1.5), r"min_p must be in \[0, 1\]"),
    (dict(repetition_penalty=0.0), "repetition_penalty must be a finite number > 0"),
    (dict(repetition_penalty=float("inf")), "repetition_penalty must be"),
    (dict(temperature=10**400), "temperature must be a finite number"),  # JSON may hold ints beyond a float
    (dict(repetition_penalty=10**400), "repetition_penalty must be a finite number"),
    (dict(seed=-1), "seed must be an integer >= 0"),
    (dict(seed=1.5), "seed must be an integer >= 0"),
])
def test_bad_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message) as e:
        Sampler(**kwargs)
    assert "\n" not in str(e.value)


def test_numpy_scalars_accepted():
    s = Sampler(temperature=np.float32(0.5), top_p=np.float64(0.9), top_k=np.int64(4), seed=np.int32(1))
    assert (s.temperature, s.top_k) == (0.5, 4)


# ---- which settings --------------------------------------------------------------------------------

NOT_GIVEN = dict(temperature=None, top_p=None, top_k=None, min_p=None, repetition_penalty=None)
MODEL = {"temperature": 0.7, "top_p": 0.9, "top_k": 50, "repetition_penalty": 1.05, "eos_token_id": 2}


def test_the_model_settings_are_the_default():
    s = resolve_sampling(NOT_GIVEN, generation_config_sampling(MODEL), LLAMA_CLI)
    assert s.options() == dict(temperature=0.7, top_p=0.9, top_k=50, min_p=0.0, repetition_penalty=1.05)
    assert s.describe() == "temperature 0.7, top_p 0.9, top_k 50, min_p 0, repetition_penalty 1.05 " \
                           "(from generation_config.json)"


def test_given_settings_win():
    s = resolve_sampling({**NOT_GIVEN, "temperature": 1.2, "top_k": 5}, generation_config_sampling(MODEL), LLAMA_CLI)
    assert s.options() == dict(temperature=1.2, top_p=0.9, top_k=5, min_p=0.0, repetition_penalty=1.05)
    assert s.describe().endswith("(temperature, top_k from the command line; top_p, min_p, repetition_penalty from "
                                 "generation_config.json)")


def test_given_temperature_zero_is_plain_greedy():
    s = resolve_sampling({**NOT_GIVEN, "temperature": 0.0}, generation_config_sampling(MODEL), LLAMA_CLI)
    assert (s.temperature, s.repetition_penalty) == (0.0, 1.0)  # the model's penalty does not apply
    assert s.describe() == "greedy, temperature 0, repetition_penalty 1 (from the command line)"
    s = resolve_sampling({"temperature": 0.0, "repetition_penalty": 1.3}, generation_config_sampling(MODEL), OPENAI)
    assert (s.temperature, s.repetition_penalty) == (0.0, 1.3)  # unless it is given too


def test_do_sample_false_is_greedy_with_the_model_penalty():
    model = generation_config_sampling({**MODEL, "do_sample": False})
    s = resolve_sampling(NOT_GIVEN, model, LLAMA_CLI)
    assert (s.temperature, s.repetition_penalty) == (0.0, 1.05)  # as transformers' greedy search
    assert s.describe() == "greedy, temperature 0, repetition_penalty 1.05 (from generation_config.json)"
    # sampling asked for on the command line takes the model's other settings
    assert resolve_sampling({"temperature": 0.5}, model, LLAMA_CLI).top_p == 0.9
    assert resolve_sampling(NOT_GIVEN, generation_config_sampling({"do_sample": False}), OPENAI).temperature == 0.0


def test_without_model_settings_the_fallback():
    for config in ({}, {"eos_token_id": 2, "bos_token_id": 1}, {"do_sample": True}, {"temperature": None}):
        assert generation_config_sampling(config) is None
        s = resolve_sampling(NOT_GIVEN, generation_config_sampling(config), LLAMA_CLI)
        assert s.options() == dict(temperature=0.8, top_p=0.95, top_k=40, min_p=0.05, repetition_penalty=1.0)
        assert s.describe().endswith("(from llama.cpp's defaults)")
        assert resolve_sampling({}, None, OPENAI).options() == dict(temperature=1.0, top_p=1.0, top_k=0, min_p=0.0,
                                                                    repetition_penalty=1.0)


def test_a_partial_model_config_leaves_the_rest_off():
    s = resolve_sampling(NOT_GIVEN, generation_config_sampling({"top_p": 0.8}), LLAMA_CLI)
    assert s.options() == dict(temperature=1.0, top_p=0.8, top_k=0, min_p=0.0, repetition_penalty=1.0)


@pytest.mark.parametrize("config, message", [({"temperature": -1}, "temperature must be"),
                                             ({"top_k": "many"}, "top_k must be"),
                                             ({"do_sample": "yes"}, "do_sample should be true or false")])
def test_bad_model_settings(config, message):
    with pytest.raises(ValueError, match=message):
        generation_config_sampling(config)
