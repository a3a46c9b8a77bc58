"""Hypothesis properties of the symbolic rules: simplify is sound and bounds are sound on random integer expression
trees (+ - * // % < != == where max, negative constants, 1-3 variables with random bounds), evaluated at random
in-bounds assignments. // and % are CDIV/CMOD: truncating toward zero, like C."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from speck.uop import DType, Ops, UOp, dtypes
from uop_helpers import DivByZero, evaluate

VAR_NAMES = ("a", "b", "c")


@st.composite
def variables(draw: st.DrawFn, dt: DType) -> list[UOp]:
    n = draw(st.integers(1, 3))
    out = []
    for name in VAR_NAMES[:n]:
        lo = draw(st.integers(-40, 40) | st.sampled_from([0, 1]) | st.integers(-(2**20), 2**20))
        hi = lo + draw(st.integers(0, 50) | st.sampled_from([0, 1]) | st.integers(0, 2**21))
        if dtypes.is_unsigned(dt):
            lo, hi = abs(lo), abs(lo) + (hi - lo)
        if dt is not dtypes.weakint:
            dlo, dhi = int(dtypes.min(dt)), int(dtypes.max(dt))
            lo, hi = min(max(lo, dlo), dhi), min(max(hi, dlo), dhi)
        out.append(UOp.variable(name, lo, hi, dt))
    return out


def _const(draw: st.DrawFn, dt: DType, nonzero: bool = False) -> UOp:
    v = draw(st.integers(-12, 12) | st.sampled_from([16, 32, 64, 256, 1024, -4, -8]))
    if nonzero and v == 0:
        v = draw(st.sampled_from([1, -1, 3, 7]))
    return UOp.const(dt, v)


@st.composite
def int_expr(draw: st.DrawFn, vs: list[UOp], dt: DType, depth: int) -> UOp:
    if depth <= 0 or draw(st.integers(0, 4)) == 0:
        return draw(st.sampled_from(vs)) if draw(st.booleans()) else _const(draw, dt)
    kind = draw(st.sampled_from(["+", "-", "*", "//", "%", "max", "where", "+c", "*c", "//c", "%c"]))
    x = draw(int_expr(vs, dt, depth - 1))
    if kind in ("+c", "*c", "//c", "%c"):
        c = _const(draw, dt, nonzero=kind in ("//c", "%c"))
        return {"+c": lambda: x + c, "*c": lambda: x * c, "//c": lambda: x // c, "%c": lambda: x % c}[kind]()
    y = draw(int_expr(vs, dt, depth - 1))
    if kind == "+":
        return x + y
    if kind == "-":
        return x - y
    if kind == "*":
        return x * y
    if kind == "//":
        return x // y
    if kind == "%":
        return x % y
    if kind == "max":
        return x.maximum(y)
    cond = draw(bool_expr(vs, dt, depth - 1))
    return cond.where(x, y)


@st.composite
def bool_expr(draw: st.DrawFn, vs: list[UOp], dt: DType, depth: int) -> UOp:
    x = draw(int_expr(vs, dt, max(depth - 1, 0)))
    y = draw(int_expr(vs, dt, max(depth - 1, 0)))
    kind = draw(st.sampled_from(["<", "!=", "=="]))
    return x < y if kind == "<" else x.ne(y) if kind == "!=" else x.eq(y)


@st.composite
def problems(draw: st.DrawFn) -> tuple[UOp, list[UOp], list[dict[str, int]]]:
    dt = draw(st.sampled_from([dtypes.weakint, dtypes.weakint, dtypes.int32, dtypes.uint32, dtypes.int8]))
    vs = draw(variables(dt))
    e = draw(int_expr(vs, dt, 4)) if draw(st.integers(0, 4)) else draw(bool_expr(vs, dt, 3))
    envs = []
    for _ in range(8):
        env = {}
        for v in vs:
            _, lo, hi = v.arg
            env[v.arg[0]] = draw(st.sampled_from([lo, hi]) | st.integers(lo, hi))
        envs.append(env)
    return e, vs, envs


def _eval(e: UOp, env: dict[str, int]) -> Any:
    try:
        return evaluate(e, env)
    except DivByZero:
        return DivByZero


@given(problems())
def test_simplify_is_sound(p: tuple[UOp, list[UOp], list[dict[str, int]]]) -> None:
    e, _, envs = p
    s = e.simplify()
    for env in envs:
        before = _eval(e, env)
        if before is DivByZero:
            continue
        after = _eval(s, env)
        assert before == after, f"{e.render(False)} -> {s.render(False)} at {env}: {before} != {after}"


@given(problems())
def test_bounds_are_sound(p: tuple[UOp, list[UOp], list[dict[str, int]]]) -> None:
    e, _, envs = p
    for node in (e, e.simplify()):
        for sub in node.toposort():
            for env in envs:
                v = _eval(sub, env)
                if v is DivByZero:
                    continue
                assert sub.vmin <= v <= sub.vmax, f"{sub.render(False)} = {v} at {env}, bounds [{sub.vmin}, {sub.vmax}]"


@given(problems())
def test_symbolic_compiled_equals_interpreted(p: tuple[UOp, list[UOp], list[dict[str, int]]]) -> None:
    from speck.uop import graph_rewrite
    from speck.uop.symbolic import symbolic

    e = p[0]
    assert graph_rewrite(e, symbolic.with_mode(False)) is graph_rewrite(e, symbolic.with_mode(True))


# ---------------- sums of scaled non-negative terms through // and % ----------------
@st.composite
def scaled_sums(draw: st.DrawFn) -> tuple[UOp, list[UOp], list[dict[str, int]]]:
    """sum(k_i * v_i) + const over non-negative variables, divided or taken modulo a constant that shares factors
    with the coefficients (the flat indices of pooled and windowed images), or re-flattened as
    (x % c)*m + (x // c)*(c*m) + rest."""
    vs = [UOp.variable(name, 0, draw(st.integers(0, 60))) for name in VAR_NAMES[: draw(st.integers(1, 3))]]
    coeffs = [draw(st.sampled_from([1, 2, 3, 4, 6, 8, 10, 20, 40, 30, 64])) for _ in vs]
    x: UOp = UOp.const(dtypes.weakint, draw(st.integers(0, 7)))
    for v, k in zip(vs, coeffs):
        x = x + v * k
    c = draw(st.sampled_from([2, 3, 4, 6, 8, 12, 24, 40, 80, 60]))
    kind = draw(st.sampled_from(["//", "%", "recombine", "nested"]))
    if kind == "//":
        e = x // c
    elif kind == "%":
        e = x % c
    elif kind == "recombine":
        m = draw(st.sampled_from([1, 2, 20]))
        e = vs[-1] * 3 + (x % c) * m + (x // c) * (c * m)
    else:  # a flat index split into three digits, in a random order
        d1, d2 = draw(st.sampled_from([2, 3, 4])), draw(st.sampled_from([2, 3, 5]))
        parts = [x % d1, ((x // d1) % d2) * d1, (x // (d1 * d2)) * (d1 * d2)]
        order = draw(st.permutations(range(3)))
        e = parts[order[0]] + parts[order[1]] + parts[order[2]]
    envs = [{v.arg[0]: draw(st.integers(v.arg[1], v.arg[2])) for v in vs} for _ in range(10)]
    return e, vs, envs


@given(scaled_sums())
def test_common_factor_and_scaled_recombine_are_sound(p: tuple[UOp, list[UOp], list[dict[str, int]]]) -> None:
    e, _, envs = p
    s = e.simplify()
    for env in envs:
        assert _eval(e, env) == _eval(s, env), f"{e.render(False)} -> {s.render(False)} at {env}"


_FRESH: list[Any] = []  # symbolic's rules in a matcher that is not declared pure (no memo), built once


@given(problems())
def test_symbolic_memo_equals_fresh_rewrite(p: tuple[UOp, list[UOp], list[dict[str, int]]]) -> None:
    """symbolic is pure, so graph_rewrite reuses earlier results; that must give what rewriting afresh gives."""
    from speck.uop import PatternMatcher, graph_rewrite
    from speck.uop.symbolic import symbolic

    if not _FRESH:
        _FRESH.append(PatternMatcher(symbolic.patterns))
    fresh = _FRESH[0]
    assert symbolic.pure and not fresh.pure
    e = p[0]
    part = e.src[0] if e.src else e
    first = graph_rewrite(part, symbolic)  # a subgraph first: the whole then starts from its memoized result
    assert graph_rewrite(e, symbolic) is graph_rewrite(e, fresh)
    assert first is graph_rewrite(part, fresh)


# ---------------- like terms inside a scaled sum ----------------
@st.composite
def sums_with_scaled_sums(draw: st.DrawFn) -> tuple[UOp, UOp | None, list[dict[str, int]]]:
    """outer + inner*k where outer repeats some of inner's terms (the sizes of symbolic cat/pad/shrink: (L+1) +
    (9 - (L+1))), in a random order and dtype; also the exact complement size + (n - size), which must fold to n."""
    dt = draw(st.sampled_from([dtypes.weakint, dtypes.weakint, dtypes.int32, dtypes.int8]))
    vs = draw(variables(dt))

    def term(v: UOp) -> UOp:
        c = draw(st.sampled_from([1, 1, 2, 3, -1, -2, 4]))
        return v if c == 1 else v * c

    inner = [term(draw(st.sampled_from(vs))) for _ in range(draw(st.integers(1, 3)))]
    if draw(st.booleans()):
        inner.append(_const(draw, dt))
    size = inner[0]
    for t in inner[1:]:
        size = size + t
    k = draw(st.sampled_from([-1, -1, 1, 2, -3]))
    shared = [t for t in inner if draw(st.booleans())] + [
        term(draw(st.sampled_from(vs))) for _ in range(draw(st.integers(0, 2)))
    ]
    parts = [size * k, *shared, _const(draw, dt)]
    order = draw(st.permutations(range(len(parts))))
    e = parts[order[0]]
    for i in order[1:]:
        e = e + parts[i]
    n = draw(st.integers(0, 64))
    complement = (size + (n - size)) if dt is dtypes.weakint else None
    envs = []
    for _ in range(8):
        envs.append(
            {v.arg[0]: draw(st.sampled_from([v.arg[1], v.arg[2]]) | st.integers(v.arg[1], v.arg[2])) for v in vs}
        )
    return e, complement, envs


@given(sums_with_scaled_sums())
def test_scaled_sum_like_terms_are_sound(p: tuple[UOp, UOp | None, list[dict[str, int]]]) -> None:
    e, complement, envs = p
    s = e.simplify()
    for env in envs:
        assert _eval(e, env) == _eval(s, env), f"{e.render(False)} -> {s.render(False)} at {env}"
    if complement is not None:
        folded = complement.simplify()
        assert folded.op is Ops.CONST, f"{complement.render(False)} stayed symbolic: {folded.render(False)}"
        for env in envs:
            assert _eval(complement, env) == folded.arg
