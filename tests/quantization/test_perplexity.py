"""`deploycc perplexity` on a tiny package with a tiny tokenizer, against a numpy computation of
the same sliding windows from the reference session's logits."""
import json
import shutil

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import require_device

import deploycc
from deploycc.cli import cli
from deploycc.errors import DeployError
from deploycc.perplexity import package_perplexity, perplexity
from deploycc.session import reference_session
from fixtures import make_tiny

TEXT = ("the quick brown fox jumps over the lazy dog while a small cat sleeps on the warm mat. "
        "a dog and a cat are friends, and the fox is not. ") * 3


def tiny_tokenizer(path):
    """A whitespace-split BPE with a vocabulary smaller than the tiny model's (101)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator([TEXT], trainers.BpeTrainer(vocab_size=90, special_tokens=["<unk>", "<s>", "</s>"]))
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "tokenizer_class": "PreTrainedTokenizerFast"}))
    return tok


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ppl") / "llama"
    shutil.copytree(make_tiny("llama-gqa1"), path)
    tok = tiny_tokenizer(path)
    assert tok.get_vocab_size() <= 101
    return path


def numpy_perplexity(logits_of, ids, window, stride):
    """The recipe, spelled out: window k covers [k*stride, k*stride + window) and scores the tokens
    after the previous window's end; token t costs -log softmax(logits[t-1])[ids[t]]."""
    total, count, prev_end = 0.0, 0, 1
    for begin in range(0, len(ids), stride):
        end = min(begin + window, len(ids))
        if end <= prev_end:
            break
        logits = logits_of(ids[begin:end]).astype(np.float64)
        for t in range(max(prev_end, begin + 1), end):
            row = logits[t - 1 - begin]
            total += np.log(np.exp(row - row.max()).sum()) + row.max() - row[ids[t]]
            count += 1
        prev_end = end
    return float(np.exp(total / count)), count


@pytest.mark.parametrize("name", ["q0f32", "q4f16_2"])
def test_package_perplexity_matches_numpy(checkpoint, tmp_path, name):
    from deploycc.package import compile_model
    from deploycc.runtime.tokenizer import Tokenizer

    require_device("opencl")
    out = compile_model(str(checkpoint), "cpu-opencl", quantization=name, context_window=64, out=str(tmp_path / "pkg"))
    ids = Tokenizer.from_dir(out).encode(TEXT)
    assert 60 < len(ids) < 200
    ref = reference_session(deploycc.load_model(str(checkpoint)), quantization=name)

    def logits_of(chunk):
        ref.reset()
        return ref.prefill(chunk, all_logits=True)

    want, count = numpy_perplexity(logits_of, ids, 24, 10)
    got = package_perplexity(out, TEXT, window=24, stride=10)
    assert got.tokens_scored == count == len(ids) - 1
    assert got.perplexity == pytest.approx(want, rel=1e-5)
    res = CliRunner().invoke(cli, ["perplexity", str(out), "--text", str(_write(tmp_path, TEXT)),
                                   "--window", "24", "--stride", "10", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["perplexity"] == pytest.approx(want, rel=1e-5)


def _write(tmp_path, text):
    p = tmp_path / "text.txt"
    p.write_text(text)
    return p


def test_windows_score_each_token_once_and_check_arguments(checkpoint):
    ref = reference_session(deploycc.load_model(str(checkpoint)), context_window=32)
    ids = list(range(3, 40))
    one = perplexity(ref, ids[:30], window=30, stride=30)
    assert one.windows == 1 and one.tokens_scored == 29
    many = perplexity(ref, ids, window=16, stride=5)
    assert many.tokens_scored == len(ids) - 1
    with pytest.raises(DeployError, match="context window"):
        perplexity(ref, ids, window=64, stride=64)
    with pytest.raises(DeployError, match="stride"):
        perplexity(ref, ids, window=8, stride=9)


def test_windows_cover_each_token_once():
    from deploycc.perplexity import windows

    wins = windows(1300, 512, 256)
    scored = [i for _, end, first in wins for i in range(first, end)]
    assert scored == list(range(1, 1300))
    assert all(end - begin <= 512 for begin, end, _ in wins)
    with pytest.raises(ValueError):
        windows(1)
    with pytest.raises(ValueError):
        windows(10, 4, 5)


def test_nll_is_log_softmax():
    import math

    from deploycc.perplexity import nll_of_targets

    logits = np.array([[0.0, 0.0], [math.log(3.0), 0.0]], dtype=np.float32)
    np.testing.assert_allclose(nll_of_targets(logits, [0, 1]), [math.log(2.0), math.log(4.0)], rtol=1e-6)
