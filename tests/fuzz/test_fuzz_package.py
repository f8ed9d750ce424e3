"""Fuzz the package loader: mutate a real tiny package's manifest.json and bytecode.json, reseal it (so the
hashes agree and the validator, not the hash check, is what must catch the damage), then load it.

Every case is loaded in this process with a spy in place of the device opener: the only exceptions allowed
are the runtime's user errors (PackageError, ...), and a package that reaches the device must have passed
validation. A case that passes is run for real (prefill + 2 decode steps on PoCL) by a long-lived worker
process (package_worker.py) with a timeout, so a native crash or a hang is a test failure, not a dead pytest.
The counts are printed (pytest -s): clean errors / loaded-and-ran (same or different logits) / crashes /
hangs / other exceptions.

The cpu target's package (native code: kernels/kernels.so and the step tables of manifest kernels.native)
is fuzzed with mutations aimed at what its native step functions trust: the weight and step tables, the
heap and shape-variable tables, the kernels' argument tables, storage sizes, the bounds, the KV cache's
shape and the weights' shapes (the params file rewritten to agree). A hostile editor also makes the
manifest's derived fields agree (the memory summary, the page pool, storages large enough for new bounds),
so a mutation is often followed by those fix-ups, to reach the dry run and the native call rather than stop
at a summary. Its worker fences every buffer with an inaccessible page and fills the context window, so a
step that reads or writes out of bounds is a crash here, not a silent read of the next allocation.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from bad_inputs.common import launches_with, reseal
from conftest import require_cc, require_device
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_package import compile_tiny_package, copy_package

from fuzz.worker import Worker

WORKER = Path(__file__).with_name("package_worker.py")
# seeded (derandomize): the same cases each run, about 100 s of the suite; DEPLOYCC_FUZZ_SCALE=4 runs four times as many
# (until 2026-11-27 the suite ran 500, 700 and 250: 160 s)
SCALE = float(os.environ.get("DEPLOYCC_FUZZ_SCALE") or 1)
CASES = {k: int(v * SCALE) for k, v in {"manifest": 300, "bytecode": 450, "native": 150}.items()}
TIMEOUT_S = 60  # a first load builds the kernels (seconds on PoCL); a step of the tiny model takes milliseconds
INTS = st.one_of(st.integers(), st.integers(-3, 3),
                 st.sampled_from([2**31 - 1, 2**31, 2**32, 2**63 - 1, 2**63, -2**63, 2**64, 10**30, -2**31]))
VALUES = st.one_of(INTS, st.floats(), st.text(max_size=12), st.none(), st.booleans(),
                   st.lists(st.integers(-2, 200), max_size=3), st.dictionaries(st.text(max_size=4), INTS, max_size=2))


# ---- the package and the worker ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    return compile_tiny_package(tmp_path_factory.mktemp("fuzz"))


@pytest.fixture(scope="module")
def worker():
    require_device("opencl")
    w = Worker(WORKER)
    yield w
    w.stop()


@pytest.fixture(scope="module")
def cpu_base(tmp_path_factory) -> Path:
    """The tiny llama for the cpu target; a 64-token window in chunks of 16, so filling it takes four chunks."""
    require_cc()
    return compile_tiny_package(tmp_path_factory.mktemp("fuzz-cpu"), "cpu", ("prefill_chunk=16", "context_window=64"))


@pytest.fixture(scope="module")
def cpu_worker():
    w = Worker(WORKER, "--native")
    yield w
    w.stop()


# ---- mutations ---------------------------------------------------------------------------------------

def paths(doc, prefix=()) -> list[tuple]:
    """Every node's path (keys and indices), leaves and containers alike."""
    out = [prefix]
    items = doc.items() if isinstance(doc, dict) else enumerate(doc) if isinstance(doc, list) else ()
    for k, v in items:
        out += paths(v, (*prefix, k))
    return out


def get(doc, path):
    for k in path:
        doc = doc[k]
    return doc


