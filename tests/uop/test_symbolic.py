"""The symbolic rules of IR.md, one behaviour per test: identities, constant combining, casts, div/mod from bounds,
comparisons from bounds, Invalid, CDIV/CMOD truncation, and the gate and range rules."""

from __future__ import annotations

import math

import pytest

from speck.uop import AxisType, Invalid, Ops, UOp, dtypes
from speck.uop.symbolic import shrink_guarded_ranges

x = UOp.variable("x", 0, 100)
n = UOp.variable("n", 0, 50)
s = UOp.variable("s", -20, 20)


def C(v: int) -> UOp:
    return UOp.const(dtypes.weakint, v)


@pytest.mark.parametrize(
    "expr,want",
    [(lambda: x + 0, lambda: x), (lambda: x * 1, lambda: x), (lambda: x * 0, lambda: C(0)), (lambda: x // 1, lambda: x),
     (lambda: x % 1, lambda: C(0)), (lambda: (s < 3).where(x, x), lambda: x), (lambda: x - x, lambda: C(0)),
     (lambda: x.maximum(x), lambda: x), (lambda: UOp.const(dtypes.bool, True).where(x, n), lambda: x),
     (lambda: UOp.const(dtypes.bool, False).where(x, n), lambda: n), (lambda: x + 3 + 4, lambda: x + 7),
     (lambda: (x * 2) * 3, lambda: x * 6), (lambda: x + n - n, lambda: x), (lambda: 3 + x, lambda: x + 3),
     (lambda: x * 3 + x * 4, lambda: x * 7), (lambda: x + n * 3 - n * 3, lambda: x)],
)  # fmt: skip
def test_identities_and_combining(expr, want) -> None:  # type: ignore[no-untyped-def]
    assert expr().simplify() is want().simplify()


def test_constants_collect_at_the_top_of_a_sum() -> None:
    assert ((x + 2) + (n + 3)).simplify().render(simplify=False) in ("((x+n)+5)", "((n+x)+5)")


def test_float_times_zero_is_not_folded() -> None:
    f = UOp.variable("f", 0, 1, dtypes.float32)
    assert (f * 0.0).simplify() is f * 0.0  # NaN * 0 is NaN


def test_double_casts_and_neg_cast() -> None:
    i8 = UOp.variable("b", -5, 5, dtypes.int8)
    assert i8.cast(dtypes.int32).cast(dtypes.int64).simplify() is i8.cast(dtypes.int64)
    assert i8.cast(dtypes.int32).cast(dtypes.int8).simplify() is i8
    big = UOp.variable("big", 0, 1000)
    assert big.cast(dtypes.int8).cast(dtypes.int32).simplify().src[0].dtype is dtypes.int8  # 1000 doesn't fit int8
    a = UOp.variable("a", 0, 10, dtypes.int32).cast(dtypes.float32) * 0.5
    assert (a.cast(dtypes.int32) + (-a).cast(dtypes.int32)).simplify() is UOp.const(dtypes.int32, 0)


def test_cast_and_bitcast_of_consts() -> None:
    assert UOp.const(dtypes.float32, 2.7).cast(dtypes.int32).simplify() is UOp.const(dtypes.int32, 2)
    assert UOp.const(dtypes.float32, -2.7).cast(dtypes.int32).simplify() is UOp.const(dtypes.int32, -2)
    assert UOp.const(dtypes.int32, 300).cast(dtypes.uint8).simplify() is UOp.const(dtypes.uint8, 44)
    assert UOp.const(dtypes.int16, 70000).bitcast(dtypes.uint16).simplify() is UOp.const(dtypes.uint16, 4464)
    assert UOp.const(dtypes.float32, 1.0).bitcast(dtypes.int32).simplify() is UOp.const(dtypes.int32, 0x3F800000)


def test_fixed_width_folding_wraps() -> None:
    i32 = dtypes.int32
    assert (UOp.const(i32, 2**31 - 1) + UOp.const(i32, 1)).simplify() is UOp.const(i32, -(2**31))
    assert (UOp.const(dtypes.uint8, 200) * UOp.const(dtypes.uint8, 2)).simplify() is UOp.const(dtypes.uint8, 144)
    h = (UOp.const(dtypes.float16, 60000.0) + UOp.const(dtypes.float16, 60000.0)).simplify()
    assert h.arg == math.inf


def test_cdiv_cmod_truncate_toward_zero() -> None:
    # // and % on UOps are C's: -7 // 2 == -3 and -7 % 2 == -1 (Python would say -4 and 1)
    assert (C(-7) // C(2)).simplify().arg == -3
    assert (C(-7) % C(2)).simplify().arg == -1
    assert (C(7) // C(-2)).simplify().arg == -3
    assert (C(7) % C(-2)).simplify().arg == 1
    assert ((s // 4).vmin, (s // 4).vmax) == (-5, 5)
    assert ((s % 4).vmin, (s % 4).vmax) == (-3, 3)


def test_div_mod_folding_from_bounds() -> None:
    assert (((x * 4) + 2) % 4).simplify() is C(2)
    assert (((x * 4) + 2) // 4).simplify() is x
    assert ((n * 6) // 3).simplify() is (n * 2).simplify()
    assert ((x * 8 + n * 4 + 3) // 4).simplify() is (x * 2 + n).simplify()
    assert ((x * 8 + n * 4 + 3) % 4).simplify() is C(3)
    assert (n % 64).simplify() is n  # n < 64
    assert (n // 64).simplify() is C(0)
    assert ((x // 2) // 3).simplify() is (x // 6).simplify()
    assert ((x % 12) % 4).simplify() is (x % 4).simplify()
    # a coefficient above the divisor splits: the windows of Tensor.unfold index rows as (y + 25*i) % 24
    y, i = UOp.range(20, 90), UOp.range(5, 91)
    assert ((y + i * 25) % 24).simplify() is (y + i).simplify()
    assert ((y + i * 25) // 24).simplify() is i
    # 6*y + i can reach 24, so the terms don't split as above; they share the factor 6 with 24 and i < 6, so
    # (30*y + i) % 24 == ((5*y) % 4)*6 + i (checked at every y, i)
    folded = ((y * 30 + i) % 24).simplify()
    assert folded is (((y * 5) % 4) * 6 + i).simplify()
    assert all(folded.substitute({y: C(ya), i: C(ia)}).simplify().arg == (30 * ya + ia) % 24
               for ya in range(20) for ia in range(5))  # fmt: skip
    # the flat index of a 2x2-pooled 20x20 image: (20*h + w) // 40 is the pooled row h // 2, and the row offset
    # (h % 2)*20 + (h // 2)*40 re-flattens to 20*h
    h, w = UOp.range(20, 94), UOp.range(20, 95)
    assert ((h * 20 + w) // 40).simplify() is (h // 2).simplify()
    assert ((h * 20 + w) % 40).simplify() is ((h % 2) * 20 + w).simplify()
    assert (x * 800 + w + (h % 2) * 20 + (h // 2) * 40).simplify() is (x * 800 + w + h * 20).simplify()
    assert (s % 3 * 5 + (s // 3) * 15).simplify() is (s * 5).simplify()  # exact for any sign
    # a (64, 3, 3) weight read flat: x // 9 is (x // 3) // 3 merged, and still pairs with (x // 3) % 3
    assert (x % 3 + ((x // 3) % 3) * 3 + (x // 9) * 9).simplify() is x
    assert ((x // 9) * 9 + x % 3 + ((x // 3) % 3) * 3).simplify() is x
    assert ((h * 20 + w + 1) // 40).simplify().op is Ops.CDIV  # w + 1 can reach 20: no common factor applies
    # a flattened (N, 28, 28) image re-read as rows of 784: the index collapses back to n*784 + p
    p, b = UOp.range(784, 92), UOp.range(128, 93)
    assert (b * 784 + p % 28 + ((p + b * 784) // 28) % 28 * 28).simplify() is (b * 784 + p).simplify()
    assert ((p + b * 784) // 28).simplify() is (b * 28 + p // 28).simplify()
    assert ((x % 7) + (x // 7) * 7).simplify() is x
    assert ((s % 7) + (s // 7) * 7).simplify() is s  # exact for truncating division of any sign
    # a negative dividend is not floor-divided: (s*4+2)//4 with s < 0 truncates differently, so it stays
    assert ((s * 4 + 2) // 4).simplify().op is Ops.CDIV


def test_comparisons_from_bounds() -> None:
    assert (x < 101).simplify() is UOp.const(dtypes.bool, True)
    assert (x < 0).simplify() is UOp.const(dtypes.bool, False)
    assert (x + 200).ne(5).simplify() is UOp.const(dtypes.bool, True)
    assert (x * 4 < 10).simplify() is (x < 3).simplify()
    assert (x + 3 < 10).simplify() is (x < 7).simplify()
    assert x.maximum(n + 200).simplify() is (n + 200).simplify()


def test_invalid() -> None:
    inv = C(0).replace(arg=Invalid)
    assert (inv + x).simplify() is inv
    assert (inv // C(0)).simplify() is inv
    assert (C(5) // inv).simplify() is inv
    assert (C(3) * inv).simplify() is inv
    v = x.valid(n < 10)
    assert (v + 1).simplify() is (x + 1).valid(n < 10).simplify()  # the gate travels through arithmetic


# ---------------- gates and ranges ----------------
buf = UOp.param(0, dtypes.float32.ptr(64))
inp = UOp.param(1, dtypes.float32.ptr(64))


def test_true_gate_is_dropped() -> None:
    r = UOp.range(16, 0, AxisType.GLOBAL)
    assert inp.index(r, gate=UOp.const(dtypes.bool, True)).simplify() is inp.index(r)
    assert inp.index(r.valid(r < 16)).simplify() is inp.index(r)  # r < 16 is True from bounds


def test_range_guarded_at_every_use_shrinks() -> None:
    r = UOp.range(16, 0, AxisType.GLOBAL)
    ast = UOp.sink(UOp.group(buf.index(r, gate=r < 10).store(inp.index(r).load()),
                             buf.index(r + 16, gate=r < 12).store(inp.index(r).load())).end(r))  # fmt: skip
    out = ast.simplify()
    ranges = [u for u in out.toposort() if u.op is Ops.RANGE]
    assert len(ranges) == 1 and ranges[0].src[0].arg == 12  # the largest guard
    # an unguarded use keeps the range
    ast2 = UOp.sink(UOp.group(buf.index(r, gate=r < 10).store(inp.index(r).load()),
                              buf.index(r + 16).store(inp.index(r).load())).end(r))  # fmt: skip
    assert shrink_guarded_ranges(ast2) is None


def test_reduce_range_guarded_by_identity_shrinks() -> None:
    r = UOp.range(32, 1, AxisType.REDUCE)
    red = inp.index(r.valid(r < 20)).load().reduce(r)  # gated loads read 0, ADD's identity
    mx = (r < 7).where(inp.index(r).load(), UOp.const(dtypes.float32, -math.inf)).reduce(r, op=Ops.MAX)
    out = UOp.sink(buf.index(C(0)).store(red), buf.index(C(1)).store(mx))
    got = shrink_guarded_ranges(out)
    assert got is not None and {u.src[0].arg for u in got.toposort() if u.op is Ops.RANGE} == {20}
    # a load with a non-identity alternative contributes for r >= k: no shrink
    alt = inp.index(r.valid(r < 20)).load(UOp.const(dtypes.float32, 2.0)).reduce(r)
    assert shrink_guarded_ranges(UOp.sink(buf.index(C(0)).store(alt))) is None


def test_one_iteration_range_disappears() -> None:
    r = UOp.range(1, 2)
    ast = UOp.sink(buf.index(r).store(inp.index(r).load()).end(r))
    assert ast.simplify() is UOp.sink(buf.index(C(0)).store(inp.index(C(0)).load()))
    red = inp.index(r).load().reduce(r)
    assert red.simplify() is inp.index(C(0)).load()


def test_where_on_gated_load_folds_into_the_load() -> None:
    r = UOp.range(16, 0)
    c = r < 5
    alt = UOp.const(dtypes.float32, 7.0)
    ld = inp.index(r.valid(c)).load()
    assert c.where(ld, alt).simplify() is UOp(Ops.LOAD, dtypes.float32, (inp.index(r.valid(c)), alt))
    ld3 = inp.index(r, gate=c).load()
    assert c.where(ld3, alt).simplify() is UOp(Ops.LOAD, dtypes.float32, (inp.index(r, gate=c), alt))
    # a different condition is not the load's gate
    assert (r < 6).where(ld, alt).simplify().op is Ops.WHERE


def test_never_valid_load_reads_its_alternative() -> None:
    assert inp.index(C(0).replace(arg=Invalid)).load().simplify() is UOp.const(dtypes.float32, 0.0)
    r = UOp.range(4, 0)
    alt = UOp.const(dtypes.float32, 3.0)
    assert UOp(Ops.LOAD, dtypes.float32, (inp.index(r, gate=r < 0), alt)).simplify() is alt


def test_shared_sums_do_not_blow_up() -> None:
    # u_{k+1} = u_k + (u_k + 1) names u_k twice: flattening the sum would give 2**60 terms
    u = UOp.variable("a", 0, 10)
    for _ in range(60):
        u = u + (u + 1)
    q = (u // 7).simplify()
    assert q.vmin >= 0 and q.op in (Ops.CDIV, Ops.ADD, Ops.CONST)


def test_float_constants_are_not_reassociated():
    # (x + 1e8) - 1e8 is not x in float32 (x is rounded to a multiple of 8 first); only ints may combine constants
    x = UOp.param(0, dtypes.float32.ptr(4)).index(UOp.const(dtypes.weakint, 0)).load()
    for e in ((x + 1e8) + -1e8, (x * 3.0) * 0.5):
        assert e.simplify() is e
    v = UOp.variable("v", 0, 10)
    assert ((v + 2) + 4).simplify() is (v + 6).simplify()


def test_range_that_may_run_zero_times_is_not_a_constant() -> None:
    """RANGE(1 - y) has bounds [0, 0] but runs zero times when y = 1: it must not fold to the constant 0 (the
    body would run once)."""
    y = UOp.range(2, 0, AxisType.GLOBAL)
    r = UOp(Ops.RANGE, dtypes.weakint, ((y * -1 + 1).simplify(),), (1, AxisType.REDUCE))
    assert r.simplify() is r
    assert UOp.range(1, 2, AxisType.REDUCE).simplify().op is Ops.CONST  # one iteration always: the constant 0
