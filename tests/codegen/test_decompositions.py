"""Decompositions for renderers that lack ops: exp2/log2/sin polynomials within their documented ulp bounds against
a long-double numpy reference (specials exact), POW sign/zero rules, THREEFRY bit-exact against the reference
implementation in speck.uop, MULACC and narrow-float promotion."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen import numeric as nm
from speck.codegen.interpret import run_program
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.numeric import storage_np
from speck.codegen.pipeline import full_rewrite_to_sink
from speck.codegen.renderer import Renderer
from speck.uop import AxisType, Context, DType, GroupOp, Ops, UOp, dtypes
from speck.uop.alu import threefry2x32


class BareRenderer(Renderer):
    """No transcendental ops, no POW/THREEFRY/MULACC: everything goes through the decompositions."""

    name = "bare-test"
    has_vectors = True
    supported_ops = GroupOp.ALU - {Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.POW, Ops.THREEFRY, Ops.MULACC}


def run_unary(op: Ops, xs: np.ndarray, dt: DType, other: np.ndarray | None = None) -> np.ndarray:
    n = xs.size
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a = UOp.param(1, dt.ptr(n)).index(i).load()
    srcs = [a] if other is None else [a, UOp.param(2, dt.ptr(n)).index(i).load()]
    val = a.alu(op, *srcs[1:])
    out = UOp.param(0, val.dtype.ptr(n))
    ast = UOp.sink(out.index(i).store(val).end(i), arg=KernelInfo(f"k_{op.name}"))
    with Context(SPEC=1):
        uops = full_rewrite_to_sink(ast, BareRenderer(), optimize=True)
    assert not any(u.op is op for u in uops), f"{op} was not decomposed"
    res = np.zeros(n, dtype=storage_np(val.dtype))
    bufs = [res, xs.astype(storage_np(dt))] + ([other.astype(storage_np(dt))] if other is not None else [])
    run_program(uops, bufs, {})
    return res


def max_ulp(got: np.ndarray, ref: np.ndarray, npt: type) -> float:
    r = ref.astype(npt)
    ok = np.isfinite(r) & (r != 0)
    sp = np.spacing(np.abs(r[ok])).astype(np.float64)
    return float(np.max(np.abs(got[ok].astype(np.float64) - ref[ok].astype(np.float64)) / sp))


RNG = np.random.default_rng(1234)
CASES = [
    (Ops.EXP2, np.float32, np.concatenate([np.linspace(-160, 130, 40001), RNG.uniform(-1, 1, 5000)]), 2.0),
    (Ops.EXP2, np.float64, np.concatenate([np.linspace(-1080, 1030, 40001), RNG.uniform(-1, 1, 5000)]), 2.0),
    (
        Ops.LOG2,
        np.float32,
        np.concatenate([np.exp(RNG.uniform(-100, 88, 40000)), np.linspace(0.5, 2, 5001), [1e-40, 1e-45, 3e38]]),
        3.0,
    ),  # fmt: skip
    (
        Ops.LOG2,
        np.float64,
        np.concatenate([np.exp(RNG.uniform(-740, 700, 40000)), np.linspace(0.5, 2, 5001), [5e-324, 1e-310]]),
        3.0,
    ),  # fmt: skip
    (Ops.SIN, np.float32, np.concatenate([RNG.uniform(-6e6, 6e6, 40000), np.linspace(-10, 10, 5001)]), 1.0),
    (Ops.SIN, np.float64, np.concatenate([RNG.uniform(-6e6, 6e6, 40000), np.linspace(-10, 10, 5001)]), 2.0),
]
REF = {Ops.EXP2: np.exp2, Ops.LOG2: np.log2, Ops.SIN: np.sin}


@pytest.mark.parametrize("op,npt,xs,bound", CASES, ids=[f"{c[0].name}-{c[1].__name__}" for c in CASES])
def test_transcendental_within_documented_ulps(op: Ops, npt: type, xs: np.ndarray, bound: float) -> None:
    dt = dtypes.float32 if npt is np.float32 else dtypes.float64
    xs = xs.astype(npt)
    with np.errstate(all="ignore"):
        ref = REF[op](xs.astype(np.longdouble))
    got = run_unary(op, xs, dt)
    assert max_ulp(got, ref, npt) <= bound


@pytest.mark.parametrize("npt", [np.float32, np.float64])
def test_transcendental_specials(npt: type) -> None:
    dt = dtypes.float32 if npt is np.float32 else dtypes.float64
    sp = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 2000.0, -2000.0, -1.0], dtype=npt)
    with np.errstate(all="ignore"):
        for op in (Ops.EXP2, Ops.LOG2, Ops.SIN):
            want = REF[op](sp.astype(np.float64)).astype(npt)
            got = run_unary(op, sp, dt)
            keep = ~((op is Ops.SIN) & (np.abs(sp) == 2000))  # sin(2000) is no special; covered by the ulp test
            np.testing.assert_array_equal(got[keep], want[keep])


def test_pow_follows_c_sign_rules() -> None:
    x = np.array([2.0, -2.0, -2.0, 0.0, 0.0, 0.0, 5.0, -8.0, 1.5, np.nan], dtype=np.float32)
    y = np.array([3.0, 3.0, 2.0, 2.0, 0.0, -1.0, 0.0, 1 / 3, -2.5, 0.0], dtype=np.float32)
    got = run_unary(Ops.POW, x, dtypes.float32, y)
    with np.errstate(all="ignore"):
        want = np.power(x.astype(np.float64), y.astype(np.float64))
    np.testing.assert_allclose(got, want, rtol=1e-6, equal_nan=True)


def test_threefry_matches_reference() -> None:
    n = 257
    xs = RNG.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(2) + RNG.integers(0, 2, n, dtype=np.uint64)
    keys = RNG.integers(0, 2**63, n, dtype=np.uint64) * np.uint64(3)
    got = run_unary(Ops.THREEFRY, xs, dtypes.uint64, keys)
    want = np.array([threefry2x32(int(a), int(k)) for a, k in zip(xs, keys)], dtype=np.uint64)
    np.testing.assert_array_equal(got, want)


@settings(deadline=None)
@given(st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=40), st.integers(0, 2**64 - 1))
def test_threefry_numpy_matches_reference(xs: list[int], key: int) -> None:
    """The interpreter's vectorized THREEFRY (speck.codegen.numeric, uint32 words) is the reference bit for bit, for
    arrays and for 0-d counters (no numpy overflow warnings either way)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = nm.threefry2x32(np.array(xs, dtype=np.uint64), np.uint64(key))
        got0 = nm.threefry2x32(np.array(xs[0], dtype=np.uint64), np.array(key, dtype=np.uint64))
    assert got.dtype == np.uint64 and got.shape == (len(xs),) and got0.shape == ()
    assert [int(v) for v in got] == [threefry2x32(x, key) for x in xs]
    assert int(got0) == threefry2x32(xs[0], key)


def test_mulacc_and_half_promotion() -> None:
    a = RNG.uniform(-4, 4, 64).astype(np.float16)
    got = run_unary(Ops.EXP2, a, dtypes.float16)
    want = np.exp2(a.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(got.view(np.float16), want)
