"""Symbolic integer expressions with a canonical form.

Every expression is kept as a polynomial: a map from monomials (sorted tuples of atoms) to integer
coefficients. Atoms are variables and the non-polynomial operators (floor division, modulo, min,
max) whose operands are themselves canonical. Two expressions that are equal as polynomials
therefore compare equal (`n*4 + 2*n == 6*n`), which is what annotation deduction, fusion and memory
planning need. Proofs of `a <= b` use interval bounds of the variables (every shape variable is
non-negative, and a declared bound such as `total_len <= context_window` is an upper bound).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Union

IntLike = Union[int, "Expr"]


@dataclass(frozen=True, eq=False)
class SymVar:
    """A symbolic integer variable. Identity semantics: two variables named `n` are different."""

    name: str

    def __repr__(self) -> str:
        return self.name


@dataclass(frozen=True)
class Atom:
    """A non-polynomial term: a variable, or `op(a, b)` with op in floordiv/mod/min/max."""

    op: str  # "var" | "floordiv" | "mod" | "min" | "max"
    var: SymVar | None = None
    args: tuple[Expr, ...] = ()

    # Atoms and expressions are immutable: their sort keys and hashes are computed once and kept in the instance's
    # __dict__ (not fields: equality, hashing and printing are unchanged). Compiling a model builds and compares
    # millions of them, and recomputing both recursively was most of a compile's time.
    def sort_key(self) -> tuple:
        key = self.__dict__.get("_key")
        if key is None:
            if self.op == "var":
                key = (0, self.var.name, id(self.var))
            else:
                key = (1, self.op, tuple(a.sort_key() for a in self.args))
            self.__dict__["_key"] = key
        return key

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash((self.op, self.var, self.args))
        return h


_MONO_KEYS: dict[tuple[Atom, ...], tuple] = {}


def _mono_key(mono: tuple[Atom, ...]) -> tuple:
    key = _MONO_KEYS.get(mono)
    if key is None:
        if len(_MONO_KEYS) >= 1 << 18:
            _MONO_KEYS.clear()
        key = _MONO_KEYS[mono] = (len(mono), tuple(a.sort_key() for a in mono))
    return key


def _by_monomial(mc: tuple) -> tuple:
    return _mono_key(mc[0])


@dataclass(frozen=True)
class Expr:
    """A canonical polynomial over atoms. `terms` maps sorted monomials to non-zero coefficients."""

    terms: tuple[tuple[tuple[Atom, ...], int], ...] = field(default=())

    # ---- construction -------------------------------------------------------------------
    @staticmethod
    def _make(d: Mapping[tuple[Atom, ...], int]) -> Expr:
        items = [(m, c) for m, c in d.items() if c != 0]
        if len(items) > 1:
            items.sort(key=_by_monomial)
        return Expr(tuple(items))

    def sort_key(self) -> tuple:
        key = self.__dict__.get("_key")
        if key is None:
            key = self.__dict__["_key"] = tuple((_mono_key(m), c) for m, c in self.terms)
        return key

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = self.__dict__["_hash"] = hash(self.terms)
        return h

    # ---- queries --------------------------------------------------------------------------
    @property
    def is_const(self) -> bool:
        return all(len(m) == 0 for m, _ in self.terms)

    @property
    def value(self) -> int:
        if not self.is_const:
            raise ValueError(f"{self} is not a constant")
        return self.terms[0][1] if self.terms else 0

    @property
    def as_var(self) -> SymVar | None:
        if len(self.terms) == 1:
            mono, c = self.terms[0]
            if c == 1 and len(mono) == 1 and mono[0].op == "var":
                return mono[0].var
        return None

    def free_vars(self) -> set[SymVar]:
        return set(self._free())

    def _free(self) -> frozenset[SymVar]:
        got = self.__dict__.get("_free_vars")
        if got is None:
            out: set[SymVar] = set()
            for mono, _ in self.terms:
                for atom in mono:
                    if atom.op == "var":
                        out.add(atom.var)
                    else:
                        for a in atom.args:
                            out |= a._free()
            got = self.__dict__["_free_vars"] = frozenset(out)
        return got

    def const_part(self) -> int:
        return sum(c for m, c in self.terms if len(m) == 0)

    # ---- arithmetic -----------------------------------------------------------------------
    def __add__(self, other: IntLike) -> Expr:
        other = as_expr(other)
        d = dict(self.terms)
        for m, c in other.terms:
            d[m] = d.get(m, 0) + c
        return Expr._make(d)

    __radd__ = __add__

    def __neg__(self) -> Expr:
        return Expr._make({m: -c for m, c in self.terms})

    def __sub__(self, other: IntLike) -> Expr:
        return self + (-as_expr(other))

    def __rsub__(self, other: IntLike) -> Expr:
        return as_expr(other) - self

    def __mul__(self, other: IntLike) -> Expr:
        other = as_expr(other)
        d: dict[tuple[Atom, ...], int] = {}
        for m1, c1 in self.terms:
            for m2, c2 in other.terms:
                m = tuple(sorted(m1 + m2, key=Atom.sort_key))
                d[m] = d.get(m, 0) + c1 * c2
        return Expr._make(d)

    __rmul__ = __mul__

    def __floordiv__(self, other: IntLike) -> Expr:
        return floordiv(self, other)

    def __rfloordiv__(self, other: IntLike) -> Expr:
        return floordiv(other, self)

    def __mod__(self, other: IntLike) -> Expr:
        return mod(self, other)

    def __rmod__(self, other: IntLike) -> Expr:
        return mod(other, self)

    def __repr__(self) -> str:
        return to_python(self)

    def __int__(self) -> int:
        return self.value

    def __index__(self) -> int:
        return self.value


def as_expr(x: IntLike | SymVar) -> Expr:
    if isinstance(x, Expr):
        return x
    if isinstance(x, SymVar):
        mono = (Atom("var", x),)
        return Expr(((mono, 1),))
    if isinstance(x, bool) or not isinstance(x, (int,)) and not hasattr(x, "__index__"):
        raise TypeError(f"not a symbolic integer: {x!r}")
    v = int(x)
    return Expr((((), v),)) if v != 0 else Expr()


def var(name: str) -> Expr:
    """A fresh symbolic variable, as an expression."""
    return as_expr(SymVar(name))


def const(v: int) -> Expr:
    return as_expr(v)


def _atom_expr(atom: Atom) -> Expr:
    mono = (atom,)
    return Expr(((mono, 1),))


def floordiv(a: IntLike, b: IntLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if b.is_const:
        d = b.value
        if d == 0:
            raise ZeroDivisionError("symbolic floor division by zero")
        if d == 1:
            return a
        if a.is_const:
            return as_expr(a.value // d)
        if d > 0:
            # (d*q + r) // d == q + r // d when every non-constant coefficient is a multiple of d.
            divisible = {m: c for m, c in a.terms if len(m) and c % d == 0}
            rest = Expr._make({m: c for m, c in a.terms if m not in divisible})
            if divisible:
                q = Expr._make({m: c // d for m, c in divisible.items()})
                if rest.is_const:
                    return q + rest.value // d
                return q + floordiv(rest, d)
            h, x, c = _common_factor(a, d)
            if h > 1:  # (h*x + c) // (h*e) == x // e when 0 <= c < h
                return floordiv(x, d // h)
    elif a == b:
        return as_expr(1)
    return _atom_expr(Atom("floordiv", args=(a, b)))


def _common_factor(a: Expr, d: int) -> tuple[int, Expr, int]:
    """(h, x, c) with a == h*x + c, h the gcd of d and a's non-constant coefficients, when 0 <= c < h
    (so the constant never carries into a multiple of h); h == 1 when there is no such split."""
    h = d
    for m, k in a.terms:
        if len(m):
            h = math.gcd(h, k)
    c = a.const_value() if hasattr(a, "const_value") else sum(k for m, k in a.terms if not len(m))
    if h <= 1 or not 0 <= c < h:
        return 1, a, 0
    return h, Expr._make({m: k // h for m, k in a.terms if len(m)}), c


def mod(a: IntLike, b: IntLike) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if b.is_const:
        d = b.value
        if d == 0:
            raise ZeroDivisionError("symbolic modulo by zero")
        if d == 1:
            return as_expr(0)
        if a.is_const:
            return as_expr(a.value % d)
        if d > 0:
            kept = {m: c % d for m, c in a.terms if len(m) == 0 or c % d != 0}
            a2 = Expr._make(kept)
            if a2.is_const:
                return as_expr(a2.value % d)
            if a2 != a:
                return mod(a2, d)
            h, x, c = _common_factor(a, d)
            if h > 1:  # (h*x + c) % (h*e) == h*(x % e) + c when 0 <= c < h
                return mod(x, d // h) * h + c
    elif a == b:
        return as_expr(0)
    return _atom_expr(Atom("mod", args=(a, b)))


def smin(a: IntLike, b: IntLike, bounds: Bounds | None = None) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if a == b:
        return a
    if a.is_const and b.is_const:
        return as_expr(min(a.value, b.value))
    bounds = bounds or Bounds()
    if bounds.prove_le(a, b):
        return a
    if bounds.prove_le(b, a):
        return b
    x, y = sorted((a, b), key=Expr.sort_key)
    return _atom_expr(Atom("min", args=(x, y)))


def smax(a: IntLike, b: IntLike, bounds: Bounds | None = None) -> Expr:
    a, b = as_expr(a), as_expr(b)
    if a == b:
        return a
    if a.is_const and b.is_const:
        return as_expr(max(a.value, b.value))
    bounds = bounds or Bounds()
    if bounds.prove_le(a, b):
        return b
    if bounds.prove_le(b, a):
        return a
    x, y = sorted((a, b), key=Expr.sort_key)
    return _atom_expr(Atom("max", args=(x, y)))


# ---- bounds and proofs ---------------------------------------------------------------------

INF = math.inf


@dataclass
class Bounds:
    """Declared ranges of symbolic variables. Every variable is at least 0 unless told otherwise.

    `upper` may be an expression in other variables (`total_len <= context_window`), which proofs
    use by substitution before falling back to interval arithmetic.
    """

    lower: dict[SymVar, int] = field(default_factory=dict)
    upper: dict[SymVar, Expr] = field(default_factory=dict)

    def declare(self, v: IntLike | SymVar, lo: int | None = None, hi: IntLike | None = None) -> Bounds:
        sv = v if isinstance(v, SymVar) else as_expr(v).as_var
        if sv is None:
            raise ValueError(f"bounds are declared on variables, not on {v}")
        if lo is not None:
            self.lower[sv] = lo
        if hi is not None:
            self.upper[sv] = as_expr(hi)
        return self

    def range_of(self, e: Expr, depth: int = 0) -> tuple[float, float]:
        """Interval [lo, hi] of `e` under the bounds (interval arithmetic on the polynomial)."""
        lo_total, hi_total = 0.0, 0.0
        for mono, c in e.terms:
            lo, hi = 1.0, 1.0
            for atom in mono:
                alo, ahi = self._atom_range(atom, depth)
                cands = [x * y for x in (lo, hi) for y in (alo, ahi) if not (math.isinf(x) and y == 0 or math.isinf(y) and x == 0)]
                cands = cands or [0.0]
                lo, hi = min(cands), max(cands)
            if c >= 0:
                lo_total, hi_total = lo_total + c * lo, hi_total + c * hi
            else:
                lo_total, hi_total = lo_total + c * hi, hi_total + c * lo
        return lo_total, hi_total

    def _atom_range(self, atom: Atom, depth: int) -> tuple[float, float]:
        if atom.op == "var":
            lo = self.lower.get(atom.var, 0)
            hi_e = self.upper.get(atom.var)
            hi = INF
            if hi_e is not None and depth < 8:
                hi = self.range_of(hi_e, depth + 1)[1]
            return float(lo), hi
        rs = [self.range_of(a, depth) for a in atom.args]
        (alo, ahi), (blo, bhi) = rs
        if atom.op == "min":
            return min(alo, blo), min(ahi, bhi)
        if atom.op == "max":
            return max(alo, blo), max(ahi, bhi)
        if atom.op == "mod":  # floor semantics: a % b lies in [0, b - 1] for b > 0, whatever the sign of a
            return (0.0, bhi - 1) if blo > 0 else (-INF, INF)
        if atom.op == "floordiv":
            if alo >= 0 and blo > 0:
                return math.floor(alo / bhi) if not math.isinf(bhi) else 0.0, ahi / blo if not math.isinf(ahi) else INF
            return -INF, INF
        return -INF, INF

    def substitute_upper(self, e: Expr) -> Expr:
        """Replace variables with positive coefficients by their upper-bound expressions, repeatedly,
        so that a chain `seq_len <= total_len <= context_window` is followed whatever its declaration order."""
        for _ in range(8):
            before = e
            for v, hi in self.upper.items():
                if hi.free_vars() and v in e.free_vars():
                    e2 = substitute(e, {v: hi}) if _coeff_sign(e, v) > 0 else e
                    e = e2
            if e == before:
                break
        return e

    def prove_le(self, a: IntLike, b: IntLike) -> bool:
        diff = as_expr(b) - as_expr(a)
        if diff.is_const:
            return diff.value >= 0
        if self.range_of(diff)[0] >= 0:
            return True
        # a <= b  <=  a' <= b where a' >= a replaces variables by symbolic upper bounds.
        neg = -diff
        stronger = self.substitute_upper(neg)
        if stronger != neg:
            return self.range_of(-stronger)[0] >= 0 or (-stronger).is_const and (-stronger).value >= 0
        return False

    def prove_lt(self, a: IntLike, b: IntLike) -> bool:
        return self.prove_le(as_expr(a) + 1, b)

    def upper_bound(self, e: IntLike) -> int | None:
        hi = self.range_of(as_expr(e))[1]
        return None if math.isinf(hi) else int(hi)


def simplify(e: IntLike, bounds: Bounds) -> Expr:
    """`e` with each floor division and modulo whose dividend provably lies in [0, divisor) under `bounds` taken
    away: a // b -> 0, a % b -> a. A reshape that only adds or drops axes of extent 1 indexes its input at
    (i0 + i1 // 4096) % seq_len, which is i0 where i0 < seq_len and i1 < 4096."""
    def node(op: str, args: list) -> Expr:
        if op in ("floordiv", "mod") and bounds.range_of(args[0])[0] >= 0 and bounds.prove_lt(args[0], args[1]):
            return as_expr(0) if op == "floordiv" else args[0]
        return _OPS[op](*args)
    return _fold(as_expr(e), as_expr, node)


def _coeff_sign(e: Expr, v: SymVar) -> int:
    """Sign of the coefficients of the linear monomials of `v` in `e` (0 if mixed or nonlinear)."""
    signs = set()
    for mono, c in e.terms:
        if any(a.op == "var" and a.var is v for a in mono):
            if len(mono) != 1:
                return 0
            signs.add(1 if c > 0 else -1)
        elif any(v in a.free_vars() for a in _nonvar_args(mono)):
            return 0
    return signs.pop() if len(signs) == 1 else 0


def _nonvar_args(mono: tuple[Atom, ...]) -> Iterable[Expr]:
    for a in mono:
        yield from a.args


def prove_eq(a: IntLike, b: IntLike) -> bool:
    return as_expr(a) == as_expr(b)


# ---- substitution and evaluation ----------------------------------------------------------

def substitute(e: IntLike, mapping: Mapping[SymVar, IntLike]) -> Expr:
    e = as_expr(e)
    if not mapping or e._free().isdisjoint(mapping):
        return e
    values = {v: as_expr(x) for v, x in mapping.items()}
    return _substitute(e, values, {})


def _substitute(e: Expr, values: Mapping[SymVar, Expr], memo: dict) -> Expr:
    """substitute(): each monomial's product accumulated in one map, and the expression made once (what folding it
    through Expr's + and * computes, without making and sorting an expression per step)."""
    if e._free().isdisjoint(values):
        return e
    got = memo.get(e)
    if got is not None:
        return got
    total: dict[tuple[Atom, ...], int] = {}
    for mono, c in e.terms:
        cur: dict[tuple[Atom, ...], int] = {(): c}
        for atom in mono:
            if atom.op == "var":
                f = values.get(atom.var)
                if f is None:
                    f = _atom_expr(atom)
            else:
                f = _OPS[atom.op](*[_substitute(a, values, memo) for a in atom.args])
            nxt: dict[tuple[Atom, ...], int] = {}
            for m1, c1 in cur.items():
                for m2, c2 in f.terms:
                    m = m1 + m2 if not m1 or not m2 else tuple(sorted(m1 + m2, key=Atom.sort_key))
                    nxt[m] = nxt.get(m, 0) + c1 * c2
            cur = nxt
        for m, k in cur.items():
            total[m] = total.get(m, 0) + k
    out = memo[e] = Expr._make(total)
    return out


def evaluate(e: IntLike, env: Mapping[SymVar, object], ops: Mapping[str, Callable] | None = None):
    """Evaluate with concrete values (ints, or numpy arrays when `ops` handles them)."""
    e = as_expr(e)
    impl = ops or _INT_OPS
    return _fold(e, lambda v: _lookup(env, v), lambda op, args: impl[op](*args), zero=0)


def _lookup(env: Mapping[SymVar, object], v: SymVar):
    try:
        return env[v]
    except KeyError:
        raise KeyError(f"symbolic variable '{v.name}' has no value") from None


def _fold(e: Expr, leaf, node, zero=None):
    total = as_expr(0) if zero is None else zero
    for mono, c in e.terms:
        term = c
        for atom in mono:
            if atom.op == "var":
                val = leaf(atom.var)
            else:
                val = node(atom.op, [_fold(a, leaf, node, zero) for a in atom.args])
            term = term * val
        total = total + term
    return total


_OPS = {"floordiv": floordiv, "mod": mod, "min": smin, "max": smax}
_INT_OPS = {"floordiv": lambda a, b: a // b, "mod": lambda a, b: a % b, "min": min, "max": max}


# ---- printing ------------------------------------------------------------------------------

def _render(e: Expr, name: Callable[[SymVar], str], binop: Callable[[str, str, str], str]) -> str:
    if not e.terms:
        return "0"
    parts: list[tuple[int, str]] = []
    for mono, c in reversed(e.terms):  # highest-degree monomials first reads naturally
        if not mono:
            parts.append((c, ""))
            continue
        factors = []
        for atom in mono:
            if atom.op == "var":
                factors.append(name(atom.var))
            else:
                a, b = (_render(x, name, binop) for x in atom.args)
                text = binop(atom.op, a, b)
                # `2 * (n // 4)` must not print as `2 * n // 4` (which Python reads as `(2 * n) // 4`).
                if atom.op in ("floordiv", "mod") and (len(mono) > 1 or c != 1) and not _grouped(text):
                    text = f"({text})"
                factors.append(text)
        parts.append((c, " * ".join(factors)))
    out = ""
    for i, (c, body) in enumerate(parts):
        mag = abs(c)
        text = body if mag == 1 and body else (str(mag) if not body else f"{mag} * {body}")
        if i == 0:
            out = ("-" if c < 0 else "") + text
        else:
            out += (" - " if c < 0 else " + ") + text
    return out


def _grouped(s: str) -> bool:
    """Whether `s` is one parenthesised group, `(...)`."""
    depth = 0
    for i, ch in enumerate(s):
        depth += {"(": 1, ")": -1}.get(ch, 0)
        if depth == 0 and i < len(s) - 1:
            return False
    return s.startswith("(")


def _wrap(s: str) -> str:
    return s if s.replace("_", "").isalnum() else f"({s})"


def to_python(e: IntLike, name: Callable[[SymVar], str] = lambda v: v.name) -> str:
    def binop(op, a, b):
        return {"floordiv": f"{_wrap(a)} // {_wrap(b)}", "mod": f"{_wrap(a)} % {_wrap(b)}",
                "min": f"min({a}, {b})", "max": f"max({a}, {b})"}[op]
    return _render(as_expr(e), name, binop)


def to_c(e: IntLike, name: Callable[[SymVar], str] = lambda v: v.name) -> str:
    """C expression; shape arithmetic is non-negative, so C's truncating `/` equals floor division."""
    def binop(op, a, b):
        return {"floordiv": f"({_wrap(a)} / {_wrap(b)})", "mod": f"({_wrap(a)} % {_wrap(b)})",
                "min": f"min({a}, {b})", "max": f"max({a}, {b})"}[op]
    return _render(as_expr(e), name, binop)

