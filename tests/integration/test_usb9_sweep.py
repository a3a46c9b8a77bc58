"""A hypothesis-driven differential sweep of the AMD (RDNA3) code generation on USB:SIM: every kernel is compiled by
the AMD backend, dispatched with PM4 through the simulated ASM2464 bridge and executed instruction by instruction by
the RDNA3 emulator. Each example is checked against numpy where numpy defines the same result (wrapping integer
arithmetic, bitwise ops, comparisons, float math within a tolerance) and against the CPU device bit for bit
otherwise (casts of out-of-range floats, truncating division, bitcasts). Shapes are small and the number of
examples is bounded: the emulator interprets every instruction."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speck.tensor import Device, Tensor, dtypes
from speck.tensor.usb import UsbDevice
from speck.uop import DType

USB = "USB:SIM"
SWEEP = settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)

INTS: dict[DType, type] = {
    dtypes.int8: np.int8, dtypes.int16: np.int16, dtypes.int32: np.int32, dtypes.int64: np.int64,
    dtypes.uint8: np.uint8, dtypes.uint16: np.uint16, dtypes.uint32: np.uint32, dtypes.uint64: np.uint64,
}  # fmt: skip
FLOATS = [dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64]
ALL = [*FLOATS, *INTS, dtypes.bool]


@pytest.fixture(scope="module", autouse=True)
def dev() -> Iterator[UsbDevice]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SPECK_USB_SIM", "1")
        d = Device[USB]
        assert isinstance(d, UsbDevice) and d.gpu.sim is not None
        yield d
        assert d.gpu.sim.violations == []


def dispatches(d: UsbDevice) -> int:
    return int(d.gpu._engine_compute().stats["dispatches"])


def on_both(fn: Callable[[str], Tensor], gpu: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """fn's result on USB:SIM (with `gpu`, it must have run a kernel on the GPU) and on the CPU."""
    d = Device[USB]
    assert isinstance(d, UsbDevice)
    before = dispatches(d)
    got = fn(USB).numpy()
    assert not gpu or dispatches(d) > before, "nothing was computed on the GPU"
    want = fn("CPU").numpy()
    assert (got.shape, got.dtype) == (want.shape, want.dtype)
    return got, want


def close(got: np.ndarray, want: np.ndarray, rtol: float, atol: float) -> None:
    g, w = got.astype(np.float64), want.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg="NaN positions")
    np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)


