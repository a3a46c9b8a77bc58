"""Tensor._binary's per-op fast path (same-shape tensors, a 0-d tensor on either side, a Python float/int literal the
tensor's dtype takes) against the general path it skips: ew.promote then the elementwise function. Hash-consing makes
equal constructions one object, so "the same node" is an identity test; values are compared with numpy, and the
result's device, requires_grad, metadata name and gradients with what the general path gives."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, TinyJit, Variable, dtypes
from speck.tensor import elementwise as ew
from speck.tensor.errors import TensorValueError
from speck.tensor.metadata import metadata_of
from speck.tensor.multi import MultiUOp
from speck.uop import DType

_DTYPES = [dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int32, dtypes.int8, dtypes.uint8, dtypes.int64,
           dtypes.bool]  # fmt: skip
_FNS = {"add": ew.add, "mul": ew.mul, "sub": ew.sub, "div": ew.div, "maximum": ew.maximum, "lt": ew.lt,
        "eq": ew.eq, "ne": ew.ne, "mod": ew.mod, "bitwise_and": ew.bitwise_and}  # fmt: skip
_SHAPES = [(), (1,), (3,), (2, 3), (1, 1)]
_CPU2 = ("CPU:0", "CPU:1")
_FLAGS = st.sampled_from([None, True, False])  # requires_grad


def _general(x: Tensor, fn: Any, y: Any, reverse: bool) -> tuple[Any, Any]:
    """The general path of Tensor._binary for these operands: the node and device it makes."""
    if isinstance(y, Tensor):
        a, b, dev, _ = ew.promote(x.uop, x._device, y.uop, y._device, reverse)
    else:
        a, b, dev, _ = ew.promote(x.uop, x._device, y, None, reverse)
    return fn(a, b, dev), dev


def _outcome(f: Any) -> tuple[str, Any]:
    try:
        return "ok", f()
    except Exception as e:  # (both paths must refuse the same operands with the same error class)
        return "raised", type(e)


def _values(shape: tuple[int, ...], dt: DType, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    v = rng.integers(-4, 5, size=shape) if dt != dtypes.bool else rng.integers(0, 2, size=shape)
    return (v + (rng.random(shape) > 0.5) * 0.5 if dtypes.is_float(dt) else v).astype(np.dtype(dt.fmt))


def _check(x: Tensor, fn: Any, y: Any, reverse: bool, values: bool = True) -> None:
    """x op y through Tensor._binary gives the general path's node (the same object), device, requires_grad and
    values; operands the general path refuses are refused with the same error class."""
    got = _outcome(lambda: x._binary(fn, y, reverse))
    ref = _outcome(lambda: _general(x, fn, y, reverse))
    assert got[0] == ref[0], (got, ref)
    if got[0] == "raised":
        assert got[1] is ref[1]
        return
    out, (u, dev) = got[1], ref[1]
    if isinstance(u, MultiUOp):  # (a sharded node is not hash-consed: its shards are)
        assert isinstance(out.uop, MultiUOp) and out.uop.axis == u.axis and out.uop.device == u.device
        assert all(a is b for a, b in zip(out.uop.shards, u.shards, strict=True))
    else:
        assert out.uop is u
    assert out.device == dev and out.dtype is u.dtype and out.shape == u.shape
    flags = [x.requires_grad] + ([y.requires_grad] if isinstance(y, Tensor) else [])
    assert out.requires_grad is (True if True in flags else None if None in flags else False)
    if values and out.device is not None and not out.dtype.is_weak:
        ref_t = Tensor(u, device=dev)
        np.testing.assert_array_equal(out.numpy(), ref_t.numpy())


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(sorted(_FNS)), st.sampled_from(_DTYPES), st.sampled_from(_SHAPES), st.integers(0, 4),
       st.booleans(), _FLAGS, _FLAGS, st.integers(0, 99))  # fmt: skip
def test_tensor_operands_give_the_general_paths_node(name: str, dt: DType, shape: tuple[int, ...], other: int,
                                                     reverse: bool, rgx: Any, rgy: Any, seed: int) -> None:  # fmt: skip
    """Same shape, a 0-d operand on either side, or shapes the fast path leaves to the general one (broadcast of
    non-0-d shapes, another dtype, a device-less operand)."""
    x = Tensor(_values(shape, dt, seed), dtype=dt, requires_grad=rgx).realize()  # (0-d: device-less)
    yshape = [shape, (), (2, 1, 1), shape, (1,)][other]
    ydt = dt if other != 3 else dtypes.float32
    y = Tensor(_values(yshape, ydt, seed + 1), dtype=ydt, requires_grad=rgy).realize()
    if other == 4:  # a 0-d tensor on the device
        y = y.reshape(())
    _check(x, _FNS[name], y, reverse)
    _check(y, _FNS[name], x, reverse)  # (the 0-d on the left)
    _check(x, _FNS[name], x.contiguous(), reverse)  # (an unrealized operand)


_LITERALS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**70), 2**70),
                      st.sampled_from([0.0, -0.0, 1, -1, 2.5, 255, 256, -129, True, False]))  # fmt: skip


@settings(max_examples=80, deadline=None)
@given(st.sampled_from(sorted(_FNS)), st.sampled_from(_DTYPES), st.sampled_from(_SHAPES), _LITERALS, st.booleans(),
       _FLAGS)  # fmt: skip
def test_literal_operands_give_the_general_paths_node(name: str, dt: DType, shape: tuple[int, ...], v: Any,
                                                      reverse: bool, rg: Any) -> None:  # fmt: skip
    """x op literal and literal op x: the literal's constant is the node ew.promote makes (its value converted to the
    dtype; an int that doesn't fit an int dtype raises in both paths; literals the dtype doesn't take unchanged -
    a float meeting ints, a bool - go the general way)."""
    x = Tensor(_values(shape, dt, 7), dtype=dt, requires_grad=rg).realize()
    _check(x, _FNS[name], v, reverse, not (name == "mod" and dt == dtypes.bool))


def test_weak_sharded_and_device_less_operands() -> None:
    """Operands the fast path leaves alone (weak literal tensors, device-less ones, sharded ones) and the weak ones it
    takes (two weak tensors of one dtype on one device) still give the general path's nodes."""
    x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)).realize()
    weak_dev = Tensor._constant(2.5, None, "CPU")  # a weak 0-d on the device
    assert weak_dev.dtype.is_weak and weak_dev.device == "CPU"
    for y in (Tensor(2.5), Tensor(3), weak_dev, Tensor(2.0, dtype=dtypes.float32)):
        for fn in (ew.add, ew.mul, ew.sub, ew.lt):
            _check(x, fn, y, False)
            _check(x, fn, y, True)
            _check(y, fn, y, False)
    _check(weak_dev, ew.add, Tensor._constant(1.5, None, "CPU"), False)
    x1 = Tensor(np.arange(3, dtype=np.float32), device="CPU:1").realize()  # (not the default device)
    for y in (Tensor(np.float32(2)), Tensor.arange(3, dtype=dtypes.float32)):  # device-less: rebuilt on CPU:1
        assert y.device is None
        for fn in (ew.add, ew.mul, ew.sub):
            _check(x1, fn, y, False)
            _check(x1, fn, y, True)
            _check(y, fn, x1, False)
    s = x.shard(_CPU2, axis=0)
    for y in (s, 2.0, 3, Tensor(2.0)):
        for fn in (ew.add, ew.mul, ew.div):
            _check(s, fn, y, False)
    np.testing.assert_array_equal((s * 2.0 + s).numpy(), x.numpy() * 3)


