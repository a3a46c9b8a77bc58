"""Parity probes, round 9: tinygrad-documented behaviours checked the way a tinygrad user's code relies on them.

Tensor(ndarray) wraps the array until the tensor (or a computation reading it) is realized: writes to the array
before that are seen, later ones are not, and the tensor never writes into the user's array."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes


# ---------------- Tensor(ndarray) wraps the array until realized (TENSOR_API 4.1) ----------------
def test_ndarray_write_before_realize_is_seen() -> None:
    a = np.zeros(3, np.float32)
    t = Tensor(a)
    a[0] = 1.0
    np.testing.assert_array_equal(t.numpy(), [1.0, 0.0, 0.0])


def test_ndarray_write_after_realize_is_not_seen() -> None:
    a = np.zeros(3, np.float32)
    t = Tensor(a).realize()
    a[1] = 2.0
    np.testing.assert_array_equal(t.numpy(), [0.0, 0.0, 0.0])


def test_ndarray_copied_in_when_a_computation_reads_it() -> None:
    a = np.ones(4, np.float32)
    t = Tensor(a)
    y = t * 2
    a[:] = 5.0
    np.testing.assert_array_equal(y.numpy(), [10.0] * 4)  # the values at the time the kernel ran
    a[:] = 7.0
    np.testing.assert_array_equal(y.numpy(), [10.0] * 4)
    np.testing.assert_array_equal(t.numpy(), [5.0] * 4)  # t's buffer got them once, with y's kernel


def test_ndarray_non_contiguous_view_follows_its_base() -> None:
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    t = Tensor(base.T[:, ::2])
    base[0, 0] = 100
    expect = base.T[:, ::2].copy()
    np.testing.assert_array_equal(t.numpy(), expect)
    assert t.shape == expect.shape and t.dtype == dtypes.int32


def test_ndarray_readonly_is_read_not_written() -> None:
    a = np.arange(4, dtype=np.float32)
    a.flags.writeable = False
    t = Tensor(a)
    t[1] = 9.0
    np.testing.assert_array_equal(t.numpy(), [0.0, 9.0, 2.0, 3.0])
    np.testing.assert_array_equal(a, [0.0, 1.0, 2.0, 3.0])


def test_tensor_writes_never_reach_the_array() -> None:
    a = np.zeros(3, np.float32)
    t = Tensor(a)
    t += 1
    t[0] = 5.0
    np.testing.assert_array_equal(t.numpy(), [5.0, 1.0, 1.0])
    np.testing.assert_array_equal(a, [0.0, 0.0, 0.0])


def test_ndarray_with_other_dtype_is_converted_at_construction() -> None:
    a = np.zeros(3, np.float64)
    t = Tensor(a, dtype=dtypes.float32)  # converted on the host first: a copy, not the array
    a[0] = 1.0
    np.testing.assert_array_equal(t.numpy(), [0.0, 0.0, 0.0])


def test_ndarray_pickled_before_realize_carries_its_values() -> None:
    a = np.arange(3, dtype=np.float32)
    t = Tensor(a)
    a[2] = 42.0
    blob = pickle.dumps(t)
    a[0] = -1.0  # pickling copied the array in: t holds its values of that time
    np.testing.assert_array_equal(pickle.loads(blob).numpy(), [0.0, 1.0, 42.0])
    np.testing.assert_array_equal(t.numpy(), [0.0, 1.0, 42.0])


def test_ndarray_moved_to_another_device_reads_the_array_then() -> None:
    a = np.zeros(2, np.float32)
    t = Tensor(a).to("CPU:1")
    a[1] = 3.0
    np.testing.assert_array_equal(t.numpy(), [0.0, 3.0])


def test_ndarray_assign_source_before_realize() -> None:
    a = np.zeros(3, np.float32)
    dst = Tensor.ones(3).contiguous().realize()
    dst.assign(Tensor(a))
    a[0] = 4.0
    np.testing.assert_array_equal(dst.numpy(), [4.0, 0.0, 0.0])


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(-1000, 1000), min_size=1, max_size=20),
    st.sampled_from([np.int32, np.int64, np.float32, np.float16, np.uint8]),
    st.booleans(),
)
def test_ndarray_aliasing_property(vals: list[int], npdt: type, realize_first: bool) -> None:
    a = np.array(vals).astype(npdt)
    orig = a.copy()
    t = Tensor(a)
    if realize_first:
        t.realize()
    a[0] = a[-1]
    a[-1] = 7
    expect = orig if realize_first else a
    out = t.numpy()
    assert out.dtype == np.dtype(npdt)
    np.testing.assert_array_equal(out, expect)


def test_ndarray_zero_size_and_0d_are_unaffected() -> None:
    e = np.zeros((0, 3), np.float32)
    assert Tensor(e).shape == (0, 3)
    z = np.array(2.5, np.float32)
    t = Tensor(z)
    z[()] = 1.0  # 0-d arrays make device-less constants of their value (TENSOR_API 0.2)
    assert t.device is None and t.item() == pytest.approx(2.5)


# ---------------- @function: writes to arguments, arguments returned (TENSOR_API 13.1) ----------------
def test_function_assign_to_argument_writes_through_in_program_order() -> None:
    from speck.tensor import function

    @function
    def step(a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        before = a * 1
        a += 1
        after = a * 1
        a[0] = 10.0
        return before, after, a

    x = Tensor([1.0, 2.0]).contiguous().realize()
    for _ in range(2):  # the second call replays the trace
        start = x.numpy().copy()
        before, after, last = step(x)
        np.testing.assert_array_equal(before.numpy(), start)
        np.testing.assert_array_equal(after.numpy(), start + 1)
        expect = start + 1
        expect[0] = 10.0
        np.testing.assert_array_equal(last.numpy(), expect)
        np.testing.assert_array_equal(x.numpy(), expect)


def test_function_advanced_setitem_on_argument() -> None:
    from speck.tensor import function

    @function
    def put(a: Tensor, idx: Tensor) -> Tensor:
        a[idx] = 5.0
        return a.sum()

    x = Tensor([1.0, 2.0, 3.0]).contiguous().realize()
    assert put(x, Tensor([2, 0])).item() == pytest.approx(12.0)
    np.testing.assert_array_equal(x.numpy(), [5.0, 2.0, 5.0])


def test_function_write_to_non_argument_is_an_error() -> None:
    from speck.tensor import function
    from speck.tensor.errors import FunctionError

    w = Tensor([1.0, 1.0]).contiguous().realize()

    @function(allow_implicit=True)
    def bump(a: Tensor) -> Tensor:
        w.assign(w + a)
        return a * 1

    with pytest.raises(FunctionError, match="not among its arguments"):
        bump(Tensor([1.0, 2.0]).realize())
    np.testing.assert_array_equal(w.numpy(), [1.0, 1.0])


def test_function_returning_its_argument() -> None:
    from speck.tensor import function

    @function
    def both(a: Tensor) -> tuple[Tensor, Tensor]:
        return a, a * 2

    x = Tensor([1.0, 2.0]).realize()
    out = both(x)
    np.testing.assert_array_equal(out[0].numpy(), [1.0, 2.0])
    np.testing.assert_array_equal(out[1].numpy(), [2.0, 4.0])


# ---------------- deferred state updates apply in program order (TENSOR_API 8, 9.1) ----------------
def test_batchnorm_called_twice_in_one_step_updates_statistics_twice() -> None:
    from speck.tensor import nn

    bn = nn.BatchNorm(2, momentum=0.1)
    x1 = np.array([[1.0, 2.0], [3.0, 6.0]], np.float32)
    x2 = np.array([[5.0, -1.0], [7.0, 3.0]], np.float32)
    with Tensor.train():
        a = bn(Tensor(x1))
        b = bn(Tensor(x2))
        (a + b).realize()
    rm, rv = np.zeros(2), np.ones(2)
    for x in (x1, x2):  # eager reference: each call updates the running statistics
        rm = 0.9 * rm + 0.1 * x.mean(0)
        rv = 0.9 * rv + 0.1 * x.var(0, ddof=1)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-6)
    assert bn.num_batches_tracked.item() == 2


def test_schedule_step_twice_applies_two_updates() -> None:
    from speck.tensor.nn import optim

    w = Tensor([1.0, 2.0]).contiguous().realize()
    opt = optim.SGD([w], lr=0.1, momentum=0.9)
    with Tensor.train():
        (w * w).sum().backward()
        opt.schedule_step()
        opt.schedule_step()
        Tensor.realize(w)
    g, b, ref = 2 * np.array([1.0, 2.0]), np.zeros(2), np.array([1.0, 2.0])
    for _ in range(2):  # the same gradient (computed before both steps), momentum carried over
        b = 0.9 * b + g
        ref = ref - 0.1 * b
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-6)


def test_function_indexing_after_an_eager_bounds_check() -> None:
    """An eager index lookup makes the device's bounds-check record before the body is traced: the record is the
    process's, not an implicit input of the body (an Embedding inside @function failed after any eager lookup)."""
    from speck.tensor import function, nn

    emb = nn.Embedding(10, 3)
    emb(Tensor([1, 2])).realize()

    @function
    def look(w: Tensor, idx: Tensor) -> Tensor:
        return w[idx].sum()

    w = emb.weight.numpy()
    assert look(emb.weight, Tensor([3, 4])).item() == pytest.approx(float(w[[3, 4]].sum()), rel=1e-6)


