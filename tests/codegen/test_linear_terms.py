"""speck.codegen.lower.expander.linear_terms: an index expression as sum(coeff * atom) + const. The forms are
memoized per node, so they are checked by value: at random variable values the form evaluates to what the
expression does, whatever was asked before (shared subexpressions, lanes that differ by a constant)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from speck.codegen.lower.expander import index_offset, linear_terms
from speck.uop import UOp, dtypes
from speck.uop.symbolic import sym_infer

VARS = [UOp.variable(n, -50, 50) for n in "abc"]


@st.composite
def index_exprs(draw: st.DrawFn, depth: int = 4) -> UOp:
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        kind = draw(st.sampled_from(["var", "const", "atom"]))
        if kind == "const":
            return UOp.const(dtypes.weakint, draw(st.integers(-20, 20)))
        v = draw(st.sampled_from(VARS))
        return v if kind == "var" else v // draw(st.sampled_from([2, 3, 7]))  # a non-linear atom
    x = draw(index_exprs(depth - 1))
    op = draw(st.sampled_from(["+", "-", "*c", "c*", "+shared"]))
    if op == "*c":
        return x * UOp.const(dtypes.weakint, draw(st.integers(-6, 6)))
    if op == "c*":
        return UOp.const(dtypes.weakint, draw(st.integers(-6, 6))) * x
    if op == "+shared":
        return x + x  # the same node twice: its form counts twice
    y = draw(index_exprs(depth - 1))
    return x + y if op == "+" else x - y


def form_value(u: UOp, env: dict[str, int]) -> int:
    terms, const = linear_terms(u)
    assert all(v != 0 for v in terms.values()), "zero coefficients are dropped"
    return const + sum(c * int(sym_infer(t, env)) for t, c in terms.items())


@given(st.lists(index_exprs(), min_size=1, max_size=4), st.lists(st.integers(-50, 50), min_size=3, max_size=3))
def test_linear_form_evaluates_like_the_expression(exprs: list[UOp], vals: list[int]) -> None:
    env = dict(zip("abc", vals))
    for e in exprs:  # several expressions in a row: later ones reuse memoized forms of shared parts
        assert form_value(e, env) == int(sym_infer(e, env))
        for s in e.src:
            assert form_value(s, env) == int(sym_infer(s, env))


@given(index_exprs(), st.integers(-30, 30))
def test_index_offset_of_a_shifted_expression(e: UOp, k: int) -> None:
    shifted = e + UOp.const(dtypes.weakint, k)
    assert index_offset(e, shifted) == k
    assert index_offset(e, e + VARS[0] * 2 + VARS[0] * -2) == 0  # cancelling terms leave no atom behind
