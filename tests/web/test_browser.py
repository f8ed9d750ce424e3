"""The browser bundle (`--device chrome-webgpu`) in headless Chromium: Debian's chromium on its SwiftShader
adapter (no shader-f16), driven by Playwright, the bundle served from 127.0.0.1 by a static file server.

Checked: prefill (every position) and decode logits of tiny models within 1e-3 (3e-3 with a float16 cache) of the
largest logit of the numpy reference (its KV cache float16, as chrome-webgpu's: written as halves of u32 words with
atomics, the reference rounding alike), with f16 weights read through the packed path, on SwiftShader (with
subgroups: the reductions' subgroup variants) and on Mesa lavapipe through ANGLE (a compatibility-mode adapter,
without subgroups: the shared-memory trees); a damaged weight file refused with a one-line message;
a second load served from the Cache API without fetching weights; a storage quota too small for the
weights leaves no cache behind and the model still runs; an adapter limit the package exceeds, bad requests,
the sampler, the bundle served by `python PKG serve`; and (marked `model`) SmolLM2 4-bit greedy
token ids equal to the Python package's for several prompts, and the chat page after an answer
(screenshot in $DEPLOYCC_ARTIFACTS, default .artifacts/).
"""
from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
from conftest import missing, require_module

from deploycc.package import compile_model
from deploycc.session import reference_session
from fixtures import make_tiny

pytestmark = pytest.mark.browser
ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = ("/usr/lib/chromium/chromium", "/usr/bin/chromium")
FLAGS = ["--enable-unsafe-webgpu", "--no-sandbox", "--disable-dev-shm-usage"]
IDS = [3, 17, 5, 42, 8, 1, 29, 11]
# max |logit difference| against the numpy reference, relative to the largest logit: f32 accumulation in another
# order and SwiftShader's exp / inversesqrt (a few ulp, as Vulkan allows), on fixtures with logits of std 3
REL_TOL = 1e-3  # measured up to 2.8e-4 (qwen3 q0f16 decode, llama q0f32 prefill 2.5e-4)
# a float16 cache (chrome-webgpu's), the reference's rounded alike: a key that the two sides' float32 sums put on
# either side of a tie between two halves rounds apart, and every later position moves (measured 1.3e-3, qwen3 q0f16
# decode): held as test_model_kernels.py holds PoCL's and lavapipe's half caches
HALF_REL_TOL = 3e-3


def tol(want, kv: str = "float32") -> float:
    return (HALF_REL_TOL if kv == "float16" else REL_TOL) * float(np.abs(want).max())


def reference(path, quant: str, package: Path):
    """The numpy reference of a tiny package and its KV cache's type (chrome-webgpu's float16: the reference's cache
    rounds alike)."""
    kv = json.loads((package / "manifest.json").read_text())["kv_cache"]["dtype"]
    return reference_session(str(path), context_window=64, quantization=quant, kv_cache=kv), kv


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


class Server:
    """A static file server on 127.0.0.1 (a secure context, as WebGPU and crypto.subtle need) for package dirs."""

    def __init__(self, root: Path):
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(root)))
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def url(self, package: str, query: str = "") -> str:
        return f"{self.base}/{package}/index.html{query}"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    server = Server(root)
    yield root, server
    server.httpd.shutdown()


@pytest.fixture(scope="module")
def playwright():
    sync_api = require_module("playwright.sync_api")
    exe = next((p for p in CHROMIUM if os.path.exists(p)), None)
    if exe is None:
        missing("Debian's chromium is not installed (apt-get install chromium; `make test` installs it)")
    with sync_api.sync_playwright() as p:
        yield p, exe


@pytest.fixture(scope="module")
def browser(playwright):
    p, exe = playwright
    b = p.chromium.launch(executable_path=exe, args=FLAGS)
    yield b
    b.close()


@pytest.fixture(scope="module")
def llama_f32(site) -> Path:
    """The tiny Llama as a q0f32 chrome-webgpu package with a float32 KV cache (no f16 anywhere: the bundle asks
    nothing of shader-f16), compiled once for the tests that read it as it is or edit a copy of it."""
    root, _ = site
    out = root / "llama-gqa1-q0f32"
    compile_model(str(make_tiny("llama-gqa1")), "chrome-webgpu", "q0f32", context_window=64, out=str(out),
                  overrides=("kv_cache=float32",))
    return out


