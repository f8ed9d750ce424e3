"""The host's time a WebGPU decode step spends encoding its launches, apart from the adapter's time running them.

    .venv/bin/python benchmarks/webgpu_host.py PKG [PKG ...] [--browser] [--steps 10] [--json]

For each package (a `cpu-webgpu` one, say; several, e.g. built from two commits, measured in turn, twice): the Python
runtime (wgpu-py, the machine's adapter: lavapipe here) prefills 32 tokens, decodes 3 warm-up steps, then `--steps`
steps with `WebGPUDevice.launch` timed (the encoding of each launch: its bind group, Params and dispatch) and
`download` timed (the submit and the wait for the adapter): launches a step, microseconds a launch, and the host's
milliseconds a step (the step less its download). With `--browser` (a package with a web bundle:
`chrome-webgpu-swiftshader`), the same in headless Chromium on SwiftShader: the JavaScript runtime's `vm.run` (the
encoding of a step's launches) timed over the steps. CPU adapters are slow at the kernels themselves, so compare the
host's columns, not the steps'.
"""
from __future__ import annotations

import argparse
import functools
import http.server
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

BROWSER_STEP = """async ([gen]) => {
  const e = window.deploycc.engine; const vm = e.vm; const run = vm.run.bind(vm); let enc = 0;
  vm.run = (...a) => { const t = performance.now(); const r = run(...a); enc += performance.now() - t; return r; };
  const ids = Array.from({length: 32}, (_, i) => 100 + i);
  e.reset(); const logits = await e.prefill(ids); let tok = 0;
  for (let i = 1; i < logits.length; i++) if (logits[i] > logits[tok]) tok = i;
  await e.decode(tok); await e.decode(tok);
  enc = 0; const l0 = vm.launches; const t = performance.now();
  for (let i = 0; i < gen; i++) await e.decode(tok);
  return {encode_ms: enc / gen, step_ms: (performance.now() - t) / gen, launches: (vm.launches - l0) / gen};
}"""


def python_row(pkg: str, steps: int) -> dict:
    from deploycc.runtime.engine import Engine

    eng = Engine.load(pkg, device="webgpu")
    dev = eng.device
    eng.prefill(np.arange(100, 132, dtype=np.int32))
    for _ in range(3):
        eng.decode(5)
    spent = {"launch": 0.0, "download": 0.0}
    count = [0]

    def timed(name, f):
        def call(*a, **k):
            t = time.perf_counter()
            try:
                return f(*a, **k)
            finally:
                spent[name] += time.perf_counter() - t
                count[0] += name == "launch"
        return call
    dev.launch, dev.download = timed("launch", dev.launch), timed("download", dev.download)
    t = time.perf_counter()
    for _ in range(steps):
        eng.decode(5)
    step = (time.perf_counter() - t) / steps
    return {"runtime": "python", "package": pkg, "adapter": dev.name, "launches": count[0] / steps,
            "us_a_launch": spent["launch"] / count[0] * 1e6, "host_ms": (step - spent["download"] / steps) * 1e3,
            "step_ms": step * 1e3}


def browser_row(pkg: str, steps: int) -> dict:
    from browser import CHROMIUM, FLAGS, _Quiet  # benchmarks/browser.py's Chromium and its quiet file server
    from playwright.sync_api import sync_playwright

    exe = next((p for p in CHROMIUM if Path(p).exists()), None)
    if exe is None:
        sys.exit("error: Debian's chromium is not installed (apt-get install chromium)")
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=pkg))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with sync_playwright() as p:
            b = p.chromium.launch(executable_path=exe, args=FLAGS)
            page = b.new_page()
            page.goto(f"http://127.0.0.1:{httpd.server_address[1]}/index.html")
            page.wait_for_function("window.deploycc && (window.deploycc.engine || window.deploycc.error)", timeout=600_000)
            err = page.evaluate("window.deploycc.error")
            if err:
                sys.exit(f"error: {pkg}'s bundle did not load: {err}")
            r = page.evaluate(BROWSER_STEP, [steps])
            b.close()
    finally:
        httpd.shutdown()
    return {"runtime": "browser", "package": pkg, "adapter": "SwiftShader", "launches": r["launches"],
            "us_a_launch": r["encode_ms"] * 1e3 / r["launches"], "host_ms": r["encode_ms"], "step_ms": r["step_ms"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("packages", nargs="+")
    ap.add_argument("--browser", action="store_true", help="the web bundle in Chromium instead of the Python runtime")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    for p in args.packages:
        if not (Path(p) / "manifest.json").exists():
            sys.exit(f"error: {p} is not a deploycc package (no manifest.json)")
    row = browser_row if args.browser else python_row
    rows = [row(p, args.steps) for _ in range(2) for p in args.packages]  # interleaved, twice
    if args.json:
        print(json.dumps(rows))
        return
    print(f"{'runtime':8} {'package':40} {'launches':>8} {'us a launch':>11} {'host ms':>8} {'step ms':>8}")
    for r in rows:
        print(f"{r['runtime']:8} {r['package'][-40:]:40} {r['launches']:8.0f} {r['us_a_launch']:11.1f} "
              f"{r['host_ms']:8.2f} {r['step_ms']:8.1f}")


if __name__ == "__main__":
    main()
