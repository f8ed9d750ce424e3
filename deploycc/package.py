"""`deploycc compile`: a model and a device preset -> a self-contained package directory.

    OUT/manifest.json      model config, quantization, target and preset, bounds, memory plan,
                           storages, KV cache shape, params index, sha256 of every file, format version
    OUT/bytecode.json      VM bytecode (runtime/vm.py)
    OUT/kernels/           kernel sources for the backend (OpenCL C, WGSL, CUDA C)
    OUT/params/            weights as safetensors shards, written one tensor at a time
    OUT/tokenizer files    tokenizer.json, tokenizer_config.json, chat template, ...
    OUT/runtime/           a copy of the runtime (it imports nothing from the compiler)
    OUT/__main__.py        `python OUT run --prompt ...` / `python OUT chat`
    OUT/signature.json     with --sign KEY: Ed25519 over manifest.json's bytes (runtime/trust.py)

The package is written into a temporary directory beside OUT and renamed into place at the end,
so an interrupted compile leaves nothing that looks like a package.
"""
from __future__ import annotations

import itertools
import json
import shutil
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from . import chat_templates, pipeline, presets
from .errors import DeployError
from .export import PAGE_SIZE, Pool, export
from .hub import load_model
from .ir.kernel import Kernel
from .runtime.package import FORMAT_VERSION, SEAL, seal_text, sha256_of

# deploycc.quantization's names; "gguf" keeps a .gguf file's quantized blocks as stored (the default for GGUF
# sources). The runtime's table, which checks a package's manifest against it
from .runtime.validate import QUANTIZATIONS
from .staging import MARKER, Staging, check_output
from .targets.backend import backend
from .vm.lower import kernel_args
from .vm.programs import kernel_work, write_programs

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                   "chat_template.jinja", "chat_template.json")
SHARD_BYTES = 512 << 20
# A browser holds a shard in memory twice while it checks and caches it, and caches shard by shard: smaller
# ones keep a page's peak memory down and let an interrupted download resume at the shard it stopped in.
WEB_SHARD_BYTES = 64 << 20
MAIN = '''"""Run this deploycc package: `python PACKAGE run --prompt TEXT` or `python PACKAGE chat`."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
try:
    from runtime.cli import main  # the package's own copy of the runtime
except ImportError as e:  # a Python without the runtime's dependencies: say which, without a traceback
    sys.exit(f"error: this package needs the Python module {e.name!r}, which {sys.executable} lacks; "
             f"pip install numpy safetensors tokenizers jinja2 and the device binding (pyopencl, wgpu or cupy-cuda12x)")

main(os.path.dirname(os.path.abspath(__file__)))
'''


def apply_overrides(preset: presets.Preset, overrides: list[str]) -> presets.Preset:
    """`key=value` (top-level preset keys) or `target.key=value`; the result is validated like a
    preset file (unknown keys name the nearest valid one, values are type-checked)."""
    if not overrides:
        return preset
    data = {"name": preset.name, "description": preset.description, "target": preset.target.to_dict(),
            "runtime": {"backend": preset.backend, "web": preset.web}, "quantization": preset.quantization,
            "context_window": preset.context_window, "prefill_chunk": preset.prefill_chunk,
            "max_num_sequences": preset.max_num_sequences, "kv_pool_tokens": preset.kv_pool_tokens,
            "kv_cache": preset.kv_cache, **({"hardware": preset.hardware} if preset.hardware else {})}
    for item in overrides:
        if "=" not in item:
            raise DeployError(f"--override {item!r} must look like key=value (e.g. prefill_chunk=256)")
        key, value = item.split("=", 1)
        parsed = _parse(value)
        if key.startswith("target."):
            data["target"][key.split(".", 1)[1]] = parsed
        elif key in ("backend", "web"):
            data["runtime"][key] = parsed
        else:
            data[key] = parsed
    return replace(presets.from_dict(data, f"--override on preset {preset.name}"), source=preset.source)


def _parse(v: str):
    low = v.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(v)
    except ValueError:
        return v


