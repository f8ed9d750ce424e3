"""The memory plan and every launch, checked by running each function on shapes alone before a device opens.

validate.py has checked the structure. Here every function runs at the corners of its bounds — one token
and a full prefill chunk, on an empty cache and on one with room for just this step — on tensors that are
only (shape, dtype, where their bytes live, how many bytes that buffer has). At each corner:

  vm.match_shape  shapes agree with the bytecode; seq_len and total_len are in the planned ranges
  vm.alloc        the view fits its storage: storages[sid].bytes is the memory plan's bound; it ends the
                  life of the storage's previous tensor
  kv.begin        reserves exactly the step's tokens, so total_len is the cache length
  kv.pages/meta   a batched step (step): batch sequences with page tables of pages_len pages, the metadata
                  int32 tensors the engine fills (runtime/batch.py), read-only; a kernel writes the pool
                  only at the rows `slot` names
  vm.launch       groups and ints agree with the kernel's calling convention (manifest kernels.entries[k].args);
                  each buffer has exactly the elements and dtype the kernel declares, so a kernel, which
                  touches only its declared shapes, stays inside every buffer; kernels write activations and
                  the KV cache only, and the cache-append kernel writes the rows of this step and no others
                  (its `offset` and `n` scalars, n 1 where it takes none: a decode step's attention that
                  appends its key and value, deploycc/vm/kv_attend.py);
                  an activation is read only after a kernel wrote it and before its storage is reused
  ret             float32 logits [1, 1 or seq_len or batch, vocab_size]

validate.py admits only sizes that grow with seq_len and total_len (so their largest value is at the upper
corner) and affine row offsets (fixed by three corners), so the corners decide every step in between; the VM
checks seq_len and total_len when it binds them on every call (vm.py).
"""
from __future__ import annotations

from dataclasses import dataclass

from .kvcache import KV_META
from .symexpr import compile_expr
from .validate import INT32_MAX, fail, kv_rows, nbytes, show
from .vm import SHAPE_VARS

LIMIT = 1 << 62


@dataclass(frozen=True, eq=False)  # identity matters: two views of one storage are two tensors
class Tensor:
    shape: tuple
    dtype: str
    home: str  # input | weight | storage | cache: who owns the buffer it views
    capacity: int  # bytes of that buffer
    sid: int = -1  # the storage, for home == "storage"

    def __str__(self) -> str:
        return f"{self.dtype} {list(self.shape)} ({self.home})"


class Cache:
    def __str__(self) -> str:
        return "the KV cache"


class Items(tuple):
    """vm.tuple's result (a plain tuple is a shape, from kv.begin)."""


def kind(v) -> str:
    return ("tensor" if isinstance(v, Tensor) else "cache" if isinstance(v, Cache) else "tuple" if isinstance(v, Items)
            else "shape")


def corners(fname: str, chunk: int, ctx: int) -> list[tuple[int, int]]:
    """(new tokens, cached tokens) at the corners of a function's bounds."""
    sizes = [1] if fname == "decode" else sorted({1, chunk})
    return list(dict.fromkeys((s, cached) for s in sizes for cached in (0, ctx - s)))


