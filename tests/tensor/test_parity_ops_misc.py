"""tinygrad-API parity fixes found by probing the documented Tensor API against numpy: realized constants must not
be remembered for other graphs, op counts of pools whose window loops depend on outer loops, squeeze of several
dims, numpy-integer and empty-list indices, the uint8 fixed-point lerp, from_blob, xor, requires_grad_
and schedule_with_vars. References are numpy (or the definition written out)."""

from __future__ import annotations

import ctypes
import pathlib

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.tensor.schedule import realized_cache


def _avg_pool_ceil_ref(x: np.ndarray, k: int) -> np.ndarray:
    """PyTorch's ceil_mode average: windows clipped at the input edge divide by the elements they hold."""
    h, w = x.shape[-2:]
    oh, ow = -(-h // k), -(-w // k)
    out = np.zeros(x.shape[:-2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            out[..., i, j] = x[..., i * k : i * k + k, j * k : j * k + k].mean(axis=(-1, -2))
    return out


def test_realized_constant_is_not_reused_by_other_graphs() -> None:
    # a gradient that is just the constant 1.0 gets realized while another graph holds the same (hash-consed) node;
    # a later graph using that constant (the ceil_mode divisor counts ones) must still see 1.0
    a, b = Tensor(np.float32(0.5)), Tensor(np.float32(0.25))
    grads = (a + b).sum().gradient(a, b)
    keep = grads[0].uop  # noqa: F841 - a second holder of the constant node
    grads[0].realize()
    assert not [k for k in realized_cache.keys() if k.op.name == "CONST"]
    del grads
    x = np.random.default_rng(0).standard_normal((1, 1, 5, 5)).astype(np.float32)
    for _ in range(3):  # other buffers come and go
        (Tensor(x) * 3).contiguous().realize()
    got = Tensor(x).avg_pool2d(2, ceil_mode=True).numpy()
    np.testing.assert_allclose(got, _avg_pool_ceil_ref(x, 2), atol=1e-5)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("k,s,pad", [(2, 2, 0), (3, 2, 1), (3, 1, 0)])
def test_pools_with_clipped_windows_run(kind: str, k: int, s: int, pad: int) -> None:
    # these kernels' inner trip counts depend on the outer window index: the op count must still evaluate
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 7)).astype(np.float32)
    t = Tensor(x)
    got = (t.max_pool2d(k, s, padding=pad) if kind == "max" else t.avg_pool2d(k, s, padding=pad)).numpy()
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)), constant_values=-np.inf if kind == "max" else 0.0)
    n = (7 + 2 * pad - k) // s + 1
    ref = np.zeros((2, 3, n, n), np.float32)
    for i in range(n):
        for j in range(n):
            win = xp[:, :, i * s : i * s + k, j * s : j * s + k]
            ref[:, :, i, j] = win.max(axis=(2, 3)) if kind == "max" else win.mean(axis=(2, 3))
    np.testing.assert_allclose(got, ref, atol=1e-5)


def test_conv_transpose2d_runs_and_matches_scatter_definition() -> None:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 2, 4, 4)).astype(np.float32)
    w = rng.standard_normal((2, 3, 3, 3)).astype(np.float32)
    ref = np.zeros((1, 3, 9, 9))
    for i in range(4):
        for j in range(4):
            ref[:, :, i * 2 : i * 2 + 3, j * 2 : j * 2 + 3] += np.einsum("nc,cokl->nokl", x[:, :, i, j], w)
    got = Tensor(x).conv_transpose2d(Tensor(w), stride=2, padding=1).numpy()
    np.testing.assert_allclose(got, ref[:, :, 1:-1, 1:-1], atol=1e-4)


