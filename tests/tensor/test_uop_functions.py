"""The op layer under Tensor: elementwise/movement/reduce primitives are functions over tensor-level UOps that work
on bare nodes (no Tensor made), and Tensor's methods are those functions wrapped. Each function is checked on nodes
built by hand (realized through a Tensor only to read the values) against numpy, and its rules (weak literals,
device-less operands, broadcasting) against the Tensor method that wraps it."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor
from speck.tensor import elementwise as ew
from speck.tensor import movement as mv
from speck.tensor import reduce as rd
from speck.tensor.device import default_device
from speck.uop import Ops, UOp, dtypes
from tensor_helpers import SOME, arrays, assert_matches, broadcast_shapes


def _node(a: np.ndarray) -> UOp:
    """A realized buffer node holding a (the test's input: a bare node, as the op modules see it)."""
    return Tensor(a).realize().uop


def _read(u: UOp) -> np.ndarray:
    return Tensor(u).numpy()


@given(shapes=broadcast_shapes(), seed=st.integers(0, 2**16))
@SOME
def test_promote_broadcasts_like_numpy_and_the_ops_compute_on_bare_nodes(shapes: Any, seed: int) -> None:
    sa, sb = shapes
    a, b = arrays(sa, np.float32, seed), arrays(sb, np.float32, seed + 1)
    dev = default_device()
    x, y, xdev, ydev = ew.promote(_node(a), dev, _node(b), dev)
    assert x.shape == y.shape == np.broadcast_shapes(sa, sb) and xdev == ydev == dev
    assert_matches(_read(ew.add(x, y, dev)), a + b)
    assert_matches(_read(ew.mod(x, y, dev)), np.mod(a, b))
    assert_matches(_read(ew.floordiv(x, y, dev)), np.floor_divide(a, b))
    assert_matches(_read(ew.ge(x, y, dev)), a >= b)
    assert_matches(_read(ew.minimum(x, y, dev)), np.minimum(a, b))


def test_a_python_scalar_is_a_weak_literal_taking_the_nodes_dtype() -> None:
    dev = default_device()
    x = _node(np.array([1, 2, 3], np.int8))
    a, b, _, bdev = ew.promote(x, dev, 3)
    assert a.dtype == b.dtype == dtypes.int8 and bdev == dev
    assert _read(ew.add(a, b, dev)).tolist() == [4, 5, 6]
    with pytest.raises(OverflowError):  # an implicit conversion never wraps
        ew.promote(x, dev, 1000)
    a, b, _, _ = ew.promote(x, dev, 0.5)  # an int tensor with a float literal: a weak float
    assert a.dtype == b.dtype == dtypes.weakfloat


def test_a_device_less_operand_takes_the_others_device() -> None:
    dev = default_device()
    lit = ew.const(2.0, dtypes.float32, None)  # device-less: no device of its own yet
    x = _node(np.array([1.0, 2.0], np.float32))
    _, y, xdev, ydev = ew.promote(x, dev, lit, None)
    assert xdev == ydev == dev
    assert any(n.op is Ops.DEVICE and n.arg == dev for n in y.toposort())


def test_where_and_shift_return_the_results_device() -> None:
    dev = default_device()
    c = _node(np.array([True, False, True]))
    u, udev = ew.where(c, dev, 1, None, 0, None)
    assert udev == dev and u.dtype == dtypes.weakint and _read(u).tolist() == [1, 0, 1]
    with pytest.raises(TypeError):  # where needs a bool condition
        ew.where(_node(np.array([1, 0])), dev, 1, None, 0, None)
    s, sdev = ew.shift(Ops.SHL, _node(np.array([1, 2], np.int32)), dev, 3, None)
    assert sdev == dev and _read(s).tolist() == [8, 16]


def test_movement_functions_return_the_node_itself_when_nothing_moves() -> None:
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    u = _node(a)
    assert mv.reshape(u, (2, 3)) is u and mv.permute(u, (0, 1)) is u and mv.flip(u, ()) is u
    assert mv.shrink(u, (None, (0, 3))) is u and mv.pad(u, ((0, 0), (0, 0))) is u
    assert_matches(_read(mv.reshape(u, (3, -1))), a.reshape(3, -1))
    assert_matches(_read(mv.permute(u, (1, 0))), a.T)
    assert_matches(_read(mv.expand(mv.reshape(u, (2, 1, 3)), (2, 4, 3))), np.broadcast_to(a[:, None], (2, 4, 3)))
    assert_matches(_read(mv.flip(u, (-1,))), a[:, ::-1])
    with pytest.raises(ValueError, match="can't reshape"):
        mv.reshape(u, (4, 2))
    with pytest.raises(IndexError):
        mv.permute(u, (0, 2))


def test_reduce_functions_keep_tensor_dtype_rules() -> None:
    dev = default_device()
    a = np.arange(12, dtype=np.int8).reshape(3, 4)
    u, udev = rd.sum_(_node(a), dev, 1)
    assert udev == dev and u.dtype == dtypes.int32  # small ints accumulate in int32
    assert _read(u).tolist() == a.sum(1).tolist()
    m, _ = rd.reduce(_node(a.astype(np.float32)), dev, Ops.MAX, (0,), keepdim=True)
    assert _read(m).tolist() == [a.max(0).astype(np.float32).tolist()]
    e, _ = rd.reduce(_node(np.zeros((0, 2), np.float32)), dev, Ops.MAX, 0)  # an empty max is its identity
    assert _read(e).tolist() == [-np.inf, -np.inf]


def test_tensor_methods_are_the_functions_wrapped() -> None:
    """The wrapper adds only Tensor's state: the same node comes out, and requires_grad is the operands'."""
    a = Tensor([1.0, 2.0], requires_grad=True)
    b = Tensor([3.0, 4.0], requires_grad=False)
    out = a + b
    assert out.uop is ew.add(a.uop, b.uop, a.device)
    assert out.requires_grad is True and (b * 2).requires_grad is False and (Tensor([1.0]) + b).requires_grad is None
    assert (a.reshape(2, 1)).uop is mv.reshape(a.uop, (2, 1))
