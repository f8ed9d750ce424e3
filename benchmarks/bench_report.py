"""The reporting half of benchmarks/compare.py: rows, decode limits, ratios to llama.cpp, the table
(rich, Markdown) and JSON. Pure functions of a result dict, so a saved --json run renders again."""
from __future__ import annotations

import json
import math

from bench_workers import PPL_STRIDE, PPL_WINDOW

# deploycc's 4-bit formats: the headline is the fastest of them (row keys of compare.DEPLOYCC_FORMATS).
DEPLOYCC_4BIT = ("q4f16_2-q8head", "q4f16_1", "gguf-q4_1")


def new_row(tool: str, key: str, label: str) -> dict:
    return {"tool": tool, "key": key, "format": label, "weights_bytes": None, "prefill_tok_s": {}, "decode_tok_s": None,
            "peak_rss_mb": None, "perplexity": None, "error": None, "notes": []}


def ref_prompt_len(prompt_lens: list[int]) -> int:
    """The prompt length the prefill ratio uses: 128 when measured, else the first one."""
    return 128 if 128 in prompt_lens else prompt_lens[0]


def decode_limit(read_gb_s: float | None, weights_bytes: int | None) -> float | None:
    """Decode tok/s if every weight byte is read once per token at the measured read bandwidth."""
    if not read_gb_s or not weights_bytes:
        return None
    return read_gb_s * 1e9 / weights_bytes


def ratio(a: float | None, b: float | None) -> float | None:
    if a is None or not b:
        return None
    return a / b


def derive(rows: list[dict], bandwidth: dict | None, prompt_lens: list[int]) -> dict:
    """Fill each row's decode limit, % of limit, prefill ratio (to llama.cpp's best prefill at the reference
    prompt length) and decode ratio (to llama.cpp Q4_1); return the references and the headline."""
    n = str(ref_prompt_len(prompt_lens))
    read = (bandwidth or {}).get("read_gb_s")
    llama = [r for r in rows if r["tool"] == "llama.cpp" and not r.get("error")]
    best_pre = max((r for r in llama if r["prefill_tok_s"].get(n)), key=lambda r: r["prefill_tok_s"][n], default=None)
    q41 = next((r for r in llama if r["key"] == "Q4_1" and r.get("decode_tok_s")), None)
    ref_pre = best_pre["prefill_tok_s"][n] if best_pre else None
    ref_dec = q41["decode_tok_s"] if q41 else None
    for r in rows:
        r["decode_limit_tok_s"] = decode_limit(read, r.get("weights_bytes"))
        pct = ratio(r.get("decode_tok_s"), r["decode_limit_tok_s"])
        r["pct_of_limit"] = None if pct is None else 100 * pct
        r["prefill_ratio"] = ratio(r["prefill_tok_s"].get(n), ref_pre)
        r["decode_ratio"] = ratio(r.get("decode_tok_s"), ref_dec)
    refs = {"prompt_len": int(n), "llama_best_prefill_format": best_pre["format"] if best_pre else None,
            "llama_best_prefill_tok_s": ref_pre, "llama_q4_1_decode_tok_s": ref_dec,
            "llama_q4_1_perplexity": q41.get("perplexity") if q41 else None}
    dc = [r for r in rows if r["tool"] == "deploycc" and r["key"] in DEPLOYCC_4BIT and r.get("decode_tok_s")]
    best = max(dc, key=lambda r: r["decode_tok_s"], default=None)
    headline = None
    if best is not None:
        p, q = best.get("perplexity"), refs["llama_q4_1_perplexity"]
        headline = {"format": best["format"], "prefill_ratio": best["prefill_ratio"],
                    "decode_ratio": best["decode_ratio"], "perplexity": p, "llama_q4_1_perplexity": q,
                    "perplexity_le_llama_q4_1": None if p is None or q is None else bool(p <= q)}
    return {"references": refs, "headline": headline}


def greedy_agreement(rows: list[dict]) -> str | None:
    """Each row's count of leading generated tokens equal to the reference row's (PyTorch float32, else
    deploycc q0f32); returns the reference's label."""
    ref = next((r for r in rows if r["key"] == "float32" and r.get("tokens")), None)
    ref = ref or next((r for r in rows if r["key"] == "q0f32" and r.get("tokens")), None)
    if ref is None:
        return None
    for r in rows:
        toks = r.get("tokens")
        if toks:
            same = 0
            for a, b in zip(toks, ref["tokens"]):
                if a != b:
                    break
                same += 1
            r["greedy_match"] = f"{same}/{len(ref['tokens'])}"
    return f"{ref['tool']} {ref['format']}"


def _f(v, fmt: str = "{:.1f}", dash: str = "—") -> str:
    return dash if v is None or (isinstance(v, float) and not math.isfinite(v)) else fmt.format(v)


def table_columns(prompt_lens: list[int]) -> list[str]:
    return (["tool", "format", "weights MB"] + [f"prefill@{n} tok/s" for n in prompt_lens]
            + ["decode tok/s", "decode limit tok/s", "% of limit", "peak RSS MB", "perplexity",
               "prefill vs llama.cpp best", "decode vs llama.cpp Q4_1", "greedy match", "notes"])