@pytest.fixture(scope="module")
def llama_f32_page(site, browser, llama_f32):
    """One page with llama_f32's engine loaded, shared by the tests that only run it (a load compiles every
    pipeline on SwiftShader, the bulk of a test's time); each of them starts with the engine's reset."""
    _, server = site
    page, err, _ = open_chat(browser, server.url(llama_f32.name))
    assert err is None
    yield page
    page.close()


def edited_copy(src: Path, name: str) -> Path:
    out = src.parent / name
    shutil.copytree(src, out)
    return out


def open_chat(browser, url: str, context=None, timeout_s: float = 300):
    """A page of the bundle once its engine loaded (or failed): (page, error or None, requested URLs)."""
    page = (context or browser).new_page()
    requests: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.goto(url)
    page.wait_for_function("window.deploycc && (window.deploycc.engine || window.deploycc.error)",
                           timeout=timeout_s * 1000)
    return page, page.evaluate("window.deploycc.error"), requests


LOGITS = """async (ids) => { const e = window.deploycc.engine; e.reset();
  const all = await e.prefill(ids, {allLogits: true}); const dec = await e.decode(ids[0]);
  return {all: Array.from(all), dec: Array.from(dec), f16: e.gpu.f16, fallback: e.gpu.isFallback,
          subgroups: e.gpu.subgroups, adapterSubgroups: e.gpu.adapter.features.has("subgroups")}; }"""


@pytest.mark.parametrize("name, quant", [("llama-gqa1", "q0f32"), ("llama-gqa1", "q4f16_1"),
                                         ("gemma2-gqa2-softcap", "q4f16_1"), ("qwen3-gqa2-headdim-window", "q0f16")])
def test_tiny_logits_match_reference(request, site, browser, name, quant):
    root, server = site
    path = make_tiny(name)
    if (name, quant) == ("llama-gqa1", "q0f32"):
        page = request.getfixturevalue("llama_f32_page")
    else:
        compile_model(str(path), "chrome-webgpu", quant, context_window=64, out=str(root / f"{name}-{quant}"))
        page, err, _ = open_chat(browser, server.url(f"{name}-{quant}"))
        assert err is None
    assert "software adapter (no GPU)" in page.inner_text("#loadText")  # chrome-webgpu's GPU kernels on SwiftShader
    got = page.evaluate(LOGITS, IDS)
    if (name, quant) != ("llama-gqa1", "q0f32"):
        page.close()
    ref, kv = reference(path, quant, root / ("llama-gqa1-q0f32" if (name, quant) == ("llama-gqa1", "q0f32")
                                            else f"{name}-{quant}"))
    want_all = ref.prefill(IDS, all_logits=True)
    want_dec = ref.decode(IDS[0])
    all_ = np.array(got["all"]).reshape(want_all.shape)
    print(name, quant, "prefill", np.abs(all_ - want_all).max() / np.abs(want_all).max(),
          "decode", np.abs(np.array(got["dec"]) - want_dec).max() / np.abs(want_dec).max())
    assert np.abs(all_ - want_all).max() < tol(want_all, kv)
    assert np.abs(np.array(got["dec"]) - want_dec).max() < tol(want_dec, kv)
    assert got["fallback"]  # SwiftShader: the adapter this test is about
    # SwiftShader has no shader-f16: f16 weights and the float16 KV cache (chrome-webgpu's) go through the packed
    # kernels, whose appends write half a u32 word each with atomics; the q0f32 fixture's float32 cache needs none
    assert got["f16"] == ("none" if quant == "q0f32" else "packed")
    # SwiftShader has subgroups: the GEMVs' and norms' reductions run as subgroup shuffles (file_subgroups)
    assert got["subgroups"] and got["adapterSubgroups"]