def pool_of(preset: presets.Preset, ctx: int, chunk: int):
    """The page pool of the package's batched steps: kv_pool_tokens (0: the context window's; at least that) in
    pages of PAGE_SIZE, for at most max_num_sequences sequences (no more than a step's tokens)."""
    tokens = preset.kv_pool_tokens or ctx
    return Pool(pages=max(-(-tokens // PAGE_SIZE), -(-ctx // PAGE_SIZE)), sequences=min(preset.max_num_sequences, chunk))


def one_token_step(preset: presets.Preset) -> bool:
    """Whether the package has step_one (deploycc/export.py), the server's step of one token with decode's folds: on
    the CUDA presets, where the performance model puts it at decode's speed (SmolLM2-shaped h100: 928 tok/s against
    step's 679 with one sequence). Not on OpenCL and WebGPU: on PoCL and lavapipe (their kernels on the Zen 5 kind) the real
    SmolLM2's step of one sequence took 64 and 466 ms with it against 50 and 357 without (the gated product folded into
    the down projection recomputed per lane group; measured again on lavapipe with runtime/devices/webgpu.py's
    Params as storage, 1.68-1.73 s against 1.22-1.31 on the Zen 3 kind: docs/gpu.md), and no GPU of theirs has
    measured it."""
    return preset.target.kind == "cuda"


def default_device() -> str:
    """The preset used when none is named: the native `cpu` target where a C compiler is found (gcc, clang,
    `python -m ziglang cc`), else `cpu-opencl` (PoCL)."""
    from .runtime import native

    try:
        native.compiler()
    except native.NativeError:
        return "cpu-opencl"
    return "cpu"


def resolve_quantization(source: str, preset: presets.Preset, quantization: str | None = None,
                         head_quantization: str | None = None) -> tuple[str, str | None]:
    """(weights, head) quantization names as compile takes them: a GGUF file keeps its blocks ("gguf") unless told
    otherwise, anything else gets the preset's; head None: as the weights."""
    from .gguf import is_gguf

    from_gguf = Path(source).expanduser().is_file() and is_gguf(Path(source).expanduser())
    quant = quantization or ("gguf" if from_gguf else preset.quantization)
    if quant not in QUANTIZATIONS:
        raise DeployError(f"quantization {quant} is not available; supported: {', '.join(QUANTIZATIONS)}")
    if head_quantization is not None and head_quantization not in QUANTIZATIONS[:-1]:
        raise DeployError(f"head quantization {head_quantization} is not available; "
                          f"supported: {', '.join(QUANTIZATIONS[:-1])}")
    return quant, None if head_quantization == quant else head_quantization


@dataclass
class Prepared:
    """A model made ready for one preset, as a package holds it: quantized (activation bits calibrated), held to
    the preset's limits (context window, prefill chunk) and exported with the package's rings and page pool."""
    model: Any
    context_window: int
    prefill_chunk: int
    exported: Any
    weights_by_type: list | None


def prepare(source: str, preset: presets.Preset, quant: str, head: str | None = None,
            context_window: int | None = None, revision: str | None = None, activations: str | dict = "auto",
            progress=None) -> Prepared:
    """Load, quantize and export `source` for `preset` (compile_model, and `deploycc inspect --device`: what
    inspect prints is what compile ships). quant/head: resolve_quantization's."""
    from .limits import check_compile
    from .quantization import GGUFModel, quantize
    from .runtime.native import weight_interleave as native_weight_interleave

    target = preset.target
    # cuda's dp4a GEMV takes the group schemes (q4f16_1 ...), not a GGUF kept as stored: that stays float there; and
    # only when asked (--activations 8): the calibration that picks the cpu's 16-bit linears keeps none of SmolLM2's
    # at 8 bits (deploycc/calibrate.py), so on cuda it would cost the compile its time to find nothing
    integer = target.integer_kernels and (target.core_loops or (quant != "gguf" and activations != "auto"))
    if activations not in ("auto", None) and not integer:  # a rounding asked for that nothing here would do
        what = "a GGUF kept as stored (--quantization gguf)" if target.integer_kernels else f"preset {preset.name}"
        raise DeployError(f"--activations {activations if isinstance(activations, str) else '{...}'}: {what} keeps "
                          f"activations float (its matmuls are float); leave --activations at auto")
    interleave = integer and target.core_loops and native_weight_interleave(target.isa)
    groups = integer and target.core_loops
    # every weight the integer kernels take multiplies activations rounded to 8 bits (the graph says so: the
    # reference of a package is its own graph, op/linalg.py round_activations)
    loaded = load_model(source, revision)
    # activations: "auto", "8", "16", or (the API) a {module name: bits} choice
    bits = (activations if isinstance(activations, dict) else int(activations) if activations != "auto" else 8
            ) if integer else None
    if integer and not target.core_loops and (16 in (bits.values() if isinstance(bits, dict) else (bits,))):
        raise DeployError(f"{preset.name} rounds activations to 8 bits (its dp4a GEMV) or keeps them float; give "
                          f"--activations 8 or auto")
    model = quantize(loaded, quant, head, interleave, groups=groups, activations=bits)
    ctx, chunk = check_compile(model, preset, context_window)  # context window and device memory, before anything
    step = progress or (lambda *a, **k: None)
    by_type = model.weight_report() if isinstance(model, GGUFModel) else None
    for row in by_type or ():  # a conversion rule is never silent
        if row["into"] != "kept":
            step("note", conversion_line(row))
    if integer and activations == "auto":  # 16 bits where 8 cost a linear too much on the calibration text
        from .calibrate import activation_costs, choose

        step("calibrate")
        probe = quantize(loaded, quant, head, False, groups=groups, activations=8)
        model = quantize(loaded, quant, head, interleave, groups=groups, activations=choose(activation_costs(probe)))
    if (model.path / "tokenizer.json").exists():  # a broken tokenizer fails the compile, not the first run
        from .runtime.tokenizer import Tokenizer, TokenizerError
        try:
            Tokenizer.from_dir(model.path, vocab_size=model.config.vocab_size)
        except TokenizerError as e:
            raise DeployError(str(e)) from None
    step("export")
    # Sliding-window layers keep rings sized for chunk-token steps; batched steps share a page pool.
    exported = export(model, ctx, chunk, pool_of(preset, ctx, chunk), preset.kv_cache,
                      one_token_step=one_token_step(preset))
    return Prepared(model, ctx, chunk, exported, by_type)


def compile_model(source: str, device: str | None = None, quantization: str | None = None,
                  context_window: int | None = None, overrides: tuple[str, ...] = (), out: str | None = None,
                  force: bool = False, revision: str | None = None, progress=None,
                  head_quantization: str | None = None, sign: str | None = None, activations: str | dict = "auto",
                  verify_kernels: bool = False, chat_template: str | None = None) -> Path:
    """sign: a private key file (deploycc/signing.py): the package gets signature.json, over its sealed manifest.
    chat_template: a Jinja file or a known template's name (chat_templates.py), stored as the package's template."""
    preset = apply_overrides(presets.load(device or default_device()), list(overrides))
    quant, head = resolve_quantization(source, preset, quantization, head_quantization)
    # before any model work: a refused output costs nothing
    out_dir = check_output(Path(out or f"dist/{Path(str(source).rstrip('/')).name}-{quant}-{preset.name}"), force)
    template = None if chat_template is None else chat_templates.resolve(chat_template)
    signer = None
    if sign is not None:
        from .signing import load_signing_key

        signer = load_signing_key(Path(sign))
    prepared = prepare(source, preset, quant, head, context_window, revision, activations, progress)
    model, ctx, chunk, exported, by_type = (prepared.model, prepared.context_window, prepared.prefill_chunk,
                                            prepared.exported, prepared.weights_by_type)
    step = progress or (lambda *a, **k: None)
    step("compile")
    compiled = pipeline.compile(exported, preset.target, chunk)
    lowered, plans = compiled.lowered, compiled.plans
    cfg = model.config
    kv_cache = {"layers": cfg.num_hidden_layers, "kv_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
                "dtype": preset.kv_cache, **({"rows": kv_rows(lowered, cfg)} if lowered.kv_rows else {}),
                "pool": exported.attrs["pool"]}

    staging = Staging(out_dir, force)
    with staging as tmp:
        try:
            kernel_files = _write_kernels(tmp, list(lowered.kernels.values()), preset, kernel_work(lowered))
        except ValueError as e:  # a target limit the kernels cannot meet
            raise DeployError(f"{e}; choose a preset with larger limits") from None
        kernel_files["programs"] = write_programs(tmp, lowered)  # what `verify --kernels` checks them against
        backend(preset.target.kind).finish(tmp, lowered, kernel_files, preset, {
            "kv_cache": kv_cache, "bounds": {"context_window": ctx, "prefill_chunk": chunk}, "exported": exported,
            "progress": step})  # the cpu kind's shared object, WebGPU's adapter limits
        if "native" not in kernel_files:  # cuda's dp4a packages: which linears round their input (verify rounds alike)
            from .transform.absorb_rounding import rounded_linears

            kernel_files.update({"activations": rounded} if (rounded := rounded_linears(exported)) else {})
        step("weights")
        params_index = _write_params(tmp, model, lowered.constants, progress, lowered.merged_params,
                                     WEB_SHARD_BYTES if preset.web else SHARD_BYTES)
        for name in TOKENIZER_FILES:
            if (model.path / name).exists():
                shutil.copy2(model.path / name, tmp / name)
        if template is not None:
            _store_template(tmp, template)
        from . import runtime as _runtime

        shutil.copytree(Path(_runtime.__file__).resolve().parent, tmp / "runtime",
                        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        (tmp / "__main__.py").write_text(MAIN)
        if preset.web:
            from .web import write_bundle

            write_bundle(tmp)
        (tmp / "bytecode.json").write_text(json.dumps(lowered.bytecode, indent=1))
        manifest = {
            "format": "deploycc-package", "format_version": FORMAT_VERSION,
            "model": {"architecture": model.architecture, "source": str(source), "hf_config": model.hf_config,
                      **({"weights_by_type": by_type} if by_type else {})},
            "quantization": quant,
            "head_quantization": head or quant,
            "preset": {"name": preset.name, "backend": preset.backend, "description": preset.description},
            "target": preset.target.to_dict(),
            "bounds": {"context_window": ctx, "prefill_chunk": chunk},
            "kv_cache": kv_cache,
            "vocab_size": cfg.vocab_size,
            "storages": lowered.storages,
            "memory": _memory_summary(plans, lowered, params_index, cfg, ctx, preset.kv_cache),
            "kernels": kernel_files,
            "params": params_index,
        }
        manifest["files"] = {p.relative_to(tmp).as_posix(): sha256_of(p) for p in sorted(tmp.rglob("*"))
                             if p.is_file() and "__pycache__" not in p.parts and p.name != MARKER}
        manifest_bytes = json.dumps(manifest, indent=1).encode()
        (tmp / "manifest.json").write_bytes(manifest_bytes)
        (tmp / SEAL).write_text(seal_text(manifest_bytes))
        if signer is not None:  # not listed in the manifest: it signs the manifest's bytes (runtime/trust.py)
            from .signing import SIGNATURE, signature_of

            (tmp / SIGNATURE).write_bytes(signature_of(signer, manifest_bytes))
        if verify_kernels:  # each kernel against its loop-level program on this machine's device, before the rename
            step("verify kernels")
            _verify_kernels(tmp)
        staging.commit()
    return out_dir


def _store_template(pkg: Path, template: str) -> None:
    """The package's chat template is `template`, wherever the model's files had theirs (tokenizer_config.json's
    chat_template comes first when the runtime reads them, so it is replaced there too)."""
    (pkg / "chat_template.json").unlink(missing_ok=True)
    (pkg / "chat_template.jinja").write_text(template, encoding="utf-8")
    tc = pkg / "tokenizer_config.json"
    if tc.exists():
        config = json.loads(tc.read_text(encoding="utf-8"))
        if "chat_template" in config:
            config["chat_template"] = template
            tc.write_text(json.dumps(config, indent=1, ensure_ascii=False), encoding="utf-8")


def _verify_kernels(pkg: Path) -> None:
    """compile --verify-kernels: runtime/kernel_check.py on the staged package; a failure leaves no package."""
    from .runtime.kernel_check import check_kernels

    report = check_kernels(pkg)
    if not report.passed:
        raise DeployError(f"{report.failure}; no package was written")


def _write_kernels(tmp: Path, kernels: list[Kernel], preset: presets.Preset, work: dict) -> dict:
    kdir = tmp / "kernels"
    kdir.mkdir()
    b = backend(preset.target.kind)
    entries = b.write_kernels(kdir, kernels, preset.target)
    for k in kernels:  # the calling convention the runtime checks every launch against at load
        entries[k.name]["args"] = kernel_args(k)
        entries[k.name].update(work.get(k.name, {}))  # a matmul's multiply-adds per row (bench --roofline)
    return {"language": b.language, "entries": entries}


def conversion_line(row: dict) -> str:
    """One line for a GGUF type that is not kept as stored (quantization/gguf_blocks.py's conversion rule)."""
    why = ("bfloat16 has no kernels here" if row["type"] == "BF16" else f"deploycc has no kernels for {row['type']}")
    return (f"converted {row['type']} -> {row['into']}: {row['tensors']} tensors, {row['file_bytes'] / 1e6:.1f} MB -> "
            f"{row['package_bytes'] / 1e6:.1f} MB ({why})")


def _write_params(tmp: Path, model, constants: dict, progress, merged: dict | None = None,
                  shard_bytes: int = SHARD_BYTES) -> list[dict]:
    """Weights one tensor at a time into shards of at most `shard_bytes` (peak memory: one shard, plus
    the parts of one merged linear: transform/merge_matmuls.py)."""
    from safetensors.numpy import save_file

    from .transform.merge_matmuls import merge_params

    pdir = tmp / "params"
    pdir.mkdir()
    index: list[dict] = []
    shard: dict[str, np.ndarray] = {}
    size = 0
    n = 0

    def flush():
        nonlocal shard, size, n
        if shard:
            fname = f"params/params-{n:05d}.safetensors"
            save_file(shard, str(tmp / fname))
            for name, arr in shard.items():
                index.append({"name": name, "shape": list(arr.shape), "dtype": str(arr.dtype), "file": fname})
            shard, size, n = {}, 0, n + 1

    dtypes = {k: p.dtype for k, p in model.build().named_parameters()}  # packed weights: uint32, float16
    typed = ((n, np.ascontiguousarray(a, dtype=dtypes.get(n, "float32"))) for n, a in model.params())
    # A generator, never a list: one converted tensor in memory at a time, plus the shard being filled.
    consts = ((n, np.ascontiguousarray(a, dtype="float32")) for n, a in constants.items())
    items = itertools.chain(merge_params(merged or {}, typed), consts)
    for name, arr in items:
        arr = np.ascontiguousarray(arr)
        if size + arr.nbytes > shard_bytes:
            flush()
        shard[name] = arr
        size += arr.nbytes
        if progress:
            progress("weight", name)
    flush()
    return index


def kv_rows(lowered, cfg) -> list[int]:
    """Per layer, the rows of its sliding-window ring (0: the whole context window)."""
    return [lowered.kv_rows.get(layer, 0) for layer in range(cfg.num_hidden_layers)]


def kv_cache_bytes(lowered, cfg, ctx: int, dtype: str = "float32") -> int:
    """The package's KV cache: K and V of every layer, of `dtype`, a ring's rows or the whole context window."""
    return 2 * sum(r or ctx for r in kv_rows(lowered, cfg)) * cfg.num_key_value_heads * cfg.head_dim * np.dtype(
        dtype).itemsize


def _memory_summary(plans, lowered, params_index, cfg, ctx, kv_dtype: str) -> dict:
    weights = sum(int(np.prod(p["shape"])) * np.dtype(p["dtype"]).itemsize for p in params_index)
    return {"weights_bytes": weights, "kv_cache_bytes": kv_cache_bytes(lowered, cfg, ctx, kv_dtype),
            "activation_bytes": sum(s["bytes"] for s in lowered.storages),
            "unplanned_activation_bytes": {f: getattr(p, "unplanned_bytes", None) for f, p in plans.items()}}