def test_literal_and_0d_results_match_numpy() -> None:
    """The common training-code forms, against numpy: x * 2.0, x + 1, 1 - x, x / 4, a 0-d tensor on the device on
    either side, chains of them."""
    xv = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    x = Tensor(xv).realize()
    s = Tensor(np.array([1.5], np.float32)).realize().reshape(())  # a 0-d float32 on the device
    free = Tensor(np.float32(1.5))  # (a numpy scalar: a device-less float32 0-d)
    assert s.shape == free.shape == () and s.device == x.device and free.device is None
    sv = np.float32(1.5)
    cases = [(x * 2.0, xv * 2), (x + 1, xv + 1), (1 - x, 1 - xv), (x / 4, xv / 4), (2.0 * x, 2 * xv),
             (x * s, xv * sv), (s - x, sv - xv), ((x + s) * x - 0.5, (xv + sv) * xv - np.float32(0.5)),
             (x.sum() * 2.0, xv.sum() * 2), (x * free, xv * sv), (free - x, sv - xv), (s + free, sv + sv)]  # fmt: skip
    for got, want in cases:
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)
    xi = Tensor(np.arange(5, dtype=np.int8)).realize()
    np.testing.assert_array_equal((xi + 1).numpy(), np.arange(5, dtype=np.int8) + 1)
    assert (xi + 1).dtype is dtypes.int8  # (the literal takes the tensor's dtype)
    with pytest.raises(OverflowError):
        xi + 300


