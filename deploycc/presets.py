"""Device presets: YAML files in configs/ (or a path), validated against a schema.

A preset names the target kind and its parameters (deploycc.targets.base.Target), the runtime
backend, the default quantization, the context window and the prefill chunk. Unknown keys are
errors that name the key and the nearest valid one; values are checked for type and range (the
target's in targets/base.py: RANGES, the window and chunk here), and `--override` goes through the
same checks, so a value no device or schedule can use is refused before any compile work.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import yaml

from .errors import DeployError
from .runtime.kinds import KINDS
from .targets.base import Target

TOP_KEYS = {"name", "description", "target", "runtime", "quantization", "context_window", "prefill_chunk",
            "max_num_sequences", "kv_pool_tokens", "kv_cache", "hardware"}
# The KV cache's element type: float32, or float16 (half the bytes a decode step reads at long contexts and half the
# memory a sequence holds; MLC's and llama.cpp's default) where the target's kernels store half floats
KV_CACHE = ("float32", "float16")
KV_HALF_KINDS = ("cuda", "opencl", "webgpu")  # OpenCL: vstore_half / vload_half (core OpenCL C without
# cl_khr_fp16); WebGPU: f16 storage with shader-f16, else two halves a u32 word, each written with atomics
# A GPU preset's device, for the performance model (deploycc/perfmodel.py; `inspect PKG --kernels`): the vendor's
# peak figures, and its limits per multiprocessor (occupancy). Not part of the target: no kernel depends on them.
HARDWARE = {"bandwidth_gb_s": (1, 100_000), "multiprocessors": (1, 4096), "fp32_tflops": (0.1, 10_000),
            "fp16_tensor_tflops": (0.1, 100_000), "tf32_tensor_tflops": (0.1, 100_000),
            "threads_per_multiprocessor": (32, 8192),
            "registers_per_multiprocessor": (1024, 1 << 20), "shared_memory_per_multiprocessor": (1024, 1 << 24),
            "blocks_per_multiprocessor": (1, 256)}
RUNTIME_KEYS = {"backend", "web"}
BACKENDS = ("opencl", "webgpu", "cuda", "cpu", "host")
# Tokens of KV cache per sequence, and tokens per prefill step: the symbolic bounds every memory
# plan and kernel is compiled for; past these a plan is gigabytes for one sequence.
CONTEXT_WINDOW = (1, 1 << 20)
PREFILL_CHUNK = (1, 8192)
# Batched steps (deploycc serve): sequences in one step, and the tokens of KV cache their page pool holds
# (0: the context window's).
MAX_NUM_SEQUENCES = (1, 256)
KV_POOL_TOKENS = (0, 1 << 22)
MAX_PRESET_BYTES = 1 << 20  # a preset is a few hundred bytes; refuse to parse a huge file
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")  # part of the default output directory name


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    target: Target
    backend: str
    quantization: str
    context_window: int
    prefill_chunk: int
    source: str = ""
    max_num_sequences: int = 16
    kv_pool_tokens: int = 0
    web: bool = False  # also write the browser bundle (deploycc/web): webgpu presets only
    hardware: dict | None = None  # HARDWARE's keys, every one, or none
    kv_cache: str = "float32"  # KV_CACHE


def names() -> list[str]:
    return sorted(p.name[:-5] for p in resources.files("deploycc.configs").iterdir() if p.name.endswith(".yaml"))


def _unknown(key: str, valid, where: str) -> DeployError:
    key = str(key)
    near = difflib.get_close_matches(key, sorted(valid), n=1)
    hint = f"; did you mean '{near[0]}'?" if near else f"; valid keys: {', '.join(sorted(valid))}"
    return DeployError(f"{where}: unknown key '{key}'{hint}")


_TYPES = {"int": (int, "an integer"), "bool": (bool, "true or false"), "str": (str, "a string")}


def _check_type(value, typename: str, what: str, positive: bool = False) -> None:
    """YAML gives ints, bools and strings; a bool is not an int here, and sizes are positive."""
    expected, words = _TYPES.get(typename, (None, ""))
    if expected is None:
        return
    if not isinstance(value, expected) or (expected is int and isinstance(value, bool)):
        raise DeployError(f"{what} must be {words}, got {value!r}")
    if expected is int and positive and value < 1:
        raise DeployError(f"{what} must be a positive integer, got {value!r}")


def load(name_or_path: str) -> Preset:
    path = Path(name_or_path)
    if name_or_path.endswith((".yaml", ".yml")) or path.exists():
        if not path.exists():
            raise DeployError(f"preset file {name_or_path} does not exist")
        text, where = _read(path), str(path)
    else:
        f = resources.files("deploycc.configs") / f"{name_or_path}.yaml"
        if not f.is_file():
            near = difflib.get_close_matches(name_or_path, names(), n=1)
            hint = f"did you mean '{near[0]}'? " if near else ""
            raise DeployError(f"unknown device preset '{name_or_path}'; {hint}available: {', '.join(names())}")
        text, where = f.read_text(), f"preset {name_or_path}"
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise DeployError(f"{where} is nested too deeply to be a preset") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise DeployError(f"{where} is not valid YAML{at}: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise DeployError(f"{where} must be a YAML mapping of preset keys")
    return from_dict(data, where)


def _read(path: Path) -> str:
    if not path.is_file():
        raise DeployError(f"preset file {path} is not a file; give a .yaml preset or a preset name")
    if path.stat().st_size > MAX_PRESET_BYTES:
        raise DeployError(f"preset file {path} is {path.stat().st_size} bytes, more than a preset can be "
                          f"({MAX_PRESET_BYTES}); is it the right file?")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise DeployError(f"preset file {path} is not UTF-8 text; save it as UTF-8 YAML") from None


def _check_range(value: int, lo: int, hi: int, what: str) -> None:
    if not lo <= value <= hi:
        raise DeployError(f"{what} is {value}, outside {lo}..{hi}; choose a value in that range")


def from_dict(data: dict, where: str = "preset") -> Preset:
    for k in data:
        if k not in TOP_KEYS:
            raise _unknown(k, TOP_KEYS, where)
    for k in ("name", "target"):
        if k not in data:
            raise DeployError(f"{where}: missing required key '{k}'")
    tdata = data["target"]
    if not isinstance(tdata, dict):
        raise DeployError(f"{where}: 'target' must be a mapping")
    if "kind" not in tdata:
        raise DeployError(f"{where}: target: missing required key 'kind' (opencl, cuda, webgpu or cpu)")
    from dataclasses import fields

    tkeys = {f.name: f.type for f in fields(Target)}
    for k, v in tdata.items():
        if k not in tkeys:
            raise _unknown(k, tkeys, f"{where}: target")
        _check_type(v, str(tkeys[k]), f"{where}: target: '{k}'")
    try:
        target = Target(**tdata)
    except (TypeError, ValueError) as e:
        raise DeployError(f"{where}: target: {e}") from None
    for k in ("name", "description", "quantization"):
        if k in data:
            _check_type(data[k], "str", f"{where}: '{k}'")
    if not _NAME.match(data["name"]):
        raise DeployError(f"{where}: 'name' {data['name']!r} must be 1-64 letters, digits, '.', '_', '+' or '-' "
                          f"(it becomes part of the output directory's name)")
    runtime = data.get("runtime") or {}
    if not isinstance(runtime, dict):
        raise DeployError(f"{where}: 'runtime' must be a mapping (e.g. runtime: {{backend: opencl}})")
    for k in runtime:
        if k not in RUNTIME_KEYS:
            raise _unknown(k, RUNTIME_KEYS, f"{where}: runtime")
    backend = runtime.get("backend", target.kind)
    if backend not in BACKENDS:
        raise DeployError(f"{where}: runtime backend '{backend}' is not one of {', '.join(BACKENDS)}")
    web = runtime.get("web", False)
    if not isinstance(web, bool):
        raise DeployError(f"{where}: runtime 'web' must be true or false, not {web!r}")
    if web and not KINDS[target.kind].browser:
        raise DeployError(f"{where}: runtime 'web: true' (a browser bundle) needs target kind webgpu, not {target.kind}")
    for k, (lo, hi) in (("context_window", CONTEXT_WINDOW), ("prefill_chunk", PREFILL_CHUNK),
                        ("max_num_sequences", MAX_NUM_SEQUENCES), ("kv_pool_tokens", KV_POOL_TOKENS)):
        if k in data:
            _check_type(data[k], "int", f"{where}: '{k}'", positive=lo > 0)
            _check_range(data[k], lo, hi, f"{where}: '{k}'")
    kv_cache = data.get("kv_cache", "float32")
    if kv_cache not in KV_CACHE:
        raise DeployError(f"{where}: 'kv_cache' is {kv_cache!r}; give one of {', '.join(KV_CACHE)}")
    if kv_cache == "float16" and target.kind not in KV_HALF_KINDS:
        raise DeployError(f"{where}: 'kv_cache: float16' needs a target whose kernels store half floats "
                          f"({', '.join(KV_HALF_KINDS)}), not {target.kind}; use kv_cache: float32")
    hardware = data.get("hardware")
    if hardware is not None:
        if not isinstance(hardware, dict) or set(hardware) != set(HARDWARE):
            missing = ", ".join(sorted(set(HARDWARE) - set(hardware))) if isinstance(hardware, dict) else ""
            for k in hardware if isinstance(hardware, dict) else ():
                if k not in HARDWARE:
                    raise _unknown(k, HARDWARE, f"{where}: hardware")
            raise DeployError(f"{where}: 'hardware' must be a mapping of every one of {', '.join(sorted(HARDWARE))}"
                              + (f" (missing: {missing})" if missing else ""))
        for k, (lo, hi) in HARDWARE.items():
            v = hardware[k]
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise DeployError(f"{where}: hardware: '{k}' is {v!r}; give a number in {lo}..{hi}")
    ctx, chunk = data.get("context_window", 4096), data.get("prefill_chunk", 512)
    if chunk > ctx:
        raise DeployError(f"{where}: 'prefill_chunk' {chunk} exceeds 'context_window' {ctx}; a prefill step cannot "
                          f"hold more tokens than the cache (lower prefill_chunk to {ctx} or less)")
    return Preset(str(data["name"]), str(data.get("description", "")), target, backend,
                  str(data.get("quantization", "q0f32")), int(data.get("context_window", 4096)),
                  int(data.get("prefill_chunk", 512)), where, int(data.get("max_num_sequences", 16)),
                  int(data.get("kv_pool_tokens", 0)), web, dict(hardware) if hardware else None, str(kv_cache))