def table_cells(r: dict, prompt_lens: list[int]) -> list[str]:
    notes = list(r.get("notes") or [])
    if r.get("error"):
        notes.insert(0, f"failed: {r['error']}")
    ppl = r.get("perplexity")
    return ([r["tool"], r["format"], _f(None if r.get("weights_bytes") is None else r["weights_bytes"] / 1e6)]
            + [_f(r["prefill_tok_s"].get(str(n))) for n in prompt_lens]
            + [_f(r.get("decode_tok_s")), _f(r.get("decode_limit_tok_s"), "{:.0f}"),
               _f(r.get("pct_of_limit"), "{:.0f}%"), _f(r.get("peak_rss_mb"), "{:.0f}"),
               _f(ppl, "{:.3f}") if ppl is not None else r.get("perplexity_note", "—"),
               _f(r.get("prefill_ratio"), "{:.2f}x"), _f(r.get("decode_ratio"), "{:.2f}x"), r.get("greedy_match", "—"),
               "; ".join(notes)])


def render_table(result: dict):
    from rich.table import Table

    cfg = result["config"]
    t = Table(title=f"{result['model']}: deploycc vs llama.cpp vs PyTorch ({cfg['threads']} threads, batch 1)")
    for i, c in enumerate(table_columns(cfg["prompt_lens"])):
        t.add_column(c, justify="left" if i < 2 or c in ("notes", "greedy match") else "right",
                     overflow="fold", max_width=48 if c == "notes" else None)
    for r in result["rows"]:
        t.add_row(*table_cells(r, cfg["prompt_lens"]))
    return t


def summary_lines(result: dict) -> list[str]:
    cfg, bw, refs, m = result["config"], result.get("bandwidth") or {}, result["references"], result["machine"]
    out = []
    if bw:
        out.append(f"memory bandwidth: read {bw['read_gb_s']:.1f} GB/s ({bw['read_method']}; used for the decode "
                   f"limit), copy {bw['copy_gb_s']:.1f} GB/s ({bw['copy_method']})")
        out.append("decode limit = read bandwidth / weight bytes: every weight byte is read once per decoded token "
                   "(the head is tied to the embedding); weights = deploycc manifest weights_bytes, llama.cpp "
                   "llama_model_size (sum of tensor data), PyTorch parameter bytes; peak RSS = VmHWM of the "
                   "speed worker")
    pre = refs.get("llama_best_prefill_tok_s")
    dec = refs.get("llama_q4_1_decode_tok_s")
    out.append(f"ratios: prefill to llama.cpp's best prefill at {refs['prompt_len']} tokens ("
               + (f"{refs['llama_best_prefill_format']}, {pre:.1f} tok/s" if pre else "not measured")
               + "); decode to llama.cpp Q4_1 (" + (f"{dec:.1f} tok/s" if dec else "not measured") + ")")
    h = result.get("headline")
    if h:
        le = h["perplexity_le_llama_q4_1"]
        ppl = ("perplexity not measured" if h["perplexity"] is None or h["llama_q4_1_perplexity"] is None else
               f"perplexity {h['perplexity']:.3f} vs llama.cpp Q4_1 {h['llama_q4_1_perplexity']:.3f}: "
               + ("<= (yes)" if le else "> (no)"))
        out.append(f"headline, best deploycc 4-bit by decode ({h['format']}): prefill "
                   f"{_f(h['prefill_ratio'], '{:.2f}x')} of llama.cpp's best, decode "
                   f"{_f(h['decode_ratio'], '{:.2f}x')} of llama.cpp Q4_1; {ppl}")
    else:
        out.append("headline: no deploycc 4-bit row measured")
    t = result.get("text", {})
    out.append(f"tokens: {t.get('source', '?')} = {t.get('tokens')} "
               f"deploycc tokens; prefill of the first N; decode {cfg['gen']} greedy tokens after the "
               f"{cfg['prompt_lens'][0]}-token prompt; median of {cfg['repeat']}"
               + (f"; perplexity over windows of {PPL_WINDOW}, stride {PPL_STRIDE} (runtime/perplexity.py)"
                  if cfg["perplexity"] else "; no perplexity"))
    if result.get("greedy_reference"):
        g = result.get("greedy_text", "")
        out.append(f"greedy match: leading generated tokens equal to {result['greedy_reference']}'s"
                   + (f", which continues {g!r}" if g else ""))
    feats = ",".join(m.get("cpu_features", []))
    vers = ", ".join(f"{k} {v}" for k, v in result.get("versions", {}).items())
    out.append(f"machine: {m.get('cpu', '?')}, {m.get('cpus')} CPUs ({feats}), {m.get('memory_gb', '?')} GB; "
               f"Python {m.get('python')}; deploycc {m.get('deploycc_commit', '?')}" + (f"; {vers}" if vers else ""))
    out.append(f"command: {result['command']}")
    out.append(f"elapsed: {result.get('elapsed_s', 0):.0f} s")
    return out


def render_text(result: dict, console=None) -> None:
    from rich.console import Console

    if console is None:
        console = Console()
        if not console.is_terminal:
            console = Console(width=240)
    console.print(render_table(result))
    for line in summary_lines(result):
        console.print(line, markup=False, highlight=False)


def render_markdown(result: dict) -> str:
    cols = table_columns(result["config"]["prompt_lens"])
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join("---" if i < 2 else "--:" for i in range(len(cols))) + "|"]
    for r in result["rows"]:
        cells = [c.replace("|", "\\|") for c in table_cells(r, result["config"]["prompt_lens"])]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines + [""] + [f"- {x}" for x in summary_lines(result)])


def to_json(result: dict) -> str:
    def clean(v):
        if isinstance(v, float) and not math.isfinite(v):
            return None
        if isinstance(v, dict):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [clean(x) for x in v]
        return v

    return json.dumps(clean(result), indent=2)
