"""SmolLM2-135M-Instruct's web bundle in headless Chromium (WebGPU on SwiftShader, no GPU here), against
the same package run by the Python runtime (wgpu-py on Mesa lavapipe), in one run.

    .venv/bin/python benchmarks/browser.py [--device chrome-webgpu-swiftshader] [--quantization q4f16_1]
                                           [--kv-cache float16,float32] [--prompt-len 32,128] [--gen-len 32] [--json]

The package is compiled once into $DEPLOYCC_HOME/bench/packages/DEVICE/QUANT-kvTYPE, for each KV cache type of
`--kv-cache` (default: the preset's; several: one package each, measured one after the other in each runtime).
Prefill: `--prompt-len` tokens in one step, after a warm-up step; decode: `--gen-len` single-token steps after it;
each tok/s is tokens over the wall time of the engine's calls (the browser's performance.now(), Python's
perf_counter), logits read back every step. Load: page open to engine ready (fetch, SHA-256 checks, WGSL builds,
weight upload), once from the network and once from the Cache API. Chromium is Debian's, driven by Playwright, with
--enable-unsafe-webgpu, twice: on its SwiftShader adapter, and on Mesa lavapipe through ANGLE's OpenGL ES
(--use-angle=vulkan --use-webgpu-adapter=opengles, a compatibility-mode adapter); the adapter's f16 mode (packed
without shader-f16) is in the table.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import _int_list, ensure_model, ensure_package, load_fetch_script, log, machine_info  # noqa: E402

CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
FLAGS = ["--enable-unsafe-webgpu", "--no-sandbox", "--disable-dev-shm-usage"]
MEASURE = """async ([n, gen]) => {
  const e = window.deploycc.engine; const ids = Array.from({length: n}, (_, i) => 100 + i);
  e.reset(); await e.prefill(ids.slice(0, 4)); e.reset();
  let t = performance.now(); const logits = await e.prefill(ids); const prefill = (performance.now() - t) / 1000;
  let tok = 0; for (let i = 1; i < logits.length; i++) if (logits[i] > logits[tok]) tok = i;
  t = performance.now(); for (let i = 0; i < gen; i++) await e.decode(tok); const decode = (performance.now() - t) / 1000;
  return {prefill_tok_s: n / prefill, decode_tok_s: gen / decode, f16: e.gpu.f16, adapter: e.gpu.name};
}"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


# (row label, extra Chromium flags, page query): its SwiftShader adapter, and Mesa lavapipe through ANGLE's
# OpenGL ES (a WebGPU compatibility-mode adapter)
BROWSERS = [("deploycc.js, Chromium", [], ""),
            ("deploycc.js, Chromium+ANGLE", ["--ignore-gpu-blocklist", "--use-angle=vulkan", "--use-webgpu-adapter=opengles"],
             "?feature_level=compatibility")]


def browser_rows(pkg: Path, kv: str, prompt_lens: list[int], gen: int, label: str, flags: list[str],
                 query: str) -> list[dict]:
    from playwright.sync_api import sync_playwright

    exe = next((p for p in CHROMIUM if os.path.exists(p)), None)
    if exe is None:
        sys.exit("error: Debian's chromium is not installed (apt-get install chromium)")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(pkg)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}/index.html{query}"
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=FLAGS + flags)
        context = browser.new_context()
        loads = []
        for _ in range(2):  # from the network, then from the Cache API
            page = context.new_page()
            t0 = time.perf_counter()
            page.goto(url)
            page.wait_for_function("window.deploycc && (window.deploycc.engine || window.deploycc.error)", timeout=600_000)
            err = page.evaluate("window.deploycc.error")
            if err:
                sys.exit(f"error: the bundle did not load: {err}")
            loads.append(time.perf_counter() - t0)
            if len(loads) == 1:
                page.close()
        for n in prompt_lens:
            log(f"{label}: prefill {n}, decode {gen}")
            r = page.evaluate(MEASURE, [n, gen])
            rows.append({"runtime": label, "adapter": r["adapter"], "f16": r["f16"], "kv_cache": kv, "prompt": n,
                         "prefill_tok_s": r["prefill_tok_s"], "decode_tok_s": r["decode_tok_s"],
                         "load_s": loads[0], "load_cached_s": loads[1]})
        browser.close()
    httpd.shutdown()
    return rows


