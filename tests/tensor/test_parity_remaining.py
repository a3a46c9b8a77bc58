"""The remaining tinygrad incompatibilities of issue 28 (round three), each against TENSOR_API or tinygrad's
documented behaviour: pending writes run when something depending on them is realized (4.6)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speck.tensor import GlobalCounters, Tensor, Variable, dtypes
from speck.tensor.errors import TensorTypeError, TensorValueError


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


# ---------------- conv2d over a symbolic spatial size ----------------
@pytest.mark.parametrize("width", [5, 8, 11])
def test_conv2d_symbolic_width(width: int) -> None:
    rng = np.random.default_rng(width)
    xn = rng.random((2, 2, 7, 16), dtype=np.float32)
    wn = rng.random((3, 2, 3, 3), dtype=np.float32)
    v = Variable("w", 4, 16).bind(width)
    out = Tensor(xn)[:, :, :, :v].conv2d(Tensor(wn), padding=1)
    ref = Tensor(xn[..., :width]).conv2d(Tensor(wn), padding=1).numpy()
    np.testing.assert_allclose(out[:, :, :, :width].numpy(), ref, rtol=1e-5, atol=1e-5)
    # the weight gradient through the symbolic convolution matches the concrete one
    w_sym, w_ref = Tensor(wn), Tensor(wn)
    Tensor(xn)[:, :, :, :v].conv2d(w_sym).sum().backward()
    Tensor(xn[..., :width]).conv2d(w_ref).sum().backward()
    assert w_sym.grad is not None and w_ref.grad is not None
    np.testing.assert_allclose(w_sym.grad.numpy(), w_ref.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_unfold_symbolic_needs_step_one() -> None:
    x = Tensor(np.arange(16, dtype=np.float32))[: Variable("n", 4, 16).bind(9)]
    with pytest.raises(TensorValueError, match="step 1"):
        x.unfold(0, 2, 2)
    np.testing.assert_equal(x.unfold(0, 3, 1)[:7].numpy(), np.lib.stride_tricks.sliding_window_view(np.arange(9), 3))


# ---------------- a bound variable's value ----------------
def test_bound_variable_val() -> None:
    v = Variable("start_pos", 0, 31).bind(7)
    assert v.val == 7
    assert Tensor.ones(32)[:v].sum().item() == 7
    with pytest.raises(ValueError, match="unbind needs a BIND"):
        _ = Variable("i", 0, 3).val


# ---------------- Python ints beyond int64 ----------------
def test_uint64_values_beyond_int64() -> None:
    big = 2**63 + 5
    assert Tensor([big], dtype=dtypes.uint64).item() == big
    t = Tensor([[2**64 - 1], [0]])
    assert t.dtype == dtypes.uint64 and t.tolist() == [[2**64 - 1], [0]]
    with pytest.raises(OverflowError):
        Tensor([-1, 2**63])  # no dtype holds both


# ---------------- schedule() lists pending partial writes too ----------------
@pytest.mark.parametrize(
    "write, expect",
    [
        (lambda t: t.__setitem__((slice(1, 3), 2), 5.0), lambda x: x.__setitem__((slice(1, 3), 2), 5.0)),
        (lambda t: t.__setitem__(Tensor([1, 3]), 2.0), lambda x: x.__setitem__([1, 3], 2.0)),
        (lambda t: t[1:3].assign(t[1:3] + 1), lambda x: x.__setitem__(slice(1, 3), x[1:3] + 1)),
    ],
)
def test_schedule_lists_partial_write(write: Any, expect: Any) -> None:
    from speck.tensor.engine.realize import run_schedule

    t = _realized(4, 4)
    ref = t.numpy()
    write(t)
    expect(ref)
    items = t.schedule()
    assert len(items) == 1  # the write's kernel
    run_schedule(items)  # running the listed items writes nothing the tensor holds ...
    np.testing.assert_equal(t.numpy(), ref)  # ... and the write still happens exactly once
    np.testing.assert_equal(t.numpy(), ref)


def test_unread_writes_do_not_pile_up() -> None:
    """Writes to tensors that are dropped unread run once the queue is long, not never (their buffers are freed)."""
    from speck.tensor import writes

    for _ in range(3 * writes._MAX_PENDING):
        t = _realized(8)
        t += 1
        del t
    assert len(writes._thread.pending) <= writes._MAX_PENDING
    b = _realized(4)
    b += 2
    np.testing.assert_equal(b.numpy(), np.arange(4) + 2)


# ---------------- comparisons with ints outside the tensor's dtype ----------------
@pytest.mark.parametrize("dt", [dtypes.uint8, dtypes.int8, dtypes.uint16, dtypes.int32])
@pytest.mark.parametrize("op", ["__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"])
def test_compare_with_out_of_range_literal(dt: Any, op: str) -> None:
    lo, hi = dtypes.min(dt), dtypes.max(dt)
    x = np.array([lo, 0, hi], dtype=np.int64)
    t = Tensor(x.tolist(), dtype=dt)
    for y in (lo - 1, hi + 1, -(2**40), 2**40, 0):
        got = getattr(t, op)(y).numpy()
        want = getattr(x, op)(y)
        np.testing.assert_equal(got, want, err_msg=f"{dt} {op} {y}")


def test_sparse_crossentropy_with_uint8_labels() -> None:
    """MNIST's labels are uint8 and the default ignore_index is -1: no label is ignored."""
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 10), dtype=np.float32)
    labels = rng.integers(0, 10, 6).astype(np.uint8)
    got = Tensor(logits).sparse_categorical_crossentropy(Tensor(labels)).item()
    ls = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    np.testing.assert_allclose(got, -ls[np.arange(6), labels].mean(), rtol=1e-5)


def test_realize_of_nothing_runs_pending_writes() -> None:
    from speck.tensor import writes

    a = _realized(4)
    a += 1
    Tensor.realize_all()
    assert not writes._thread.pending
    np.testing.assert_equal(a.numpy(), np.arange(4) + 1)