def int_values(np_dt: type, n: int) -> st.SearchStrategy[np.ndarray]:
    info = np.iinfo(np_dt)
    edges = [int(info.min), int(info.max), 0, 1, int(info.max) // 2 + 1]
    if info.min < 0:
        edges += [-1, int(info.min) + 1]
    one = st.one_of(st.sampled_from(edges), st.integers(int(info.min), int(info.max)))
    return st.lists(one, min_size=n, max_size=n).map(lambda v: np.array(v, dtype=np_dt))


# (name, Tensor op, numpy op or None for "CPU only") on two operands of one integer dtype
INT_OPS: list[tuple[str, Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray] | None]] = [
    ("add", lambda a, b: a + b, lambda a, b: a + b),
    ("sub", lambda a, b: a - b, lambda a, b: a - b),
    ("mul", lambda a, b: a * b, lambda a, b: a * b),
    ("and", lambda a, b: a & b, lambda a, b: a & b),
    ("or", lambda a, b: a | b, lambda a, b: a | b),
    ("xor", lambda a, b: a ^ b, lambda a, b: a ^ b),
    ("lt", lambda a, b: a < b, lambda a, b: a < b),
    ("eq", lambda a, b: a == b, lambda a, b: a == b),
    ("max", lambda a, b: a.maximum(b), np.maximum),
    ("min", lambda a, b: a.minimum(b), np.minimum),
    ("where", lambda a, b: (a > b).where(a, b), lambda a, b: np.where(a > b, a, b)),
    ("floordiv", lambda a, b: a // b, None),
    ("mod", lambda a, b: a % b, None),
    ("truncdiv", lambda a, b: a.div(b, rounding_mode="trunc"), None),
    ("shl", lambda a, b: a << (b & 7), None),
    ("shr", lambda a, b: a >> (b & 7), None),
]


@SWEEP
@given(st.data(), st.sampled_from(list(INTS)), st.sampled_from(INT_OPS), st.sampled_from([1, 7, 33]))
def test_integer_ops_match_numpy_and_the_cpu(data: st.DataObject, dt: DType, op: tuple, n: int) -> None:
    name, fn, ref = op
    np_dt = INTS[dt]
    a = data.draw(int_values(np_dt, n), label="a")
    b = data.draw(int_values(np_dt, n), label="b")
    if name in ("floordiv", "mod", "truncdiv"):
        b[b == 0] = 3  # division by zero is undefined on both devices
    got, want = on_both(lambda d: fn(Tensor(a, device=d), Tensor(b, device=d)))
    np.testing.assert_array_equal(got, want, err_msg=f"{name} {dt} vs CPU")
    if ref is not None:
        with np.errstate(over="ignore"):
            np.testing.assert_array_equal(got, ref(a, b), err_msg=f"{name} {dt} vs numpy")
    if name == "truncdiv":  # C semantics, computed exactly on Python ints (wrapping like the dtype)
        exact = [(abs(x) // abs(y)) * (1 if (x < 0) == (y < 0) else -1) for x, y in zip(a.tolist(), b.tolist())]
        np.testing.assert_array_equal(got, np.array(exact, dtype=object).astype(np.int64).astype(np_dt))


SPECIAL = [0.0, -0.0, 0.5, -0.5, 1.5, -2.5, 127.5, 128.0, -129.0, 255.9, 256.0, 32768.0, 65535.5, 65536.0, 2.0**31,
           -(2.0**31) - 1, 2.0**32, 2.0**63, -(2.0**63), 2.0**64, 1e20, -1e20,
           float("inf"), float("-inf"), float("nan")]  # fmt: skip


@SWEEP
@given(st.data(), st.sampled_from(ALL))
def test_casts_between_every_dtype_pair_equal_the_cpu_bit_for_bit(data: st.DataObject, src: DType) -> None:
    """Out-of-range float -> int included: whatever the rule, USB:SIM and the CPU must agree, never diverge."""
    dst = data.draw(st.sampled_from([t for t in ALL if t != src]), label="dst")  # (a cast to itself is no kernel)
    if src in INTS:
        vals = data.draw(int_values(INTS[src], 9), label="values")
        make: Callable[[str], Tensor] = lambda d: Tensor(vals, device=d)
    elif src == dtypes.bool:
        bits = data.draw(st.lists(st.booleans(), min_size=5, max_size=5), label="values")
        make = lambda d: Tensor(bits, dtype=dtypes.bool, device=d)
    else:
        picked = data.draw(st.lists(st.sampled_from(SPECIAL), min_size=9, max_size=9), label="values")
        make = lambda d: Tensor(picked, dtype=dtypes.float32, device=d).cast(src)
    got, want = on_both(lambda d: make(d).cast(dst))
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{src} -> {dst}")


@SWEEP
@given(st.data(), st.sampled_from(list(INTS)))
def test_bitcast_round_trips_bit_for_bit(data: st.DataObject, dt: DType) -> None:
    a = data.draw(int_values(INTS[dt], 7), label="a")
    same = [t for t in [dtypes.float16, dtypes.float32, dtypes.float64, *INTS] if t.itemsize == dt.itemsize]
    to = data.draw(st.sampled_from(same), label="to")
    got, want = on_both(lambda d: Tensor(a, device=d).bitcast(to) + 0)
    np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8))
    np.testing.assert_array_equal(Tensor(a, device=USB).bitcast(to).bitcast(dt).numpy(), a)


FLOAT_OPS: list[tuple[str, Callable[[Tensor, Tensor], Tensor], Callable[[np.ndarray, np.ndarray], np.ndarray]]] = [
    ("exp2", lambda a, b: a.exp2(), np.exp2),
    ("log2", lambda a, b: a.abs().log2(), lambda a, b: np.log2(np.abs(a))),
    ("sin", lambda a, b: a.sin(), np.sin),
    ("cos", lambda a, b: a.cos(), np.cos),
    ("sqrt", lambda a, b: a.abs().sqrt(), lambda a, b: np.sqrt(np.abs(a))),
    ("reciprocal", lambda a, b: a.reciprocal(), lambda a, b: 1 / a),
    ("pow", lambda a, b: a.abs().pow(b), lambda a, b: np.abs(a) ** b),
    ("erf", lambda a, b: a.erf(), lambda a, b: np.vectorize(__import__("math").erf)(a)),
    ("div", lambda a, b: a / b, lambda a, b: a / b),
    ("sigmoid", lambda a, b: a.sigmoid(), lambda a, b: 1 / (1 + np.exp(-a))),
    ("floor", lambda a, b: a.floor(), np.floor),
    ("lt", lambda a, b: a < b, lambda a, b: a < b),
]


@SWEEP
@given(
    st.data(), st.sampled_from([dtypes.float32, dtypes.float16, dtypes.float64]), st.sampled_from(FLOAT_OPS),
    st.sampled_from([1, 7, 33]),
)  # fmt: skip
def test_float_ops_and_transcendentals_match_numpy(data: st.DataObject, dt: DType, op: tuple, n: int) -> None:
    name, fn, ref = op
    finite = st.floats(-20.0, 20.0, allow_nan=False, width=16 if dt == dtypes.float16 else 32)
    a = np.array(data.draw(st.lists(finite, min_size=n, max_size=n), label="a"), np.float32)
    b = np.array(
        data.draw(st.lists(finite.filter(lambda v: abs(v) > 0.25), min_size=n, max_size=n), label="b"), np.float32
    )
    a[np.abs(a) < 1e-3] = 0.75  # away from log2(0) / 1/0 so numpy's reference is finite
    np_dt = {dtypes.float32: np.float32, dtypes.float16: np.float16, dtypes.float64: np.float64}[dt]
    a, b = a.astype(np_dt), b.astype(np_dt)
    got, want = on_both(lambda d: fn(Tensor(a, device=d), Tensor(b, device=d)))
    rtol = 1e-2 if dt == dtypes.float16 else 2e-5
    if got.dtype == np.bool_:
        np.testing.assert_array_equal(got, ref(a, b))
        return
    close(got, want, rtol, 1e-5)
    with np.errstate(all="ignore"):
        expect = ref(a.astype(np.float64), b.astype(np.float64))
    finite_ref = np.isfinite(expect) & (np.abs(expect) < np.finfo(np_dt).max)
    close(got[finite_ref], expect[finite_ref], rtol * 2, 1e-5 if dt != dtypes.float16 else 2e-3)


@SWEEP
@given(
    st.data(), st.sampled_from([(1,), (7,), (33,), (1023,), (3, 7), (5, 1, 9), (2, 33)]),
    st.sampled_from(["sum", "max", "min", "prod", "mean", "argmax", "cumsum"]),
    st.sampled_from([dtypes.float32, dtypes.int32]),
)  # fmt: skip
def test_reductions_over_odd_sizes_and_every_axis_match_numpy(
    data: st.DataObject, shape: tuple[int, ...], op: str, dt: DType
) -> None:
    axis = data.draw(
        st.sampled_from([None, *range(len(shape))]) if op != "cumsum" else st.sampled_from(range(len(shape)))
    )
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    x = rng.uniform(0.5, 1.5, shape) if op == "prod" else rng.standard_normal(shape) * 10
    x = x.astype(np.float32) if dt == dtypes.float32 else np.round(x).astype(np.int32)
    reduced = x.size if axis is None else shape[axis]
    got, want = on_both(lambda d: getattr(Tensor(x, device=d), op)(axis), gpu=reduced > 1)  # (of 1: a view)
    ref = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod, "mean": np.mean, "argmax": np.argmax,
           "cumsum": np.cumsum}[op](x.astype(np.float64), axis=axis)  # fmt: skip
    close(got, want, 1e-5, 1e-4)
    close(got, ref, 1e-4, 1e-3)


