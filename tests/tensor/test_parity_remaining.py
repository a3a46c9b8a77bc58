"""The remaining tinygrad incompatibilities of issue 28 (round three), each against TENSOR_API or tinygrad's
documented behaviour: pending writes run when something depending on them is realized (4.6)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speck.tensor import GlobalCounters, Tensor, dtypes
from speck.tensor.errors import TensorTypeError


def _realized(*shape: int) -> Tensor:
    return Tensor(np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)).realize()


# ---------------- pending writes run when a dependent tensor is realized (4.6) ----------------
def test_unrelated_realize_leaves_pending_write() -> None:
    a, b = _realized(4), _realized(4)
    a += 1
    GlobalCounters.reset()
    c = (b * 2).realize()
    assert GlobalCounters.kernel_count == 1  # only c's kernel: a's assign waits for something that reads a
    np.testing.assert_equal(c.numpy(), np.arange(4) * 2)
    np.testing.assert_equal(a.numpy(), np.arange(4) + 1)


def test_pending_writes_keep_program_order() -> None:
    a, b = _realized(4), _realized(4)
    a.assign(b + 1)  # reads b before b's own write
    b.assign(b * 3)
    d = _realized(4)
    d += 5  # after b's write, unrelated to it
    np.testing.assert_equal(b.numpy(), np.arange(4) * 3)  # runs a's and b's writes, in order
    np.testing.assert_equal(a.numpy(), np.arange(4) + 1)
    np.testing.assert_equal(d.numpy(), np.arange(4) + 5)


def test_old_value_read_after_skipped_write() -> None:
    a, b = _realized(4), _realized(4)
    old = a * 1  # built before the write: keeps the old value
    a.assign(b + 10)
    GlobalCounters.reset()
    (b + 1).realize()
    np.testing.assert_equal(old.numpy(), np.arange(4))
    np.testing.assert_equal(a.numpy(), np.arange(4) + 10)
    np.testing.assert_equal(old.numpy(), np.arange(4))


# ---------------- float-literal functions of int tensors are weakfloat (3.3) ----------------
@pytest.mark.parametrize("fn", ["sigmoid", "tanh", "gelu", "silu"])
@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.uint8, dtypes.bool])
def test_float_literal_functions_of_ints_are_weakfloat(fn: str, dt: Any) -> None:
    x = np.array([0, 1, 3], dtype=np.int64)
    t = Tensor(x.tolist(), dtype=dt)
    out = getattr(t, fn)()
    assert out.dtype == dtypes.weakfloat
    ref = getattr(
        Tensor(x.astype(np.float32).tolist() if dt != dtypes.bool else (x != 0).astype(np.float32).tolist()), fn
    )()
    np.testing.assert_allclose(out.numpy(), ref.numpy(), rtol=1e-6)
    assert out.numpy().dtype == np.float32  # read at the default float
    assert (out + Tensor([1.0, 2.0, 3.0], dtype=dtypes.half)).dtype == dtypes.half  # weak: joins the strong dtype


def test_exp_of_int_is_default_float() -> None:
    assert Tensor([1, 2]).exp().dtype == dtypes.float32


# ---------------- gather needs an int index ----------------
def test_gather_float_index_is_type_error() -> None:
    x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    with pytest.raises(TypeError, match="gather: index must be an int tensor"):
        x.gather(1, Tensor([[0.0, 1.0], [1.0, 0.0]]))
    with pytest.raises(TensorTypeError):
        x.gather(1, Tensor([[0.5, 1.0], [1.0, 0.0]]))
    np.testing.assert_equal(x.gather(1, Tensor([[1, 0], [0, 0]])).numpy(), [[2, 1], [3, 3]])
