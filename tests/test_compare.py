"""benchmarks/compare.py: its perplexity matches deploycc's, and its ratios, limits and table are right.

The peers themselves (llama.cpp, PyTorch) are not run here: building llama-cpp-python takes 10-20 minutes.
The numbers the benchmark prints rest on these functions.
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from deploycc.perplexity import perplexity

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def compare():
    spec = importlib.util.spec_from_file_location("compare_bench", ROOT / "benchmarks" / "compare.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class _Session:
    """A deterministic 'model': logits of position i depend on the window's tokens up to i."""

    vocab = 11

    def __init__(self):
        self.calls = []

    def reset(self):
        pass

    def logits(self, ids):
        ids = np.asarray(ids, dtype=np.float64)
        pos = np.arange(len(ids))[:, None]
        v = np.arange(self.vocab)[None, :]
        return np.sin(np.cumsum(ids)[:, None] * 0.37 + v * 1.3 + pos * 0.11).astype(np.float32)

    def prefill(self, ids, all_logits=False):
        self.calls.append(len(ids))
        out = self.logits(ids)
        return out if all_logits else out[-1]


@pytest.mark.parametrize("n,window,stride", [(1300, 512, 512), (1300, 512, 256), (512, 512, 512), (7, 4, 3)])
def test_perplexity_equals_deploycc_perplexity(compare, n, window, stride):
    """The workers score peers with runtime/perplexity.py loaded by path (no deploycc in llama.cpp's venv),
    through LogitsSession; that gives deploycc.perplexity's result exactly."""
    import bench_workers

    ids = list(np.random.default_rng(n).integers(0, _Session.vocab, n))
    ours = perplexity(_Session(), ids, window, stride)
    s = _Session()
    by_path = bench_workers.load_runtime_module("perplexity")
    theirs = by_path.perplexity(bench_workers.LogitsSession(s.logits), ids, window, stride).to_dict()
    assert theirs["windows"] == ours.windows
    assert theirs["tokens_scored"] == ours.tokens_scored
    # every token after the first once, except a window's first token when windows do not overlap
    assert ours.tokens_scored == n - 1 - (len(range(0, n, stride)) - 1 if stride == window else 0)
    assert theirs["perplexity"] == pytest.approx(ours.perplexity, rel=1e-12)
    assert by_path.__file__ == str(ROOT / "runtime" / "perplexity.py")


def test_workers_measure_peak_rss_of_their_own_process(compare):
    import bench_workers

    rss = bench_workers.load_runtime_module("procstat").peak_rss_bytes()
    assert 10 << 20 < rss < 64 << 30


def _row(compare, tool, key, pre=None, dec=None, wbytes=None, ppl=None, tokens=None):
    r = compare.new_row(tool, key, key)
    r.update(prefill_tok_s=pre or {}, decode_tok_s=dec, weights_bytes=wbytes, perplexity=ppl, tokens=tokens)
    return r


def test_derive_ratios_limits_and_headline(compare):
    rows = [
        _row(compare, "deploycc", "q4f16_2-q8head", {"128": 400.0, "512": 350.0}, 130.0, 100_000_000, 15.42),
        _row(compare, "deploycc", "q0f32", {"128": 100.0}, 20.0, 500_000_000, 15.41),
        _row(compare, "llama.cpp", "Q4_1", {"128": 150.0}, 65.0, 90_000_000, 15.46),
        _row(compare, "llama.cpp", "Q4_0", {"128": 400.0}, 89.0, 80_000_000, 15.9),
        _row(compare, "pytorch", "float32", {"128": 500.0}, 15.0, 540_000_000),
    ]
    out = compare.derive(rows, {"read_gb_s": 10.0}, [128, 512])
    refs = out["references"]
    assert refs["llama_best_prefill_format"] == "Q4_0" and refs["llama_best_prefill_tok_s"] == 400.0
    assert refs["llama_q4_1_decode_tok_s"] == 65.0 and refs["llama_q4_1_perplexity"] == 15.46
    assert rows[0]["decode_limit_tok_s"] == pytest.approx(100.0)  # 10 GB/s / 100 MB
    assert rows[0]["pct_of_limit"] == pytest.approx(130.0)
    assert rows[0]["prefill_ratio"] == pytest.approx(1.0)
    assert rows[0]["decode_ratio"] == pytest.approx(2.0)
    assert rows[4]["prefill_ratio"] == pytest.approx(1.25)  # PyTorch is compared with llama.cpp's best too
    h = out["headline"]
    assert h["format"] == "q4f16_2-q8head" and h["decode_ratio"] == pytest.approx(2.0)
    assert h["perplexity_le_llama_q4_1"] is True