@given(st.lists(st.sampled_from([1, 2, 3]), min_size=1, max_size=5), st.data())
def test_squeeze_several_dims_matches_numpy(shape: list[int], data: st.DataObject) -> None:
    dims = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), max_size=len(shape), unique=True))
    x = np.zeros(shape, np.float32)
    keep = [i for i in range(len(shape)) if not (shape[i] == 1 and (i in dims or i - len(shape) in dims))]
    assert Tensor(x).squeeze(tuple(dims)).shape == tuple(shape[i] for i in keep)


def test_squeeze_tuple_out_of_range_is_index_error() -> None:
    with pytest.raises(IndexError):
        Tensor.zeros(1, 2).squeeze((0, 5))


def test_numpy_integer_and_empty_list_indices() -> None:
    a = np.arange(24).reshape(2, 3, 4).astype(np.int32)
    t = Tensor(a)
    np.testing.assert_equal(t[np.int64(1)].numpy(), a[1])
    np.testing.assert_equal(t[np.int32(-1), np.int8(2)].numpy(), a[-1, 2])
    np.testing.assert_equal(t[:, []].numpy(), a[:, np.array([], np.int64)])
    with pytest.raises(IndexError):
        t[np.int64(5)]


@given(st.lists(st.integers(0, 255), min_size=1, max_size=8), st.data())
def test_uint8_lerp_with_tensor_weight_is_rounded_fixed_point(start: list[int], data: st.DataObject) -> None:
    n = len(start)
    end = data.draw(st.lists(st.integers(0, 255), min_size=n, max_size=n))
    weight = data.draw(st.lists(st.sampled_from([0.0, 0.125, 0.25, 0.5, 0.75, 1.0]), min_size=n, max_size=n))
    a, b, w = np.array(start, np.uint8), np.array(end, np.uint8), np.array(weight, np.float32)
    got = Tensor(a).lerp(Tensor(b), Tensor(w))
    assert got.dtype == dtypes.uint8
    # 7-bit weights are exact here, so this is round-half-up of the real-valued lerp
    ref = a.astype(np.int64) + np.floor((b.astype(np.int64) - a) * w * 128 / 128 + 0.5).astype(np.int64)
    np.testing.assert_equal(got.numpy(), ref.astype(np.uint8))


def test_float_lerp_unchanged() -> None:
    a, b = np.array([0.0, 10.0], np.float32), np.array([10.0, 0.0], np.float32)
    np.testing.assert_allclose(Tensor(a).lerp(Tensor(b), 0.3).numpy(), a + (b - a) * 0.3, rtol=1e-6)


@pytest.mark.parametrize("dt", [dtypes.float32, dtypes.int16, dtypes.uint8, dtypes.float64])
def test_from_blob_reads_external_memory(dt) -> None:
    from speck.tensor.dtype import _to_np_dtype

    arr = (np.arange(12) * 3).astype(_to_np_dtype(dt)).reshape(3, 4)
    t = Tensor.from_blob(arr.ctypes.data, (3, 4), dtype=dt)
    assert t.shape == (3, 4) and t.dtype == dt
    np.testing.assert_equal(t.numpy(), arr)


def test_from_blob_bfloat16_is_a_clear_error() -> None:
    buf = (ctypes.c_uint16 * 4)()
    with pytest.raises(RuntimeError, match="bitcast"):
        Tensor.from_blob(ctypes.addressof(buf), (4,), dtype=dtypes.bfloat16)


def test_xor_alias_and_requires_grad_() -> None:
    a, b = np.array([5, 3, -8], np.int32), np.array([3, 6, 1], np.int32)
    np.testing.assert_equal(Tensor(a).xor(Tensor(b)).numpy(), a ^ b)
    np.testing.assert_equal(Tensor([True, False]).xor(True).numpy(), [False, True])
    x = Tensor([1.0, 2.0])
    assert x.requires_grad_(False) is x and x.requires_grad is False
    y = Tensor([3.0, 4.0])
    (x * y).sum().backward()
    assert x.grad is None and y.grad is not None
    np.testing.assert_allclose(y.grad.numpy(), [1.0, 2.0])