def test_compatibility_adapter_through_angle(site, playwright):
    """Mesa lavapipe through ANGLE's OpenGL ES: a WebGPU compatibility-mode adapter (no shader-f16 either)."""
    root, server = site
    p, exe = playwright
    name, quant = "llama-gqa1", "q4f16_1"
    out = root / "compat"
    compile_model(str(make_tiny(name)), "chrome-webgpu", quant, context_window=64, out=str(out))
    b = p.chromium.launch(executable_path=exe, args=FLAGS + ["--ignore-gpu-blocklist", "--use-angle=vulkan",
                                                             "--use-webgpu-adapter=opengles"])
    page, err, _ = open_chat(b, server.url("compat", "?feature_level=compatibility"))
    assert err is None
    got = page.evaluate(LOGITS, IDS)
    b.close()
    ref, kv = reference(make_tiny(name), quant, out)
    want_all = ref.prefill(IDS, all_logits=True)
    want_dec = ref.decode(IDS[0])
    assert np.abs(np.array(got["all"]).reshape(want_all.shape) - want_all).max() < tol(want_all, kv)
    assert np.abs(np.array(got["dec"]) - want_dec).max() < tol(want_dec, kv)
    assert got["f16"] == "packed" and not got["fallback"]
    # no subgroups in compatibility mode: the reductions' shared-memory trees (the variant without subgroups)
    assert not got["subgroups"] and not got["adapterSubgroups"]


HALVE = """async ([src, xs, groups, entry]) => {
  const device = await (await navigator.gpu.requestAdapter()).requestDevice();
  const usage = GPUBufferUsage, words = Math.ceil(xs.length / 2) * 4;
  const x = device.createBuffer({size: xs.length * 4, usage: usage.STORAGE | usage.COPY_DST});
  const out = device.createBuffer({size: words, usage: usage.STORAGE | usage.COPY_SRC});
  const back = device.createBuffer({size: words, usage: usage.MAP_READ | usage.COPY_DST});
  device.queue.writeBuffer(x, 0, new Float32Array(xs));
  const module = device.createShaderModule({code: src});
  const pipe = device.createComputePipeline({layout: "auto", compute: {module, entryPoint: entry}});
  const group = device.createBindGroup({layout: pipe.getBindGroupLayout(0),
    entries: [{binding: 0, resource: {buffer: x}}, {binding: 1, resource: {buffer: out}}]});
  const enc = device.createCommandEncoder(), pass = enc.beginComputePass();
  pass.setPipeline(pipe); pass.setBindGroup(0, group); pass.dispatchWorkgroups(groups); pass.end();
  enc.copyBufferToBuffer(out, 0, back, 0, words); device.queue.submit([enc.finish()]);
  await back.mapAsync(GPUMapMode.READ);
  return {bits: Array.from(new Uint16Array(back.getMappedRange().slice(0))),
          f16: (await navigator.gpu.requestAdapter()).features.has("shader-f16")}; }"""


@pytest.mark.parametrize("half_bits", [True, False])
def test_half_stores_round_to_nearest_even_on_swiftshader(site, browser, monkeypatch, half_bits):
    """The packed kernels' f16 stores (a float16 KV cache's appends: two halves a u32 word, an atomicAnd and an
    atomicOr each) on the adapter that runs them, SwiftShader (no shader-f16): bit for bit numpy's astype(float16)
    on every case of the rounding (kernels/test_wgsl_f16_packed.py), through half_bits. The negative control:
    SwiftShader's own pack2x16float rounds otherwise (measured: 230 of 10,864, subnormals)."""
    from kernels.test_wgsl_f16_packed import halve_program, halves_to_store

    from deploycc import presets
    from deploycc.ir import sym
    from deploycc.ir.kernel import scheduled
    from deploycc.schedule import schedule_program
    from deploycc.targets import wgsl

    root, server = site
    (root / "blank").mkdir(exist_ok=True)
    (root / "blank" / "index.html").write_text("<html></html>")  # a page of 127.0.0.1: a secure context
    if not half_bits:
        monkeypatch.setattr(wgsl, "HALF_BITS", wgsl.HALF_BITS.replace(
            "return ((b >> 16u) & 0x8000u) | h;", "return pack2x16float(vec2<f32>(x, 0.0)) & 0xffffu;"))
    x = halves_to_store()
    x = x[np.isfinite(x)]  # JSON carries no inf or NaN
    target = presets.load("chrome-webgpu").target
    (k,) = scheduled(schedule_program(halve_program(len(x)), target)).kernels
    page = browser.new_page()
    page.goto(server.url("blank"))
    got = page.evaluate(HALVE, [wgsl.render([k], target, packed_f16=True), [float(v) for v in 2 * x],
                                int(sym.evaluate(k.groups, {})), k.name])
    page.close()
    assert not got["f16"]  # SwiftShader: the packed kernels are the ones it runs
    with np.errstate(over="ignore"):
        wrong = int((np.array(got["bits"][:len(x)], np.uint16) != x.astype(np.float16).view(np.uint16)).sum())
    print(f"SwiftShader's f16 stores {'with' if half_bits else 'without'} half_bits: {wrong} of {len(x)} rounded otherwise")
    assert (wrong == 0) is half_bits


