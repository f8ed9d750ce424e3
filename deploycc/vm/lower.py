"""lower_vm: scheduled graph functions -> VM bytecode (two opcodes; everything else a builtin).

Opcodes: `call` (a named builtin, writing an optional register) and `ret`. The models' graph functions have no
control flow (an `If` binding is refused here: "cannot lower If"), so the format has no `goto` or `if`. Arguments are
registers `{"r": i}`, symbolic integers on the shape heap `{"s": <sym json>}`, immediates `{"i": v}`,
strings `{"str": v}`, kernels `{"k": name}` and KV-cache buffers `{"kv": [reg, "k"|"v", layer]}`.

Builtins (implemented by runtime/vm.py):
  vm.match_shape(value, dims...)   dims {"bind": name} define a shape variable, {"s": e} check one
  vm.alloc(storage, dtype, dims...) a tensor view of a planned storage (storages exist from load on)
  vm.launch(kernel, groups, threads, buffers..., "|", scalars...)
  vm.tuple(values...), vm.get(tuple, index)
  kv.begin(cache, n) -> shape (total length); kv.view(cache, "k"|"v", layer, kv_heads, head_dim)
  kv.pages(cache) -> shape (batch, pages_len); kv.meta(cache, name) -> the int32 metadata of a batched step
  over a page pool (nn.Cache: pos, seq, slot, pages, last)
  kv.append lowers to launches of the kv_copy kernel into the cache buffers (kv_copy_paged: into the pool's
  rows `slot`); on the GPU presets to one launch of keys and values (kv_pair), or of the programs that make them
  writing into the cache (vm/kv_fuse.py).
The symbolic shapes of every call_tir are rewritten into the caller's variables here, so the VM
evaluates each launch's groups and int arguments from one shape heap per call.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..errors import DeployError
from ..ir import annotation as A
from ..ir import sym, tir
from ..ir.expr import Binding, Call, CallPyFunc, CallTIR, Constant, Function, If, MatchCast, SeqExpr, TupleGetItem, Var
from ..ir.kernel import Kernel, scheduled
from ..ir.module import IRModule
from ..ir.printer import program_text
from ..ir.tir import Block, Seq, Store, TensorProgram
from ..transform.dce import used_vars
from ..transform.plan_memory import program_sym_map
from . import kv_attend, kv_fuse

FORMAT_VERSION = 1


def sym_json(e, name) -> object:
    """A symbolic expression as JSON: int | "var" | [op, args...] (op in + * // % min max)."""
    e = sym.as_expr(e)
    terms = []
    for mono, c in e.terms:
        factors: list = [] if c == 1 and mono else [c]
        for atom in mono:
            if atom.op == "var":
                factors.append(name(atom.var))
            else:
                op = {"floordiv": "//", "mod": "%", "min": "min", "max": "max"}[atom.op]
                factors.append([op, *(sym_json(a, name) for a in atom.args)])
        terms.append(factors[0] if len(factors) == 1 else ["*", *factors])
    if not terms:
        return 0
    return terms[0] if len(terms) == 1 else ["+", *terms]


def kernel_args(k: Kernel) -> dict:
    """A kernel's calling convention for the package manifest: its int arguments by name, each buffer's
    shape in those names, dtype and whether the kernel stores to it, and its work-group count. The runtime
    checks every launch against it at load (runtime/dryrun.py), so that a launch whose buffers are smaller
    than the kernel touches is refused before it runs."""
    names: dict[sym.SymVar, str] = {}
    for v in k.scalars:
        nm, i = v.name, 1
        while nm in names.values():
            nm, i = f"{v.name}_{i}", i + 1
        names[v] = nm

    def name(v: sym.SymVar) -> str:
        if v not in names:  # the kernel could not be launched from its int arguments alone
            raise ValueError(f"kernel {k.name}: a buffer or its group count uses {v.name}, which is not an int argument")
        return names[v]

    buffers = [{"shape": [sym_json(d, name) for d in b.shape], "dtype": b.dtype, "written": b in k.written}
               for b in k.buffers]
    return {"scalars": list(names.values()), "buffers": buffers, "groups": sym_json(k.groups, name)}


@dataclass
class Lowered:
    bytecode: dict
    kernels: dict[str, Kernel]  # by unique name
    constants: dict[str, object] = field(default_factory=dict)  # name -> numpy array
    storages: list[dict] = field(default_factory=list)  # {"bytes": bound}
    # the storage of every Schedule.zeroed buffer (counters the kernels leave zero), shared by them alone: allocated
    # zeroed once, as every device's alloc does, it stays zero between launches
    zeroed_storage: int | None = None
    plans: dict = field(default_factory=dict)
    kv_copy: TensorProgram | None = None
    kv_copy_ring: TensorProgram | None = None
    kv_copy_paged: TensorProgram | None = None
    kv_pairs: dict = field(default_factory=dict)  # GPU presets: "plain", "ring", "paged" -> kv_pair_program's
    kv_fused: dict = field(default_factory=dict)  # GPU presets: vm/kv_fuse.py's programs, by their text
    kv_attended: dict = field(default_factory=dict)  # and vm/kv_attend.py's, scheduled, by their text
    kv_rows: dict = field(default_factory=dict)  # layer -> rows of its ring (sliding-window layers that keep one)
    merged_params: dict = field(default_factory=dict)  # parameter -> its parts (transform/merge_matmuls.py)
    # every program launched, and where: its variables in the step function's (deploycc/vm/programs.py)
    programs: dict[str, TensorProgram] = field(default_factory=dict)
    sites: dict[str, list[dict]] = field(default_factory=dict)


def kv_copy_program(ring: bool = False, dtype: str = "float32") -> TensorProgram:
    """dst[offset + i, h, c] = src[i, h, c]: appends a layer's new keys or values to the cache; into a ring
    cache (a sliding-window layer's) at row (offset + i) % rows. `dtype`: the cache's (float16: rounded to nearest)."""
    n, cap, h, d, off = (sym.SymVar(x) for x in ("n", "cap", "h", "d", "offset"))
    N, CAP, H, D, OFF = (sym.as_expr(x) for x in (n, cap, h, d, off))
    src = tir.Buffer("src", (N, H, D))
    dst = tir.Buffer("dst", (CAP, H, D), dtype)
    its = tir.iters("i j c", (N, H, D))
    i, j, c = (tir.v(x) for x in its)
    name = "kv_copy_ring" if ring else "kv_copy"
    row = sym.mod(i + OFF, CAP) if ring else i + OFF
    body = Block(name, its, Store(dst, (row, j, c), tir.cast(dtype, src[i, j, c])))
    return TensorProgram(name, (src, dst), body, (off,), 1, {"op": name})


def kv_pair_program(paged: bool = False, ring: bool = False, dtype: str = "float32") -> TensorProgram:
    """kv_copy (or kv_copy_paged) of a layer's keys and values at once: two blocks over the same points, which the GPU
    presets make one kernel (schedule/fallback.py: side by side), one launch per layer instead of two."""
    n, h, d = (sym.SymVar(x) for x in ("n", "h", "d"))
    N, H, D = (sym.as_expr(x) for x in (n, h, d))
    cap = sym.SymVar("rows" if paged else "cap")
    k, v = tir.Buffer("k", (N, H, D)), tir.Buffer("v", (N, H, D))
    k_cache, v_cache = (tir.Buffer(x, (sym.as_expr(cap), H, D), dtype) for x in ("k_cache", "v_cache"))
    its = tir.iters("i j c", (N, H, D))
    i, j, c = (tir.v(x) for x in its)
    name = "kv_pair_paged" if paged else "kv_pair_ring" if ring else "kv_pair"
    if paged:
        slot = tir.Buffer("slot", (N,), "int32")
        row, params, syms = slot[i], (k, v, slot, k_cache, v_cache), ()
    else:
        off = sym.SymVar("offset")
        row = sym.mod(i + sym.as_expr(off), sym.as_expr(cap)) if ring else i + sym.as_expr(off)
        params, syms = (k, v, k_cache, v_cache), (off,)
    body = Seq((Block(f"{name}_k", its, Store(k_cache, (row, j, c), tir.cast(dtype, k[i, j, c]))),
                Block(f"{name}_v", its, Store(v_cache, (row, j, c), tir.cast(dtype, v[i, j, c])))))
    return TensorProgram(name, params, body, syms, 2, {"op": name})


def kv_copy_paged_program(dtype: str = "float32") -> TensorProgram:
    """dst[slot[i], h, c] = src[i, h, c]: appends a batched step's keys or values to the rows of a page pool."""
    n, rows, h, d = (sym.SymVar(x) for x in ("n", "rows", "h", "d"))
    N, R, H, D = (sym.as_expr(x) for x in (n, rows, h, d))
    src, slot = tir.Buffer("src", (N, H, D)), tir.Buffer("slot", (N,), "int32")
    dst = tir.Buffer("dst", (R, H, D), dtype)
    its = tir.iters("i j c", (N, H, D))
    i, j, c = (tir.v(x) for x in its)
    body = Block("kv_copy_paged", its, Store(dst, (slot[i], j, c), tir.cast(dtype, src[i, j, c])))
    return TensorProgram("kv_copy_paged", (src, slot, dst), body, (), 1, {"op": "kv_copy_paged"})


class _FnLowering:
    def __init__(self, fn: Function, mod: IRModule, out: Lowered, plan, bounds: sym.Bounds):
        self.fn, self.mod, self.out, self.plan, self.bounds = fn, mod, out, plan, bounds
        self.regs: dict[object, int] = {}
        self.code: list[dict] = []
        self.names: dict[sym.SymVar, str] = {}
        self.fused: dict = {}  # kv.append binding -> (its kv_fuse.Fused, (the shared program, its n, offset, rows))
        self.absorbed: set = set()  # bindings launched with the kv.append after them
        self.attended: dict = {}  # attention binding -> (the kv.append it takes, its kv_fuse.Fused, the program)
        self.deferred: set = set()  # kv.append bindings launched with the attention after them

    def name(self, v: sym.SymVar) -> str:
        if v not in self.names:
            base, i = v.name, 1
            taken = set(self.names.values())
            nm = base
            while nm in taken:
                nm, i = f"{base}_{i}", i + 1
            self.names[v] = nm
        return self.names[v]

    def s(self, e) -> dict:
        return {"s": sym_json(e, self.name)}

    def reg(self, key) -> int:
        if key not in self.regs:
            self.regs[key] = len(self.regs)
        return self.regs[key]

    def emit(self, fn: str, args: list, dst: int | None = None, **extra) -> None:
        ins = {"op": "call", "fn": fn, "args": args}
        if dst is not None:
            ins["dst"] = dst
        ins.update(extra)
        self.code.append(ins)

    def match(self, reg: int, ann: A.Annotation, defined: set) -> None:
        dims = ann.shape if isinstance(ann, A.TensorAnn) else ann.values if isinstance(ann, A.ShapeAnn) else None
        if dims is None:
            return
        args: list = [{"r": reg}]
        for d in dims:
            v = d.as_var
            if v is not None and v not in defined:
                defined.add(v)
                args.append({"bind": self.name(v)})
            else:
                args.append(self.s(d))
        self.emit("vm.match_shape", args)

    def arg(self, e) -> dict:
        if isinstance(e, Var):
            return {"r": self.regs[e]}
        if isinstance(e, Constant):
            key = f"const.{len(self.out.constants)}"
            for k, v in self.out.constants.items():
                if v is e.value:
                    key = k
                    break
            self.out.constants[key] = e.value
            return {"r": self.reg(("const", key))}
        raise TypeError(f"lower_vm: unsupported argument {type(e).__name__}")

    def storage(self, var, k: int = 0) -> int:
        ids = self.plan.tensors.get(var)
        if isinstance(ids, int) and k == 0:
            return ids
        # Not planned (a tuple field): a storage of its own, sized at the bounds.
        ann = var.ann.fields[k] if isinstance(var.ann, A.TupleAnn) else var.ann
        return self._extra_storage(ann)

    def _bound_bytes(self, ann: A.TensorAnn) -> int:
        size = sym.as_expr(4)
        for d in ann.shape:
            size = size * d
        bound = self.bounds.upper_bound(size)
        if bound is None:
            raise ValueError(f"lower_vm: no upper bound for a tensor of shape {ann.shape}")
        return int(bound)

    def _extra_storage(self, ann: A.TensorAnn) -> int:
        self.out.storages.append({"bytes": self._bound_bytes(ann)})
        return len(self.out.storages) - 1

    def _zeroed_storage(self, ann: A.TensorAnn) -> int:
        """The package's one storage of zeroed counters (Schedule.zeroed), grown to hold `ann`: never planned, so no
        other tensor is written into it; the kernels that use it leave it zero, and they run one after another."""
        if self.out.zeroed_storage is None:
            self.out.zeroed_storage = self._extra_storage(ann)
        st = self.out.storages[self.out.zeroed_storage]
        st["bytes"] = max(st["bytes"], self._bound_bytes(ann))
        return self.out.zeroed_storage

    def alloc(self, sid: int, ann: A.TensorAnn, dst: int) -> None:
        self.emit("vm.alloc", [{"i": sid}, {"str": ann.dtype}, *(self.s(d) for d in ann.shape)], dst)

    def lower(self) -> dict:
        fn = self.fn
        num_inputs = fn.attrs.get("num_inputs", len(fn.params))
        defined: set = set()
        for p in fn.params:
            self.reg(p)
        for p in fn.params[:num_inputs]:
            self.match(self.regs[p], p.ann, defined)
        flat = [b for block in fn.body.blocks for b in block.bindings]
        if self.out.kv_pairs:  # GPU presets: kv.append with the programs that make its keys and values
            self.fuse_appends(flat)
        for b in flat:
            self.binding(b, defined)
        self.code.append({"op": "ret", "args": [self.arg(fn.body.result)]})
        consts = sorted((k[1], r) for k, r in self.regs.items() if isinstance(k, tuple) and k[0] == "const")
        return {"params": [p.name for p in fn.params], "num_inputs": num_inputs, "registers": len(self.regs),
                "constants": consts, "instructions": self.code}

    def fuse_appends(self, flat: list) -> None:
        from ..schedule import schedule_program

        uses = used_vars(self.fn)
        for i, b in enumerate(flat):
            if not (isinstance(b, Binding) and isinstance(b.value, Call) and b.value.op == "kv.append"):
                continue
            run = kv_fuse.members_of(flat, i, self.mod, uses, self.storages_of)
            append = b.value
            paged = len(append.args) == 4
            fused = run and kv_fuse.fuse(run, append, self.mod, paged)
            if not fused:
                continue
            if self.attend_append(flat, i, run, fused, uses):
                continue
            text = program_text(fused.prog, name="_")
            if text not in self.out.kv_fused:  # the first of its text: named, scheduled, launched by every layer
                p = fused.prog
                p = TensorProgram(f"kv_append{len(self.out.kv_fused)}", p.params, p.body, p.sym_params, p.num_outputs,
                                  p.attrs)
                self.out.kv_fused[text] = (schedule_program(p, self.target), fused.n, fused.offset, fused.rows)
            self.fused[b] = (fused, self.out.kv_fused[text])
            self.absorbed.update(run)

    def attend_append(self, flat: list, at: int, run: list, fused, uses: dict) -> bool:
        """The attention after the kv.append flat[at] takes it and its members (vm/kv_attend.py), if it may and the
        plan kept what they read out of the attention's output and workspace."""
        from ..schedule import schedule_program

        attn = kv_attend.attention_after(flat, at, run, self.mod, uses, self.target)
        prog = attn and kv_attend.program(fused, self.mod[attn.value.program])
        if not prog or self.storages_of(attn.var) & set().union(*(self.storages_of(x) for x in fused.inputs)):
            return False
        text = program_text(prog, name="_")
        if text not in self.out.kv_attended:  # named as the first of its text
            self.out.kv_attended[text] = schedule_program(replace(prog, name=f"{prog.name}{len(self.out.kv_attended)}"),
                                                          self.target)
        self.attended[attn] = (flat[at], fused, self.out.kv_attended[text])
        self.deferred.add(flat[at])
        self.absorbed.update(run)
        self.absorbed.update(kv_attend.unread_views(flat, at, attn, uses, self.fn.params))
        return True

    def attend(self, b: Binding, dst: int) -> None:
        """An attention that makes its queries and appends its key and value (vm/kv_attend.py): one launch."""
        append_b, f, prog = self.attended[b]
        (o, k_cache, v_cache), (offset, total) = prog.outputs, prog.sym_params
        rows = append_b.value.attrs.get("rows", 0) or self.ctx
        env = {offset: self.fn_total - 1, total: self.fn_total, k_cache.shape[0].as_var: sym.as_expr(rows)}
        self.alloc(self.storage(b.var), b.var.ann, dst)
        regs = {x: self.arg(a) for x, a in zip(prog.inputs, f.inputs)}
        regs.update(zip((o, k_cache, v_cache), ({"r": dst}, *self.cache_operands(append_b.value))))
        self.workspace(b.var, scheduled(prog), env, regs)
        self.launch_program(prog, regs, env)

    def cache_operands(self, append: Call) -> tuple[dict, dict]:
        """kv.append's cache as launch operands: its layer's keys and values (a ring's rows recorded)."""
        layer, rows = append.attrs["layer"], append.attrs.get("rows", 0)
        if rows:
            self.out.kv_rows[layer] = rows
        r = self.arg(append.args[0])["r"]
        return {"kv": [r, "k", layer]}, {"kv": [r, "v", layer]}

    def storages_of(self, var) -> set[int]:
        """The storage ids the plan gave `var` (a parameter or constant: none) and its call's workspace."""
        own = self.plan.tensors.get(var)
        fields = self.plan.tuple_tensors.get(var, ())
        return ({own} if isinstance(own, int) else set()) | set(fields) | set(self.plan.workspace.get(var, []))

    def fused_append(self, b: Binding, dst: int) -> None:
        """kv.append and the programs that make its keys and values, one launch (vm/kv_fuse.py)."""
        f, (prog, n, offset, rows) = self.fused[b]
        append = b.value
        tokens = sym.as_expr(append.args[1].ann.shape[0])
        paged = offset is None
        env = {n: tokens, rows: sym.as_expr(self.pool_rows if paged else append.attrs.get("rows", 0) or self.ctx)}
        if offset is not None:
            env[offset] = self.fn_total - tokens
        ours = {v.name: v for v in kv_fuse.shape_vars(f.prog)}
        for v in kv_fuse.shape_vars(prog):  # the function's own (seq_len), by name: the same text, maybe another function
            env.setdefault(v, sym.as_expr(ours[v.name]))
        args = [self.arg(x) for x in f.inputs]
        for m in f.outputs:
            r = self.regs[m.var]
            self.alloc(self.storage(m.var), m.var.ann, r)
            args.append({"r": r})
        args += self.cache_operands(append)
        self.launch_program(prog, dict(zip(prog.params, args)), env)
        self.emit("vm.move", [self.arg(append.args[0])], dst)

    def binding(self, b, defined: set) -> None:
        v = b.value
        dst = self.reg(b.var)
        if b in self.absorbed:  # launched with the kv.append after it (fused_append)
            return
        if b in self.deferred:  # launched with the attention after it (attend)
            self.emit("vm.move", [self.arg(v.args[0])], dst)
            return
        if b in self.attended:
            self.attend(b, dst)
            return
        if b in self.fused:
            self.fused_append(b, dst)
            return
        if isinstance(b, MatchCast):
            self.emit("vm.move", [self.arg(v)], dst)
            self.match(dst, b.ann, defined)
            return
        if isinstance(v, CallTIR):
            self.call_tir(b.var, v, dst)
        elif isinstance(v, TupleGetItem):
            self.emit("vm.get", [self.arg(v.tuple_value), {"i": v.index}], dst)
        elif isinstance(v, Call) and v.op == "kv.begin":
            (n,) = v.args[1].values
            self.emit("kv.begin", [self.arg(v.args[0]), self.s(n)], dst)
        elif isinstance(v, Call) and v.op == "kv.pages":
            self.emit("kv.pages", [self.arg(v.args[0])], dst)
        elif isinstance(v, Call) and v.op == "kv.meta":
            self.emit("kv.meta", [self.arg(v.args[0]), {"str": v.attrs["name"]}], dst)
        elif isinstance(v, Call) and v.op in ("kv.keys", "kv.values"):
            self.emit("kv.view", [self.arg(v.args[0]), {"str": v.op[3]}, {"i": v.attrs["layer"]}], dst)
        elif isinstance(v, Call) and v.op == "kv.append":
            self.kv_append(v, dst)
        elif isinstance(v, Var):
            self.emit("vm.move", [self.arg(v)], dst)
        else:
            raise TypeError(f"lower_vm: cannot lower {type(v).__name__} {getattr(v, 'op', '')}")

    def kv_append(self, v: Call, dst: int) -> None:
        cache = self.arg(v.args[0])
        layer, rows = v.attrs["layer"], v.attrs.get("rows", 0)
        paged = len(v.args) == 4
        if self.out.kv_pairs:  # keys and values in one launch
            prog = self.out.kv_pairs["paged" if paged else "ring" if rows else "plain"]
            if rows:
                self.out.kv_rows[layer] = rows
            k_src, v_src, *rest = prog.params
            n, h, d = v.args[1].ann.shape
            env = {k_src.shape[0].as_var: n, k_src.shape[1].as_var: h, k_src.shape[2].as_var: d,
                   rest[-1].shape[0].as_var: sym.as_expr(self.pool_rows if paged else rows or self.ctx)}
            if not paged:
                env[prog.sym_params[0]] = self.fn_total - n
            args = [self.arg(v.args[1]), self.arg(v.args[2])] + ([self.arg(v.args[3])] if paged else []) + [
                {"kv": [cache["r"], "k", layer]}, {"kv": [cache["r"], "v", layer]}]
            self.launch_program(prog, dict(zip(prog.params, args)), env)
            self.emit("vm.move", [cache], dst)
            return
        if paged:  # into a page pool
            k = scheduled(self.out.kv_copy_paged).kernels[0]
            self.out.kernels[k.name] = k
            src, _, pool = self.out.kv_copy_paged.params
            for which, t in (("k", v.args[1]), ("v", v.args[2])):
                env = {a.as_var: b for a, b in zip(src.shape, t.ann.shape)}
                env[pool.shape[0].as_var] = sym.as_expr(self.pool_rows)
                self.site(self.out.kv_copy_paged, env)
                self.launch(k, [self.arg(t), self.arg(v.args[3]), {"kv": [cache["r"], which, layer]}], env)
            self.emit("vm.move", [cache], dst)
            return
        prog = self.out.kv_copy_ring if rows else self.out.kv_copy
        if rows:
            self.out.kv_rows[layer] = rows
        k = scheduled(prog).kernels[0]
        self.out.kernels[k.name] = k
        for which, t in (("k", v.args[1]), ("v", v.args[2])):
            n, h, d = t.ann.shape
            heads, dim = h, d
            env = {prog.params[0].shape[0].as_var: n, prog.params[0].shape[1].as_var: heads,
                   prog.params[0].shape[2].as_var: dim, prog.params[1].shape[0].as_var: sym.as_expr(rows or self.ctx),
                   prog.sym_params[0]: self.fn_total - n}
            bufs = [self.arg(t), {"kv": [cache["r"], which, layer]}]
            self.site(prog, env)
            self.launch(k, bufs, env)
        self.emit("vm.move", [cache], dst)

    def site(self, prog: TensorProgram, env: dict) -> None:
        """Record that this function runs `prog` with its variables `env` (program var -> our expression)."""
        self.out.programs[prog.name] = prog
        where = {"function": self.fname, "vars": {v: sym_json(e, self.name) for v, e in env.items()}}
        sites = self.out.sites.setdefault(prog.name, [])
        if all(s["vars"] != where["vars"] for s in sites):
            sites.append(where)

    def launch_program(self, prog: TensorProgram, regs: dict, env: dict) -> None:
        """Every kernel of scheduled `prog`, its buffers from `regs` (program buffer -> operand), its variables `env`."""
        self.site(prog, env)
        for k in scheduled(prog).kernels:
            self.out.kernels[k.name] = k
            self.launch(k, [regs[b] for b in k.buffers], env)

    def launch(self, k: Kernel, bufs: list, env: dict) -> None:
        groups = sym.substitute(k.groups, env)
        scalars = [self.s(sym.substitute(sym.as_expr(v), env)) for v in k.scalars]
        self.emit("vm.launch", [{"k": k.name}, self.s(groups), {"i": k.threads}, *bufs, {"str": "|"}, *scalars])

    def call_tir(self, var: Var, call: CallTIR, dst: int) -> None:
        prog: TensorProgram = self.mod[call.program]
        sched = scheduled(prog)
        tensor_args = [a for a in call.args if not isinstance(a.ann, A.ShapeAnn)]
        outs = list(call.out_ann.fields) if isinstance(call.out_ann, A.TupleAnn) else [call.out_ann]
        out_regs = []
        for k_out, ann in enumerate(outs):
            r = dst if len(outs) == 1 else self.reg((var, k_out))
            sid = self.storage(var, k_out)
            self.alloc(sid, ann, r)
            out_regs.append(r)
        if len(outs) > 1:
            self.emit("vm.tuple", [{"r": r} for r in out_regs], dst)
        env = program_sym_map(prog, call)  # program variable -> caller expression
        regs = {b: self.arg(a) for b, a in zip(prog.inputs, tensor_args)}
        regs.update({b: {"r": r} for b, r in zip(prog.outputs, out_regs)})
        self.workspace(var, sched, env, regs)
        self.launch_program(prog, regs, env)

    def workspace(self, var: Var, sched, env: dict, regs: dict) -> None:
        """The workspace of `var`'s launch: its planned storages in order (grown where the launched program's is
        larger than the planned one's: an attention that appends, vm/kv_attend.py), the zeroed counters' own."""
        ws_ids = list(self.plan.workspace.get(var, []))  # the planned ones (not the zeroed), in order
        for i, w in enumerate(sched.workspace):
            wann = A.Tensor(tuple(sym.substitute(d, env) for d in w.shape), w.dtype)
            if w in sched.zeroed:
                sid = self._zeroed_storage(wann)
            elif ws_ids:
                sid = ws_ids.pop(0)
                st = self.out.storages[sid]
                st["bytes"] = max(st["bytes"], self._bound_bytes(wann))
            else:
                sid = self._extra_storage(wann)
            r = self.reg((var, "ws", i))
            self.alloc(sid, wann, r)
            regs[w] = {"r": r}


def lower_vm(mod: IRModule, plans: dict, target, bounds: dict[str, sym.Bounds],
             functions=("prefill", "decode")) -> Lowered:
    """Lower the scheduled module; `plans` maps function name -> MemoryPlan (deploycc.transform.plan_memory),
    `bounds` function name -> the symbolic bounds the plan was made under."""
    from ..schedule import schedule_program

    for fname in functions:
        _reject_python(mod[fname].body, fname, target)
    out = Lowered({"version": FORMAT_VERSION, "functions": {}}, {})
    dtype = mod.attrs.get("kv_cache", "float32")  # the cache's elements (export: float16 rounds as it stores)
    out.kv_copy = schedule_program(kv_copy_program(dtype=dtype), target)
    out.kv_copy_ring = schedule_program(kv_copy_program(ring=True, dtype=dtype), target)
    out.kv_copy_paged = schedule_program(kv_copy_paged_program(dtype), target)
    if target.workgroup_gemv:  # keys and values in one launch (the CPU presets keep their kernels byte for byte)
        out.kv_pairs = {kind: schedule_program(kv_pair_program(kind == "paged", kind == "ring", dtype), target)
                        for kind in ("plain", "ring", "paged")}
    out.merged_params = dict(mod.attrs.get("merged_params", {}))
    ctx = mod.attrs["context_window"]
    # Functions never run at the same time: storage i of every function shares one buffer,
    # sized for the largest use. Storages for unplanned tensors are appended after these.
    n = max((len(plans[f].storages) for f in functions), default=0)
    out.storages = [{"bytes": 0} for _ in range(n)]
    for fname in functions:
        for st in plans[fname].storages:
            out.storages[st.id]["bytes"] = max(out.storages[st.id]["bytes"], int(st.bound))
    for fname in functions:
        fl = _FnLowering(mod[fname], mod, out, plans[fname], bounds[fname])
        fl.ctx, fl.fname, fl.target = ctx, fname, target
        fl.fn_total = _total_len(mod[fname])
        pool = mod.attrs.get("pool")
        fl.pool_rows = pool["pages"] * pool["page_size"] if pool else 0
        out.bytecode["functions"][fname] = fl.lower()
    return out


def _reject_python(body: SeqExpr, fname: str, target) -> None:
    """A package runs without Python (a browser, a phone), so call_py_func is a compile-time error."""
    for block in body.blocks:
        for b in block.bindings:
            v = b.value
            if isinstance(v, CallPyFunc):
                raise DeployError(
                    f"call_py_func needs a Python host; target {target.kind} cannot run it: {fname} calls the Python "
                    f"function {v.func!r} (binding {b.var.name}). Run the module with deploycc.pymodule, or replace "
                    f"the call with a tensor program or a graph function before compiling")
            if isinstance(v, If):
                _reject_python(v.then_branch, fname, target)
                _reject_python(v.else_branch, fname, target)


def _total_len(fn: Function) -> sym.Expr | None:
    """The total_len that kv.begin's result binds; None in a batched step (its cache is a page pool)."""
    begun = set()
    for block in fn.body.blocks:
        for b in block.bindings:
            if isinstance(b.value, Call) and b.value.op == "kv.begin":
                begun.add(b.var)
            elif isinstance(b, MatchCast) and b.value in begun:
                return b.ann.values[0]
    return None


def disassemble(bytecode: dict) -> str:
    """Human-readable bytecode (`deploycc inspect --stage vm`)."""
    def a(x):
        if "r" in x:
            return f"%{x['r']}"
        if "s" in x:
            return _sym_text(x["s"])
        if "i" in x:
            return str(x["i"])
        if "str" in x:
            return repr(x["str"])
        if "k" in x:
            return f"@{x['k']}"
        if "kv" in x:
            r, w, layer = x["kv"]
            return f"%{r}.{w}[{layer}]"
        if "bind" in x:
            return f"?{x['bind']}"
        return str(x)
    lines = [f"; deploycc VM bytecode, format {bytecode['version']}"]
    for name, f in bytecode["functions"].items():
        lines.append(f"\nfunction {name}({', '.join(f['params'][:f['num_inputs']])}) "
                     f"; {len(f['params']) - f['num_inputs']} weights, {f['registers']} registers")
        for i, ins in enumerate(f["instructions"]):
            args = ", ".join(a(x) for x in ins.get("args", []))
            dst = f"%{ins['dst']} = " if "dst" in ins else ""
            head = ins["fn"] if ins["op"] == "call" else ins["op"]
            lines.append(f"  {i:4d}  {dst}{head}({args})")
    return "\n".join(lines) + "\n"


def _sym_text(j) -> str:
    if isinstance(j, (int, str)):
        return str(j)
    op, *args = j
    if op in ("min", "max"):
        return f"{op}({', '.join(_sym_text(x) for x in args)})"
    return "(" + f" {op} ".join(_sym_text(x) for x in args) + ")"