class Docs:
    """The base documents as text (a fresh copy per case is one json.loads) and the paths a mutation picks from."""

    def __init__(self, pkg: Path):
        self.text = {name: (pkg / f"{name}.json").read_text() for name in ("manifest", "bytecode")}
        self.nodes = {name: [p for p in paths(json.loads(t)) if p] for name, t in self.text.items()}
        loaded = {name: json.loads(t) for name, t in self.text.items()}
        bc = loaded["bytecode"]
        self.ints = {n: [p for p in ps if type(get(loaded[n], p)) is int] for n, ps in self.nodes.items()}
        self.keys = {n: [p for p in ps if isinstance(p[-1], str)] for n, ps in self.nodes.items()}
        self.regs = [p for p in self.nodes["bytecode"] if p[-1] in ("r", "dst") or (len(p) > 1 and p[-2] == "kv"
                                                                                      and p[-1] == 0)]
        self.functions = {f: (len(spec["instructions"]), spec["registers"]) for f, spec in bc["functions"].items()}

    @functools.cached_property
    def native_nodes(self) -> tuple[list, list, list]:
        """The manifest's paths inside NATIVE_TREES: all of them, the ints, the keys (a cpu package's)."""
        nodes = [n for n in self.nodes["manifest"] if any(n[:len(t)] == t for t in NATIVE_TREES)]
        ints = set(self.ints["manifest"])
        return nodes, [n for n in nodes if n in ints], [n for n in nodes if isinstance(n[-1], str)]


@st.composite
def mutations(draw, docs: Docs, which: str):
    """(description, function that changes the fresh documents in place)."""
    nodes, ints, keys = docs.nodes[which], docs.ints[which], docs.keys[which]
    kinds = ["replace", "replace", "nudge", "delete"] + (["set_reg", "set_reg", "swap_regs", "dup_ins", "del_ins",
                                                           "swap_ins"] if which == "bytecode" else [])
    kind = draw(st.sampled_from(kinds))
    if kind == "replace":
        path, value = draw(st.sampled_from(nodes)), draw(VALUES)
        return f"{which} {path} = {value!r}", lambda d: _set(d[which], path, value)
    if kind == "nudge":  # near misses pass the type checks: off by one, doubled, halved, negated
        path = draw(st.sampled_from(ints))
        change = draw(st.sampled_from(["+1", "-1", "*2", "//2", "neg", "+1000"]))
        new = {"+1": lambda v: v + 1, "-1": lambda v: v - 1, "*2": lambda v: v * 2, "//2": lambda v: v // 2,
               "neg": lambda v: -v, "+1000": lambda v: v + 1000}[change]
        return f"{which} {path} {change}", lambda d: _set(d[which], path, new(get(d[which], path)))
    if kind == "delete":
        path = draw(st.sampled_from(keys))
        return f"{which} del {path}", lambda d: get(d[which], path[:-1]).pop(path[-1])
    if kind == "set_reg":
        path = draw(st.sampled_from(docs.regs))
        r = draw(st.integers(0, docs.functions[path[1]][1] - 1))
        return f"bytecode {path} = register {r}", lambda d: _set(d[which], path, r)
    if kind == "swap_regs":
        a = draw(st.sampled_from(docs.regs))
        b = draw(st.sampled_from([p for p in docs.regs if p[1] == a[1]]))
        return f"bytecode swap {a} {b}", lambda d: _swap(d[which], a, b)
    fname = draw(st.sampled_from(sorted(docs.functions)))
    n = docs.functions[fname][0]
    i, j = draw(st.integers(0, n - 1)), draw(st.integers(0, n - 1))
    code = ("functions", fname, "instructions")
    if kind == "dup_ins":
        return f"bytecode {fname} duplicate {i} at {j}", lambda d: get(d[which], code).insert(j, get(d[which], code)[i])
    if kind == "del_ins":
        return f"bytecode {fname} remove {i}", lambda d: get(d[which], code).pop(i)
    return f"bytecode {fname} swap {i} {j}", lambda d: _swap(d[which], (*code, i), (*code, j))


def _set(doc, path, value) -> None:
    get(doc, path[:-1])[path[-1]] = value


def _swap(doc, a, b) -> None:
    va, vb = get(doc, a), get(doc, b)
    _set(doc, a, vb)
    _set(doc, b, va)


# ---- mutations of a cpu package: what the native step functions trust ---------------------------------

