"""WGSL without shader-f16: float16 buffers declared as packed u32 words and read with unpack2x16float, or written half
a word at a time with atomics (targets/wgsl.py packed_f16). The packed modules never name f16; on lavapipe (which
has shader-f16, forced off here with WebGPUDevice(f16=False) / DEPLOYCC_WEBGPU_F16=0) they give the interpreter's
values exactly, split into binding ranges too, and packages of every f16 quantization give the same logits with
either variant as with the other and within 1e-4 of the quantized reference."""
import json
import re

import numpy as np
import pytest
from conftest import require_device

import deploycc
from deploycc import presets
from deploycc.ir import tir
from deploycc.ir.kernel import scheduled
from deploycc.ir.tir_interp import run_program
from deploycc.kernel_runner import KernelRunner
from deploycc.schedule import schedule_program
from deploycc.targets.wgsl import render
from fixtures import make_tiny

F16_TYPE = re.compile(r"\bf16\b|\benable\b")  # the f16 type (or the enable directive) anywhere in a source
IDS = [3, 1, 4, 1, 5, 9, 2]


def pick_program(rows: int, cols: int) -> tir.TensorProgram:
    """out[r, j] = s[r, cols-1 - j*(cols//2)] * s[r, j], j < 2: halves at both positions of a word (cols odd)."""
    S = tir.Buffer("s", (rows, cols), "float16")
    O = tir.Buffer("out", (rows, 2), "float32")
    its = tir.iters("r j", (rows, 2))
    r, j = (tir.v(i) for i in its)
    far = tir.cast("float32", S[r, (cols - 1) - j * (cols // 2)])
    body = tir.Block("pick", its, tir.Store(O, (r, j), far * tir.cast("float32", S[r, j])))
    return tir.TensorProgram("pick", (S, O), body)


def halve_program(n: int) -> tir.TensorProgram:
    """out[i] = half(x[i] / 2): a kernel that writes float16."""
    X = tir.Buffer("x", (n,), "float32")
    O = tir.Buffer("out", (n,), "float16")
    its = tir.iters("i", (n,))
    i = tir.v(its[0])
    return tir.TensorProgram("halve", (X, O), tir.Block("halve", its, tir.Store(O, (i,), tir.cast("float16", X[i] * 0.5))))


def kernels_of(prog, target):
    return list(scheduled(schedule_program(prog, target)).kernels)


def test_packed_variant_reads_words_and_never_names_f16():
    target = presets.load("cpu-webgpu").target
    kernels = kernels_of(pick_program(41, 63), target)
    native, packed = render(kernels, target), render(kernels, target, packed_f16=True)
    assert native.startswith("enable f16;") and "array<f16>" in native
    assert not F16_TYPE.search(packed), packed
    assert "var<storage, read> s: array<u32>;" in packed
    assert "unpack2x16float(s[u32(i) >> 1u])[u32(i) & 1u]" in packed


def halves_to_store() -> np.ndarray:
    """float32 values whose halves are every case of the rounding: each tie between two neighbouring halves (normal
    and subnormal, even and odd below), a float32 ulp either side of each, 65,504 and 65,520 (halfway to inf: rounds
    up), the smallest subnormal's half (a tie to 0), signed zeros, inf, NaN, and normal draws of every scale."""
    rng = np.random.default_rng(0)
    h = np.concatenate([np.arange(0, 0x7bff, 97, dtype=np.uint16), np.arange(0, 0x400, 7, dtype=np.uint16)])
    lo, hi = h.view(np.float16).astype(np.float32), (h + 1).view(np.float16).astype(np.float32)
    ties = (lo + hi) / 2  # exact in float32
    near = np.concatenate([ties, np.nextafter(ties, np.inf), np.nextafter(ties, -np.inf)])
    special = np.array([65504, 65519.99, 65520, 1e6, 2.0 ** -25, 2.0 ** -26, 0.0, np.inf, np.nan], np.float32)
    draws = (rng.standard_normal(4000) * 10.0 ** rng.uniform(-9, 5, 4000)).astype(np.float32)
    x = np.concatenate([near, special, draws])
    return np.concatenate([x, -x]).astype(np.float32)


def racy_store_fn(name: str) -> str:
    """The packed store as one read-modify-write of the word (each access atomic, the pair not): the negative
    control of the atomicAnd and atomicOr."""
    return (f"fn st_{name}(i: i32, x: f32) {{\n  let w = u32(i) >> 1u;\n  let sh = (u32(i) & 1u) * 16u;\n"
            f"  let old = atomicLoad(&{name}[w]);\n"
            f"  atomicStore(&{name}[w], (old & ~(0xffffu << sh)) | (half_bits(x) << sh));\n}}")


@pytest.mark.parametrize("variant", ["native", "packed", "packed-racy"])
def test_webgpu_f16_stores_round_to_nearest_even(variant, monkeypatch):
    """A kernel that writes float16 (a float16 KV cache's appends): natively `array<f16>`, and in the packed variant
    an `array<atomic<u32>>` each of whose words two invocations write at once, a half each (atomicAnd, atomicOr).
    Both round through half_bits, to nearest with ties to even, which WGSL leaves to the implementation: bit for bit
    numpy's astype(float16) (CUDA's __float2half, OpenCL's vstore_half) on lavapipe, on every case of the rounding.
    The negative control: the packed store as a plain read-modify-write of its word loses about every other half
    (measured 5,182 of 10,868: lavapipe runs neighbouring invocations side by side)."""
    from deploycc.runtime.devices.webgpu import WebGPUDevice
    from deploycc.targets import wgsl

    require_device("webgpu", f16=True)
    f16 = variant == "native"
    if variant == "packed-racy":
        monkeypatch.setattr(wgsl.WGSLRenderer, "store_fn", staticmethod(racy_store_fn))
    device = WebGPUDevice(f16=f16)
    target = presets.load("cpu-webgpu").target
    x = halves_to_store()
    prog = schedule_program(halve_program(len(x)), target)
    source = render(kernels_of(halve_program(len(x)), target), target, packed_f16=not f16)
    assert "fn half_bits(" in source
    assert ("var<storage, read_write> out: array<atomic<u32>>;" in source) is not f16 and bool(F16_TYPE.search(source)) is f16
    got = [2 * x, np.zeros(len(x), np.float16)]  # the program halves its input: 2x, then x, both exact
    KernelRunner(device, target)(prog, got, [])
    with np.errstate(over="ignore"):
        want = x.astype(np.float16)
    same = (got[1].view(np.uint16) == want.view(np.uint16)) | (np.isnan(got[1]) & np.isnan(want))
    if variant == "packed-racy":
        assert (~same).sum() > len(x) // 4, int((~same).sum())
        return
    assert same.all(), [(float(a), float(b), float(c)) for a, b, c in zip(x[~same], got[1][~same], want[~same])][:5]


def test_packed_variant_reads_what_it_writes_with_atomic_loads():
    """A packed kernel that writes an f16 buffer (array<atomic<u32>>) and reads it (a decode step's attention reads
    back the key it appended: schedule/attention_append.py) loads the element's word with atomicLoad and unpacks its
    half; run end to end in tests/kernels/test_attention_append.py."""
    from deploycc.targets.wgsl import WGSLRenderer

    target = presets.load("cpu-webgpu").target
    (k,) = kernels_of(halve_program(10), target)
    out = next(b for b in k.buffers if b.name == "out")
    r = WGSLRenderer(packed_f16=True)
    text = r.kernel(k)
    assert "array<atomic<u32>>" in text  # the renderer's state is now this kernel's: out is written
    assert r.load(out, (tir.index(3),)).replace("(", "").replace(")", "") == "ld_out3"
    assert "fn ld_out(i: i32) -> f32 {\n  return unpack2x16float(atomicLoad(&out[u32(i) >> 1u]))[u32(i) & 1u];" in text


@pytest.mark.parametrize("max_binding", [1 << 27, 512])
@pytest.mark.parametrize("f16", [True, False])
def test_split_ranges_read_the_same_halves(max_binding, f16):
    """With 512-byte bindings s (41 x 63 halves, 5166 bytes) is bound as 11 ranges of 256 halves, the last
    ending mid-word; both variants equal the interpreter exactly."""
    from dataclasses import replace

    from deploycc.runtime.devices.webgpu import WebGPUDevice

    require_device("webgpu", f16=True)
    device = WebGPUDevice(f16=f16)
    assert device.has_f16 is f16
    target = replace(presets.load("cpu-webgpu").target, max_storage_binding=max_binding)
    prog = pick_program(41, 63)
    s = np.random.default_rng(0).standard_normal((41, 63)).astype(np.float16)
    want = [s, np.zeros((41, 2), np.float32)]
    run_program(prog, want, [])
    got = [s, np.zeros((41, 2), np.float32)]
    runner = KernelRunner(device, target)
    runner(schedule_program(prog, target), got, [])
    np.testing.assert_array_equal(got[1], want[1])
    (source,) = runner.sources.values()
    assert bool(F16_TYPE.search(source)) is f16
    assert source.count("@binding") == (12 if max_binding == 512 else 2)


def logits(session) -> np.ndarray:
    return np.concatenate([session.prefill(IDS, all_logits=True)] + [session.decode(t)[None] for t in (7, 8)])


def run_both(out, monkeypatch, subgroups_too: bool = False) -> dict:
    """{(f16 variant, subgroups): logits} of the package loaded with shader-f16 on and off, and with subgroups (on by
    default) off too where asked."""
    from deploycc.runtime.engine import Engine

    got = {}
    for flag in ("1", "0"):
        for subgroups in ("1", "0") if subgroups_too else ("1",):
            monkeypatch.setenv("DEPLOYCC_WEBGPU_F16", flag)
            monkeypatch.setenv("DEPLOYCC_WEBGPU_SUBGROUPS", subgroups)
            engine = Engine.load(out)
            assert engine.device.has_f16 is (flag == "1") and engine.device.has_subgroups is (subgroups == "1")
            got[engine.f16, engine.subgroups] = logits(engine)
    return got


@pytest.mark.parametrize("preset", ["chrome-webgpu", "cpu-webgpu"])
@pytest.mark.parametrize("model", ["llama-gqa1", "gpt2-odd"])
@pytest.mark.parametrize("quant", ["q4f16_1", "q0f16", "q8f16_0", "q0f32"])
def test_package_runs_with_and_without_shader_f16(tmp_path, monkeypatch, preset, model, quant):
    """Every kernel whose source enables f16 has a packed twin (file_no_f16) that names no f16, and every kernel with
    warp-level reductions a twin of each with subgroup operations (file_subgroups, file_no_f16_subgroups: lavapipe
    has the feature, forced off here too for q4f16_1 and q0f32); the engine uses the packed twins exactly when the
    device lacks shader-f16 and the subgroup ones exactly when it has subgroups; logits of the f16 variants agree to
    1e-6 (the same f32 arithmetic on the same halves), and every variant's with the quantized reference to 1e-4 (with
    and without subgroups the sums go in another order: 1.9e-5 apart at logits near 5). q0f32 on cpu-webgpu has no f16
    at all; on chrome-webgpu its KV cache is float16 (the appends' stores packed too)."""
    from deploycc.package import compile_model

    require_device("webgpu", f16=True)
    path = str(make_tiny(model))
    out = compile_model(path, preset, quantization=quant, out=str(tmp_path / "pkg"), context_window=32)
    manifest = json.loads((out / "manifest.json").read_text())
    entries = manifest["kernels"]["entries"].values()
    for e in entries:
        native = (out / e["file"]).read_text()
        assert ("file_no_f16" in e) == ("enable f16;" in native)
        assert "subgroup" not in native
        if "file_no_f16" in e:
            assert e["file_no_f16"] == e["file"].replace(".wgsl", ".nof16.wgsl") and e["file_no_f16"] in manifest["files"]
            assert not F16_TYPE.search((out / e["file_no_f16"]).read_text())
        for key in ("file", "file_no_f16"):
            if f"{key}_subgroups" in e:
                assert e[f"{key}_subgroups"] == e[key].replace(".wgsl", ".sg.wgsl")
                assert "enable subgroups;" in (out / e[f"{key}_subgroups"]).read_text()
    assert any("file_subgroups" in e for e in entries)  # the GEMVs and norms (schedule/gemv.py, row_block.py)
    both = quant in ("q4f16_1", "q0f32")  # the default GPU scheme and the one without f16: subgroups off too
    got = run_both(out, monkeypatch, both)
    kv = manifest["kv_cache"]["dtype"]  # chrome-webgpu's float16 (the reference's rounds alike): an f16 buffer too
    want = logits(deploycc.reference_session(deploycc.load_model(path), context_window=32, quantization=quant,
                                             kv_cache=kv))
    subgroups = (True, False) if both else (True,)
    if quant == "q0f32" and kv == "float32":
        assert set(got) == {("none", sg) for sg in subgroups} and not any("file_no_f16" in e for e in entries)
    else:
        assert set(got) == {(f16, sg) for f16 in ("native", "packed") for sg in subgroups}
    # a float16 cache: a key that the kernels' and numpy's float32 sums put on either side of a tie between two halves
    # rounds apart (measured 5.8e-4 at logits near 6), held as test_model_kernels.py holds lavapipe's half cache
    atol = 1e-4 if kv == "float32" else 3e-3 * max(1.0, float(np.abs(want).max()))
    for (_, subgroups), variant in got.items():
        np.testing.assert_allclose(variant, got[next(iter(got))[0], subgroups], atol=1e-6, rtol=0)
        np.testing.assert_allclose(variant, want, atol=atol, rtol=0)


def test_split_f16_weights_package(tmp_path, monkeypatch):
    """q0f16 with 4 KiB bindings: f16 weights are bound as ranges of 2048 halves (4096 bytes, as the manifest
    says) in both variants, and both match the reference."""
    from deploycc.package import compile_model

    require_device("webgpu", f16=True)
    path = str(make_tiny("llama-gqa1"))
    out = compile_model(path, "cpu-webgpu", quantization="q0f16", out=str(tmp_path / "pkg"), context_window=32,
                        overrides=("target.max_storage_binding=4096",))
    entries = json.loads((out / "manifest.json").read_text())["kernels"]["entries"]
    split_f16 = [(e["split"][i], e) for e in entries.values() for i in e.get("split", {})
                 if e["args"]["buffers"][int(i)]["dtype"] == "float16"]
    assert split_f16 and all(r == [4096, r[1]] and r[1] >= 2 and "file_no_f16" in e for r, e in split_f16)
    got = run_both(out, monkeypatch)
    want = logits(deploycc.reference_session(deploycc.load_model(path), context_window=32, quantization="q0f16"))
    for variant in got.values():
        np.testing.assert_allclose(variant, want, atol=1e-4, rtol=0)


def test_a_package_without_the_packed_kernels_says_to_recompile(tmp_path, monkeypatch):
    """A package from before file_no_f16, on a device without shader-f16: one line that says to recompile."""
    from bad_inputs.common import reseal

    from deploycc.package import compile_model
    from deploycc.runtime.engine import Engine
    from deploycc.runtime.package import PackageError

    require_device("webgpu", f16=True)
    out = compile_model(str(make_tiny("llama-gqa1")), "chrome-webgpu", quantization="q4f16_1",
                        out=str(tmp_path / "pkg"), context_window=32)
    m = json.loads((out / "manifest.json").read_text())
    for e in m["kernels"]["entries"].values():
        e.pop("file_no_f16", None)
        e.pop("file_no_f16_subgroups", None)
    (out / "manifest.json").write_text(json.dumps(m))
    reseal(out)
    assert Engine.load(out).f16 == "native"
    monkeypatch.setenv("DEPLOYCC_WEBGPU_F16", "0")
    with pytest.raises(PackageError, match=r"need shader-f16, which .* lacks, .* recompile it$") as e:
        Engine.load(out)
    assert "\n" not in str(e.value)


def test_bad_f16_switch_is_one_line(monkeypatch):
    from deploycc.runtime.devices import DeviceError, open_device

    require_device("webgpu")
    monkeypatch.setenv("DEPLOYCC_WEBGPU_F16", "no")
    with pytest.raises(DeviceError, match="DEPLOYCC_WEBGPU_F16 is 'no'; set it to 0"):
        open_device("webgpu")
