"""Fuzz the package loader: mutate a real tiny package's manifest.json and bytecode.json, reseal it (so the
hashes agree and the validator, not the hash check, is what must catch the damage), then load it.

Every case is loaded in this process with a spy in place of the device opener: the only exceptions allowed
are the runtime's user errors (PackageError, ...), and a package that reaches the device must have passed
validation. A case that passes is run for real (prefill + 2 decode steps on PoCL) by a long-lived worker
process (package_worker.py) with a timeout, so a native crash or a hang is a test failure, not a dead pytest.
The counts are printed (pytest -s): clean errors / loaded-and-ran (same or different logits) / crashes /
hangs / other exceptions.
"""
from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
from bad_inputs.common import reseal
from conftest import require_device
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_package import compile_tiny_package, copy_package

from fuzz.worker import Worker

WORKER = Path(__file__).with_name("package_worker.py")
CASES = {"manifest": 800, "bytecode": 1200}
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
    baseline = worker.ask(str(base), TIMEOUT_S)
    assert baseline["kind"] == "ran", baseline
    counts: Counter = Counter()
    findings: list[str] = []

    @settings(max_examples=CASES[which], deadline=None, derandomize=True, database=None,
              suppress_health_check=list(HealthCheck))
    @given(mutation=mutations(docs, which))
    def case(mutation):
        what, change = mutation
        fresh = {which: json.loads(docs.text[which])}
        try:
            change(fresh)
        except (IndexError, KeyError, TypeError, AttributeError):  # the path went away with an earlier change
            counts["skipped"] += 1
            return
        (pkg / f"{which}.json").write_text(json.dumps(fresh[which]))  # the other document is never changed
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
