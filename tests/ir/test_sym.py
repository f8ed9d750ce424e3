"""Symbolic integers: canonical form, simplification, bounds and proofs, substitution, printing."""
import operator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deploycc.ir import sym


@pytest.fixture
def nm():
    return sym.var("n"), sym.var("m")


# ---- canonical form --------------------------------------------------------------------------------

def test_like_terms_collect(nm):
    n, _ = nm
    assert n * 4 + 2 * n == 6 * n
    assert n * 4 + 2 * n != 5 * n


def test_commutativity_and_associativity(nm):
    n, m = nm
    assert n + m == m + n
    assert n * m == m * n
    assert (n + m) + 3 == n + (m + 3)
    assert (n * m) * 2 == n * (2 * m)


def test_cancellation(nm):
    n, m = nm
    assert (n + m) - m == n
    assert (n - n).is_const and (n - n).value == 0
    assert n * m - m * n == sym.const(0)


def test_distributivity(nm):
    n, m = nm
    assert 3 * (n + m) == 3 * n + 3 * m
    assert (n + 1) * (m + 2) == n * m + 2 * n + m + 2
    assert (n + m) * (n - m) == n * n - m * m


def test_same_name_different_variables_are_different():
    a, b = sym.var("n"), sym.var("n")
    assert a != b
    assert a - b != sym.const(0)


def test_queries(nm):
    n, m = nm
    e = 2 * n * m + 3
    assert e.free_vars() == {n.as_var, m.as_var}
    assert e.const_part() == 3
    assert n.as_var is not None and (2 * n).as_var is None and (n + 1).as_var is None
    assert sym.const(7).is_const and sym.const(7).value == 7
    with pytest.raises(ValueError, match="is not a constant"):
        _ = n.value


# ---- floor division and modulo ---------------------------------------------------------------------