@SWEEP
@given(st.integers(1, 9), st.integers(1, 33), st.integers(1, 9), st.integers(0, 2**16))
def test_matmul_of_odd_shapes_matches_numpy(m: int, k: int, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    got, want = on_both(lambda d: Tensor(a, device=d) @ Tensor(b, device=d))
    close(got, a.astype(np.float64) @ b, 1e-4, 1e-4)
    ai, bi = (a * 8).astype(np.int32), (b * 8).astype(np.int32)
    got_i, _ = on_both(lambda d: Tensor(ai, device=d) @ Tensor(bi, device=d))
    np.testing.assert_array_equal(got_i, ai @ bi)


def conv_ref(x: np.ndarray, w: np.ndarray, stride: int, pad: int) -> np.ndarray:
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    oh, ow = (h - kh) // stride + 1, (wd - kw) // stride + 1
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = x[:, :, i * stride : i * stride + kh, j * stride : j * stride + kw]
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, w)
    return out


@SWEEP
@given(
    st.integers(1, 3), st.integers(3, 8), st.integers(3, 7), st.integers(1, 3), st.integers(1, 3),
    st.integers(1, 2), st.integers(0, 2), st.integers(0, 2**16),
)  # fmt: skip
def test_conv2d_of_odd_shapes_matches_numpy(
    c: int, h: int, w: int, o: int, k: int, stride: int, pad: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    x, wt = rng.standard_normal((1, c, h, w)).astype(np.float32), rng.standard_normal((o, c, k, k)).astype(np.float32)
    got, want = on_both(lambda d: Tensor(x, device=d).conv2d(Tensor(wt, device=d), stride=stride, padding=pad))
    close(got, conv_ref(x, wt, stride, pad), 1e-4, 1e-4)


@SWEEP
@given(st.integers(0, 2**16), st.sampled_from([dtypes.float32, dtypes.int8, dtypes.uint16, dtypes.int64]))
def test_indexing_and_views_match_numpy(seed: int, dt: DType) -> None:
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((5, 7)) * 50).astype(np.float32)
    x = x if dt == dtypes.float32 else x.astype(INTS[dt])
    rows, cols = rng.integers(-5, 5, 4), rng.integers(-7, 7, 4)
    g_idx = rng.integers(0, 7, (5, 3))
    sc_idx = np.stack([rng.permutation(7)[:2] for _ in range(5)])

    def setitem(d: str) -> Tensor:
        t = Tensor(x, device=d).contiguous()
        t[1:4, 2:6] = Tensor(np.ones((3, 4), x.dtype), device=d)
        t[:, -1] = 3
        return t

    views: list[tuple[Callable[[str], Tensor], np.ndarray]] = [
        (lambda d: Tensor(x, device=d)[1:4, ::2] + 1, x[1:4, ::2] + 1),
        (lambda d: Tensor(x, device=d)[::-1, 5:1:-2] + 0, x[::-1, 5:1:-2]),
        (lambda d: Tensor(x, device=d)[Tensor(rows, device=d), Tensor(cols, device=d)], x[rows, cols]),
        (lambda d: Tensor(x, device=d).gather(1, Tensor(g_idx, device=d)), np.take_along_axis(x, g_idx, 1)),
        (lambda d: Tensor(x, device=d).pad(((1, 2), (3, 0)), value=2), np.pad(x, ((1, 2), (3, 0)), constant_values=2)),
        (lambda d: Tensor(x, device=d).shrink(((1, 4), (2, 3))) * 1, x[1:4, 2:3]),
        (lambda d: Tensor(x[:, :1], device=d).expand(5, 9) + 0, np.broadcast_to(x[:, :1], (5, 9))),
        (setitem, None),
    ]
    for i, (fn, ref) in enumerate(views):
        got, want = on_both(fn)
        np.testing.assert_array_equal(got, want, err_msg=f"view {i}")
        if ref is not None:
            np.testing.assert_array_equal(got, ref.astype(got.dtype), err_msg=f"view {i} vs numpy")
    src = np.full((5, 2), 9, x.dtype)
    got, _ = on_both(lambda d: Tensor(x, device=d).scatter(1, Tensor(sc_idx, device=d), Tensor(src, device=d)))
    ref = x.copy()
    np.put_along_axis(ref, sc_idx, src, 1)
    np.testing.assert_array_equal(got, ref)


# the copy pipeline moves 240 KiB chunks (and stages files in 16 MiB pieces): sizes on and around the boundaries
@pytest.mark.parametrize("nbytes", [240 * 1024 - 4, 240 * 1024, 240 * 1024 + 4, 480 * 1024 + 12, 1 << 20 | 4])
def test_buffers_crossing_the_copy_chunks_arrive_and_compute_exactly(nbytes: int) -> None:
    x = np.random.default_rng(nbytes).integers(-(2**31), 2**31 - 1, nbytes // 4, dtype=np.int32)
    t = Tensor(x, device=USB)
    np.testing.assert_array_equal(t.numpy(), x)
    np.testing.assert_array_equal((t ^ 0x5A5A5A5A).numpy(), x ^ 0x5A5A5A5A)
    np.testing.assert_array_equal(t[1:-1].contiguous().numpy(), x[1:-1])  # an unaligned view of it
