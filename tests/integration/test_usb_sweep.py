"""A differential sweep of the tensor ops a user hits, on USB:SIM against the CPU: every kernel is compiled by the AMD
backend, dispatched with PM4 and run instruction by instruction in the RDNA3 emulator, and its result must equal the
CPU's (bit for bit for integers and bools, within a tolerance for floats, NaN where the CPU has NaN).

What it covers: elementwise integer ops of every integer dtype on the values at the edges of its range (overflowing
add/mul, shifts, bitwise, comparisons, truncating and flooring division and modulo with negative operands), float
ops of every float dtype on special values (signed zeros, denormals, infinities, NaN, halfway cases of rounding),
transcendentals, a cast between every pair of dtypes (fp8 included), reductions longer than one workgroup and NaN in
reductions, sort/topk, gather and scatter_reduce, masked ops, int64 index math, pad modes, pooling, interpolation,
normalisation, attention, einsum, convolutions, random numbers for the same seed, odd sizes and unaligned views
(the tails of vector loads), gradients and TinyJit replays with a symbolic size.

Shapes are small (the emulator interprets each instruction) and the ops of one case are stacked into one kernel
where they can be."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest

from speck.tensor import Context, Tensor, TinyJit, Variable, dtypes
from speck.tensor.usb import UsbDevice
from speck.uop import DType

pytestmark = pytest.mark.usefixtures("two_simulated_bridges")

USB = "USB:SIM"
Case = Callable[[str], "Tensor | Sequence[Tensor]"]


def dispatches(d: UsbDevice) -> int:
    return int(d.gpu._engine_compute().stats["dispatches"])


def _read(out: Tensor | Sequence[Tensor]) -> list[np.ndarray]:
    outs = [out] if isinstance(out, Tensor) else list(out)
    Tensor.realize(*outs)
    return [o.numpy() for o in outs]


def check(d: UsbDevice, fn: Case, rtol: float = 1e-5, atol: float = 1e-6, gpu: bool = True) -> None:
    """fn on USB:SIM equals fn on the CPU: exact for integers and bools, within rtol/atol for floats (looser for the
    16-bit and 8-bit floats), NaN exactly where the CPU has NaN. With `gpu`, at least one kernel ran on the GPU."""
    want = _read(fn("CPU"))
    before = dispatches(d)
    got = _read(fn(USB))
    assert not gpu or dispatches(d) > before, "nothing was computed on the GPU"
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.shape, g.dtype) == (w.shape, w.dtype), (i, g.shape, g.dtype, w.shape, w.dtype)
        if w.dtype.kind == "f" or w.dtype.kind == "V":
            small = w.dtype.itemsize <= 2 or w.dtype.kind == "V"
            tol = max(rtol, 1e-2) if small else rtol
            gf, wf = g.astype(np.float64), w.astype(np.float64)
            np.testing.assert_array_equal(np.isnan(gf), np.isnan(wf), err_msg=f"output {i}: NaN positions")
            np.testing.assert_allclose(gf, wf, rtol=tol, atol=max(atol, tol if small else atol), err_msg=f"out {i}")
        else:
            np.testing.assert_array_equal(g, w, err_msg=f"output {i}")


def T(a: object, d: str, dt: DType | None = None) -> Tensor:
    return Tensor(a, device=d, dtype=dt)


def rnd(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def rint(lo: int, hi: int, *shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(lo, hi, shape)


# ---------------- integers at the edges of their range ----------------
INTS = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
        dtypes.uint64]  # fmt: skip
NP: dict[DType, Any] = {dtypes.int8: np.int8, dtypes.uint8: np.uint8, dtypes.int16: np.int16, dtypes.uint16: np.uint16,
      dtypes.int32: np.int32, dtypes.uint32: np.uint32, dtypes.int64: np.int64, dtypes.uint64: np.uint64}  # fmt: skip


def edges(dt: DType) -> np.ndarray:
    info = np.iinfo(NP[dt])
    mid = [0, 1, 2, 3, 7, 100] if info.min == 0 else [-100, -7, -3, -1, 0, 1, 3, 7, 100]
    vals = [info.min, info.min + 1, info.max - 1, info.max, info.max // 2, info.max // 2 + 1, *mid]
    if info.min < 0:
        vals += [info.min // 2, info.min // 2 - 1]
    return np.array(vals, NP[dt])


def _int_ops(dt: DType) -> Case:
    a = edges(dt)
    b = np.roll(a, 5)

    def ops(d: str) -> Tensor:
        x, y = T(a, d, dt), T(b, d, dt)
        sh = T(np.arange(len(a)) % 8, d, dt)  # variable shift amounts below the smallest width
        outs = [x + y, x - y, x * y, x.maximum(y), x.minimum(y), x & y, x | y, x ^ y, -x, ~x, x << 1, x >> 1, x << 5,
                x >> 3, x << sh, x >> sh, (x < y).cast(dt), (x <= y).cast(dt), (x == y).cast(dt), (x != y).cast(dt),
                (x > y).where(x, y), x.abs(), x.sign()]  # fmt: skip
        return Tensor.stack(*outs)

    return ops


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_int_ops_at_range_edges(dev: UsbDevice, dt: DType) -> None:
    check(dev, _int_ops(dt))


@pytest.mark.parametrize("dt", INTS, ids=str)
def test_int_division_and_modulo_with_negative_operands(dev: UsbDevice, dt: DType) -> None:
    a = edges(dt)
    b = np.roll(a, 3)
    b[b == 0] = 3
    if dtypes.is_unsigned(dt):
        b = np.concatenate([b, np.array([1, 2, 7], NP[dt])])
        a = np.concatenate([a, np.array([6, 6, 6], NP[dt])])
    else:
        b[(b == -1) & (a == np.iinfo(NP[dt]).min)] = -3  # MIN // -1 overflows (undefined)
        a = np.concatenate([a, np.array([-7, 7, -7, 7, -1, 1], NP[dt])])
        b = np.concatenate([b, np.array([2, -2, -2, 2, 3, -3], NP[dt])])
    check(dev, lambda d: Tensor.stack(T(a, d, dt) // T(b, d, dt), T(a, d, dt) % T(b, d, dt),
                                      T(a, d, dt).idiv(T(b, d, dt)), T(a, d, dt) // 7, T(a, d, dt) % 5))  # fmt: skip


def test_int64_index_math(dev: UsbDevice) -> None:
    i = rint(-50, 50, 5, 7)

    def ops(d: str) -> Sequence[Tensor]:
        x = T(i, d, dtypes.int64)
        big = Tensor.arange(35, device=d).reshape(5, 7).cast(dtypes.int64) * (2**33) + x
        return [big // 7, big % 1000003, (x * (2**33 + 1)) % T(np.where(i == 0, 3, i), d, dtypes.int64),
                (x << 40) >> 3, (T(np.abs(i), d, dtypes.uint32) * 100000000) // 7]  # fmt: skip

    check(dev, ops)


# ---------------- floats: special values, rounding, transcendentals ----------------
FLOATS = [dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]
SPECIAL = np.array([0, -0.0, 1, -1, 0.5, -0.5, 1.5, 2.5, -2.5, 3.7, -3.7, 1e-40, -1e-40, 6e-8, 65504, 65520, 1e5,
                    -1e5, 3e38, -3e38, np.inf, -np.inf, np.nan, 2**31, -(2**31), 1e20, 255.5, -128.5],
                   np.float32)  # fmt: skip


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_float_ops_on_special_values(dev: UsbDevice, dt: DType) -> None:
    def ops(d: str) -> Tensor:
        x = T(SPECIAL, d).cast(dt)
        y = x.flip(0)
        outs = [-x, x.abs(), x.floor(), x.ceil(), x.round(), x.trunc(), x.sign(), x.relu(), x + y, x - y, x * y,
                x / y, x.maximum(y), x.minimum(y), (x < y).cast(dt), (x == x).cast(dt), (x != y).cast(dt),
                x.isnan().cast(dt), x.isinf().cast(dt), (x > 1).where(x, y), x.reciprocal(), x.sqrt(),
                x * x]  # fmt: skip
        return Tensor.stack(*outs)

    check(dev, ops)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_transcendentals_per_float_dtype(dev: UsbDevice, dt: DType) -> None:
    a = np.concatenate([np.linspace(-4, 4, 11), [0, -0.0, 1e-4, 30, -30, 100]]).astype(np.float32)

    def ops(d: str) -> Tensor:
        x = T(a, d).cast(dt)
        p = x.abs() + 0.01
        t = x.tanh() * 0.99
        outs = [x.exp(), x.exp2(), p.log(), p.log2(), x.sin(), x.cos(), x.tanh(), x.sigmoid(), x.gelu(), x.silu(),
                x.erf(), p.rsqrt(), x.softplus(), t.asin(), x.atan(), x.sinh(), (x.abs() + 1).acosh(), t.atanh(),
                p.pow(x.clip(-3, 3)), x.elu(), x.mish()]  # fmt: skip
        return Tensor.stack(*outs).cast(dtypes.float32)

    # FP_CONTRACT=1 (the default) lets the GPU fuse a*b+c into one FMA where the CPU rounds twice: a 16-bit float
    # result may differ in its last bit (float16: 2**-11 relative, bfloat16: 2**-8)
    tol = {dtypes.float16: 2e-3, dtypes.bfloat16: 1e-2}.get(dt, 1e-5)
    check(dev, ops, rtol=tol, atol=tol)


def test_special_values_through_transcendentals_and_large_arguments(dev: UsbDevice) -> None:
    sp = np.array([0, -0.0, -1, 1e-40, np.inf, -np.inf, np.nan, 1, 88.7, -103, 1e4, -1e4], np.float32)
    check(dev, lambda d: Tensor.stack(T(sp, d).log(), T(sp, d).exp(), T(sp, d).sqrt(), T(sp, d).sin(),
                                      T(sp, d).tanh(), T(sp, d).sigmoid(), T(sp, d).log2(), T(sp, d).exp2()),
          rtol=1e-5, atol=1e-5)  # fmt: skip
    big = np.linspace(-1e4, 1e4, 97).astype(np.float32)
    check(dev, lambda d: Tensor.stack(T(big, d).sin(), T(big, d).cos()), rtol=1e-4, atol=1e-5)


# ---------------- casts between every pair of dtypes ----------------
FP8 = [dtypes.fp8e4m3, dtypes.fp8e5m2, dtypes.fp8e4m3fnuz, dtypes.fp8e5m2fnuz]
ALL = [dtypes.bool, *INTS, *FLOATS]
CAST_SRC = np.array([-300.7, -129.5, -128, -2.5, -1.5, -1, -0.5, -0.0, 0, 0.4, 0.5, 1, 1.5, 2.5, 100.5, 127, 127.9,
                     128, 255, 255.9, 256, 300.2, 65504, 1e6], np.float32)  # fmt: skip


def _source(src: DType, d: str) -> Tensor:
    if dtypes.is_float(src):
        return T(CAST_SRC, d).cast(src)
    if src == dtypes.bool:
        return T(CAST_SRC > 1, d)
    lo = 0 if dtypes.is_unsigned(src) else -129
    return T(np.clip(CAST_SRC, lo, 1e6).astype(np.int64), d).cast(src)  # wraps into src's range


def _in_range(src: DType, dst: DType, d: str) -> Tensor:
    """A float source restricted to values dst holds (a float out of an integer type's range is undefined)."""
    if not dtypes.is_float(src) or dtypes.is_float(dst) or dst == dtypes.bool:
        return _source(src, d)
    info = np.iinfo(NP[dst])
    vals = CAST_SRC[(CAST_SRC > info.min - 1) & (CAST_SRC < info.max + 1)]
    return T(vals, d).cast(src)


@pytest.mark.parametrize("src", ALL + FP8, ids=str)
def test_cast_to_every_dtype(dev: UsbDevice, src: DType) -> None:
    targets = [t for t in ALL + FP8 if t != src]
    if src in FP8:  # fp8 holds only small values: cast the in-range part
        check(dev, lambda d: [T(CAST_SRC[np.abs(CAST_SRC) < 200], d).cast(src).cast(t) for t in targets])
    else:
        check(dev, lambda d: [_in_range(src, t, d).cast(t) for t in targets])


def test_fp8_round_trip_and_saturation(dev: UsbDevice) -> None:
    a = np.array([0, -0.0, 1e-3, 0.0039, 0.00195, 2e-7, 240, -240, 448, 500, 57344, -60000, 1e5, np.inf, -np.inf,
                  np.nan, 3.3, -7.7], np.float32)  # fmt: skip
    check(dev, lambda d: [T(a, d).cast(f).cast(dtypes.float32) for f in FP8])


# ---------------- reductions, scans, sorting ----------------
BIG = rnd(3, 1000)
REDUCES: dict[str, Callable[[Tensor], Any]] = {
    "sum": lambda x: x.sum(), "sum1": lambda x: x.sum(1), "max": lambda x: x.max(), "min0": lambda x: x.min(0),
    "argmax": lambda x: x.argmax(), "argmax1": lambda x: x.argmax(1), "argmin0": lambda x: x.argmin(0),
    "prod": lambda x: (x * 0.01 + 1).prod(1), "mean": lambda x: x.mean(), "var": lambda x: x.var(1),
    "std0": lambda x: x.std(0), "logsumexp": lambda x: x.logsumexp(1), "any": lambda x: (x > 2).any(1),
    "all": lambda x: (x > -3).all(1), "softmax": lambda x: x.softmax(1), "log_softmax": lambda x: x.log_softmax(0),
    "cumsum": lambda x: x.cumsum(1), "cumprod": lambda x: (x * 0.01 + 1).cumprod(1), "cummax": lambda x: x.cummax(1),
    "cummin": lambda x: x.cummin(0),
}  # fmt: skip


@pytest.mark.parametrize("name", list(REDUCES))
def test_reductions_longer_than_a_workgroup(dev: UsbDevice, name: str) -> None:
    # summation order differs (the GPU splits a row across work-items): cumulative sums of 1000 terms differ by ~1e-5
    check(dev, lambda d: REDUCES[name](T(BIG, d)), rtol=1e-4, atol=5e-5)


@pytest.mark.parametrize("dt", [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32,
                                dtypes.int64, dtypes.float16, dtypes.float64], ids=str)  # fmt: skip
def test_reductions_per_dtype(dev: UsbDevice, dt: DType) -> None:
    a = rint(-100, 100, 9, 131, seed=1)

    def ops(d: str) -> list[Tensor]:
        x = T(a, d).cast(dt)
        return [x.sum(1), x.max(0), x.min(1), x.argmax(1), x.argmin(0), x.cumsum(1), x.sum()]

    check(dev, ops, rtol=2e-3 if dt == dtypes.float16 else 1e-5)


@pytest.mark.parametrize("dt", FLOATS, ids=str)
def test_nan_and_inf_in_reductions(dev: UsbDevice, dt: DType) -> None:
    a = rnd(6, 50, seed=2)
    a[1, 7], a[2, 3], a[3, 9], a[4, :], a[5, 10], a[5, 11] = np.nan, np.inf, -np.inf, np.nan, np.nan, np.inf

    def ops(d: str) -> list[Tensor]:
        x = T(a, d).cast(dt)
        return [x.max(1), x.min(1), x.sum(1), x.argmax(1), x.argmin(1), x.prod(1), x.cumsum(1), x.softmax(1),
                x.max(), x.relu(), x.clip(-1, 1), x.sort(1)[0], x.topk(3)[0], x.maximum(0), x.minimum(x.flip(1)),
                x.mean(1), x.logsumexp(1), x.bool().any(1), x.reshape(1, 6, 5, 10).max_pool2d()]  # fmt: skip

    check(dev, ops)


def test_sort_topk_argsort(dev: UsbDevice) -> None:
    f, i = rnd(5, 37, seed=3), rint(-20, 20, 5, 37, seed=3)  # many ties in the ints
    check(dev, lambda d: [*T(f, d).sort(1), *T(f, d).sort(0, descending=True), *T(f, d).topk(4), *T(i, d).sort(1),
                          T(i, d).argsort(1), *T(f, d).topk(3, dim=0, largest=False)])  # fmt: skip


# ---------------- matmul, einsum, convolutions ----------------
def test_matmuls(dev: UsbDevice) -> None:
    a, b = rnd(13, 17), rnd(17, 11, seed=1)
    ia, ib = rint(-50, 50, 9, 12), rint(-50, 50, 12, 5, seed=1)
    check(dev, lambda d: [T(a, d) @ T(b, d), T(a, d).half() @ T(b, d).half(), T(a, d).double() @ T(b, d).double(),
                          T(ia, d, dtypes.int32) @ T(ib, d, dtypes.int32),
                          T(ia, d, dtypes.int8) @ T(ib, d, dtypes.int8),
                          T(rnd(3, 5, 7), d) @ T(rnd(3, 7, 4), d), T(rnd(67, 95), d) @ T(rnd(95, 33), d),
                          T(rnd(65, 129), d) @ T(rnd(129), d)], rtol=1e-4, atol=1e-4)  # fmt: skip


def test_int8_dot_products(dev: UsbDevice) -> None:
    """Sums of int8/uint8 products, which LLVM selects v_dot4_u32_u8 / v_dot4_i32_iu8 (neg_lo signedness) for."""
    a, b = rint(-128, 128, 5, 64), rint(0, 256, 5, 64, seed=1)

    def ops(d: str) -> list[Tensor]:
        x, y = T(a, d).cast(dtypes.int8), T(b, d).cast(dtypes.uint8)
        i32 = dtypes.int32
        return [(x.cast(i32) * x.cast(i32)).sum(1), (x.cast(i32) * y.cast(i32)).sum(1),
                (y.cast(i32) * y.cast(i32)).sum(1), x.matmul(x.T, dtype=i32), y.matmul(y.T, dtype=dtypes.uint32),
                x @ x.T]  # fmt: skip

    check(dev, ops)


def test_einsum(dev: UsbDevice) -> None:
    check(dev, lambda d: [Tensor.einsum("ij,jk->ik", T(rnd(4, 5), d), T(rnd(5, 3), d)),
                          Tensor.einsum("bij,bkj->bik", T(rnd(2, 3, 4), d), T(rnd(2, 5, 4), d)),
                          Tensor.einsum("ii->i", T(rnd(4, 4), d)), Tensor.einsum("ij->", T(rnd(4, 6), d))],
          rtol=1e-5, atol=1e-5)  # fmt: skip


CONV: dict[str, Callable[[str], Tensor]] = {
    "stride_pad": lambda d: T(rnd(2, 3, 9, 9), d).conv2d(T(rnd(4, 3, 3, 3), d), padding=1, stride=2),
    "dilation": lambda d: T(rnd(2, 3, 9, 9), d).conv2d(T(rnd(4, 3, 3, 3), d), dilation=2),
    "groups": lambda d: T(rnd(1, 4, 6, 6), d).conv2d(T(rnd(4, 2, 3, 3), d), groups=2),
    "transposed": lambda d: T(rnd(2, 3, 5, 5), d).conv_transpose2d(T(rnd(3, 2, 3, 3), d), stride=2, padding=1),
}


@pytest.mark.parametrize("name", list(CONV))
def test_convolutions(dev: UsbDevice, name: str) -> None:
    check(dev, CONV[name], rtol=1e-4, atol=1e-5)


# ---------------- indexing, scatter, masks ----------------
def test_gather_embedding_one_hot_masks(dev: UsbDevice) -> None:
    f, b = rnd(5, 7), rint(0, 2, 5, 7).astype(bool)
    gi, gi64, emb = rint(0, 7, 5, 4).astype(np.int32), rint(0, 5, 3, 7), rint(0, 10, 4, 3).astype(np.int32)
    check(dev, lambda d: [T(f, d).gather(1, T(gi, d)), T(f, d).gather(0, T(gi64, d)), T(rnd(10, 6), d)[T(emb, d)],
                          T(emb, d).one_hot(10), T(f, d).masked_fill(T(b, d), -1e9),
                          T(b, d).where(T(f, d), 0)])  # fmt: skip
    # data-dependent shapes: the mask is read back, the selection computed on the GPU
    check(dev, lambda d: [T(f, d).masked_select(T(b, d)), T(f, d)[T(rint(0, 5, 6), d)]])


@pytest.mark.parametrize("reduce", ["sum", "prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(dev: UsbDevice, reduce: str, include_self: bool) -> None:
    idx = rint(0, 7, 5, 7, seed=2).astype(np.int32)
    check(dev, lambda d: T(rnd(5, 7), d).scatter_reduce(1, T(idx, d), T(rnd(5, 7, seed=1), d), reduce=reduce,
                                                        include_self=include_self))  # fmt: skip


def test_scatter_and_setitem(dev: UsbDevice) -> None:
    sidx = np.array([[0, 1, 2, 3, 4], [4, 3, 2, 1, 0]], np.int32)

    def ops(d: str) -> list[Tensor]:
        t = T(rnd(8, 5), d).contiguous()
        t[2:4] = T(np.full((2, 5), -1, np.float32), d)
        s = T(rint(-9, 9, 6, 5), d, dtypes.int8).contiguous()
        s[1::2, 1] = 100
        return [t, s, T(rnd(8, 5), d).scatter(0, T(sidx, d), T(rnd(2, 5), d))]

    check(dev, ops)


# ---------------- movement, padding, pooling, resizing, normalisation, attention ----------------
MOVES: dict[str, Callable[[Tensor], Tensor]] = {
    "pad_constant": lambda x: x.pad((1, 2, 2, 1), value=-3.0),
    "pad_reflect": lambda x: x.pad((1, 2, 2, 1), mode="reflect"),
    "pad_replicate": lambda x: x.pad((1, 2, 2, 1), mode="replicate"),
    "pad_circular": lambda x: x.pad((1, 2, 2, 1), mode="circular"), "maxpool": lambda x: x.max_pool2d(),
    "maxpool3s2": lambda x: x.max_pool2d(kernel_size=3, stride=2), "avgpool": lambda x: x.avg_pool2d(),
    "avgpool_pad": lambda x: x.avg_pool2d(kernel_size=3, stride=2, padding=1),
    "nearest": lambda x: x.interpolate((5, 13), mode="nearest"),
    "nearest_exact": lambda x: x.interpolate((5, 13), mode="nearest-exact"),
    "linear": lambda x: x.interpolate((5, 13), mode="linear"),
    "linear_align": lambda x: x.interpolate((5, 13), mode="linear", align_corners=True),
    "flip_roll": lambda x: x.flip(2).roll(3, 3), "permute": lambda x: x.permute(3, 1, 0, 2),
    "repeat": lambda x: x.repeat(1, 2, 1, 2), "repeat_interleave": lambda x: x.repeat_interleave(2, dim=1),
    "tril_triu": lambda x: x.tril(1) + x.triu(-1), "unfold": lambda x: x.flatten().unfold(0, 4, 3),
    "layernorm": lambda x: x.layernorm(), "batchnorm_train": lambda x: (x - x.mean((0, 2, 3), keepdim=True)) /
    (x.var((0, 2, 3), keepdim=True) + 1e-5).sqrt(),
}  # fmt: skip


@pytest.mark.parametrize("name", list(MOVES))
def test_movement_pooling_resizing_normalisation(dev: UsbDevice, name: str) -> None:
    x = rnd(2, 3, 9, 9, seed=4)
    check(dev, lambda d: MOVES[name](T(x, d)), rtol=1e-5, atol=1e-5)


def test_batchnorm_attention_losses(dev: UsbDevice) -> None:
    q, k, v = rnd(2, 4, 6, 8), rnd(2, 4, 6, 8, seed=1), rnd(2, 4, 6, 8, seed=2)
    logits, labels = rnd(5, 7), np.array([0, 3, 6, 2, 1], np.int32)
    mask = np.tril(np.ones((6, 6), bool))
    check(dev, lambda d: [T(rnd(2, 3, 4, 4), d).batchnorm(T(rnd(3), d), T(rnd(3), d), T(rnd(3), d),
                                                          (T(rnd(3), d) ** 2 + 1).rsqrt()),
                          T(q, d).scaled_dot_product_attention(T(k, d), T(v, d), is_causal=True),
                          T(q, d).scaled_dot_product_attention(T(k, d), T(v, d), attn_mask=T(mask, d)),
                          T(logits, d).cross_entropy(T(labels, d)), T(logits, d).log_softmax(1).nll_loss(T(labels, d)),
                          T(logits, d).sigmoid().binary_crossentropy(T(logits > 0, d).float())],
          rtol=1e-5, atol=1e-5)  # fmt: skip


# ---------------- random numbers for the same seed ----------------
def test_random_matches_cpu_for_the_same_seed(dev: UsbDevice) -> None:
    def rand(d: str) -> list[Tensor]:
        Tensor.manual_seed(3)
        outs = [Tensor.rand(5, 37, device=d), Tensor.randn(301, device=d),
                Tensor.randint(41, low=-5, high=100, device=d), Tensor.rand(33, device=d, dtype=dtypes.float16),
                Tensor.randperm(20, device=d), T(np.abs(rnd(3, 6)), d).multinomial(4, replacement=True),
                Tensor.kaiming_uniform(6, 7, device=d)]  # fmt: skip
        with Tensor.train():
            outs.append(T(rnd(5, 7), d).dropout(0.5))
        return outs

    check(dev, rand)


# ---------------- odd sizes, unaligned views: the tails of vector loads ----------------
ODD_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.int64, dtypes.uint64,
              dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]  # fmt: skip


@pytest.mark.parametrize("dt", ODD_DTYPES, ids=str)
def test_odd_sizes_and_unaligned_views(dev: UsbDevice, dt: DType) -> None:
    def ops(d: str) -> list[Tensor]:
        outs = []
        base = T(rint(-100, 100, 1100, seed=5), d).cast(dt).realize()
        for n, off in ((1, 0), (3, 1), (17, 2), (1001, 3)):
            x, y = base[off : off + n], base[off + 1 : off + n + 1]
            outs.append((x ^ y) | x if dt == dtypes.bool else x * y + x)
            outs.append(x.maximum(y))
        outs.append(base[5:155].reshape(10, 15).max(1))
        outs.append(base[1:100].reshape(-1, 11).T.contiguous())
        return outs

    check(dev, ops, rtol=1e-2 if dt in (dtypes.float16, dtypes.bfloat16) else 1e-6)


# ---------------- gradients ----------------
GRADS: dict[str, tuple[Callable[..., Tensor], tuple[tuple[int, ...], ...]]] = {
    "unary": (lambda x: x.exp() + x.tanh() + x.sigmoid() + x.gelu() + x.abs() + x.relu() * x.sin(), ((9, 13),)),
    "binary": (lambda x, y: x * y + x / (y.abs() + 0.5) + x.maximum(y) + (x.abs() + 0.5) ** y, ((9, 13), (9, 13))),
    "reduce": (lambda x: x.max(0) + x.std(0) + x.logsumexp(0) + x.cumsum(0)[-1], ((9, 13),)),
    "softmax_layernorm": (lambda x: x.softmax(1) + x.layernorm(), ((9, 13),)),
    "movement": (lambda x: x.pad((1, 2, 3, 4), mode="reflect")[2:7, ::-2].repeat(2, 1) * 2, ((9, 13),)),
    "gather_sort": (lambda x: x.gather(1, Tensor(rint(0, 13, 9, 4), device=x.device)) + x.sort(1)[0][:, :4],
                    ((9, 13),)),
    "matmul": (lambda x, y: x @ y.T, ((9, 13), (7, 13))),
    "conv": (lambda x, w: x.conv2d(w, padding=(1, 2), stride=(2, 1), groups=2), ((2, 4, 9, 10), (6, 2, 3, 3))),
    "pool_interp": (lambda x: x.max_pool2d().interpolate((5, 7), mode="linear") + x.avg_pool2d(3, 2)[:, :, :4, :4].
                    interpolate((5, 7)), ((1, 2, 9, 10),)),
    "attention": (lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True), ((2, 3, 7, 8),) * 3),
    "embedding": (lambda w: w[Tensor(rint(0, 10, 4, 6), device=w.device)], ((10, 8),)),
    "scatter_reduce": (lambda x, s: x.scatter_reduce(1, Tensor(rint(0, 13, 9, 5), device=x.device), s, reduce="sum"),
                       ((9, 13), (9, 5))),
}  # fmt: skip


@pytest.mark.parametrize("name", list(GRADS))
def test_gradients(dev: UsbDevice, name: str) -> None:
    fn, shapes = GRADS[name]

    def run(d: str) -> list[Tensor]:
        ts = [T(rnd(*s, seed=i), d).requires_grad_() for i, s in enumerate(shapes)]
        out = fn(*ts)
        (out * T(rnd(*[s for s in out.shape if isinstance(s, int)], seed=9), d)).sum().backward()
        return [out, *(t.grad for t in ts if t.grad is not None)]

    check(dev, run, rtol=1e-4, atol=1e-5)


# ---------------- TinyJit replays, a symbolic size ----------------
def test_tinyjit_replays_with_new_inputs_and_a_symbolic_size(dev: UsbDevice) -> None:
    def run(d: str) -> list[Tensor]:
        @TinyJit
        def f(x: Tensor, y: Tensor) -> Tensor:
            return ((x @ y).relu() + x.sum()).realize()

        @TinyJit
        def g(x: Tensor) -> Tensor:
            return (x * 2 + 1).sum(0).realize()

        outs = [f(T(rnd(6, 6, seed=i), d), T(rnd(6, 6, seed=i + 10), d)).numpy() for i in range(4)]
        base = T(rnd(20, 3), d).realize()
        outs += [g(base[: Variable("n", 1, 20).bind(n)]).numpy() for n in (3, 7, 11, 7, 19)]
        return [Tensor(o) for o in outs]

    check(dev, run, rtol=1e-5, atol=1e-5, gpu=False)  # the results were read in run: dispatches were counted there


# ---------------- kernels through codegen's interpreter (SPECK_CODEGEN=0) ----------------
def test_interpreted_kernels_write_their_results_into_vram(dev: UsbDevice) -> None:
    """With SPECK_CODEGEN=0 every kernel runs in codegen's AST interpreter on the host, over copies of the VRAM
    buffers the host cannot map: what it stores must be copied back (it used to be lost: zeros, or stale data)."""
    a, b = rnd(5, 7), rnd(5, 7, seed=1)
    want = [(T(a, "CPU") * T(b, "CPU") + 1).numpy(), T(a, "CPU").sum(1).numpy()]
    with Context(SPECK_CODEGEN=0):
        x = T(a, USB).contiguous().realize()
        x.assign(x * T(b, USB) + 1).realize()  # in place: the buffer read is the buffer written
        got = [x.numpy(), T(a, USB).sum(1).numpy()]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