def test_schedule_with_vars() -> None:
    t = Tensor([1.0, 2.0]) + 1
    items, var_vals = t.schedule_with_vars()
    assert len(items) >= 1 and var_vals == {}


@pytest.mark.parametrize(
    "shape,mask_shape,lead",
    [((3,), (2,), 0), ((3,), (4,), 0), ((3, 4), (2,), 1), ((3, 4), (4, 3), 0), ((2, 3, 4), (3, 5), 1)],
)
def test_bool_mask_of_the_wrong_shape_is_index_error(shape: tuple[int, ...], mask_shape: tuple[int, ...],
                                                      lead: int) -> None:  # fmt: skip
    t = Tensor(np.zeros(shape, np.float32))
    mask = Tensor(np.ones(mask_shape, bool))
    with pytest.raises(IndexError, match="boolean index did not match"):
        t[(slice(None),) * lead + (mask,)]
    with pytest.raises(IndexError, match="boolean index did not match"):
        t[(slice(None),) * lead + (np.ones(mask_shape, bool).tolist(),)] if len(mask_shape) == 1 else t[mask]


@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.data())
def test_bool_mask_of_the_right_shape_matches_numpy(shape: list[int], data: st.DataObject) -> None:
    a = np.arange(int(np.prod(shape))).reshape(shape).astype(np.int32)
    lead = data.draw(st.integers(0, len(shape) - 1))
    m = np.array(data.draw(st.lists(st.booleans(), min_size=shape[lead], max_size=shape[lead])))
    idx = (slice(None),) * lead + (m,)
    np.testing.assert_equal(Tensor(a)[(slice(None),) * lead + (Tensor(m),)].numpy(), a[idx])


def test_true_division_and_float_math_of_ints_follow_default_float() -> None:
    old = dtypes.default_float
    try:
        dtypes.default_float = dtypes.float16
        a = np.array([1, 4, 9], np.int32)
        for got, ref in [(Tensor(a) / 2, a / 2), (Tensor(a).sqrt(), np.sqrt(a)), (7 / Tensor(a), 7 / a)]:
            assert got.dtype == dtypes.float16
            np.testing.assert_allclose(got.numpy(), ref.astype(np.float16), rtol=1e-3)
        assert (Tensor([1.0], dtype=dtypes.float32) / 2).dtype == dtypes.float32  # a concrete float stays
    finally:
        dtypes.default_float = old
    assert (Tensor([1]) / 2).dtype == dtypes.float32


def test_values_computed_only_from_opted_out_tensors_get_no_grad() -> None:
    rng = np.random.default_rng(3)
    xa, ma, wa = (rng.standard_normal(s).astype(np.float32) for s in [(3, 4), (3, 4), (4, 5)])
    x, m = Tensor(xa, requires_grad=False), Tensor(ma, requires_grad=False)
    w = Tensor(wa, requires_grad=True)
    tmp = x.mul(m)
    mm = tmp.matmul(w)
    scaled = tmp * 2  # a Python scalar does not make it need a gradient
    assert tmp.requires_grad is False and scaled.requires_grad is False and mm.requires_grad is True
    (mm.relu().sum() + scaled.sum()).backward()
    assert x.grad is None and m.grad is None and tmp.grad is None and scaled.grad is None
    assert mm.grad is not None and w.grad is not None
    xm = xa * ma
    ref = xm.T @ (xm @ wa > 0).astype(np.float32)
    np.testing.assert_allclose(w.grad.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_op_results_combine_requires_grad_and_detach_opts_out() -> None:
    a, n, f = Tensor([1.0], requires_grad=True), Tensor([1.0]), Tensor([1.0], requires_grad=False)
    assert (a + f).requires_grad is True and (f + a).requires_grad is True
    assert (n + f).requires_grad is None and (f + n).requires_grad is None and (f + f).requires_grad is False
    assert f.exp().reshape(1, 1).requires_grad is False and a.sum().requires_grad is True
    assert a.detach().requires_grad is False
    # a leaf without any flag still gets its gradient (no requires_grad needed)
    x = Tensor([1.0, 2.0])
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [2.0, 4.0])


