"""tinygrad-parity edges found by probing the public API from outside: nonzero of a 0-d tensor, safe_save given a
list, TinyJit wrapping something that is not a function. Values are checked against numpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from speck.tensor import Context, GlobalCounters, Tensor, TinyJit, dtypes, function, nn
from speck.tensor.errors import SafetensorsError, TensorError, TensorTypeError, TensorValueError
from speck.tensor.nn.optim import SGD, OptimizerGroup
from speck.tensor.nn.state import safe_load, safe_save


@pytest.mark.parametrize("value", [3, 0, 2.5, 0.0, True, False])
def test_nonzero_of_a_0d_tensor_has_one_row_per_nonzero_value(value: float) -> None:
    # numpy's argwhere (torch's nonzero): a nonzero 0-d value gives shape (1, 0), a zero gives (0, 0)
    want = np.argwhere(np.array(value))
    got = Tensor(value).nonzero()
    assert got.shape == want.shape and got.dtype == dtypes.int32
    assert got.numpy().shape == want.shape
    assert Tensor(np.array([value])).nonzero().tolist() == np.argwhere(np.array([value])).tolist()


def test_safe_save_of_a_list_is_a_clear_type_error(tmp_path: object) -> None:
    with pytest.raises(TensorTypeError, match="dict of name -> Tensor, got list"):
        safe_save([Tensor([1.0])], f"{tmp_path}/x.safetensors")  # type: ignore[arg-type]


def test_tinyjit_of_a_non_callable_is_a_clear_type_error() -> None:
    with pytest.raises(TensorTypeError, match="TinyJit wraps a function, got int"):
        TinyJit(3)  # type: ignore[arg-type]


def test_tinyjit_without_a_function_called_on_tensors_is_a_clear_error() -> None:
    jit: TinyJit[Tensor] = TinyJit()
    with pytest.raises(TensorError, match="has no function to run"):
        jit(Tensor([1.0]).realize())
    # the decorator form still works
    jit2: TinyJit[Tensor] = TinyJit(prune=True)
    f = jit2(lambda x: (x * 2).realize())
    assert [f(Tensor([float(k)]).realize()).item() for k in range(3)] == [0.0, 2.0, 4.0]


def test_realize_do_update_stats_false_leaves_the_run_counters() -> None:
    GlobalCounters.reset()
    a, b = Tensor([1.0, 2.0]) + 1, Tensor([3.0]) * 2
    assert a.realize(b, do_update_stats=False) is a
    assert (GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem) == (0, 0, 0)
    assert a.tolist() == [2.0, 3.0] and b.tolist() == [6.0]
    c = (Tensor([1.0, 2.0]) + 3).realize(do_update_stats=True)
    assert GlobalCounters.kernel_count >= 1 and c.tolist() == [4.0, 5.0]


@pytest.mark.parametrize("lr", [0.1, 0.3, 1e-3])
def test_sgd_on_float64_parameters_uses_a_float64_learning_rate(lr: float) -> None:
    # TENSOR_API 9.1: lr is a (1,) tensor of at least float32 - the parameters' dtype when wider; a float32 lr of 0.1
    # moved a float64 model by 0.100000001490116 * g
    w0 = np.array([1.0, -2.0, 3.5])
    w = Tensor(w0.copy(), dtype=dtypes.float64)
    opt = SGD([w], lr=lr, momentum=0.9)
    assert opt.lr.dtype == dtypes.float64 and opt.lr.shape == (1,)
    ref, buf = w0.copy(), np.zeros(3)
    with Context(TRAINING=1):
        for _ in range(3):
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
            buf = 0.9 * buf + 2 * ref
            ref = ref - lr * buf
    np.testing.assert_allclose(w.numpy(), ref, rtol=1e-13, atol=0)
    assert SGD([Tensor([1.0], dtype=dtypes.half)]).lr.dtype == dtypes.float32  # never narrower than float32


@pytest.mark.parametrize("args", [(0.5, 3), (0, 3, 0.5), (-2.5, 2), (0, 10, 2.5), (5, 0, -1.5), (0, 2.5)])
@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64, dtypes.int16])
def test_arange_with_an_int_dtype_over_float_bounds_has_that_dtype(args: tuple[float, ...], dt: object) -> None:
    # dtype= is the result's dtype (it came back weakfloat holding 0.5, 1.5, ...); the values are the float range's,
    # truncated toward zero as a cast does (torch.arange(0.5, 3, dtype=int32) is [0, 1, 2])
    got = Tensor.arange(*args, dtype=dt)
    assert got.dtype == dt and got.device is None
    np.testing.assert_array_equal(got.numpy(), np.trunc(np.arange(*args)).astype(np.int64))


@pytest.mark.parametrize("op", ["cummax", "cummin"])
@pytest.mark.parametrize("seed", range(4))
def test_cummax_cummin_indices_point_at_the_value_with_nans(op: str, seed: int) -> None:
    # a NaN running extreme gave the index n (past the axis): NaN == NaN is False. Now the first NaN's index,
    # values as numpy's fmax/fmin-free accumulation (NaN propagates), other indices the first occurrence
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 4, size=(3, 7)).astype(np.float32)
    x[rng.random(x.shape) < 0.25] = np.nan
    vals, idx = getattr(Tensor(x), op)(1)
    acc = (np.maximum if op == "cummax" else np.minimum).accumulate(x, axis=1)
    np.testing.assert_array_equal(vals.numpy(), acc)
    got = idx.numpy()
    assert idx.dtype == dtypes.int32 and got.min() >= 0 and got.max() < x.shape[1]
    for r in range(x.shape[0]):
        for i in range(x.shape[1]):
            same = np.isnan(x[r, : i + 1]) if np.isnan(acc[r, i]) else x[r, : i + 1] == acc[r, i]
            assert got[r, i] == int(np.argmax(same))


_SCALE = 2.0
_W = Tensor([1.0, 1.0]).realize()


def test_function_retraces_when_a_global_or_closure_constant_it_reads_is_rebound() -> None:
    # TENSOR_API 13.1: every call traces the body; speck keeps one capture per argument signature, which replayed a
    # rebound global (scale = 3.0) or closure value silently with the old one. Now they are part of the signature.
    global _SCALE, _W
    a = Tensor([1.0, 2.0]).realize()

    @function
    def scaled(x: Tensor) -> Tensor:
        return x * _SCALE

    @function(allow_implicit=True)
    def weighted(x: Tensor) -> Tensor:
        return x * _W

    def make(k: float) -> Any:
        @function
        def closure(x: Tensor) -> Tensor:
            return x * k

        return closure

    saved = (_SCALE, _W)
    try:
        assert scaled(a).tolist() == [2.0, 4.0] and weighted(a).tolist() == [1.0, 2.0]
        _SCALE, _W = 3.0, Tensor([5.0, 5.0]).realize()
        assert scaled(a).tolist() == [3.0, 6.0] and weighted(a).tolist() == [5.0, 10.0]
        assert len(scaled.captures) == 1  # replaced, not accumulated
    finally:
        _SCALE, _W = saved
    assert make(2.0)(a).tolist() == [2.0, 4.0] and make(4.0)(a).tolist() == [4.0, 8.0]
    traced: list[int] = []

    @function
    def counting(x: Tensor) -> Tensor:
        traced.append(1)  # a list the body mutates is keyed by identity: no retrace per call
        return x + 1

    for _ in range(3):
        counting(a)
    assert traced == [1]


class _Cfg:
    def __init__(self, s: float) -> None:
        self.s = s


_CFG = _Cfg(1.0)


def test_function_retraces_for_a_new_object_even_where_the_old_ones_id_is_reused() -> None:
    # an object the body reads is keyed by identity; a bare id() let `del cfg; cfg = Cfg(2)` (CPython reuses the
    # freed id at once) replay the old capture: 49 of 50 results were stale
    global _CFG

    @function
    def scaled(x: Tensor) -> Tensor:
        return x * _CFG.s

    saved = _CFG
    try:
        for i in range(20):
            del _CFG
            _CFG = _Cfg(float(i))
            assert scaled(Tensor.ones(2)).tolist() == [float(i)] * 2
    finally:
        _CFG = saved


def test_function_retraces_for_a_new_unhashable_argument_even_where_a_freed_ones_id_is_reused() -> None:
    # an unhashable argument (a numpy array) is keyed by identity; a bare id() replayed the capture of a freed array
    # whose id the new one took: 17 of 30 results were stale in a probe

    @function
    def f(x: Tensor, arr: np.ndarray) -> Tensor:
        return x * Tensor(arr)

    for i in range(20):
        assert f(Tensor.ones(2), np.array([float(i), 1.0])).tolist() == [float(i), 1.0]


def test_lstmcell_with_a_malformed_state_and_rmsnorm_with_a_wrong_width_are_clear_errors() -> None:
    cell = nn.LSTMCell(3, 4)
    with pytest.raises(TensorTypeError, match=r"hc must be None or a \(h, c\) pair of Tensors, got a tuple of 1"):
        cell(Tensor.ones(2, 3), (Tensor.zeros(2, 4),))  # type: ignore[arg-type]
    h, c = cell(Tensor.ones(2, 3), [Tensor.zeros(2, 4), Tensor.zeros(2, 4)])  # type: ignore[arg-type]
    assert h.shape == c.shape == (2, 4)
    with pytest.raises(TensorValueError, match=r"RMSNorm\(3\) normalizes the last dim"):
        nn.RMSNorm(3)(Tensor.ones(2, 4))
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_allclose(nn.RMSNorm(3)(Tensor(x)).numpy(), x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-6),
                               rtol=1e-5)  # fmt: skip


@pytest.mark.parametrize(
    "dt",
    [
        dtypes.bool,
        dtypes.int8,
        dtypes.uint16,
        dtypes.int32,
        dtypes.int64,
        dtypes.uint64,
        dtypes.float32,
        dtypes.float64,
    ],
)
def test_data_is_a_memoryview_in_the_struct_format_with_the_tensor_shape(dt: Any) -> None:
    # TENSOR_API 4.4: int64 data() was numpy's 'l' (not the struct code 'q') and a 0-d tensor's had shape (1,)
    x = np.array([[1, 0, 3], [4, 5, 0]]).astype(np.dtype(dt.fmt))
    m = Tensor(x, dtype=dt).data()
    assert (m.format, m.shape, m.tolist()) == (dt.fmt, (2, 3), x.tolist())
    m0 = Tensor(np.array([7]).astype(np.dtype(dt.fmt)), dtype=dt).reshape(()).data()
    assert (m0.format, m0.shape, m0.tolist()) == (dt.fmt, (), x.dtype.type(7).item())
    assert Tensor(np.array([3]).astype(np.dtype(dt.fmt)), dtype=dt).item() == x.dtype.type(3).item()


def test_backward_through_a_function_gives_its_unused_inputs_zero_gradients() -> None:
    # TENSOR_API 13.1: gradients flow to the explicit inputs and unused ones get zeros; the instantiated body read
    # only x, so backward() left y.grad None
    xn = np.array([1.0, -2.0, 3.0], np.float32)
    x, y, other = Tensor(xn).realize(), Tensor(np.ones(3, np.float32)).realize(), Tensor([5.0]).realize()

    @function
    def f(a: Tensor, b: Tensor) -> Tensor:
        return (a * a).sum()

    f(x, y).backward()
    np.testing.assert_allclose(x.grad.numpy(), 2 * xn)  # type: ignore[union-attr]
    assert y.grad is not None and y.grad.shape == (3,) and y.grad.device == y.device
    assert y.grad.tolist() == [0.0, 0.0, 0.0]
    assert other.grad is None  # not an input of the call
    (f(x, y) * 2).backward()  # accumulates
    np.testing.assert_allclose(x.grad.numpy(), 6 * xn)  # type: ignore[union-attr]


def test_safe_save_refuses_a_tensor_named_metadata_and_non_dict_metadata(tmp_path: Any) -> None:
    # a tensor named '__metadata__' was written and then silently dropped by safe_load (that key is the metadata);
    # metadata='x' was a raw AttributeError
    path = f"{tmp_path}/m.safetensors"
    with pytest.raises(SafetensorsError, match="'__metadata__' is the safetensors metadata key"):
        safe_save({"__metadata__": Tensor([1.0]), "w": Tensor([2.0])}, path)
    with pytest.raises(SafetensorsError, match="metadata must be a dict of str to str, got str"):
        safe_save({"w": Tensor([2.0])}, path, metadata="x")  # type: ignore[arg-type]
    safe_save({"w": Tensor([2.0])}, path, metadata={"k": "v"})
    assert {k: v.to("CPU").tolist() for k, v in safe_load(path).items()} == {"w": [2.0]}


@pytest.mark.parametrize(
    "args", [(1, 16777217, 2), (0, 100000001, 3), (-(2**31) + 1, 2**31 - 1, 5), (7, -99999999, 4), (0, 10, 4)]
)
@pytest.mark.parametrize("dt", [dtypes.int32, dtypes.int64])
def test_linspace_into_a_wide_int_dtype_keeps_every_digit(args: tuple[int, int, int], dt: Any) -> None:
    # the values were computed in float32 (24-bit significand): linspace(1, 16777217, 2, dtype=int32) ended at 16777216
    got = Tensor.linspace(*args, dtype=dt)
    assert got.dtype == dt
    assert got.tolist() == np.linspace(*args).astype(np.dtype(dt.fmt)).tolist()


def test_optimizer_group_of_a_non_optimizer_is_a_clear_type_error() -> None:
    with pytest.raises(TensorTypeError, match="OptimizerGroup takes optimizers"):
        OptimizerGroup(SGD([Tensor([1.0])]), [Tensor([2.0])])  # type: ignore[arg-type]
    group = OptimizerGroup(SGD([Tensor([1.0])]))
    assert len(group.params) == 1


def test_an_index_tensor_on_another_device_is_refused_when_the_op_is_called() -> None:
    # TENSOR_API 6.1/6.3: RuntimeError; it failed at realize with the runtime's "program loaded on CPU:1 but buffer
    # on CPU" (the kernel ran on the index's device)
    a = Tensor([[1, 2], [3, 4]]).realize()
    with pytest.raises(TensorValueError, match=r"getitem: the index tensor is on CPU:1 but the indexed tensor is on"):
        a[Tensor([0], device="CPU:1")]
    with pytest.raises(TensorValueError, match=r"gather: the index tensor is on CPU:1"):
        a.gather(0, Tensor([[0, 1]], device="CPU:1"))
    assert a[Tensor([1])].tolist() == [[3, 4]] and a[Tensor(1)].tolist() == [3, 4]  # device-less and same device
    assert a.gather(1, Tensor.arange(2).reshape(1, 2)).tolist() == [[1, 2]]