def step_corners(m: dict, fname: str = "step") -> list[tuple[int, int, int]]:
    """(tokens, sequences, page-table width) at the corners of a batched step's bounds (step_one's: one token)."""
    chunk, pool = m["bounds"]["prefill_chunk"], m["kv_cache"]["pool"]
    widths = sorted({1, -(-m["bounds"]["context_window"] // pool["page_size"])})
    sizes = [1] if fname == "step_one" else sorted({1, chunk})
    return list(dict.fromkeys((s, b, p) for s in sizes for b in sorted({1, min(s, pool["sequences"])})
                              for p in widths))


def check_plan(m: dict, bc: dict) -> None:
    compiled: dict = {}  # id(expression) -> its closure, shared by the corners (the documents outlive the check)
    for fname, spec in bc["functions"].items():
        if fname in ("step", "step_all", "step_one"):
            for s, batch, width in step_corners(m, fname):
                _DryRun(fname, spec, m, s, 0, compiled, (batch, width)).run()
            continue
        for s, cached in corners(fname, m["bounds"]["prefill_chunk"], m["bounds"]["context_window"]):
            _DryRun(fname, spec, m, s, cached, compiled).run()


class _DryRun:
    def __init__(self, fname: str, spec: dict, m: dict, s: int, cached: int, compiled: dict,
                 batch: tuple[int, int] | None = None):
        """batch: (sequences, page-table width) of a batched step."""
        self.fname, self.spec, self.m, self.s, self.length = fname, spec, m, s, cached
        self.compiled = compiled
        self.where = f"bytecode.json: functions.{fname}"
        b = m["bounds"]
        self.chunk, self.ctx = b["prefill_chunk"], b["context_window"]
        self.batch = batch
        self.at = f"{s} new tokens of {batch[0]} sequences" if batch else f"{s} new tokens after {cached} cached"
        self.heap: list = [None] * len(SHAPE_VARS)
        self.live: dict[int, Tensor] = {}  # storage -> the tensor that now owns it
        self.written: set[int] = set()  # id() of the activations a kernel has written
        self.views: dict[int, tuple] = {}  # id() of a kv.view -> ("k" | "v", layer)
        self.appended: set[tuple] = set()  # the ("k" | "v", layer) whose rows of this step a kernel wrote
        weights = {p["name"]: Tensor(tuple(p["shape"]), p["dtype"], "weight", nbytes(p["shape"], p["dtype"]))
                   for p in m["params"]}
        self.regs: list = [None] * spec["registers"]
        self.regs[0] = Tensor((1, s), "int32", "input", 4 * self.chunk)  # the engine's ids buffer
        self.regs[1] = Cache()
        for r, name in enumerate(spec["params"][2:], 2):
            self.regs[r] = weights[name]
        for name, r in spec["constants"]:
            self.regs[r] = weights[name]

    def run(self) -> None:
        for pc, ins in enumerate(self.spec["instructions"]):
            w = f"bytecode.json: functions.{self.fname}.instructions[{pc}]"
            if ins["op"] == "ret":
                self.ret(self.regs[ins["args"][0]["r"]])
                return
            fn = ins["fn"]
            self.where = f"{w} ({fn}, {self.at})"
            v = getattr(self, fn.replace(".", "_"))(self.where, ins["args"])
            if "dst" in ins:
                self.regs[ins["dst"]] = v

    # ---- values ----
    def ev(self, e, slot=SHAPE_VARS.index, heap=None) -> int:
        """`e` on the shape heap, or with `slot` and `heap`, on a kernel's int arguments."""
        heap = self.heap if heap is None else heap
        if type(e) is int:
            return e
        if type(e) is str:
            return heap[slot(e)]
        f = self.compiled.get(id(e))  # a list: one object per place in the documents, so one meaning
        if f is None:
            f = self.compiled[id(e)] = compile_expr(e, slot)
        v = f(heap)
        if not -LIMIT <= v <= LIMIT:  # the products below stay printable (str() refuses 4300 digits)
            fail(self.where, f"has an expression that evaluates to more than 2^62: {show(e)}")
        return v

    def reg(self, a: dict, w: str, *kinds: str):
        v = self.regs[a["r"]]
        if kind(v) not in kinds:
            fail(w, f"needs {' or '.join(kinds)} in register {a['r']}, which holds {kind(v)} {v}")
        return v

    # ---- builtins ----
    def vm_match_shape(self, w: str, args: list) -> None:
        v = self.reg(args[0], w, "tensor", "shape")
        shape = v.shape if isinstance(v, Tensor) else v
        if len(shape) != len(args) - 1:
            fail(w, f"matches {len(args) - 1} dimensions against {list(shape)}")
        for k, (a, d) in enumerate(zip(args[1:], shape)):
            if "bind" in a:
                name = a["bind"]
                hi = {"seq_len": self.chunk, "total_len": self.length}.get(name)
                if name in ("batch", "pages_len"):
                    hi = self.batch[name == "pages_len"] if self.batch else 0
                if not 1 <= d <= hi or (name == "total_len" and d != self.length):
                    fail(w, f"binds {name} = {d}, but it must be {'1..' if name == 'seq_len' else ''}{hi}")
                self.heap[SHAPE_VARS.index(name)] = d
            elif self.ev(a["s"]) != d:
                fail(w, f"expects dimension {k} to be {self.ev(a['s'])}, but it is {d} in {list(shape)}")

    def vm_alloc(self, w: str, args: list) -> Tensor:
        sid, dtype = args[0]["i"], args[1]["str"]
        dims = tuple(self.ev(a["s"]) for a in args[2:])
        if any(d < 0 for d in dims):
            fail(w, f"allocates the shape {list(dims)}")
        have = self.m["storages"][sid]["bytes"]
        if nbytes(dims, dtype) > have:
            fail(w, f"needs {nbytes(dims, dtype)} bytes of storage {sid} for {dtype} {list(dims)}, but "
                    f"manifest.json storages[{sid}].bytes is {have}")
        t = Tensor(dims, dtype, "storage", have, sid)
        self.live[sid] = t
        return t

    def vm_tuple(self, w: str, args: list) -> Items:
        return Items(self.regs[a["r"]] for a in args)

    def vm_get(self, w: str, args: list):
        t, i = self.reg(args[0], w, "tuple"), args[1]["i"]
        if i >= len(t):
            fail(w, f"takes item {i} of a tuple of {len(t)}")
        return t[i]

    def vm_move(self, w: str, args: list):
        return self.regs[args[0]["r"]]

    def kv_begin(self, w: str, args: list) -> tuple:
        self.reg(args[0], w, "cache")
        n = self.ev(args[1]["s"])
        if n != self.s or self.length + n > self.ctx:
            fail(w, f"reserves {n} rows of the KV cache; a step must reserve its {self.s} new tokens, once")
        self.length += n
        return (self.length,)

    def kv_pages(self, w: str, args: list) -> tuple:
        self.reg(args[0], w, "cache")
        if self.batch is None:
            fail(w, "asks for a batched step's page tables outside the step function")
        return self.batch

    def kv_meta(self, w: str, args: list) -> Tensor:
        """The engine's metadata buffers (runtime/batch.py), sized for the bounds; only the step's part is viewed."""
        self.reg(args[0], w, "cache")
        if self.batch is None:
            fail(w, "asks for a batched step's metadata outside the step function")
        pool, chunk = self.m["kv_cache"]["pool"], self.chunk
        widest = -(-self.ctx // pool["page_size"])
        batch, width = self.batch
        shape, capacity = {"pages": ((batch, width), pool["sequences"] * widest),
                           "last": ((batch,), pool["sequences"])}.get(args[1]["str"], ((self.s,), chunk))
        t = Tensor(shape, "int32", "meta", 4 * capacity)
        self.views[id(t)] = ("meta", KV_META.index(args[1]["str"]))
        return t

    def kv_view(self, w: str, args: list) -> Tensor:
        self.reg(args[0], w, "cache")
        c = self.layer_buf(args[2]["i"])
        ring = self.m["kv_cache"].get("rows") and self.m["kv_cache"]["rows"][args[2]["i"]]
        t = Tensor((c.shape[0] if self.batch else ring or self.length, *c.shape[1:]), c.dtype, "cache", c.capacity)
        self.views[id(t)] = (args[1]["str"], args[2]["i"])
        return t

    def vm_launch(self, w: str, args: list) -> None:
        name = args[0]["k"]
        sig = self.m["kernels"]["entries"][name]["args"]
        sep = next(i for i, a in enumerate(args) if a.get("str") == "|")
        bufs = [self.reg(a, w, "tensor") if "r" in a else self.kv_buffer(a, w) for a in args[3:sep]]
        ints = [self.ev(a["s"]) for a in args[sep + 1:]]
        for arg, v in zip(sig["scalars"], ints):
            if not -INT32_MAX - 1 <= v <= INT32_MAX:
                fail(w, f"passes {arg} = {v} to {name}, outside int32")
        scalars = {arg: i for i, arg in enumerate(sig["scalars"])}
        for j, (a, b, decl) in enumerate(zip(args[3:sep], bufs, sig["buffers"])):
            dims = [self.ev(d, scalars.__getitem__, ints) for d in decl["shape"]]
            self.buffer(w, name, j, b, dims, decl)
            if "kv" in a and decl["written"] and self.batch:  # a pool: written at the rows slot names
                if not any(self.views.get(id(x)) == ("meta", KV_META.index("slot")) for x in bufs):
                    fail(w, f"lets {name} write the page pool without the step's slots")
                self.appended.add(tuple(a["kv"][1:]))
            elif "kv" in a and decl["written"]:  # rows offset .. offset + n - 1 (n: 1 where it takes none)
                rows = dict(zip(sig["scalars"], ints))
                if "offset" not in rows:
                    fail(w, f"lets {name} write the KV cache without an offset saying which rows")
                if (rows["offset"], rows.get("n", 1)) != (self.length - self.s, self.s):
                    fail(w, f"lets {name} write rows {rows['offset']}..{rows['offset'] + rows.get('n', 1) - 1} of "
                            f"the KV cache; this step's rows are {self.length - self.s}..{self.length - 1}")
                self.appended.add(tuple(a["kv"][1:]))
            elif id(b) in self.views and self.views[id(b)][0] != "meta" and self.views[id(b)] not in self.appended:
                which, layer = self.views[id(b)]
                fail(w, f"lets {name} read layer {layer}'s {'keys' if which == 'k' else 'values'} before this step's "
                        f"rows were appended to the KV cache")
        groups, want = self.ev(args[1]["s"]), self.ev(sig["groups"], scalars.__getitem__, ints)
        max_grid = self.m["target"].get("max_grid", 65535)
        if groups != want or not 0 <= groups <= max_grid * max_grid:
            fail(w, f"launches {groups} work-groups of {name}, which needs {want} (at most {max_grid}^2)")

    def kv_buffer(self, a: dict, w: str) -> Tensor:
        self.reg({"r": a["kv"][0]}, w, "cache")
        return self.layer_buf(a["kv"][2])

    def layer_buf(self, layer: int) -> Tensor:
        """A layer's keys or values buffer: the whole context window, its sliding-window ring, or in a batched
        step its page pool."""
        kv = self.m["kv_cache"]
        rows = kv["pool"]["pages"] * kv["pool"]["page_size"] if self.batch else kv_rows(self.m, layer)
        shape = (rows, kv["kv_heads"], kv["head_dim"])
        return Tensor(shape, kv["dtype"], "cache", nbytes(shape, kv["dtype"]))

    def buffer(self, w: str, name: str, j: int, b: Tensor, dims: list, decl: dict) -> None:
        numel = 1
        for d in b.shape:
            numel *= d
        want = 1
        for d in dims:
            want *= d
        if any(d < 0 for d in dims) or want != numel or decl["dtype"] != b.dtype or nbytes(dims, b.dtype) > b.capacity:
            fail(w, f"passes {b} as buffer {j} of {name}, which takes {decl['dtype']} {dims}")
        if decl["written"] and b.home not in ("storage", "cache"):
            fail(w, f"lets {name} write its buffer {j}, which is the {b.home} {list(b.shape)}")
        if b.home == "storage":
            self.alive(w, f"buffer {j} of {name}", b, reading=not decl["written"])
            if decl["written"]:
                self.written.add(id(b))

    def alive(self, w: str, what: str, t: Tensor, reading: bool) -> None:
        """The plan gives a storage to one tensor at a time: using an older tensor of it would read or clobber
        its successor's values, and reading one no kernel has written reads whatever the storage held."""
        if self.live.get(t.sid) is not t:
            fail(w, f"uses {t} as {what} after storage {t.sid} was given to another tensor")
        if reading and id(t) not in self.written:
            fail(w, f"reads {t} as {what} before any kernel writes it")

    def ret(self, v) -> None:
        rows = {"decode": (1,), "prefill": (1, self.s), "prefill_all": (self.s,),
                "step": (self.batch[0] if self.batch else 0,), "step_all": (self.s,), "step_one": (1,)}[self.fname]
        vocab = self.m["vocab_size"]
        w = f"bytecode.json: functions.{self.fname} ({self.at})"
        if not (isinstance(v, Tensor) and v.dtype == "float32" and len(v.shape) == 3 and v.shape[0] == 1
                and v.shape[1] in rows and v.shape[2] == vocab):
            fail(w, f"returns {show(str(v))}, not the logits: float32 [1, {rows[-1]}, {vocab}] (vocab_size {vocab})")
        if v.home == "storage":
            self.alive(w, "its result", v, reading=True)