@pytest.mark.parametrize("n", [1500, 3000])
def test_long_op_chains_realize_and_differentiate(n: int) -> None:
    base = Tensor([1.0, 2.0])
    parts = [base * i for i in range(n)]
    total = sum(parts[1:], parts[0])  # a chain of n additions
    ref = sum(range(n)) * np.array([1.0, 2.0])
    np.testing.assert_allclose(total.numpy(), ref, rtol=1e-6)
    x = Tensor([1.0])
    y = x
    for _ in range(n // 3):
        y = y * 1.001
    y.sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [1.001 ** (n // 3)], rtol=1e-4)


@given(st.integers(0, 1), st.sampled_from([None, "sum_self", "sum_noself"]), st.integers(0, 2**31 - 1))
def test_scatter_with_gradients_matches_the_write_kernel_and_differentiates(dim: int, mode: str | None,
                                                                            seed: int) -> None:  # fmt: skip
    rng = np.random.default_rng(seed)
    base = rng.standard_normal((4, 5)).astype(np.float32)
    idx = rng.integers(0, base.shape[dim], (3, 4))
    src = rng.standard_normal((3, 5)).astype(np.float32)
    weight = rng.standard_normal((4, 5)).astype(np.float32)

    def run(t: Tensor, s: Tensor) -> Tensor:
        if mode is None:
            return t.scatter(dim, Tensor(idx), s)
        return t.scatter_reduce(dim, Tensor(idx), s, "sum", include_self=mode == "sum_self")

    fast = run(Tensor(base), Tensor(src)).numpy()  # no gradients asked: the O(k) write kernel
    t, s = Tensor(base, requires_grad=True), Tensor(src, requires_grad=True)
    out = run(t, s)
    np.testing.assert_allclose(out.numpy(), fast, rtol=1e-6, atol=1e-6)
    (run(t, s) * Tensor(weight)).sum().backward()
    # reference gradients from the definition: where each src element lands, and which self elements survive
    gs, gt = np.zeros_like(src), weight.copy()
    last: dict[tuple[int, int], tuple[int, int]] = {}
    for i in range(3):
        for j in range(4):
            tgt = (idx[i, j], j) if dim == 0 else (i, idx[i, j])
            last[tgt] = (i, j)
            if mode is not None:
                gs[i, j] = weight[tgt]
            if mode != "sum_self":
                gt[tgt] = 0.0
    if mode is None:
        for tgt, (i, j) in last.items():
            gs[i, j] = weight[tgt]
    np.testing.assert_allclose(s.grad.numpy(), gs, rtol=1e-6)
    np.testing.assert_allclose(t.grad.numpy(), gt, rtol=1e-6)


def test_bitcast_from_and_to_bool_is_the_bytes() -> None:
    """bool's bytes are 0 and 1 (numpy's view): bitcasts from and to bool compile everywhere (a 1-bit bitcast was
    refused by every renderer), and an assign through one writes the source."""
    b = np.array([True, False, True, True, False, False, True, False])
    np.testing.assert_array_equal(Tensor(b).bitcast(dtypes.uint8).numpy(), b.view(np.uint8))
    np.testing.assert_array_equal(Tensor(b).bitcast(dtypes.int16).numpy(), b.view(np.int16))
    np.testing.assert_array_equal(Tensor(b.view(np.uint8)).bitcast(dtypes.bool).numpy(), b)
    a = Tensor(b).realize()
    a.bitcast(dtypes.int8).assign(Tensor(np.arange(8) % 2, dtype=dtypes.int8))
    np.testing.assert_array_equal(a.numpy(), (np.arange(8) % 2).astype(bool))


def test_a_graph_naming_no_device_is_a_device_less_tensor() -> None:
    from speck.tensor.uop.ops import UOp

    t = Tensor(UOp.const(dtypes.float, 2.0))
    u = t.uop
    assert t.device is None and t.uop.device is None and "<UOp None" in repr(t)
    assert t.realize() is t and t.uop is u  # realize is a no-op for a device-less tensor
    assert (t + Tensor([1.0, 2.0])).tolist() == [3.0, 4.0] and t.item() == 2.0


def test_rand_rejects_unknown_keywords() -> None:
    with pytest.raises(TypeError, match="generator"):
        Tensor.rand(5, generator="foo")
    with pytest.raises(TypeError):
        Tensor.randn(5, nonsense=1)
    assert Tensor.rand(3, contiguous=False).shape == (3,)


def test_has_buffer_identity() -> None:
    from speck.tensor.uop.ops import UOp

    assert Tensor([1.0]).realize().uop.has_buffer_identity() and not (Tensor([1.0]) * 2).uop.has_buffer_identity()
    assert Tensor(UOp.const(dtypes.float, 2.0)).clone().uop.has_buffer_identity()
    e = Tensor.ones(4, 8).shard(("CPU", "CPU:1"), axis=0).empty_like()
    assert e.uop.axis == 0 and e.uop.has_buffer_identity()


def test_safe_save_refuses_literal_dtypes(tmp_path: pathlib.Path) -> None:
    from speck.tensor.nn.state import safe_save

    with pytest.raises(ValueError, match="literal"):
        safe_save({"a": Tensor([1, 2]) * 0.5}, tmp_path / "a.safetensors")
    assert not (tmp_path / "a.safetensors").exists()


def test_from_blob_sees_later_changes_to_the_memory_and_never_frees_it() -> None:
    """from_blob wraps the memory (no copy): a computation run after the owner changed it reads the new values, even
    one structurally identical to an earlier one; dropping the tensor frees nothing and counts nothing."""
    import gc

    from speck.tensor import GlobalCounters

    arr = np.zeros(4, np.int32)
    gc.collect()
    before = GlobalCounters.mem_used
    t = Tensor.from_blob(arr.ctypes.data, (4,), dtype=dtypes.int32, device="CPU")
    assert (t + 1).tolist() == [1, 1, 1, 1]
    arr[:] = [0, 1, 2, 3]
    assert (t + 1).tolist() == [1, 2, 3, 4] and t.tolist() == [0, 1, 2, 3]
    (t * 2).realize()
    del t
    gc.collect()
    assert GlobalCounters.mem_used == before and arr.tolist() == [0, 1, 2, 3]


def test_uop_shard() -> None:
    u = Tensor(np.arange(8, dtype=np.float32)).realize().uop
    assert u.shard(("CPU", "CPU:1")).axis is None and u.shard(("CPU", "CPU:1"), 0).axis == 0
    np.testing.assert_array_equal(Tensor(u.shard(("CPU", "CPU:1"), 0)).numpy(), np.arange(8))


@pytest.mark.parametrize("dt", [dtypes.int8, dtypes.uint8, dtypes.bool, dtypes.int16, dtypes.half, dtypes.float32])
def test_cumsum_of_0d_and_empty_takes_the_sum_dtype(dt) -> None:  # type: ignore[no-untyped-def]
    # TENSOR_API 7.2: "0-d or empty returns the input (cast as sum would)"; int8/bool kept their own dtype
    want = Tensor([1], dtype=dt).sum().dtype
    for t in (Tensor(1, dtype=dt), Tensor.ones(0, dtype=dt), Tensor.ones(2, 0, dtype=dt)):
        out = t.cumsum(-1)
        assert out.dtype == want and out.shape == t.shape
    assert Tensor(1, dtype=dt).cumsum().tolist() == 1
    assert Tensor([1, 1], dtype=dt).cumsum().dtype == want