def test_bad_requests_are_one_line_errors(llama_f32_page):
    """A prompt that leaves no room in the context window, a token outside the vocabulary, no tokenizer."""
    errors = llama_f32_page.evaluate("""async () => { const e = window.deploycc.engine; e.reset(); const out = [];
      for (const f of [() => e.generate(Array.from({length: 64}, () => 5)).next(), () => e.prefill([3, 1000]),
                       () => e.generate("hello").next()]) {
        try { await f(); out.push(null); } catch (x) { out.push(x.message); } }
      return out; }""")
    assert "the prompt is 64 tokens, but the context window is 64" in errors[0]
    assert "token id 1000 is outside the vocabulary of 101" in errors[1]
    assert "no tokenizer.json" in errors[2]
    assert all("\n" not in e for e in errors)


def test_deploycc_serve_serves_the_bundle(tmp_path, browser):
    """`python PKG serve` of a web package answers the API and serves the page and the package's listed files;
    with an API key it serves no files."""
    import subprocess
    import sys
    import urllib.error
    import urllib.request

    from tiny_package import compile_tiny_package

    pkg = compile_tiny_package(tmp_path, "chrome-webgpu")
    page = None
    for key in ([], ["--api-key", "k"]):
        port = free_port()
        log = open(tmp_path / "serve.log", "w")
        proc = subprocess.Popen([sys.executable, str(pkg), "serve", "--port", str(port), *key], stdout=log, stderr=log)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_for(f"{base}/health", proc, tmp_path / "serve.log")

            def get(path: str) -> int:
                try:
                    with urllib.request.urlopen(base + path, timeout=30) as r:
                        return r.status
                except urllib.error.HTTPError as e:
                    return e.code
            codes = {p: get(p) for p in ("/", "/web/deploycc.js", "/manifest.json", "/runtime/../manifest.json",
                                         "/../../etc/passwd", "/not-listed.txt")}
            if key:
                assert codes == dict.fromkeys(codes, 404)
                continue
            assert codes == {"/": 200, "/web/deploycc.js": 200, "/manifest.json": 200, "/runtime/../manifest.json": 404,
                             "/../../etc/passwd": 404, "/not-listed.txt": 404}
            page, err, _ = open_chat(browser, base + "/")
            assert err is None
            stats = page.evaluate("""async () => { const stats = {};
              for await (const _ of window.deploycc.engine.generate("hi", {maxTokens: 4, stats})) {} return stats; }""")
            assert stats["generated"] and stats["promptTokens"] > 0
            page.close()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            log.close()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(url: str, proc, log: Path, timeout: float = 120) -> None:
    import time
    import urllib.request

    deadline = time.time() + timeout
    while time.time() < deadline:
        assert proc.poll() is None, f"the server exited: {log.read_text()[-2000:]}"
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    raise AssertionError(f"no answer from {url} within {timeout} s")


