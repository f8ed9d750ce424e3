"""The schema of bytecode.json (runtime/validate.py holds the manifest's and the field checks both use): every
function's structure, registers read only after they are written, each builtin's operands by kind, and every
reference into the manifest (kernels, params, storages, shape variables) resolved. Standard library only."""
from __future__ import annotations

from .kvcache import KV_META
from .validate import (
    BYTECODE_VERSION,
    FUNCTIONS,
    MAX_DIMS,
    MAX_INSTRUCTIONS,
    MAX_ITEMS,
    NUM_INPUTS,
    REQUIRED_FUNCTIONS,
    affine,
    check_expr,
    fail,
    monotone,
    names_in,
    need_dict,
    need_int,
    need_list,
    need_str,
    show,
)
from .vm import BUILTIN_TABLE, BUILTINS, DTYPE_BYTES, SHAPE_VARS

B = "bytecode.json:"
# the groups of operand kinds a builtin's further operands may be (runtime/vm.py Builtin.more)
KINDS = {"dim": ("bind", "s"), "buf": ("r", "kv"), "launch": ("r", "kv", "str", "s")}


def check_bytecode(bc, m: dict) -> None:
    """The structure of the bytecode and its references into the manifest (which check_manifest passed)."""
    need_dict(bc, "bytecode.json", ("version", "functions"))
    need_int(bc["version"], f"{B} version", BYTECODE_VERSION, BYTECODE_VERSION)
    functions = need_dict(bc["functions"], f"{B} functions", REQUIRED_FUNCTIONS)
    if ("step" in functions) != ("pool" in m["kv_cache"]):
        fail(f"{B} functions", "must have a step function exactly where manifest.json kv_cache has a pool")
    for extra in ("step_all", "step_one"):
        if extra in functions and "step" not in functions:
            fail(f"{B} functions", f"has {extra} without step (both run on the page pool)")
    for name, spec in functions.items():
        if name not in FUNCTIONS:
            fail(f"{B} functions", f"has {show(name)}, which the runtime never calls (it has {', '.join(FUNCTIONS)})")
        _FunctionCheck(name, spec, m).run()


