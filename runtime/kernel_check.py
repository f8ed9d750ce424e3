"""`python PKG verify --kernels`: every kernel of a package against its loop-level program, on the package's device.

Mirage's probabilistic equivalence check, shipped with the package: two programs that agree on random inputs
are equal with high probability, so each program's kernels (the schedule's work, rendered for the target and
built by the device's own compiler) run on random inputs, and the program's loop-level specification
(kernels/programs.json, run by runtime/loopir.py) on the same inputs. A user can check a package on the
device it will run on, without the compiler.

Sizes: for each place a step function runs the program, every corner of its shape variables' bounds (seq_len
1 and the prefill chunk, total_len seq_len and the context window, batch 1 and the page pool's sequences,
pages_len 1 and the widest page table) and INTERIOR random odd sizes between (no multiple of a power-of-two
tile). Inputs: packed integer weights random bits, float inputs standard normal (activations, norm weights,
scales), int32 inputs drawn where they are meaningful (deploycc/vm/programs.py int_domains), outputs filled
with the same random values on both sides, so an element a kernel must leave alone (a KV cache's other rows)
is compared too and an element neither side writes never differs. The input the cpu target's integer kernels
round to 8 or 16 bits is rounded for the reference as they round it (round_activations).

Judgement, per output: a program that rounds no float (copies, gathers, integer arithmetic) must agree bit for
bit; otherwise max |kernel - reference| / max |reference| <= FLOAT_TOLERANCE. Why that bound: both sides compute
in float32 and differ only in summation order, fused multiply-adds and the math library's last bits. A float32 sum
of K terms carries a rounding error of about sqrt(K) * 2^-24 times its terms' size, and the longest sums here are
attention's over the context window: 4e-6 for K = 4096. Measured on the 14 tiny architectures (cpu, PoCL,
lavapipe): below 6e-7, but 7.6e-6 for Gemma 2's soft-capped output head (the error of the logits before the cap,
relative to the capped ones); 3.3e-6 on SmolLM2's cpu package and 5.2e-6 on its PoCL one (attention over 4096
keys). 1e-4 leaves a factor of 13, and an RMSNorm kernel whose store is one element off measures 1.1.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from .devices import DeviceError
from .errors import PackageError
from .loopir import DTYPES, ProgramError, exact, round_activations, run_program, shape_of, sym_eval

FLOAT_TOLERANCE = 1e-4
INTERIOR = 2  # random interior sizes per call site, beside the corners
ORDER = ("seq_len", "total_len", "batch", "pages_len")  # a variable's range may depend on those before it


@dataclass
class KernelResult:
    name: str  # the program; its kernels launch in order
    kernels: list[str]
    sizes: list[dict] = field(default_factory=list)  # the program's variables, per size tried
    worst_error: float = 0.0
    tolerance: float = FLOAT_TOLERANCE  # 0: bit for bit
    seconds: float = 0.0
    problem: str | None = None  # why it failed (or was not run): a predicate of the kernel, in one line

    @property
    def passed(self) -> bool:
        return self.problem is None and self.worst_error <= self.tolerance


@dataclass
class KernelReport:
    package: str
    device: str
    results: list[KernelResult]
    seconds: float

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failure(self) -> str | None:
        """The first failing kernel, in one line."""
        for r in self.results:
            if not r.passed:
                if not r.kernels:  # not a kernel's fault: the document
                    return r.problem
                kernels = f" (kernels {', '.join(r.kernels)})" if r.kernels != [r.name] else ""
                return f"kernel {r.name}{kernels} {r.problem}"
        return None

    def to_dict(self) -> dict:
        return {"package": self.package, "device": self.device, "passed": self.passed, "seconds": self.seconds,
                "failure": self.failure, "kernels": [{**asdict(r), "passed": r.passed} for r in self.results]}


# ---- the check --------------------------------------------------------------------------------------

def check_kernels(path, seed: int = 0, on_result=None, trust=None) -> KernelReport:
    """Load the package (every check Engine.load makes; trust: its TrustPolicy, runtime/trust.py), then check each
    program; `on_result(KernelResult)` as each finishes."""
    from .engine import Engine

    t0 = time.perf_counter()
    path = Path(path)
    engine = Engine.load(path, native_steps=False, trust=trust, every_kernel=True)
    doc = read_programs(path, engine.manifest)
    ranges = Ranges(engine.manifest)
    rng = np.random.default_rng(seed)
    results = []
    covered = set()
    for prog in doc["programs"]:
        r = check_program(engine, prog, ranges, rng)
        covered.update(r.kernels)
        results.append(r)
        if on_result:
            on_result(r)
    for name in sorted(set(engine.manifest["kernels"]["entries"]) - covered):
        results.append(KernelResult(name, [name], problem="is stated by no loop-level program in kernels/programs.json"))
        if on_result:
            on_result(results[-1])
    return KernelReport(str(path), engine.device.name, results, time.perf_counter() - t0)


def read_programs(path: Path, manifest: dict) -> dict:
    """kernels/programs.json (its sha256 checked with every file of the package by Engine.load)."""
    rel = manifest["kernels"].get("programs")
    if rel is None or rel not in manifest["files"]:
        raise PackageError(f"{path} carries no loop-level programs (compiled before `verify --kernels` existed); "
                           f"recompile it")
    try:
        doc = json.loads((path / rel).read_bytes())
    except (OSError, ValueError, RecursionError) as e:
        raise PackageError(f"{path / rel} is unreadable ({e}); recompile the package") from None
    if type(doc) is not dict or doc.get("version") != 1 or type(doc.get("programs")) is not list:
        raise PackageError(f"{path / rel} is not a programs document of version 1; recompile the package")
    return doc


def check_program(engine, prog: dict, ranges: Ranges, rng) -> KernelResult:
    t0 = time.perf_counter()
    if type(prog) is not dict or type(prog.get("name")) is not str:
        return KernelResult("?", [], problem="kernels/programs.json holds a malformed entry; recompile the package")
    if "unchecked" in prog:
        return KernelResult(prog["name"], list(prog.get("kernels", [])), problem=f"was not checked: {prog['unchecked']}")
    r = KernelResult(prog["name"], [])
    try:
        r.kernels = [k["name"] for k in prog["schedule"]["kernels"]]
        bit_for_bit = exact(prog)
        r.tolerance = 0.0 if bit_for_bit else FLOAT_TOLERANCE
        for env in ranges.sizes(prog, rng):
            r.sizes.append(env)
            ins = make_inputs(prog, env, rng, ranges.context)
            want = reference(prog, ins, env)
            got = on_device(engine, prog, ins, env)
            for g, w in zip(got, want):
                r.worst_error = max(r.worst_error, error(g, w, bit_for_bit))
            if not r.passed:
                sizes = " ".join(f"{k}={v}" for k, v in env.items())
                how = f"error {r.worst_error:.3g} exceeds {r.tolerance:g}" if r.tolerance else \
                    f"differs by {r.worst_error:.3g} where it must agree bit for bit"
                r.problem = f"disagrees with its loop-level program: {how} at {sizes or 'its only size'}"
                break
    except DeviceError as e:  # a build or launch the device refused
        r.problem = f"failed on the device: {e}"
    except (ProgramError, KeyError, IndexError, TypeError, ValueError, RecursionError) as e:  # a malformed document
        r.problem = f"could not be checked: {type(e).__name__}: {e}"
    r.seconds = time.perf_counter() - t0
    return r


class Ranges:
    """The step functions' shape variables and their bounds, from the manifest (what the VM holds them to)."""

    def __init__(self, manifest: dict):
        b, kv = manifest["bounds"], manifest["kv_cache"]
        self.chunk, self.context = b["prefill_chunk"], b["context_window"]
        pool = kv.get("pool") or {}
        self.sequences = pool.get("sequences", 1)
        self.widest = -(-self.context // pool.get("page_size", self.context))

    def bounds(self, var: str, env: dict) -> tuple[int, int]:
        """A step's seq_len tokens are at most total_len and hold at least one of each of its batch sequences."""
        return {"seq_len": (1, self.chunk), "total_len": (env.get("seq_len", 1), self.context),
                "batch": (1, min(self.sequences, env.get("seq_len", self.chunk))), "pages_len": (1, self.widest)}[var]

    def sizes(self, prog: dict, rng) -> list[dict]:
        """The program's variables at every corner and INTERIOR random points of each call site, unique."""
        out: list[dict] = []
        for site in prog["sites"]:
            used = set()
            for e in site["vars"].values():
                _names(e, used)
            unknown = used - set(ORDER)
            if unknown:
                raise ValueError(f"a call site uses {sorted(unknown)[0]}, which is not a shape variable")
            names = [v for v in ORDER if v in used]
            points = self._corners(names, {}) + [self._interior(names, rng) for _ in range(INTERIOR)]
            for p in points:
                env = {v: int(sym_eval(e, p)) for v, e in site["vars"].items()}
                if env not in out:
                    out.append(env)
        return out

    def _corners(self, names: list[str], env: dict) -> list[dict]:
        if not names:
            return [dict(env)]
        lo, hi = self.bounds(names[0], env)
        return [p for v in sorted({lo, hi}) for p in self._corners(names[1:], {**env, names[0]: v})]

    def _interior(self, names: list[str], rng) -> dict:
        env: dict = {}
        for v in names:
            lo, hi = self.bounds(v, env)
            x = int(rng.integers(lo, hi + 1))
            env[v] = x + 1 if x % 2 == 0 and x < hi else x - 1 if x % 2 == 0 and x > lo else x
        return env


def _names(e, out: set) -> None:
    if type(e) is str:
        out.add(e)
    elif type(e) is list:
        for a in e[1:]:
            _names(a, out)


# ---- inputs, the two runs and the comparison -----------------------------------------------------------

def make_inputs(prog: dict, env: dict, rng, context: int) -> list[np.ndarray]:
    """One array per param: the inputs, then the outputs' initial contents (the same on both sides)."""
    arrays = []
    for i, b in enumerate(prog["params"]):
        info = prog["buffers"][b]
        shape, dtype = shape_of(prog, b, env), DTYPES[info["dtype"]]
        dom = prog["domains"].get(str(i))
        if info["dtype"] == "int32" and i < len(prog["params"]) - prog["num_outputs"]:
            arrays.append(_ints(shape, dom, env, rng, context))
        elif np.issubdtype(dtype, np.floating):
            arrays.append(rng.standard_normal(shape, dtype=np.float32).astype(dtype))
        else:  # packed weights: every bit pattern is a valid code
            arrays.append(rng.integers(np.iinfo(dtype).min, np.iinfo(dtype).max, shape, dtype=dtype, endpoint=True))
    return arrays


def _ints(shape, dom, env, rng, context: int) -> np.ndarray:
    bounds = [int(sym_eval(e, env)) for e in (dom or {}).get("below", [])]
    hi = min(bounds) if bounds else context
    n = int(np.prod(shape))
    if dom and dom["distinct"]:
        if n > hi:
            raise ValueError(f"{n} distinct values below {hi} do not exist")
        return rng.choice(hi, n, replace=False).astype(np.int32).reshape(shape)
    return rng.integers(0, hi, shape, dtype=np.int32)


def reference(prog: dict, ins: list[np.ndarray], env: dict) -> list[np.ndarray]:
    arrays = [a.copy() for a in ins]
    if "rounded" in prog:  # what the integer kernels compute with
        i, bits = prog["rounded"]
        arrays[i] = round_activations(arrays[i], bits)
    run_program(prog, arrays, env)
    return arrays[len(arrays) - prog["num_outputs"]:]


def on_device(engine, prog: dict, ins: list[np.ndarray], env: dict) -> list[np.ndarray]:
    """The program's kernels in launch order, as the VM launches them (runtime/vm.py)."""
    from .devices import buffer_ranges

    dev, sched = engine.device, prog["schedule"]
    bufs = {b: dev.upload(np.ascontiguousarray(a)) for b, a in zip(prog["params"], ins)}
    for w in sched["workspace"]:
        info = prog["buffers"][w]
        bufs[w] = dev.alloc(int(np.prod(shape_of(prog, w, env))) * np.dtype(DTYPES[info["dtype"]]).itemsize)
    max_grid = engine.manifest["target"].get("max_grid", 65535)
    for k in sched["kernels"]:
        groups = int(sym_eval(k["groups"], env))
        if groups == 0:
            continue
        kernel = engine.vm.kernels[k["name"]]
        split = kernel.meta.get("split") or {}
        args = []
        for i, b in enumerate(k["buffers"]):
            args += buffer_ranges(bufs[b], *split[i]) if i in split else [bufs[b]]
        args += [int(sym_eval(s, env)) for s in k["scalars"]]
        grid = (groups, 1, 1) if groups <= max_grid else (max_grid, -(-groups // max_grid), 1)
        dev.launch(kernel, args, grid, (k["threads"], 1, 1))
    outs = prog["params"][len(prog["params"]) - prog["num_outputs"]:]
    return [dev.download(bufs[b], shape_of(prog, b, env), DTYPES[prog["buffers"][b]["dtype"]]) for b in outs]


def error(got: np.ndarray, want: np.ndarray, bit_for_bit: bool) -> float:
    """Bit for bit: the largest |difference| (0 when equal). Else relative to the output's largest |element|."""
    floating = np.issubdtype(want.dtype, np.floating)
    if bit_for_bit or not floating:
        if np.array_equal(got, want, equal_nan=floating):
            return 0.0
        d = np.abs(got.astype(np.float64) - want.astype(np.float64))
        return float(np.nanmax(d)) if np.isfinite(d).any() else float("inf")
    g, w = got.astype(np.float32, copy=False), want.astype(np.float32, copy=False)
    d = np.abs(g - w)
    worst = float(d.max(initial=0.0))
    scale = float(np.abs(w).max(initial=0.0))
    if math.isnan(worst) or math.isnan(scale):  # NaN where the reference has none (or the reverse) fails
        if (np.isnan(g) != np.isnan(w)).any():
            return float("inf")
        worst, scale = float(np.nanmax(d, initial=0.0)), float(np.nanmax(np.abs(w), initial=0.0))
    return worst / (scale or 1.0)


# ---- the report as text -----------------------------------------------------------------------------

HEADER = f"{'worst error':>11} {'bound':>7} {'time':>7}  {'kernel':48} sizes tried"


def result_line(r: KernelResult) -> str:
    name = r.name if len(r.kernels) <= 1 else f"{r.name} ({len(r.kernels)} kernels)"
    err = "-" if r.problem and not r.sizes else f"{r.worst_error:.2e}"
    bound = "exact" if r.tolerance == 0 else f"{r.tolerance:.0e}"
    mark = "" if r.passed else f"  FAILED: {r.problem}"
    return f"{err:>11} {bound:>7} {r.seconds:6.2f}s  {name:48} {sizes_text(r.sizes)}{mark}"


def sizes_text(sizes: list[dict]) -> str:
    """'7 sizes: seq_len 1..512, total_len 1..4096' (the JSON report lists each)."""
    if not sizes:
        return "-"
    names = list(dict.fromkeys(k for s in sizes for k in s))
    spans = ", ".join(f"{v} {min(s[v] for s in sizes)}..{max(s[v] for s in sizes)}" for v in names)
    return f"{len(sizes)} size{'s' if len(sizes) > 1 else ''}" + (f": {spans}" if spans else " (fixed)")


def report_text(report: KernelReport) -> str:
    n = len(report.results)
    ok = sum(r.passed for r in report.results)
    verdict = "ok" if report.passed else "FAILED"
    return (f"{verdict}: {ok} of {n} kernel programs agree with their loop-level programs on {report.device} "
            f"({report.seconds:.1f}s)")


def verify_command(package_dir, as_json: bool = False, seed: int = 0, out=None, trust=None) -> KernelReport:
    """`python PKG verify --kernels` and `deploycc verify PKG --kernels`: the table streamed as kernels finish (or
    one JSON object); the caller says report.failure in one line and exits 1 when it did not pass."""
    import sys

    out = out or sys.stdout

    def row(r: KernelResult) -> None:
        print(result_line(r), file=out, flush=True)

    if not as_json:
        print(HEADER, file=out, flush=True)
    report = check_kernels(package_dir, seed, None if as_json else row, trust)
    print(json.dumps(report.to_dict(), indent=2) if as_json else report_text(report), file=out, flush=True)
    return report