def test_sampler(llama_f32_page):
    """deploycc.js's Sampler: softmax frequencies at temperature 1, top-k, top-p (the smallest head reaching p, as
    runtime/sampler.py), the repetition penalty, and a seed that repeats its draws."""
    r = llama_f32_page.evaluate("""async () => { const { Sampler } = await import("./web/deploycc.js");
      const logits = Float32Array.from([Math.log(0.5), Math.log(0.3), Math.log(0.2)]);
      const draw = (opts, n, hist = []) => {
        const s = new Sampler(opts); return Array.from({length: n}, () => s.sample(logits, hist)); };
      const count = (xs) => [0, 1, 2].map((i) => xs.filter((x) => x === i).length / xs.length);
      return { t1: count(draw({temperature: 1, seed: 3}, 20000)), k1: count(draw({temperature: 1, topK: 1, seed: 3}, 500)),
               k2: count(draw({temperature: 1, topK: 2, seed: 3}, 20000)),
               p5: count(draw({temperature: 1, topP: 0.5, seed: 3}, 500)),
               p8: count(draw({temperature: 1, topP: 0.8, seed: 3}, 20000)),
               pen: new Sampler({repetitionPenalty: 2}).sample(Float32Array.from([2, 1.9]), [0]),
               same: JSON.stringify(draw({temperature: 1, seed: 7}, 50)) === JSON.stringify(draw({temperature: 1, seed: 7}, 50)),
               other: JSON.stringify(draw({temperature: 1, seed: 7}, 50)) !== JSON.stringify(draw({temperature: 1, seed: 8}, 50)),
               bad: (() => { try { new Sampler({topP: 0}); return null; } catch (e) { return e.message; } })() }; }""")
    assert np.allclose(r["t1"], [0.5, 0.3, 0.2], atol=0.015)
    assert r["k1"] == [1, 0, 0] and r["p5"] == [1, 0, 0]
    assert np.allclose(r["k2"], [0.625, 0.375, 0], atol=0.015)
    assert np.allclose(r["p8"], [0.625, 0.375, 0], atol=0.015)  # 0.5 + 0.3 reaches 0.8: two kept
    assert r["pen"] == 1 and r["same"] and r["other"]
    assert r["bad"] == "top_p must be in (0, 1]"


def test_adapter_limit_refused(site, browser, llama_f32):
    """A package that needs more of a limit than the adapter allows (its manifest edited and resealed) is refused
    in one line naming the limit, before any weight is fetched."""
    import hashlib
    import json

    root, server = site
    out = edited_copy(llama_f32, "limits")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["kernels"]["requires"]["maxStorageBuffersPerShaderStage"] = 4096
    data = json.dumps(manifest, indent=1).encode()
    (out / "manifest.json").write_bytes(data)
    (out / "manifest.sha256").write_text(f"{hashlib.sha256(data).hexdigest()}  manifest.json\n")
    page, err, requests = open_chat(browser, server.url("limits"))
    page.close()
    assert err is not None and "\n" not in err
    assert "this package needs maxStorageBuffersPerShaderStage 4096, but google swiftshader allows" in err
    assert not any("/params/" in u for u in requests)


def test_damaged_weights_refused(site, browser, llama_f32):
    root, server = site
    out = edited_copy(llama_f32, "damaged")
    shard = next((out / "params").glob("*.safetensors"))
    data = bytearray(shard.read_bytes())
    data[-1] ^= 0xFF
    shard.write_bytes(bytes(data))
    page, err, _ = open_chat(browser, server.url("damaged"))
    assert err is not None and "does not match the manifest's SHA-256" in err and "\n" not in err
    assert "Could not load" in page.inner_text("#loadText")
    page.close()


def page_kernels(pkg) -> tuple[set, dict]:
    """The kernels the page's functions launch (deploycc.js STEP_FUNCTIONS: prefill, prefill_all, decode), and each
    kernel file of the package (any variant) -> the kernels it holds."""
    bc = json.loads((pkg / "bytecode.json").read_text())
    entries = json.loads((pkg / "manifest.json").read_text())["kernels"]["entries"]
    launched = {ins["args"][0]["k"] for f in ("prefill", "prefill_all", "decode") for ins in bc["functions"][f]["instructions"]
                if ins.get("fn") == "vm.launch"}
    files: dict = {}
    for name, e in entries.items():
        for key, f in e.items():
            if key.startswith("file"):
                files.setdefault(f, set()).add(name)
    return launched, files


def test_second_load_from_cache_api(site, browser, llama_f32):
    """A second load takes every file from the Cache API, with the same logits. The page fetches the kernels its
    functions launch and no other: the server's steps' own (step, step_all, step_one) are never compiled there."""
    root, server = site
    context = browser.new_context()  # storage of its own: the shared page's cache is not this one's
    first, err, req1 = open_chat(browser, server.url(llama_f32.name), context)
    assert err is None
    a = first.evaluate(LOGITS, IDS)
    load1 = first.evaluate("window.deploycc.engine.load")
    first.close()
    second, err, req2 = open_chat(browser, server.url(llama_f32.name), context)
    assert err is None
    load2 = second.evaluate("window.deploycc.engine.load")
    b = second.evaluate(LOGITS, IDS)
    second.close()
    context.close()
    assert any("/params/" in u for u in req1) and not any("/params/" in u for u in req2)
    assert any(f.startswith("params/") for f in load1["fetched"])
    assert load2["fetched"] == [] and any(f.startswith("params/") for f in load2["cached"])
    assert a["all"] == b["all"] and a["dec"] == b["dec"]
    launched, files = page_kernels(llama_f32)
    fetched = set().union(*(files[f] for f in load1["fetched"] if f.startswith("kernels/")))
    assert fetched == launched and launched < set().union(*files.values()), sorted(fetched ^ launched)