def python_rows(pkg: Path, kv: str, prompt_lens: list[int], gen: int) -> list[dict]:
    import numpy as np

    from deploycc.runtime.engine import Engine

    t0 = time.perf_counter()
    eng = Engine.load(pkg)
    load = time.perf_counter() - t0
    rows = []
    for n in prompt_lens:
        log(f"python: prefill {n}, decode {gen}")
        ids = [100 + i for i in range(n)]
        eng.reset()
        eng.prefill(ids[:4])
        eng.reset()
        t = time.perf_counter()
        logits = eng.prefill(ids)
        prefill = time.perf_counter() - t
        tok = int(np.argmax(logits))
        t = time.perf_counter()
        for _ in range(gen):
            eng.decode(tok)
        decode = time.perf_counter() - t
        rows.append({"runtime": "deploycc Python (wgpu-py)", "adapter": eng.device.name, "f16": getattr(eng, "f16", "-"),
                     "kv_cache": kv, "prompt": n, "prefill_tok_s": n / prefill, "decode_tok_s": gen / decode, "load_s": load,
                     "load_cached_s": None})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="chrome-webgpu-swiftshader")
    ap.add_argument("--quantization", default="q4f16_1")
    ap.add_argument("--kv-cache", default="", help="KV cache types, comma-separated (default: the preset's)")
    ap.add_argument("--prompt-len", type=_int_list, default=[32, 128])
    ap.add_argument("--gen-len", type=int, default=32)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    fetch = load_fetch_script()
    hf_dir, _ = ensure_model(fetch)
    from deploycc import presets

    kvs = args.kv_cache.split(",") if args.kv_cache else [presets.load(args.device).kv_cache]
    pkgs = {kv: ensure_package(fetch.cache_home() / "bench", f"{args.quantization}-kv{kv}", hf_dir,
                               ["--quantization", args.quantization, "--context-window", "1024",
                                "--override", f"kv_cache={kv}"], 0, args.device) for kv in kvs}
    rows = [r for b in BROWSERS for kv, pkg in pkgs.items()
            for r in browser_rows(pkg, kv, args.prompt_len, args.gen_len, *b)]
    rows += [r for kv, pkg in pkgs.items() for r in python_rows(pkg, kv, args.prompt_len, args.gen_len)]
    report = {"machine": machine_info(), "packages": {kv: str(p) for kv, p in pkgs.items()}, "device": args.device,
              "quantization": args.quantization, "gen_len": args.gen_len, "rows": rows}
    if args.json:
        print(json.dumps(report, indent=2))
        return
    m = report["machine"]
    print(f"SmolLM2-135M-Instruct {args.quantization}, preset {args.device}; {m.get('cpu')} ({m.get('cpus')} CPUs)")
    print(f"{'runtime':28} {'adapter':34} {'f16':7} {'KV':7} {'prompt':>6} {'prefill tok/s':>14} {'decode tok/s':>13} "
          f"{'load s':>7} {'cached s':>8}")
    for r in rows:
        cached = f"{r['load_cached_s']:.1f}" if r["load_cached_s"] is not None else "-"
        print(f"{r['runtime']:28} {str(r['adapter'])[:34]:34} {r['f16']:7} {r['kv_cache']:7} {r['prompt']:>6} "
              f"{r['prefill_tok_s']:>14.1f} "
              f"{r['decode_tok_s']:>13.2f} {r['load_s']:>7.1f} {cached:>8}")


if __name__ == "__main__":
    main()