def test_gradients_flow_through_fast_path_nodes() -> None:
    """requires_grad tensors keep their graph: d/dw of sum(w * 2.0 + 1 - w * s) is 2 - s, d/ds is -sum(w)."""
    wv = np.array([1.0, -2.0, 3.0], np.float32)
    w = Tensor(wv, requires_grad=True).realize()
    s = Tensor(np.array([0.25], np.float32)).realize().reshape(()).requires_grad_()
    out = w * 2.0 + 1 - w * s
    assert out.requires_grad is True
    out.sum().backward()
    assert w.grad is not None and s.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), np.full(3, 2 - 0.25, np.float32))
    np.testing.assert_allclose(s.grad.numpy(), -wv.sum())
    frozen = Tensor(wv, requires_grad=False).realize()
    assert (frozen * 2.0).requires_grad is False and (frozen + w).requires_grad is True
    assert (frozen + Tensor(wv).realize()).requires_grad is None


def test_fast_path_nodes_are_named_after_the_outermost_public_op() -> None:
    """Metadata as the general path records it: the public operator the user called (`*` with a literal: __mul__,
    the reflected form: __rmul__), the outermost public method when one calls another, none with TRACEMETA=0."""
    x = Tensor(np.arange(3, dtype=np.float32) + 1).realize()
    s = Tensor(np.float32(2))

    def name(t: Tensor) -> object:
        m = metadata_of(t.uop)
        return None if m is None else m.name

    assert name(x * 3.0) == "__mul__" and name(3.0 * x) == "__rmul__" and name(x.add(7)) == "add"
    assert name(x - s) == "__sub__" and name(s + x) == "__add__" and name(x.lerp(x * 5.0, 0.25)) == "lerp"
    held, held2 = x * 13.0, x + x  # (a node something holds, made again by another op: it keeps its first name)
    assert name(x.mul(13.0)) == name(held) == "__mul__" and name(x.add(x)) == name(held2) == "__add__"
    del held, held2
    assert name(x.mul(13.0)) == "mul"  # (nothing held it: a new node, named by its op)
    with Context(TRACEMETA=0):
        assert name(x * 11.0) is None


def test_disallow_broadcast_still_refuses_a_0d_tensor() -> None:
    x = Tensor(np.ones(3, np.float32)).realize()
    s = Tensor(np.float32(2)).realize()
    with Context(DISALLOW_BROADCAST=1):
        with pytest.raises(TensorValueError):
            x + s
        with pytest.raises(TensorValueError):
            s * x
        np.testing.assert_array_equal((x * 2.0).numpy(), np.full(3, 2, np.float32))  # (a literal always broadcasts)
    np.testing.assert_array_equal((x + s).numpy(), np.full(3, 3, np.float32))