class _FunctionCheck:
    """One pass over a function in order: registers are read only after they are written (inputs, weights
    and constants are written at load), shape variables used only after vm.match_shape binds them."""

    def __init__(self, name: str, spec, m: dict):
        self.m, self.where = m, f"{B} functions.{name}"
        w = self.where
        need_dict(spec, w, ("params", "num_inputs", "registers", "constants", "instructions"))
        need_int(spec["num_inputs"], f"{w}.num_inputs", NUM_INPUTS, NUM_INPUTS)
        params = need_list(spec["params"], f"{w}.params", NUM_INPUTS)
        self.nregs = need_int(spec["registers"], f"{w}.registers", len(params), MAX_ITEMS)
        weights = {p["name"] for p in m["params"]}
        for i, p in enumerate(params):
            need_str(p, f"{w}.params[{i}]")
            if i >= NUM_INPUTS and p not in weights:
                fail(f"{w}.params[{i}]", f"is {show(p)}, which is not in manifest.json params")
        self.defined = set(range(len(params)))
        for i, c in enumerate(need_list(spec["constants"], f"{w}.constants")):
            need_list(c, f"{w}.constants[{i}]", 2, 2)
            if need_str(c[0], f"{w}.constants[{i}][0]") not in weights:
                fail(f"{w}.constants[{i}][0]", f"is {show(c[0])}, which is not in manifest.json params")
            r = need_int(c[1], f"{w}.constants[{i}][1]", len(params), self.nregs - 1)
            if r in self.defined:
                fail(f"{w}.constants[{i}][1]", f"is register {r}, which already holds another value")
            self.defined.add(r)
        self.preset = frozenset(self.defined)  # written at load: never an instruction's result
        self.bound: set[str] = set()
        self.meta: dict[int, str] = {}  # registers that hold kv.meta's tensors, by name
        self.code = need_list(spec["instructions"], f"{w}.instructions", 1, MAX_INSTRUCTIONS)

    def run(self) -> None:
        for pc, ins in enumerate(self.code):
            self.instruction(f"{self.where}.instructions[{pc}]", ins, pc == len(self.code) - 1)

    def instruction(self, w: str, ins, last: bool) -> None:
        need_dict(ins, w, ("op", "args"))
        unknown = sorted(set(ins) - {"op", "fn", "args", "dst"})
        if unknown:
            fail(w, f"has the unknown field {show(unknown[0])}")
        op = need_str(ins["op"], f"{w}.op", ("call", "ret"))  # the format's two opcodes
        args = need_list(ins["args"], f"{w}.args", 0, MAX_ITEMS)
        if op == "ret":
            if not last or "fn" in ins or "dst" in ins:
                fail(w, "must be the one ret, at the end of the function, with no fn or dst")
            need_list(args, f"{w}.args", 1, 1)
            self.operand(args[0], f"{w}.args[0]", "r")
            return
        if last:
            fail(w, "is not a ret; a function must end with one")
        fn = need_str(ins.get("fn"), f"{w}.fn", BUILTINS)
        b = BUILTIN_TABLE[fn]
        fixed, rest, writes = b.operands, b.more, b.writes
        if len(args) < len(fixed) or (rest is None and len(args) != len(fixed)):
            fail(f"{w}.args", f"has {len(args)} operands; {fn} takes {len(fixed)}{' or more' if rest else ''}")
        kinds = [*fixed, *(self.operand_kind(a, f"{w}.args[{i}]", KINDS.get(rest, (rest,)))
                           for i, a in enumerate(args[len(fixed):], len(fixed)))]
        values = [self.operand(a, f"{w}.args[{i}]", kind) for i, (a, kind) in enumerate(zip(args, kinds))]
        if fn == "vm.launch":
            self.launch(w, values, kinds)
        else:
            self.references(w, fn, values)
        if not writes and "dst" in ins:
            fail(f"{w}.dst", f"is set, but {fn} has no result")
        if writes:
            r = need_int(ins.get("dst"), f"{w}.dst", 0, self.nregs - 1)
            if r in self.preset:
                fail(f"{w}.dst", f"is register {r}, which holds an input, a weight or a constant")
            self.defined.add(r)
            if fn == "kv.meta" or (fn == "vm.move" and values[0] in self.meta):  # the pool rows a step writes
                self.meta[r] = values[1] if fn == "kv.meta" else self.meta[values[0]]
            else:
                self.meta.pop(r, None)

    def references(self, w: str, fn: str, values: list) -> None:
        if fn == "vm.alloc":
            n = len(self.m["storages"])
            if values[0] >= n:
                fail(f"{w}.args[0]", f"is storage {values[0]}, but manifest.json has {n} storages")
            need_str(values[1], f"{w}.args[1].str", tuple(DTYPE_BYTES))
            if len(values) - 2 > MAX_DIMS:
                fail(w, f"allocates a tensor of {len(values) - 2} dimensions, more than {MAX_DIMS}")
            for i, d in enumerate(values[2:], 2):
                if not monotone(d):
                    fail(f"{w}.args[{i}].s", f"is {show(d)}, not a size that grows with seq_len and total_len")
        elif fn == "kv.begin" and not affine(values[1]):
            fail(f"{w}.args[1].s", f"is {show(values[1])}; the tokens a step appends must be seq_len or a constant")
        elif fn == "kv.view":
            need_str(values[1], f"{w}.args[1].str", ("k", "v"))
            need_int(values[2], f"{w}.args[2].i", 0, self.m["kv_cache"]["layers"] - 1)
        elif BUILTIN_TABLE[fn].paged and "pool" not in self.m["kv_cache"]:
            fail(w, f"calls {fn}, but manifest.json kv_cache has no pool")
        elif fn == "kv.meta":
            need_str(values[1], f"{w}.args[1].str", KV_META)
        elif fn == "vm.match_shape" and len(values) - 1 > MAX_DIMS:
            fail(w, f"matches {len(values) - 1} dimensions, more than {MAX_DIMS}")

    def launch(self, w: str, values: list, kinds: list) -> None:
        """kernel, groups, threads, buffers..., "|", int arguments...: as many of each as the kernel takes, the
        ints its buffer sizes depend on growing with seq_len and total_len, and for a kernel that writes the
        KV cache an affine `offset` and `n` (the rows it writes; a kernel without `n` writes one: a decode step's
        attention that appends, deploycc/vm/kv_attend.py), so dryrun.py's corners decide them."""
        name, threads = values[0], values[2]
        entry = self.m["kernels"]["entries"][name]
        if threads != entry["threads"]:
            fail(f"{w}.args[2]", f"launches {name} with {threads} threads, but it was compiled for {entry['threads']}")
        seps = [i for i, k in enumerate(kinds) if k == "str"]
        if len(seps) != 1 or values[seps[0]] != "|":
            fail(f"{w}.args", "must separate the buffers from the int arguments with one '|'")
        sep = seps[0]
        for i, kind in enumerate(kinds[3:], 3):
            if (i < sep and kind not in ("r", "kv")) or (i > sep and kind != "s"):
                fail(f"{w}.args[{i}]", "must be a buffer (r or kv) before '|' and an int (s) after it")
        sig = entry["args"]
        bufs, ints = kinds[3:sep], values[sep + 1:]
        if (len(bufs), len(ints)) != (len(sig["buffers"]), len(sig["scalars"])):
            fail(f"{w}.args", f"passes {len(bufs)} buffers and {len(ints)} ints to {name}, which takes "
                              f"{len(sig['buffers'])} and {len(sig['scalars'])}")
        sized = set()
        for b in sig["buffers"]:
            for d in b["shape"]:
                sized |= names_in(d)
        for i, (arg, e) in enumerate(zip(sig["scalars"], ints)):
            if arg in sized and not monotone(e):
                fail(f"{w}.args[{sep + 1 + i}].s", f"is {show(e)}; {name}'s {arg} sizes a buffer, so it must grow "
                                                   f"with seq_len and total_len")
        slots = [a for a, k in zip(values[3:sep], bufs) if k == "r" and self.meta.get(a) == "slot"]
        if any(k == "kv" and b["written"] for k, b in zip(bufs, sig["buffers"])) and not slots:
            rows = dict(zip(sig["scalars"], ints))
            if "offset" not in rows or not (affine(rows["offset"]) and affine(rows.get("n", 1))):
                fail(f"{w}.args", f"lets {name} write the KV cache without affine int arguments offset and n "
                                  f"(the rows it writes; n 1 where it takes none)")

    # ---- operands ----
    def operand_kind(self, a, w: str, allowed: tuple) -> str:
        if type(a) is not dict or len(a) != 1 or next(iter(a)) not in allowed:
            fail(w, f"must be one operand of kind {' or '.join(allowed)}, got {show(a)}")
        return next(iter(a))

    def operand(self, a, w: str, kind: str):
        v = a[self.operand_kind(a, w, (kind,))]
        if kind == "r":
            self.register(v, f"{w}.r")
        elif kind == "s":
            check_expr(v, f"{w}.s", self.bound)
        elif kind == "i":
            need_int(v, f"{w}.i")
        elif kind == "str":
            need_str(v, f"{w}.str", hi=64)
        elif kind == "k":
            if need_str(v, f"{w}.k") not in self.m["kernels"]["entries"]:
                fail(f"{w}.k", f"is {show(v)}, which is not in manifest.json kernels.entries")
        elif kind == "kv":
            need_list(v, f"{w}.kv", 3, 3)
            self.register(v[0], f"{w}.kv[0]")
            need_str(v[1], f"{w}.kv[1]", ("k", "v"))
            need_int(v[2], f"{w}.kv[2]", 0, self.m["kv_cache"]["layers"] - 1)
        elif kind == "bind":
            if need_str(v, f"{w}.bind", SHAPE_VARS) in self.bound:
                fail(f"{w}.bind", f"binds {v} a second time")
            self.bound.add(v)
        return v

    def register(self, r, w: str) -> int:
        need_int(r, w, 0, self.nregs - 1)
        if r not in self.defined:
            fail(w, f"reads register {r} before any instruction writes it")
        return r