def test_quota_too_small_leaves_no_cache(site, browser, llama_f32):
    root, server = site
    context = browser.new_context()
    page = context.new_page()
    cdp = context.new_cdp_session(page)
    cdp.send("Storage.overrideQuotaForOrigin", {"origin": server.base, "quotaSize": 64 * 1024})
    page.goto(server.url(llama_f32.name))
    page.wait_for_function("window.deploycc && (window.deploycc.engine || window.deploycc.error)", timeout=120000)
    assert page.evaluate("window.deploycc.error") is None
    msg = page.evaluate("window.deploycc.engine.load.cacheError")
    assert msg and "storage quota" in msg and "runs from memory" in msg
    assert page.evaluate("caches.keys()") == []  # nothing half-cached
    got = page.evaluate(LOGITS, IDS)
    assert np.isfinite(got["all"]).all()
    assert "storage quota" in page.inner_text("#loadText")
    context.close()


@pytest.mark.model
def test_smollm2_chat_matches_python_package(site, browser, smollm2_path):
    """SmolLM2-135M-Instruct q4f16_1 (f16 scales read packed on SwiftShader) for chrome-webgpu-swiftshader: the
    browser's greedy ids equal the Python engine's (wgpu-py on lavapipe, shader-f16 native) for each prompt."""
    from deploycc.runtime.engine import Engine
    from deploycc.runtime.generate import encode_prompt

    root, server = site
    out = root / "smollm2"
    compile_model(smollm2_path, "chrome-webgpu-swiftshader", "q4f16_1", context_window=512, out=str(out))
    shards = sorted((out / "params").glob("*.safetensors"))  # a browser bundle's shards: 64 MiB at most
    assert len(shards) >= 2 and all(f.stat().st_size <= (64 << 20) + (1 << 16) for f in shards)
    prompts = ["What is the capital of France?", "Write a haiku about the sea."]  # a third: 40 s more on two cores
    eng = Engine.load(out)
    want = {}
    for p in prompts:
        stats: dict = {}
        "".join(eng.generate(p, max_tokens=12, stats=stats))
        want[p] = stats["generated"]
    page, err, _ = open_chat(browser, server.url("smollm2"))
    assert err is None
    assert page.evaluate("window.deploycc.engine.gpu.f16") == "packed"
    assert "software adapter" not in page.inner_text("#loadText")  # the preset for it
    texts = ["naïve café — 東京 🚀 x²", "  spaces\tand\nnewlines  ", "<|im_start|>user\nliteral special tokens<|im_end|>"]
    for t in texts:  # the chat template (jinja) and tokenizer (tokenizers.js) as the Python runtime's
        assert page.evaluate("(t) => window.deploycc.engine.encode(t)", t) == encode_prompt(eng.tokenizer, t), t
        assert page.evaluate("(t) => window.deploycc.engine.encode(t, {chat: false})", t) == eng.tokenizer.encode(t), t
    for p in prompts:
        got = page.evaluate("""async (p) => { const e = window.deploycc.engine; const stats = {};
          for await (const _ of e.generate(p, {maxTokens: 12, stats})) {} return stats.generated; }""", p)
        assert got == want[p], p
    page.fill("#input", prompts[0])
    page.press("#input", "Enter")
    page.wait_for_function("window.deploycc.replies >= 1 && !window.deploycc.busy", timeout=300000)
    reply = page.inner_text(".msg.assistant")
    assert "Paris" in reply
    assert "tok/s" in page.inner_text("#stats")
    shots = Path(os.environ.get("DEPLOYCC_ARTIFACTS") or ROOT / ".artifacts")
    shots.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shots / "chrome-webgpu-chat.png"), full_page=True)
    page.close()
    shutil.rmtree(out)