def test_ops_under_tinyjit_capture_replay_like_eager() -> None:
    """A jitted step built from fast-path ops (literal, 0-d and same-shape operands) replays with fresh inputs like
    the eager computation."""

    @TinyJit
    def step(a: Tensor, b: Tensor, s: Tensor) -> Tensor:
        return ((a * 2.0 + b) * s - 1).realize()

    rng = np.random.default_rng(0)
    for _ in range(4):
        av, bv = rng.standard_normal(5).astype(np.float32), rng.standard_normal(5).astype(np.float32)
        sv = np.float32(rng.standard_normal())
        got = step(Tensor(av).realize(), Tensor(bv).realize(), Tensor(np.array([sv])).realize().reshape(()))
        np.testing.assert_allclose(got.numpy(), (av * 2 + bv) * sv - 1, rtol=1e-5, atol=1e-6)


def test_special_literals_keep_their_bits() -> None:
    """-0.0, NaN and inf literals become constants with those values (floats are keyed by their bits)."""
    x = Tensor(np.array([1.0, -1.0], np.float32)).realize()
    np.testing.assert_array_equal((x * -0.0).numpy(), np.array([1.0, -1.0], np.float32) * np.float32(-0.0))
    assert np.signbit((x * -0.0).numpy()[0]) and not np.signbit((x * 0.0).numpy()[0])
    assert np.isnan((x + math.nan).numpy()).all() and ((x + math.inf).numpy() == np.inf).all()


def test_recent_literals_are_the_general_paths_nodes_across_evictions() -> None:
    """The broadcast literals kept alive between ops (ew.broadcast_literal) are promote's nodes on a hit, after the
    table empties when full, and per value bits (0.0 and -0.0, ints and floats), dtype, shape and device."""
    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    x2 = Tensor(np.arange(8, dtype=np.float32).reshape(2, 4)).realize()
    x1 = Tensor(np.arange(4, dtype=np.float32), device="CPU:1").realize()
    xi = Tensor(np.arange(4, dtype=np.int32)).realize()
    for v in [*range(ew._RECENT_MAX + 10), 0.0, -0.0, 1.0, 2.5, math.nan, math.inf]:
        for t in (x, x2, x1, xi):
            for lit in (v, float(v)) if t is not xi else (int(v) if math.isfinite(v) else 3,):
                _check(t, ew.mul, lit, False, values=False)
                _check(t, ew.mul, lit, True, values=False)
    assert len(ew._RECENT_LITERALS) <= ew._RECENT_MAX
    np.testing.assert_array_equal((x * -0.0).numpy(), np.arange(4, dtype=np.float32) * np.float32(-0.0))
    assert np.signbit((x * -0.0).numpy()).all() and not np.signbit((x * 0.0).numpy()).any()
    np.testing.assert_array_equal((x1 * 3.0 + 1).numpy(), np.arange(4, dtype=np.float32) * 3 + 1)


def test_literals_and_0d_tensors_meet_symbolic_shapes() -> None:
    """A literal or 0-d operand broadcast to a shape with a bound variable: promote's nodes, numpy's values, and the
    literal's nodes not kept among the recent ones (they would keep the variable alive)."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(x)[:, : Variable("w", 1, 4).bind(3)]
    s = Tensor(np.array([2], np.float32)).realize().reshape(())
    before = set(ew._RECENT_LITERALS)
    for y in (2.0, 3, s):
        for fn in (ew.mul, ew.sub, ew.div):
            _check(t, fn, y, False, values=False)
            _check(t, fn, y, True, values=False)
    assert all(all(d.__class__ is int for d in k[3]) for k in set(ew._RECENT_LITERALS) - before)
    np.testing.assert_array_equal((t * 2.0 - s)[:, :2].numpy(), x[:, :2] * 2 - 2)