def test_failed_llama_rows_are_no_reference(compare):
    rows = [_row(compare, "deploycc", "q4f16_1", {"128": 300.0}, 40.0, 100),
            _row(compare, "llama.cpp", "Q4_1", {"128": 900.0}, 900.0, 100)]
    rows[1]["error"] = "crashed (SIGSEGV)"
    out = compare.derive(rows, None, [128])
    assert out["references"]["llama_q4_1_decode_tok_s"] is None
    assert rows[0]["decode_ratio"] is None and rows[0]["decode_limit_tok_s"] is None
    assert out["headline"]["perplexity_le_llama_q4_1"] is None


def test_greedy_agreement_counts_the_leading_run(compare):
    rows = [_row(compare, "pytorch", "float32", tokens=[1, 2, 3, 4]),
            _row(compare, "deploycc", "q4f16_1", tokens=[1, 2, 9, 4])]
    assert compare.greedy_agreement(rows) == "pytorch float32"
    assert rows[1]["greedy_match"] == "2/4" and rows[0]["greedy_match"] == "4/4"


def test_table_cells_and_json(compare):
    r = _row(compare, "llama.cpp", "F16", {"128": 123.45}, float("nan"), 270_000_000)
    r["error"] = "crashed (SIGSEGV)"
    cells = compare.table_cells(r, [128, 512])
    cols = compare.table_columns([128, 512])
    assert len(cells) == len(cols)
    assert cells[cols.index("prefill@128 tok/s")] == "123.5"
    assert cells[cols.index("prefill@512 tok/s")] == "—"
    assert cells[cols.index("decode tok/s")] == "—"  # NaN is shown as missing
    assert cells[cols.index("weights MB")] == "270.0"
    assert cells[-1].startswith("failed: crashed")
    assert json.loads(compare.to_json({"x": [float("inf"), 1.5]})) == {"x": [None, 1.5]}


def test_arguments(compare):
    a = compare.parse_args(["--quick"])
    assert (a.repeat, a.prompt_lens, a.gen, a.perplexity) == (1, [32], 16, False)
    a = compare.parse_args(["--quick", "--gen", "8", "--only", "deploycc,pytorch"])
    assert a.gen == 8 and a.only == ["deploycc", "pytorch"]
    a = compare.parse_args([])
    assert (a.repeat, a.prompt_lens, a.gen, a.perplexity) == (3, [128, 512], 128, True)
    for bad in (["--only", "vllm"], ["--prompt-lens", "0"], ["--prompt-lens", "2000"], ["--repeat", "x"]):
        with pytest.raises(SystemExit):
            compare.parse_args(bad)


def test_markdown_and_render_of_a_saved_run(compare, tmp_path, capsys):
    rows = [_row(compare, "deploycc", "q4f16_1", {"128": 300.0}, 40.0, 100_000_000, 15.5, [1, 2]),
            _row(compare, "llama.cpp", "Q4_1", {"128": 150.0}, 80.0, 100_000_000, 15.4, [1, 3])]
    rows[0]["notes"].append("a | b")
    result = {"config": {"prompt_lens": [128], "gen": 2, "repeat": 1, "threads": 2, "perplexity": True},
              "rows": rows, "machine": {}, "text": {"tokens": 10}, "command": "compare.py", "bandwidth": None,
              **compare.derive(rows, None, [128])}
    md = compare.render_markdown(result)
    table = [ln for ln in md.splitlines() if ln.startswith("|")]
    assert len(table) == 4 and table[2].startswith("| deploycc | q4f16_1 |")
    assert "a \\| b" in table[2] and "0.50x" in table[2]  # decode 40 / llama.cpp Q4_1 80
    saved = tmp_path / "run.json"
    saved.write_text(compare.to_json(result))
    assert compare.main(["--render", str(saved), "--markdown"]) == 0
    assert capsys.readouterr().out.strip() == md
    saved.write_text("{}")
    with pytest.raises(SystemExit, match="not a saved compare.py --json result"):
        compare.main(["--render", str(saved)])