# manifest subtrees the native path reads (a node's path starts with one of these)
NATIVE_TREES = (("kernels", "native"), ("kernels", "entries"), ("storages",), ("bounds",), ("kv_cache",),
                ("params",), ("vocab_size",), ("target", "isa"), ("target", "num_threads"))


class Params:
    """The base package's weights (one params file): a weight-shape mutation rewrites the file to agree."""

    def __init__(self, pkg: Path):
        from safetensors.numpy import load_file

        files = {p["file"] for p in json.loads((pkg / "manifest.json").read_text())["params"]}
        assert len(files) == 1, files
        self.file = files.pop()
        self.base = pkg / self.file
        self.arrays = load_file(str(self.base))
        self.dirty = False

    def write(self, pkg: Path, arrays: dict | None) -> None:
        from safetensors.numpy import save_file

        if arrays is not None:
            save_file(arrays, str(pkg / self.file))
        elif self.dirty:
            shutil.copyfile(self.base, pkg / self.file)
        self.dirty = arrays is not None


def _fix_memory(m: dict) -> None:
    """The memory summary recomputed from what it summarises, as a careful hostile editor would."""
    from deploycc.runtime.validate import kv_bytes, nbytes

    mem = m["memory"]
    mem["weights_bytes"] = sum(nbytes(p["shape"], p["dtype"]) for p in m["params"])
    mem["kv_cache_bytes"] = kv_bytes(m)
    mem["activation_bytes"] = sum(s["bytes"] for s in m["storages"])


def _roomy(m: dict) -> None:
    """Every storage four times larger (more room is always safe), so bounds made larger can pass the plan."""
    for storage in m["storages"]:
        storage["bytes"] *= 4


FIXUPS = {"": (), "memory": (_fix_memory,), "roomy": (_roomy, _fix_memory)}