# ---------------- custom_kernel on sharded tensors (TENSOR_API 13.2) ----------------
def _inc_kernel(shapes: list[tuple[int, ...]]):  # type: ignore[no-untyped-def]
    from speck.codegen.kernel_info import KernelInfo
    from speck.uop import UOp

    def fxn(out, a):  # type: ignore[no-untyped-def]
        shapes.append(a.shape)
        i = UOp.range(a.shape[0], 0)
        return out[i].store(a[i] + 1).end(i).sink(arg=KernelInfo(name="inc"))

    return fxn


def test_custom_kernel_on_sharded_tensors_runs_per_shard() -> None:
    devs = ("CPU", "CPU:1")
    shapes: list[tuple[int, ...]] = []
    x = Tensor([1.0, 2.0, 3.0, 4.0]).shard(devs, axis=0).realize()
    out, same = Tensor.empty(4).shard(devs, axis=0).custom_kernel(x, fxn=_inc_kernel(shapes))
    assert shapes == [(2,)]  # fxn sees each device's shard
    assert out.device == devs and out.uop.axis == 0
    np.testing.assert_array_equal(out.numpy(), [2.0, 3.0, 4.0, 5.0])
    np.testing.assert_array_equal(same.numpy(), [1.0, 2.0, 3.0, 4.0])


