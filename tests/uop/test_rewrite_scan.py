"""rewrites_anything (the flat pre-scan the lowering pipeline runs before rewrites that leave most kernels unchanged)
agrees with graph_rewrite on random graphs, and a SINK's cached toposort is the walk's order, a fresh list each call,
and no reference cycle (the sink still dies by reference counting)."""

from __future__ import annotations

import gc
import weakref

from hypothesis import given
from hypothesis import strategies as st

from speck.uop import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite, rewrites_anything

x, y = UOp.variable("x", 0, 10), UOp.variable("y", -5, 5)

# rule sets that fire on a few shapes only, so random graphs hit both outcomes
RULES = {
    "mul1": PatternMatcher([(UPat.var("a") * 1, lambda a: a)]),
    "add0": PatternMatcher([(UPat.var("a") + 0, lambda a: a)]),
    "max_same": PatternMatcher([(UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("a"))), lambda a: a)]),
    "ctx_gated": PatternMatcher(
        [(UPat(Ops.CONST, name="c"), lambda ctx, c: UOp.const(c.dtype, 3) if ctx and c.arg == 2 else None)]
    ),  # fmt: skip
}


@st.composite
def graphs(draw: st.DrawFn, depth: int = 4) -> UOp:
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        leaf = UOp.const(dtypes.weakint, draw(st.integers(0, 3)))
        return draw(st.sampled_from([x, y])) if draw(st.booleans()) else leaf
    a, b = draw(graphs(depth - 1)), draw(graphs(depth - 1))
    op = draw(st.sampled_from(["+", "*", "max", "max_same"]))
    return a + b if op == "+" else a * b if op == "*" else a.maximum(b) if op == "max" else a.maximum(a)


@given(graphs(), st.sampled_from(sorted(RULES)), st.booleans(), st.booleans(), st.booleans())
def test_scan_agrees_with_rewrite(g: UOp, rules: str, as_sink: bool, ctx: bool, compiled: bool) -> None:
    root = UOp.sink(g) if as_sink else g
    pm = RULES[rules].with_mode(compiled)
    assert rewrites_anything(root, pm, ctx) == (graph_rewrite(root, pm, ctx) is not root)


@given(graphs())
def test_sink_toposort_is_cached_walk_order(g: UOp) -> None:
    s = UOp.sink(g, x)
    first = s.toposort()
    assert first == s._toposort(None)  # the uncached walk
    again = s.toposort()
    assert again == first and again is not first  # callers may mutate what they get
    again.append(x)
    assert s.toposort() == first


def test_cached_sink_toposort_leaves_no_cycle() -> None:
    was = gc.isenabled()
    gc.disable()  # refcounting alone must free it
    try:
        s = UOp.sink(UOp.variable("z", 0, 3) * 7 + 1)
        s.toposort()
        ref = weakref.ref(s)
        del s
        assert ref() is None
    finally:
        if was:
            gc.enable()


def _reference_fixed_point(root: UOp, pm: PatternMatcher, ctx: object) -> UOp:
    """The default order written plainly (recursion, sources first, a rule's result rewritten again): what the
    specialised loop in speck.uop.rewrite must compute."""
    done: dict[UOp, UOp] = {}

    def visit(n: UOp) -> UOp:
        if n in done:
            return done[n]
        new_src = tuple(visit(s) for s in n.src)
        nn = n if all(a is b for a, b in zip(new_src, n.src)) else UOp(n.op, n.dtype, new_src, n.arg, n.tag)
        r = pm.rewrite(nn, ctx)
        done[n] = nn if r is None else visit(r)
        return done[n]

    return visit(root)


# rules whose results are new nodes over shared sources (what the specialised loop's stack entries must get right)
RULES_GROWING = PatternMatcher(
    [
        (UPat.var("a") * 1, lambda a: a),
        (UPat(Ops.MAX, src=(UPat.var("a"), UPat.var("a"))), lambda a: a + 0),
        (UPat.var("a") + 0, lambda a: a),
        (UPat(Ops.ADD, src=(UPat.var("a"), UPat.var("b"))), lambda a, b: b + a if a.op is Ops.CONST else None),
    ]
)


@given(graphs(), st.sampled_from([*sorted(RULES), "growing"]), st.booleans(), st.booleans(), st.booleans())
def test_fixed_point_matches_a_plain_reference(g: UOp, rules: str, as_sink: bool, ctx: bool, compiled: bool) -> None:
    root = UOp.sink(g, g.maximum(g)) if as_sink else g
    pm = (RULES_GROWING if rules == "growing" else RULES[rules]).with_mode(compiled)
    assert graph_rewrite(root, pm, ctx) is _reference_fixed_point(root, pm, ctx)
