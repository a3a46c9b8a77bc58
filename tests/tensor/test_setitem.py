"""Tensor.__setitem__ against numpy: basic and advanced (list / index tensor) indices, broadcasting values, the dtype
rules, duplicate indices (the last one wins), realized targets written in place (views see it) and unrealized ones
rebound to the merged value, DISK targets, and O(k) scatter kernels for index tensors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, dtypes
from speck.tensor.schedule import assert_kernel_count

A = np.arange(60, dtype=np.int32).reshape(3, 4, 5)


def _index(data: st.DataObject, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """A random mix of ints, slices, lists and int arrays, one per leading dim."""
    out: list[Any] = []
    for d, n in enumerate(shape[: data.draw(st.integers(1, len(shape)), label="ndims")]):
        kind = data.draw(st.sampled_from(["int", "slice", "list", "array", "all"]), label=f"kind{d}")
        if kind == "int":
            out.append(data.draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            out.append(slice(data.draw(st.integers(-n, n)), data.draw(st.integers(-n, n)),
                             data.draw(st.sampled_from([1, 2, -1, 3]))))  # fmt: skip
        elif kind in ("list", "array"):
            ix = data.draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=4))
            out.append(ix if kind == "list" else np.array(ix, dtype=np.int32))
        else:
            out.append(slice(None))
    return tuple(out)


def _as_speck(idx: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(Tensor(i) if isinstance(i, np.ndarray) else i for i in idx)


@given(data=st.data())
@settings(max_examples=30)
def test_setitem_matches_numpy(data: st.DataObject) -> None:
    idx = _index(data, A.shape)
    ref = A.copy()
    try:
        np_shape = ref[idx].shape
    except IndexError:
        return  # index lists that don't broadcast together: getitem's errors are tested with getitem
    speck_shape = Tensor(A)[_as_speck(idx)].shape
    t = Tensor(A.copy()).realize()
    view = t.reshape(60)
    if np_shape != speck_shape:
        return  # int indices do not take part in advanced placement (spec 6.1): numpy's shape differs there
    if np.prod(np_shape) == 0:
        return
    value = np.arange(int(np.prod(np_shape)), dtype=np.int32).reshape(np_shape) - 100
    if data.draw(st.booleans(), label="broadcast value"):
        value = value.reshape(np_shape)[(0,) * (len(np_shape) - 1)] if np_shape else value
    ref[idx] = np.broadcast_to(value, np_shape)
    t[_as_speck(idx)] = Tensor(value)
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(view.numpy(), ref.reshape(60))


def test_duplicate_indices_last_one_wins() -> None:
    ref = np.zeros(8, np.float32)
    t = Tensor(ref.copy()).realize()
    idx = np.array([3, 1, 3, 3, 1, 7, -1], dtype=np.int32)
    vals = np.arange(7, dtype=np.float32) + 1
    t[Tensor(idx)] = Tensor(vals)
    ref[idx] = vals
    np.testing.assert_array_equal(t.numpy(), ref)
    assert t.numpy()[3] == 4 and t.numpy()[7] == 7  # positions 0..6 in index order: the last write of 3 is 4th


def test_two_index_tensors_and_a_slice() -> None:
    ref = np.zeros((4, 5, 6), np.float32)
    t = Tensor(ref.copy()).realize()
    i, j = np.array([0, 3, 3], np.int32), np.array([[1], [4]], np.int32)
    ref[i, 1:4, j] = 9
    t[Tensor(i), 1:4, Tensor(j)] = 9
    np.testing.assert_array_equal(t.numpy(), ref)


def test_setitem_values_and_dtypes() -> None:
    t = Tensor(np.zeros(4, np.int32)).realize()
    t[1] = 2.7  # a Python value is converted to the target dtype
    t[2:] = [5, 6]
    assert t.tolist() == [0, 2, 5, 6]
    with pytest.raises(RuntimeError, match="setitem dtype mismatch"):
        t[0] = Tensor([1.5])
    with pytest.raises(ValueError, match="broadcast"):
        t[1:3] = Tensor(np.array([1, 2, 3], np.int32))
    with pytest.raises(IndexError):
        t[4] = 1
    assert t.tolist() == [0, 2, 5, 6]


def test_setitem_on_views_and_through_views() -> None:
    ref = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = Tensor(ref.copy()).realize()
    row = t[1]
    tt = t.T
    tt[Tensor([0, 2]), 1] = -1.0  # advanced setitem through a transposed view writes the base
    ref.T[[0, 2], 1] = -1
    row[::2] = 7.0
    ref[1, ::2] = 7
    np.testing.assert_array_equal(t.numpy(), ref)
    np.testing.assert_array_equal(row.numpy(), ref[1])


def test_setitem_on_an_unrealized_tensor_rebinds_it() -> None:
    t = Tensor.zeros(5)
    other = Tensor.zeros(5)  # an equal lazy graph: must not change
    t[Tensor([1, 3])] = 2.0
    t[0] = 1.0
    assert t.tolist() == [1, 2, 0, 2, 0] and other.tolist() == [0, 0, 0, 0, 0]
    lazy = Tensor(np.arange(4, dtype=np.float32)) * 2
    before = lazy + 0
    lazy[1:3] = Tensor([9.0, 9.0])
    assert lazy.tolist() == [0, 9, 9, 6] and before.tolist() == [0, 2, 4, 6]


def test_reads_before_a_setitem_keep_old_values() -> None:
    t = Tensor(np.arange(5, dtype=np.float32)).realize()
    old = t * 1
    t[Tensor([0, 4])] = Tensor([10.0, 40.0])
    new = t * 1
    assert new.tolist() == [10, 1, 2, 3, 40] and old.tolist() == [0, 1, 2, 3, 4]


def test_setitem_from_its_own_values_reads_them_first() -> None:
    ref = np.arange(6, dtype=np.float32)
    t = Tensor(ref.copy()).realize()
    idx = np.array([1, 2, 3], np.int32)
    t[Tensor(idx)] = t[Tensor(idx - 1)] * 10  # numpy: the right side is computed before any write
    ref[idx] = ref[idx - 1] * 10
    np.testing.assert_array_equal(t.numpy(), ref)


def test_index_tensor_setitem_is_one_scatter_kernel() -> None:
    t = Tensor(np.zeros(1 << 16, np.float32)).realize()
    idx, v = Tensor(np.arange(0, 1 << 16, 7, dtype=np.int32)), Tensor(np.ones((1 << 16) // 7 + 1, np.float32))
    t[idx] = v
    with assert_kernel_count(1):  # in place: no copy of the 64k-element target, no pass over it per index
        t.realize()
    assert t.numpy()[::7].sum() == len(range(0, 1 << 16, 7)) and t.numpy().sum() == len(range(0, 1 << 16, 7))


def test_disk_basic_setitem(tmp_path: Any) -> None:
    path = tmp_path / "d.bin"
    t = Tensor.empty(6, dtype=dtypes.uint8, device=f"DISK:{path}")
    t[:] = Tensor(np.zeros(6, np.uint8)).to(t.device)
    t[1:3] = Tensor(np.array([5, 6], np.uint8)).to(t.device)
    assert path.read_bytes() == bytes([0, 5, 6, 0, 0, 0])


def test_two_index_tensors_cost_o_k() -> None:
    """The work of a setitem (and the getitem) with several index tensors is per selected element, not per element
    of the target: the estimated ops of the kernels stay far below the 4M-element target's size."""
    from speck.tensor import GlobalCounters

    ref = np.zeros((2000, 2000), np.float32)
    t = Tensor(ref.copy()).realize()
    rng = np.random.default_rng(1)
    i, j = rng.integers(-2000, 2000, 300).astype(np.int32), rng.integers(0, 2000, 300).astype(np.int32)
    GlobalCounters.reset()
    t[Tensor(i), Tensor(j)] = Tensor(np.arange(300, dtype=np.float32))
    got = t[Tensor(i), Tensor(j)].numpy()
    ref[i, j] = np.arange(300)
    np.testing.assert_array_equal(got, ref[i, j])
    np.testing.assert_array_equal(t.numpy(), ref)
    assert GlobalCounters.global_ops < 300 * 1000, GlobalCounters.global_ops