def _bounds(d: dict, ctx: int, chunk: int) -> None:
    m = d["manifest"]
    m["bounds"].update(context_window=ctx, prefill_chunk=chunk)
    pool = m["kv_cache"].get("pool")
    if pool:
        pool["pages"] = max(pool["pages"], -(-ctx // pool["page_size"]))
        pool["sequences"] = max(1, min(pool["sequences"], chunk))


def _reshape_weight(d: dict, params: Params, i: int, shape: list, follow: bool) -> None:
    """params[i] gets `shape`, its tensor in the params file too (the old values repeated or cut); with
    `follow`, the kernels launched with it declare that argument with the new shape."""
    m = d["manifest"]
    p = m["params"][i]
    p["shape"] = shape
    arrays = dict(params.arrays) if d["params"] is None else d["params"]
    arrays[p["name"]] = np.resize(params.arrays[p["name"]], shape)
    d["params"] = arrays
    if follow:
        for kernel, j in launches_with(d["bytecode"], p["name"]):
            m["kernels"]["entries"][kernel]["args"]["buffers"][j]["shape"] = list(shape)


SIZE_CHANGES = {"+1": lambda v: v + 1, "-1": lambda v: v - 1, "*2": lambda v: v * 2, "//2": lambda v: v // 2,
                "0": lambda v: 0, "+64": lambda v: v + 64}


@st.composite
def native_mutations(draw, docs: Docs, params: Params):
    """(description, change of {"manifest", "bytecode", "params"} in place) for a cpu package."""
    m = json.loads(docs.text["manifest"])
    kind = draw(st.sampled_from(["tree", "tree", "bytecode", "bounds", "bounds", "weight", "weight", "storage",
                                 "kv", "args", "args"]))
    fixup = draw(st.sampled_from(["", "memory", "memory", "roomy"]))
    if kind == "tree":  # any field of the trees the native path reads: replaced, nudged or deleted
        in_trees, ints, keys = docs.native_nodes
        op = draw(st.sampled_from(["replace", "nudge", "nudge", "delete"]))
        if op == "replace":
            path, value = draw(st.sampled_from(in_trees)), draw(VALUES)
            what, change = f"manifest {path} = {value!r}", lambda d: _set(d["manifest"], path, value)
        elif op == "nudge":
            path, how = draw(st.sampled_from(ints)), draw(st.sampled_from(sorted(SIZE_CHANGES)))
            what = f"manifest {path} {how}"
            change = lambda d: _set(d["manifest"], path, SIZE_CHANGES[how](get(d["manifest"], path)))
        else:
            path = draw(st.sampled_from(keys))
            what, change = f"manifest del {path}", lambda d: get(d["manifest"], path[:-1]).pop(path[-1])
    elif kind == "bytecode":  # the bytecode the native code was lowered from, changed under it
        what, change = draw(mutations(docs, "bytecode"))
    elif kind == "bounds":
        b = m["bounds"]  # a new window only passes the plan with the KV cache's size in the bytecode changed too
        ctx = draw(st.one_of(st.just(b["context_window"]), st.sampled_from(sorted({
            1, b["prefill_chunk"], b["context_window"] - 1, b["context_window"] + 1, 2 * b["context_window"], 2048}))))
        chunk = draw(st.sampled_from(sorted({1, b["prefill_chunk"] - 1, b["prefill_chunk"], b["prefill_chunk"] + 1,
                                             2 * b["prefill_chunk"], ctx})))
        what, change = f"bounds context_window={ctx} prefill_chunk={chunk}", lambda d: _bounds(d, ctx, chunk)
    elif kind == "weight":
        i = draw(st.integers(0, len(m["params"]) - 1))
        old = m["params"][i]["shape"]
        how = draw(st.sampled_from(["+1", "-1", "//2", "*2", "drop", "add"]))
        j = draw(st.integers(0, max(0, len(old) - 1)))
        shape = (old[:j] + old[j + 1:] if how == "drop" else old + [1] if how == "add" or not old
                 else old[:j] + [max(0, SIZE_CHANGES[how](old[j]))] + old[j + 1:])
        follow = draw(st.booleans())
        what = f"params[{i}] {m['params'][i]['name']} {old} -> {shape}{' (kernel args follow)' if follow else ''}"
        change = lambda d: _reshape_weight(d, params, i, shape, follow)
    elif kind == "storage":
        i = draw(st.integers(0, len(m["storages"]) - 1))
        how = draw(st.sampled_from(sorted(SIZE_CHANGES)))
        what = f"storages[{i}].bytes {how}"
        change = lambda d: _set(d["manifest"], ("storages", i, "bytes"),
                                SIZE_CHANGES[how](d["manifest"]["storages"][i]["bytes"]))
    elif kind == "kv":
        key = draw(st.sampled_from(["layers", "kv_heads", "head_dim", "dtype"]))
        if key == "dtype":
            value = "float16" if m["kv_cache"]["dtype"] == "float32" else "float32"
            what = f"kv_cache.dtype = {value}"
            change = lambda d: _set(d["manifest"], ("kv_cache", "dtype"), value)
        else:
            how = draw(st.sampled_from(["+1", "-1", "*2", "//2"]))
            what = f"kv_cache.{key} {how}"
            change = lambda d: _set(d["manifest"], ("kv_cache", key), SIZE_CHANGES[how](d["manifest"]["kv_cache"][key]))
    else:  # a kernel's argument table: one dimension of one buffer, its groups, its scalars' order
        name = draw(st.sampled_from(sorted(m["kernels"]["entries"])))
        args = m["kernels"]["entries"][name]["args"]
        where = ("kernels", "entries", name, "args")
        choices = [("buffers", i, "shape", j) for i, b in enumerate(args["buffers"]) for j in range(len(b["shape"]))]
        op = draw(st.sampled_from(["dim", "dim", "dim", "groups"] + (["swap"] if len(args["buffers"]) > 1 else [])))
        if op == "dim" and choices:
            path = (*where, *draw(st.sampled_from(choices)))
            value = draw(st.one_of(st.sampled_from([1, 2, 31, 33, 64, 4096]), st.sampled_from(args["scalars"] or [1]),
                                   st.sampled_from([["*", 2, s] for s in args["scalars"]] or [0])))
            what, change = f"manifest {path} = {value!r}", lambda d: _set(d["manifest"], path, value)
        elif op == "groups" or not choices:
            value = draw(st.sampled_from([1, 2, ["*", 2, args["groups"]], ["+", 1, args["groups"]]]))
            what, change = f"{name} groups = {value!r}", lambda d: _set(d["manifest"], (*where, "groups"), value)
        else:
            a, b = draw(st.lists(st.integers(0, len(args["buffers"]) - 1), min_size=2, max_size=2, unique=True))
            what = f"{name} buffers {a} <-> {b}"
            change = lambda d: _swap(d["manifest"], (*where, "buffers", a), (*where, "buffers", b))

    def apply(d: dict) -> None:
        change(d)
        for f in FIXUPS[fixup]:
            try:
                f(d["manifest"])
            except (KeyError, TypeError, IndexError, AttributeError, ValueError):  # the mutation broke what it reads
                break
    return what + (f" + {fixup}" if fixup else ""), apply


# ---- one case ------------------------------------------------------------------------------------------

class _DeviceOpened(Exception):
    """Raised by the spy in place of open_device: the package passed every check before the device."""


def load_in_process(pkg: Path) -> tuple[str, str]:
    from deploycc.runtime.cli import USER_ERRORS
    from deploycc.runtime.engine import Engine

    try:
        Engine.load(pkg)
    except _DeviceOpened:
        return "valid", ""
    except USER_ERRORS as e:
        return "rejected", f"{type(e).__name__}: {e}"
    except Exception as e:  # noqa: BLE001 - the finding this test exists for
        return "other", f"{type(e).__name__}: {e}"[:400]
    return "other", "Engine.load returned without opening a device"


def run_fuzz(which: str, base: Path, tmp_path: Path, worker: Worker, monkeypatch) -> Counter:
    import deploycc.runtime.engine as engine_module

    def spy(kind, **opts):
        raise _DeviceOpened(kind)

    monkeypatch.setattr(engine_module, "open_device", spy)
    pkg = copy_package(base, tmp_path / "pkg")
    docs = Docs(base)
    params = Params(base) if which == "native" else None
    strategy = native_mutations(docs, params) if which == "native" else mutations(docs, which)
    baseline = worker.ask(str(base), TIMEOUT_S)
    assert baseline["kind"] == "ran", baseline
    counts: Counter = Counter()
    findings: list[str] = []

    @settings(max_examples=CASES[which], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutation=strategy)
    def case(mutation):
        what, change = mutation
        fresh = {name: json.loads(text) for name, text in docs.text.items()} | {"params": None}
        try:
            change(fresh)
        except (IndexError, KeyError, TypeError, AttributeError):  # the path went away with an earlier change
            counts["skipped"] += 1
            return
        for name in docs.text:
            (pkg / f"{name}.json").write_text(json.dumps(fresh[name]))
        if params is not None:
            params.write(pkg, fresh["params"])
        reseal(pkg)
        outcome, detail = load_in_process(pkg)
        if outcome == "valid":
            r = worker.ask(str(pkg), TIMEOUT_S)
            outcome = {"ran": "ran, same logits" if r.get("logits") == baseline["logits"] else "ran, different logits",
                       "error": "clean error at run"}.get(r["kind"], r["kind"])
            detail = r.get("message", r.get("code", ""))
        counts[outcome] += 1
        if outcome not in ("rejected", "ran, same logits", "clean error at run"):
            findings.append(f"{outcome}: {what}: {detail}")
        assert outcome not in ("other", "crash", "hang"), f"{outcome}: {what}: {detail}"

    try:
        case()
    finally:
        print(f"\n{which}: {sum(counts.values())} cases: {dict(counts)}")
        for f in findings[:40]:
            print("  ", f)
    return counts


def test_fuzz_manifest(base, tmp_path, worker, monkeypatch):
    counts = run_fuzz("manifest", base, tmp_path, worker, monkeypatch)
    assert counts["rejected"] > CASES["manifest"] // 4


def test_fuzz_bytecode(base, tmp_path, worker, monkeypatch):
    counts = run_fuzz("bytecode", base, tmp_path, worker, monkeypatch)
    assert counts["rejected"] > CASES["bytecode"] // 2


def test_fuzz_cpu_package(cpu_base, tmp_path, cpu_worker, monkeypatch):
    """The cpu target's native path: every mutated package is refused in one line or runs, its steps inside
    every buffer (the worker's fences turn an out-of-bounds access into a crash)."""
    counts = run_fuzz("native", cpu_base, tmp_path, cpu_worker, monkeypatch)
    assert counts["rejected"] > CASES["native"] // 4
    assert counts["ran, same logits"] + counts["ran, different logits"] > CASES["native"] // 20
