"""UPat / PatternMatcher: captures, commutative matching, ctx, any/or_casted, and the property that the compiled and
interpreted matchers return identical results on random graphs and random rule sets (NaN consts included)."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.uop import Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite

MODES = [False, True]


@pytest.mark.parametrize("compiled", MODES)
def test_captures_and_commutative(compiled: bool) -> None:
    x = UOp.variable("x", 0, 10)
    pm = PatternMatcher([(UPat.var("a") + UPat.cvar("c"), lambda a, c: a * c.arg)], compiled=compiled)
    assert pm.rewrite(x + 3) is x * 3
    assert pm.rewrite(UOp.const(dtypes.weakint, 3) + x) is x * 3  # commutative: either source order
    assert pm.rewrite(x * 3) is None


@pytest.mark.parametrize("compiled", MODES)
def test_same_name_means_same_node(compiled: bool) -> None:
    x, y = UOp.variable("x", 0, 10), UOp.variable("y", 0, 10)
    pm = PatternMatcher([(UPat.var("a") + UPat.var("a"), lambda a: a * 2)], compiled=compiled)
    assert pm.rewrite(x + x) is x * 2 and pm.rewrite(x + y) is None


@pytest.mark.parametrize("compiled", MODES)
def test_ctx_dtype_any_or_casted(compiled: bool) -> None:
    x = UOp.variable("x", 0, 10)
    seen: list[Any] = []
    pm = PatternMatcher(
        [
            (UPat(Ops.DEFINE_VAR, name="v"), lambda v, ctx: ctx.append(v)),
            (UPat.var("a", dtypes.int32).cast(dtypes.float32, name="c"), lambda a, c: a),
            (UPat.any(UPat(Ops.SQRT, name="s"), UPat(Ops.EXP2, name="s")), lambda s: s.src[0]),
            (UPat.cvar("k").or_casted().alu(Ops.MAX, UPat.var("y")), lambda k, y: y),
        ],
        compiled=compiled,
    )
    assert pm.rewrite(x, seen) is None and seen == [x]  # None from the function: no rewrite
    i = UOp.variable("i", 0, 3, dtypes.int32)
    assert pm.rewrite(i.cast(dtypes.float32)) is i
    assert pm.rewrite(i.cast(dtypes.float16)) is None
    f = UOp.variable("f", 0, 1, dtypes.float32)
    assert pm.rewrite(f.sqrt()) is f and pm.rewrite(f.exp2()) is f
    assert pm.rewrite(UOp.const(dtypes.weakint, 1).cast(dtypes.float32).maximum(f)) is f


def test_ctx_name_is_reserved() -> None:
    with pytest.raises(RuntimeError, match="reserved"):
        UPat.var("ctx")


@pytest.mark.parametrize("compiled", MODES)
def test_allow_any_len_and_repeat(compiled: bool) -> None:
    a, b, c = (UOp.variable(n, 0, 1) for n in "abc")
    pm = PatternMatcher(
        [
            (UPat(Ops.SINK, src=(UPat.var("first"),), allow_any_len=True), lambda first: first),
            (UPat(Ops.GROUP, src=UPat(Ops.DEFINE_VAR, name="v")), lambda v: v),
        ],
        compiled=compiled,
    )
    assert pm.rewrite(UOp.sink(a, b, c)) is a
    assert pm.rewrite(UOp(Ops.GROUP, dtypes.void, (a, a))) is a
    assert pm.rewrite(UOp(Ops.GROUP, dtypes.void, (a, b))) is None  # one name, two different nodes


def test_pm_add_concatenates() -> None:
    x = UOp.variable("x", 0, 10)
    pm1 = PatternMatcher([(UPat.var("a") * 1, lambda a: a)])
    pm2 = PatternMatcher([(UPat.var("a") + 0, lambda a: a)])
    assert graph_rewrite(x * 1 + 0, pm1 + pm2) is x


# ---------------- property 4: compiled == interpreted ----------------
LEAF_CONSTS = [0, 1, 2, -1, 0.0, -0.0, 1.0, math.nan, math.inf]


@st.composite
def graphs(draw: st.DrawFn) -> UOp:
    leaves = [UOp.variable("a", 0, 4), UOp.variable("b", -2, 2)]
    fleaves = [UOp.const(dtypes.float32, v) for v in (0.0, math.nan, 1.0, -0.0)] + [
        UOp.variable("f", 0, 1, dtypes.float32)
    ]
    nodes_i: list[UOp] = list(leaves) + [UOp.const(dtypes.weakint, draw(st.sampled_from([0, 1, 2, -1])))]
    nodes_f: list[UOp] = list(fleaves)
    for _ in range(draw(st.integers(1, 12))):
        if draw(st.booleans()):
            a, b = draw(st.sampled_from(nodes_i)), draw(st.sampled_from(nodes_i))
            op = draw(st.sampled_from([Ops.ADD, Ops.MUL, Ops.MAX, Ops.CDIV, Ops.CMOD]))
            nodes_i.append(UOp(op, dtypes.weakint, (a, b)))
        else:
            a, b = draw(st.sampled_from(nodes_f)), draw(st.sampled_from(nodes_f))
            kind = draw(st.sampled_from(["add", "mul", "max", "where", "cast", "sqrt"]))
            if kind == "where":
                nodes_f.append((a < b).where(a, b))
            elif kind == "cast":
                nodes_f.append(draw(st.sampled_from(nodes_i)).cast(dtypes.float32))
            elif kind == "sqrt":
                nodes_f.append(a.sqrt())
            else:
                nodes_f.append(UOp({"add": Ops.ADD, "mul": Ops.MUL, "max": Ops.MAX}[kind], dtypes.float32, (a, b)))
    return UOp.sink(nodes_i[-1], nodes_f[-1])


@st.composite
def patterns(draw: st.DrawFn, depth: int = 2) -> UPat:
    kind = draw(
        st.sampled_from(["var", "cvar", "const", "op", "op", "any", "cast"] if depth > 0 else ["var", "cvar", "const"])
    )
    name = draw(st.sampled_from([None, "x", "y", "z"]))
    if kind == "var":
        return UPat.var(name, draw(st.sampled_from([None, dtypes.weakint, dtypes.float32])))
    if kind == "cvar":
        return UPat.cvar(name)
    if kind == "const":
        return UPat(Ops.CONST, arg=draw(st.sampled_from(LEAF_CONSTS)), name=name)
    if kind == "any":
        return UPat.any(draw(patterns(depth - 1)), draw(patterns(depth - 1)))
    if kind == "cast":
        return draw(patterns(depth - 1)).cast(name=name)
    ops = draw(st.sampled_from([(Ops.ADD,), (Ops.MUL,), (Ops.MAX,), (Ops.ADD, Ops.MUL), (Ops.CDIV, Ops.CMOD),
                                (Ops.WHERE,), (Ops.SQRT,)]))  # fmt: skip
    n = 3 if ops == (Ops.WHERE,) else 1 if ops == (Ops.SQRT,) else 2
    if draw(st.booleans()):
        src: Any = tuple(draw(patterns(depth - 1)) for _ in range(n))
    elif draw(st.booleans()):
        src = [draw(patterns(depth - 1)) for _ in range(n)]
    else:
        src = draw(patterns(depth - 1))
    return UPat(ops, name=name, src=src, allow_any_len=draw(st.booleans()))


def _rule(tag: int) -> Any:
    def fn(**kw: UOp) -> UOp | None:
        # the result depends on which nodes were bound to which names, so a different binding order shows
        if tag % 3 == 0:
            return None
        if not kw:
            return UOp.const(dtypes.weakint, 1000 + tag)
        names = sorted(kw)
        return UOp(Ops.NOOP, dtypes.void, tuple(kw[k] for k in names), (tag, tuple(names)))

    return fn


@given(graphs(), st.lists(patterns(), min_size=1, max_size=5))
def test_compiled_equals_interpreted(g: UOp, pats: list[UPat]) -> None:
    rules = [(p, _rule(i)) for i, p in enumerate(pats)]
    pi, pc = PatternMatcher(rules, compiled=False), PatternMatcher(rules, compiled=True)
    for u in g.toposort():
        assert pi.rewrite(u) is pc.rewrite(u), (u, pats)
    # and through graph_rewrite (NOOP results have no rules, so the rewrite terminates)
    assert graph_rewrite(g, pi, walk=True) is graph_rewrite(g, pc, walk=True)


@pytest.mark.parametrize("compiled", MODES)
def test_any_in_swapped_source_order_checks_its_ops(compiled: bool) -> None:
    # regression: the compiled matcher shares the root's source variables between source orders, and an op check
    # done for one order must not be taken as done for a UPat.any alternative in the other
    x = UOp.variable("x", 0, 3)
    m = x * 2
    pat = UPat(Ops.ADD, src=(UPat(Ops.MUL, name="m"), UPat.any(UPat(Ops.CONST, name="c"), UPat(Ops.SQRT, name="c"))))
    pm = PatternMatcher([(pat, lambda m, c: c)], compiled=compiled)
    assert pm.rewrite(x + m) is None
    assert pm.rewrite(m + 5) is UOp.const(dtypes.weakint, 5)
    assert pm.rewrite(UOp.const(dtypes.weakint, 5) + m) is UOp.const(dtypes.weakint, 5)