def test_custom_kernel_sharded_gradient_uses_grad_fxn_per_shard() -> None:
    devs = ("CPU", "CPU:1")
    w = Tensor([1.0, 2.0, 3.0, 4.0]).shard(devs, axis=0).contiguous().realize()
    y = (
        Tensor.empty(4)
        .shard(devs, axis=0)
        .custom_kernel(w, fxn=_inc_kernel([]), grad_fxn=lambda g, call: (None, g * 2))[0]
    )
    (y * y).sum().backward()
    assert w.grad is not None
    np.testing.assert_allclose(w.grad.numpy(), 2 * 2 * (np.array([1.0, 2.0, 3.0, 4.0]) + 1))


def test_custom_kernel_mixing_sharded_and_single_is_a_clear_error() -> None:
    from speck.tensor.errors import CustomKernelError

    x = Tensor([1.0, 2.0, 3.0, 4.0]).shard(("CPU", "CPU:1"), axis=0).realize()
    with pytest.raises(CustomKernelError, match="one device"):
        Tensor.empty(4).custom_kernel(x, fxn=_inc_kernel([]))


# ---------------- @function on sharded tensors (TENSOR_API 13.1, 12) ----------------
def test_function_on_sharded_inputs_values_and_gradients() -> None:
    from speck.tensor import function

    devs = ("CPU", "CPU:1")

    @function
    def rowdot(a: Tensor, b: Tensor) -> Tensor:
        return (a * b).sum(axis=1)

    an = np.arange(8, dtype=np.float32).reshape(4, 2)
    bn = an + 1
    a = Tensor(an).shard(devs, axis=0).contiguous().realize()
    b = Tensor(bn).shard(devs, axis=0).contiguous().realize()
    out = rowdot(a, b)
    assert out.device == devs and out.uop.axis == 0
    s = (an * bn).sum(1)
    np.testing.assert_allclose(out.numpy(), s)
    (rowdot(a, b) ** 2).sum().backward()
    assert a.grad is not None and b.grad is not None
    np.testing.assert_allclose(a.grad.numpy(), 2 * s[:, None] * bn)
    np.testing.assert_allclose(b.grad.numpy(), 2 * s[:, None] * an)
    np.testing.assert_allclose(rowdot(a, b).sum().gradient(a)[0].numpy(), bn)


def test_function_sharded_capture_keys_on_the_shard_axis() -> None:
    from speck.tensor import function

    devs = ("CPU", "CPU:1")

    @function
    def double(a: Tensor) -> Tensor:
        return a * 2

    xn = np.arange(16, dtype=np.float32).reshape(4, 4)
    for axis in (0, 1, None):
        out = double(Tensor(xn).shard(devs, axis=axis).realize())
        assert out.uop.axis == axis
        np.testing.assert_array_equal(out.numpy(), xn * 2)