def test_floordiv_simplification(nm):
    n, m = nm
    assert (n * 8 + 4) // 4 == 2 * n + 1
    assert (4 * n + 3) // 4 == n
    assert (4 * n + m) // 4 == n + m // 4
    assert n // 1 == n
    assert sym.const(17) // 5 == sym.const(3)
    assert (n + m) // (m + n) == sym.const(1)
    # Not simplifiable: stays an atom, but a canonical one.
    assert (n + 3) // 4 == (3 + n) // 4
    assert ((n + 3) // 4).as_var is None


def test_mod_simplification(nm):
    n, m = nm
    assert (n * 8 + 4) % 4 == sym.const(0)
    assert (n * 8 + 5) % 4 == sym.const(1)
    assert (5 * n) % 4 == n % 4
    assert n % 1 == sym.const(0)
    assert (n + m) % (m + n) == sym.const(0)
    with pytest.raises(ZeroDivisionError):
        n // 0
    with pytest.raises(ZeroDivisionError):
        n % 0


# ---- min / max -------------------------------------------------------------------------------------

def test_min_max_use_bounds(nm):
    n, m = nm
    # Variables are non-negative by default, so n <= n + m.
    assert sym.smin(n, n + m) == n
    assert sym.smax(n, n + m) == n + m
    assert sym.smin(n, n) == n
    assert sym.smin(3, 5) == sym.const(3)
    # Without a proof the result is a symmetric atom.
    assert sym.smin(n, m) == sym.smin(m, n)
    assert sym.to_python(sym.smin(n, m)) == "min(m, n)"
    b = sym.Bounds().declare(n, hi=64)
    assert sym.smin(n, 100, b) == n
    assert sym.smax(n, 100, b) == sym.const(100)
    assert sym.to_python(sym.smin(n, 10, b)) == "min(10, n)"


# ---- bounds and proofs -----------------------------------------------------------------------------

@pytest.fixture(params=["ctx-first", "seq-first"])
def chain(request):
    """seq_len <= total_len <= context_window <= 4096, declared in either order."""
    seq, total, ctx = sym.var("seq_len"), sym.var("total_len"), sym.var("context_window")
    decls = [(ctx, 4096), (total, ctx), (seq, total)]
    if request.param == "seq-first":
        decls.reverse()
    b = sym.Bounds()
    for v, hi in decls:
        b.declare(v, lo=1, hi=hi)
    return b, seq, total, ctx


def test_prove_le_through_declared_bounds(chain):
    b, seq, total, ctx = chain
    assert b.prove_le(total, ctx)
    assert b.prove_le(seq, total)
    assert b.prove_le(seq, ctx)  # two steps of the chain
    assert b.prove_le(seq, 4096)
    assert b.prove_le(total - seq, total)
    assert b.prove_le(2 * seq, seq + ctx)
    assert sym.smin(seq, ctx, b) == seq


def test_failing_proofs_return_false(chain):
    b, seq, total, ctx = chain
    assert not b.prove_le(ctx, total)
    assert not b.prove_le(total, seq)
    assert not b.prove_le(seq, 4095)
    assert not b.prove_le(2 * seq, ctx)
    assert not b.prove_lt(seq, total)
    assert not b.prove_le(sym.var("other"), ctx)  # an unbounded variable proves nothing


def test_prove_lt(chain):
    b, seq, total, ctx = chain
    assert b.prove_lt(seq, total + 1)
    assert b.prove_lt(seq - 1, total)
    assert b.prove_lt(0, seq)  # declared lower bound 1
    assert not b.prove_lt(seq, seq)


def test_upper_bound(chain):
    b, seq, total, ctx = chain
    assert b.upper_bound(ctx) == 4096
    assert b.upper_bound(seq) == 4096
    assert b.upper_bound(2 * seq + 1) == 8193
    assert b.upper_bound(seq * total) == 4096 * 4096
    assert sym.Bounds().upper_bound(sym.var("x")) is None


def test_ranges_of_division_and_modulo(nm):
    n, m = nm
    b = sym.Bounds().declare(n, hi=100)
    assert b.upper_bound(n % 8) == 7
    assert b.upper_bound(m % 8) == 7  # whatever m is
    assert b.upper_bound(n // 4) == 25
    # A negative divisor gives a non-positive remainder: min(0, n % -3) is not 0.
    assert sym.evaluate(sym.smin(0, n % -3), {n.as_var: 1}) == -2
    assert not b.prove_le(0, n % -3)


def test_declare_rejects_expressions(nm):
    n, m = nm
    with pytest.raises(ValueError, match="declared on variables"):
        sym.Bounds().declare(n + m, hi=3)


# ---- substitution and evaluation -------------------------------------------------------------------

def test_substitute(nm):
    n, m = nm
    e = 2 * n + m * n + (n + 3) // 4
    assert sym.substitute(e, {n.as_var: m + 1}) == 2 * m + 2 + m * (m + 1) + (m + 4) // 4
    assert sym.substitute(e, {n.as_var: 8, m.as_var: 2}) == sym.const(16 + 16 + 2)
    assert sym.substitute(e, {}) == e


def test_evaluate(nm):
    n, m = nm
    e = 3 * n * m - (n + 5) // 2 + sym.smax(n, m) % 3
    assert sym.evaluate(e, {n.as_var: 4, m.as_var: 7}) == 3 * 4 * 7 - (4 + 5) // 2 + max(4, 7) % 3
    with pytest.raises(KeyError, match="'m' has no value"):
        sym.evaluate(e, {n.as_var: 4})


# ---- printing --------------------------------------------------------------------------------------

def test_print_python_c_wgsl(nm):
    n, m = nm
    assert sym.to_python(2 * n + 1) == "2 * n + 1"
    assert sym.to_python(n * m - n - 3) == "m * n - n - 3"  # factors sorted by name
    assert sym.to_python(-n) == "-n"
    assert sym.to_python(sym.const(0)) == "0"
    e = (n + 3) // 4 * m % 7
    assert sym.to_python(e) == "(m * ((n + 3) // 4)) % 7"
    assert sym.to_c(e) == "((m * ((n + 3) / 4)) % 7)"
    assert sym.to_c(sym.smax(n, m) * 2 - 1) == "2 * max(m, n) - 1"
    assert sym.to_c(n // 4 + m) == "(n / 4) + m"
    assert sym.to_python(n, lambda v: f"shape[{v.name!r}]") == "shape['n']"


def test_printed_python_keeps_precedence(nm):
    n, m = nm
    for e in (2 * (n // 4), -(n // 4), 3 * (n % 4) + m, m * (n // 3), -(n % 5)):
        text = sym.to_python(e)
        for nv, mv in ((0, 0), (1, 2), (7, 3), (13, 11)):
            assert eval(text, {"n": nv, "m": mv}) == sym.evaluate(e, {n.as_var: nv, m.as_var: mv}), text


# ---- property: evaluating an expression tree equals evaluating its canonical form ---------------------

VARS = [sym.SymVar(name) for name in "abc"]
BINOPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}


def _trees():
    leaves = st.one_of(st.integers(-6, 6).map(lambda c: ("const", c)),
                       st.sampled_from(range(len(VARS))).map(lambda i: ("var", i)))

    def extend(children):
        return st.one_of(
            st.tuples(st.sampled_from(sorted(BINOPS)), children, children),
            st.tuples(st.sampled_from(["//", "%"]), children, st.sampled_from([-3, 2, 3, 4, 8])),
            st.tuples(st.sampled_from(["min", "max"]), children, children),
        )
    return st.recursive(leaves, extend, max_leaves=12)


def _build(t):
    op = t[0]
    if op == "const":
        return sym.const(t[1])
    if op == "var":
        return sym.as_expr(VARS[t[1]])
    if op in ("//", "%"):
        a = _build(t[1])
        return a // t[2] if op == "//" else a % t[2]
    a, b = _build(t[1]), _build(t[2])
    if op in BINOPS:
        return BINOPS[op](a, b)
    return sym.smin(a, b) if op == "min" else sym.smax(a, b)


def _eval_tree(t, env):
    op = t[0]
    if op == "const":
        return t[1]
    if op == "var":
        return env[VARS[t[1]]]
    if op in ("//", "%"):
        a = _eval_tree(t[1], env)
        return a // t[2] if op == "//" else a % t[2]
    a, b = _eval_tree(t[1], env), _eval_tree(t[2], env)
    if op in BINOPS:
        return BINOPS[op](a, b)
    return min(a, b) if op == "min" else max(a, b)


@settings(max_examples=300, deadline=None)
@given(_trees(), st.lists(st.integers(0, 50), min_size=len(VARS), max_size=len(VARS)))
def test_canonical_form_preserves_value(tree, values):
    # Variables are non-negative (shapes), which min/max simplification is entitled to assume.
    env = dict(zip(VARS, values))
    e = _build(tree)
    assert sym.evaluate(e, env) == _eval_tree(tree, env)
    text = sym.to_python(e)
    assert eval(text, {"min": min, "max": max, **{v.name: x for v, x in env.items()}}) == _eval_tree(tree, env)


def test_simplify_takes_away_divisions_and_moduli_within_range():
    """sym.simplify: a // b -> 0 and a % b -> a where 0 <= a < b under the bounds (a reshape's input index that adds
    an axis of one, fuse_tensor's gathers); a dividend that may reach the divisor, or be negative, stays."""
    i0, i1, n = sym.SymVar("i0"), sym.SymVar("i1"), sym.SymVar("n")
    b = sym.Bounds().declare(i0, 0, sym.as_expr(n) - 1).declare(i1, 0, 63)
    assert sym.simplify(sym.mod(sym.as_expr(i0) + sym.floordiv(i1, 64), n), b) == sym.as_expr(i0)
    assert sym.simplify(sym.mod(i1, 64), b) == sym.as_expr(i1)
    assert sym.simplify(sym.mod(sym.as_expr(i0) + 1, n), b) == sym.mod(sym.as_expr(i0) + 1, n)
    assert sym.simplify(sym.floordiv(i1, 32), b) == sym.floordiv(i1, 32)
    assert sym.simplify(sym.mod(sym.as_expr(i1) - 1, 64), b) == sym.mod(sym.as_expr(i1) - 1, 64)
