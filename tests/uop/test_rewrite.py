"""graph_rewrite: fixed points, bottom_up and walk orders, graph_rewrite_map, and bad rule sets that never reach a
fixed point (a bounded number of passes, then RuntimeError naming the last rule)."""

from __future__ import annotations

import pytest

from speck.uop import Context, Ops, PatternMatcher, UOp, UPat, dtypes, graph_rewrite, graph_rewrite_map

x = UOp.variable("x", 0, 10)
one = PatternMatcher([(UPat.var("a") * 1, lambda a: a), (UPat.var("a") + 0, lambda a: a)])


@pytest.mark.parametrize("compiled", [False, True])
def test_fixed_point(compiled: bool) -> None:
    pm = one.with_mode(compiled)
    e = ((x * 1 + 0) * 1 + 0) * 1
    assert graph_rewrite(e, pm) is x
    assert graph_rewrite(e, pm, bottom_up=True) is x


def test_walk_visits_each_node_once() -> None:
    bump = PatternMatcher([(UPat(Ops.CONST, name="c"), lambda c: UOp.const(c.dtype, c.arg + 1))])
    assert graph_rewrite(x + 1, bump, walk=True) is x + 2  # the fixed point would never end
    with Context(REWRITE_LIMIT=50), pytest.raises(RuntimeError, match="fixed point"):
        graph_rewrite(x + 1, bump)


def test_bottom_up_sees_parents_first() -> None:
    seen: list[Ops] = []
    pm = PatternMatcher([(UPat(name="u"), lambda u, ctx: ctx.append(u.op))])
    graph_rewrite(x + 1, pm, ctx=seen, bottom_up=True)
    assert seen[0] is Ops.ADD
    seen.clear()
    graph_rewrite(x + 1, pm, ctx=seen)
    assert seen[-1] is Ops.ADD


def test_graph_rewrite_map() -> None:
    e = x * 1 + 2
    m = graph_rewrite_map(e, one)
    assert m[e] is x + 2 and m[x * 1] is x


def test_two_rules_undoing_each_other_raise_naming_the_rule() -> None:
    a, b = UOp.variable("a", 0, 1), UOp.variable("b", 0, 1)

    def to_b() -> UOp:
        return b

    def to_a() -> UOp:
        return a

    pm = PatternMatcher([(UPat(Ops.DEFINE_VAR, arg=a.arg), to_b), (UPat(Ops.DEFINE_VAR, arg=b.arg), to_a)])
    for compiled in (False, True):
        with pytest.raises(
            RuntimeError, match=r"did not reach a fixed point.*last rule applied was \S*to_(a|b) for pattern"
        ):
            graph_rewrite(a + 1, pm.with_mode(compiled), name="flipflop")


def test_growing_rule_set_raises() -> None:
    # every rewrite makes a brand new, bigger node: the chain limit never sees a repeat, the budget does
    grow = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: UOp.variable(v.arg[0] + "'", 0, 1) + 0)])
    with Context(REWRITE_LIMIT=20), pytest.raises(RuntimeError, match="fixed point"):
        graph_rewrite(x, grow)
    nest = PatternMatcher([(UPat(Ops.ADD, src=(UPat.var("p"), UPat.var("q"))),
                            lambda p, q: (p * 1) + (q * 1) if p.op is not Ops.MUL else None),
                           (UPat(Ops.MUL, src=(UPat.var("p"), UPat.cvar())), lambda p: p + p)])  # fmt: skip
    with Context(REWRITE_LIMIT=20), pytest.raises(RuntimeError, match="fixed point"):
        graph_rewrite(x + x, nest)


@pytest.mark.slow
def test_100k_chain_rewrites_without_recursion() -> None:
    e = x
    for _ in range(100_000):
        e = e * 1
    assert graph_rewrite(e, one) is x
    assert graph_rewrite(e, one, bottom_up=True) is x
    assert graph_rewrite(UOp.sink(e), PatternMatcher([]), walk=True) is UOp.sink(e)


def test_tags_are_part_of_identity() -> None:
    t = x.replace(tag="seen")
    untag = PatternMatcher([(UPat(Ops.DEFINE_VAR, name="v"), lambda v: v.replace(tag=None) if v.tag else None)])
    assert graph_rewrite(t + 1, untag) is x + 1
    assert UOp.const(dtypes.weakint, 1).replace(tag=1) is not UOp.const(dtypes.weakint, 1)


def test_pure_matcher_skips_what_it_rewrote_before() -> None:
    calls: list[UOp] = []

    def strip_mul1(a: UOp) -> UOp:
        calls.append(a)
        return a

    pure = PatternMatcher([(UPat.var("a") * 1, strip_mul1)], pure=True)
    e = (x * 1 + 3) * 1
    assert graph_rewrite(e, pure) is x + 3 and len(calls) == 2
    assert graph_rewrite(e, pure) is x + 3 and len(calls) == 2  # remembered: no rule ran again
    assert graph_rewrite(e + 1, pure) is (x + 3) + 1 and len(calls) == 2  # only the new node was visited
    assert e in pure.memo()


def test_impure_or_ctx_rewrites_are_not_remembered() -> None:
    seen: list[UOp] = []
    impure = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda u: seen.append(u))])
    graph_rewrite(x + 1, impure)
    graph_rewrite(x + 1, impure)
    assert len(seen) == 2 and not impure.memo()
    with_ctx = PatternMatcher([(UPat(Ops.ADD, name="u"), lambda u, ctx: ctx.append(u))], pure=True)
    graph_rewrite(x + 1, with_ctx, ctx=seen)
    graph_rewrite(x + 1, with_ctx, ctx=seen)
    assert len(seen) == 4 and not with_ctx.memo()  # a ctx may change between calls: never remembered


def test_pure_memo_starts_afresh_when_full(monkeypatch: pytest.MonkeyPatch) -> None:
    pure = PatternMatcher([(UPat.var("a") * 1, lambda a: a)], pure=True)
    monkeypatch.setattr(PatternMatcher, "MEMO_LIMIT", 4)
    graph_rewrite(((x * 1 + 1) * 1 + 2) * 1 + 3, pure)
    old = pure._memo
    assert len(old) > 4
    assert graph_rewrite(x * 1 + 5, pure) is x + 5
    assert pure._memo is not old and x * 1 + 5 not in old  # a new dict; the old one is left intact (other threads)
    assert (pure + PatternMatcher([])).pure is False and (pure + PatternMatcher([], pure=True)).pure is True
