"""Tensor.assign with numpy's ("eager") semantics: writes through every kind of view land in the buffer, reads taken
between writes keep the value of their time however late (and in whatever order) they are realized, overlapping
shifted writes give numpy's result. The backbone is a hypothesis test that plays random chains of views, writes
and reads on a realized tensor against the same chain on a numpy array."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor, TinyJit, dtypes
from speck.tensor.schedule import assert_kernel_count

BASE = np.arange(24, dtype=np.float32).reshape(4, 6)


# ---------------- a random program of views, writes and reads ----------------
def _view(t: Tensor, a: np.ndarray, kind: str, data: st.DataObject) -> tuple[Tensor, np.ndarray] | None:
    """The same view of the speck tensor and of the numpy array (None when numpy would copy instead)."""
    if a.ndim == 0:
        return None
    ax = data.draw(st.integers(0, a.ndim - 1), label="axis")
    n = a.shape[ax]
    if kind == "slice":
        start, stop = data.draw(st.integers(-n, n), label="start"), data.draw(st.integers(-n, n), label="stop")
        step = data.draw(st.sampled_from([1, 1, 2, -1, -2, 3]), label="step")
        sl = tuple(slice(None) if i != ax else slice(start, stop, step) for i in range(a.ndim))
        return t[sl], a[sl]
    if kind == "int" and n > 0:
        i = data.draw(st.integers(-n, n - 1), label="index")
        sl = tuple(slice(None) if k != ax else i for k in range(a.ndim))
        return t[sl], a[(*sl, Ellipsis)]  # numpy: the trailing ... keeps a 0-d result a view, not a scalar copy
    if kind == "flip":
        return t.flip(ax), np.flip(a, ax)
    if kind == "permute" and a.ndim >= 2:
        order = data.draw(st.permutations(range(a.ndim)), label="order")
        return t.permute(order), a.transpose(order)
    if kind == "reshape" and a.size > 0:
        r = a.reshape(-1)
        if not np.shares_memory(r, a):
            return None  # numpy copies a non-contiguous view: no aliasing to compare against
        return t.reshape(-1), r
    if kind == "bitcast":
        return t.bitcast(dtypes.int32), a.view(np.int32)
    return None


@given(data=st.data())
@settings(max_examples=40)
def test_random_views_writes_and_reads_match_numpy(data: st.DataObject) -> None:
    ref = BASE.copy()
    x = Tensor(BASE.copy()).realize()
    handles: list[tuple[Tensor, np.ndarray]] = [(x, ref)]
    reads: list[tuple[Tensor, np.ndarray]] = []
    for _ in range(data.draw(st.integers(1, 8), label="steps")):
        op = data.draw(st.sampled_from(["view", "view", "assign", "assign", "read", "realize", "setitem"]))
        t, a = handles[data.draw(st.integers(0, len(handles) - 1), label="handle")]
        if op == "view":
            kind = data.draw(st.sampled_from(["slice", "int", "flip", "permute", "reshape", "bitcast"]))
            v = _view(t, a, kind, data)
            if v is not None and v[1].dtype == np.float32:
                handles.append(v)
        elif op == "assign" and a.dtype == np.float32:
            same = [h for h in handles + reads if h[1].shape == a.shape and h[1].dtype == np.float32]
            src_t, src_a = same[data.draw(st.integers(0, len(same) - 1), label="source")]
            how = data.draw(st.sampled_from(["expr", "const", "copy"]))
            if how == "expr":
                t.assign(src_t * 2 + 1)
                a[...] = src_a * 2 + 1
            elif how == "const":
                c = float(data.draw(st.integers(-5, 5)))
                t.assign(c)
                a[...] = c
            else:
                t.assign(src_t)
                a[...] = src_a
        elif op == "read":
            reads.append((t + 0, a + 0))
        elif op == "realize" and reads:
            reads[data.draw(st.integers(0, len(reads) - 1), label="which read")][0].realize()
        elif op == "setitem" and a.ndim == 1 and a.size > 0 and a.dtype == np.float32:
            idx = data.draw(st.lists(st.integers(-a.size, a.size - 1), min_size=1, max_size=5), label="indices")
            vals = np.arange(len(idx), dtype=np.float32) + 100
            t[Tensor(np.array(idx, dtype=np.int32))] = Tensor(vals)
            a[np.array(idx)] = vals  # numpy: the last duplicate wins
    order = data.draw(st.permutations(range(len(reads))), label="read order")
    for i in order:
        np.testing.assert_array_equal(reads[i][0].numpy(), reads[i][1], err_msg=f"read {i}")
    np.testing.assert_array_equal(x.numpy(), ref)
    for t, a in handles:
        np.testing.assert_array_equal(t.numpy(), a)


# ---------------- the cases the issue names ----------------
def test_write_through_a_slice_changes_the_tensor() -> None:
    x = Tensor(np.arange(8, dtype=np.float32)).realize()
    x[2:4].assign(x[2:4] + 1)
    assert x.tolist() == [0, 1, 3, 4, 4, 5, 6, 7]


@pytest.mark.parametrize("first", ["y0", "y1"])
def test_reads_between_writes_keep_their_values(first: str) -> None:
    x = Tensor(np.arange(4, dtype=np.float32)).realize()
    y0 = x + 0
    x.assign(x + 1)
    y1 = x + 0
    got = {"y0": None, "y1": None}
    for name in (first, "y1" if first == "y0" else "y0"):
        got[name] = (y0 if name == "y0" else y1).numpy()
    np.testing.assert_array_equal(got["y0"], [0, 1, 2, 3])
    np.testing.assert_array_equal(got["y1"], [1, 2, 3, 4])


def test_overlapping_shifted_writes_give_numpy_results() -> None:
    ref = np.arange(10, dtype=np.float32)
    x = Tensor(ref.copy()).realize()
    x[1:].assign(x[:-1])
    ref[1:] = ref[:-1]
    x[:-2].assign(x[2:] * 10)
    ref[:-2] = ref[2:] * 10
    x[::-1].assign(x)
    ref[::-1] = ref.copy()
    np.testing.assert_array_equal(x.numpy(), ref)


def test_strided_permuted_flipped_reshaped_and_bitcast_views_write_through() -> None:
    ref = np.arange(24, dtype=np.float32).reshape(4, 6)
    x = Tensor(ref.copy()).realize()
    x[::2, 1::3].assign(Tensor(np.full((2, 2), -1, np.float32)))
    ref[::2, 1::3] = -1
    x.T[2].assign(Tensor(np.array([7, 8, 9, 10], np.float32)))
    ref.T[2] = [7, 8, 9, 10]
    x.flip(1)[1].assign(Tensor(np.arange(6, dtype=np.float32) * -1))
    np.flip(ref, 1)[1] = np.arange(6) * -1
    x.reshape(24)[20:].assign(5.0)
    ref.reshape(24)[20:] = 5
    x.bitcast(dtypes.int32)[3, :2].assign(Tensor(np.array([1, 2], np.int32)))
    ref.view(np.int32)[3, :2] = [1, 2]
    x.pad(((1, 1), (0, 0)))[1:3].assign(Tensor(np.zeros((2, 6), np.float32)))  # the padded rows have no memory
    ref[:2] = 0
    np.testing.assert_array_equal(x.numpy(), ref)


def test_views_taken_before_a_write_see_it_and_values_computed_before_do_not() -> None:
    x = Tensor(np.arange(6, dtype=np.float32)).realize()
    view, computed = x.reshape(2, 3)[1], x.reshape(2, 3)[1] * 1
    x.assign(Tensor(np.ones(6, np.float32)))
    assert view.tolist() == [1, 1, 1] and computed.tolist() == [3, 4, 5]


def test_write_through_a_broadcast_view_raises() -> None:
    x = Tensor(np.arange(3, dtype=np.float32)).realize()
    with pytest.raises(RuntimeError, match="broadcast"):
        x.reshape(1, 3).expand(2, 3).assign(Tensor(np.zeros((2, 3), np.float32)))
    assert x.tolist() == [0, 1, 2]


def test_chains_of_lazy_assigns_run_in_order() -> None:
    x = Tensor(np.zeros(3, np.float32)).realize()
    y = Tensor(np.ones(3, np.float32)).realize()
    x.assign(y + 1)
    y.assign(x * 10)  # reads x after its write
    x.assign(x + y)
    with assert_kernel_count(3):  # lazy: nothing ran until here
        Tensor.realize(x, y)
    assert x.tolist() == [22, 22, 22] and y.tolist() == [20, 20, 20]


def test_assign_to_an_unrealized_target() -> None:
    a = Tensor(np.array([1.0, 2.0], np.float32)) * 1
    b = a * 1
    a += 1
    assert a.tolist() == [2, 3] and b.tolist() == [1, 2]  # b was computed from a before the write
    z = Tensor.zeros(4).contiguous()
    zv = z[1:3]
    zv.assign(Tensor([5.0, 6.0]))
    assert z.tolist() == [0, 5, 6, 0] and zv.tolist() == [5, 6]
    w1, w2 = Tensor.ones(2), Tensor.ones(2)  # equal lazy graphs, distinct tensors
    w1.assign(Tensor([3.0, 4.0]))
    assert w1.tolist() == [3, 4] and w2.tolist() == [1, 1]


def test_assign_of_scalars_and_lists_and_self() -> None:
    x = Tensor(np.zeros((2, 2), np.int32)).realize()
    x.assign(3)
    assert x.tolist() == [[3, 3], [3, 3]]
    x.assign([[1, 2], [3, 4]])
    assert x.tolist() == [[1, 2], [3, 4]]
    x[0].assign([7, 8])
    assert x.tolist() == [[7, 8], [3, 4]]
    assert x.assign(x) is x and x.tolist() == [[7, 8], [3, 4]]


def test_assign_errors() -> None:
    x = Tensor(np.zeros(4, np.float32)).realize()
    with pytest.raises(ValueError, match="broadcast"):
        x.assign(Tensor(np.zeros(3, np.float32)))
    with pytest.raises(RuntimeError, match="assign dtype mismatch"):
        x.assign(Tensor(np.zeros(4, np.int32)))
    with pytest.raises(RuntimeError, match="assign device mismatch"):  # another device (TENSOR_API 4.6): move it first
        x.assign(Tensor(np.ones(4, np.float32), device="PYTHON"))
    assert x.tolist() == [0, 0, 0, 0]
    x.assign(Tensor(np.ones(4, np.float32), device="PYTHON").to(x.device))
    assert x.tolist() == [1, 1, 1, 1]


def test_assign_broadcasts_the_value() -> None:
    x = Tensor(np.zeros((2, 3), np.float32)).realize()
    x.assign(Tensor(np.array([1, 2, 3], np.float32)))
    assert x.tolist() == [[1, 2, 3], [1, 2, 3]]


def test_disk_assign_writes_immediately(tmp_path: Any) -> None:
    path = tmp_path / "data.bin"
    t = Tensor.empty(8, dtype=dtypes.uint8, device=f"DISK:{path}")
    t.assign(Tensor(np.arange(8, dtype=np.uint8)).to(t.device))
    assert path.read_bytes() == bytes(range(8))  # no realize: DISK writes happen at once
    t[2:4].assign(Tensor(np.array([9, 9], np.uint8)).to(t.device))
    assert path.read_bytes() == bytes([0, 1, 9, 9, 4, 5, 6, 7])


def test_jit_captures_assigns_and_reads_of_old_values() -> None:
    w = Tensor(np.ones(3, np.float32)).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        before = (w * x).sum()  # read before the write: old values
        w.assign(w + x)
        return before

    ref, got = np.ones(3, np.float32), []
    for i in range(5):
        xi = np.full(3, i, np.float32)
        got.append(step(Tensor(xi)).item())
        assert got[-1] == float((ref * xi).sum())
        ref = ref + xi
        np.testing.assert_array_equal(w.numpy(), ref)


def test_assign_of_a_realized_tensor_shares_memory_until_one_is_written_in_place() -> None:
    src = Tensor(np.arange(4, dtype=np.float32)).realize()
    dst = Tensor(np.zeros(4, np.float32)).realize()
    with assert_kernel_count(0):  # no copy kernel: dst takes src's memory
        dst.assign(src).realize()
    dst[1] = 9.0
    src[2] = 7.0
    assert dst.tolist() == [0, 9, 2, 3] and src.tolist() == [0, 1, 7, 3]


@pytest.mark.parametrize("reduction", ["sum", "max", "min", "mean", "sum_keepdim", "sum_of_view"])
def test_reduction_over_size_one_dims_is_a_read_of_its_time(reduction: str) -> None:
    """A reduction over 1-sized dims only has the values it reads, but it is a read: a later write to the buffer
    must not show through it (it used to fold into a view of the buffer)."""
    ref = np.array([[3.0, -1.0]], np.float32)
    x = Tensor(ref.copy()).realize()
    red = {
        "sum": lambda t: t.sum(0), "max": lambda t: t.max(0), "min": lambda t: t.min(0), "mean": lambda t: t.mean(0),
        "sum_keepdim": lambda t: t.sum(0, keepdim=True), "sum_of_view": lambda t: t.T.sum(1),
    }[reduction]  # fmt: skip
    want = {"sum": ref.sum(0), "max": ref.max(0), "min": ref.min(0), "mean": ref.mean(0),
            "sum_keepdim": ref.sum(0, keepdims=True), "sum_of_view": ref.T.sum(1)}[reduction]  # fmt: skip
    before = red(x)
    x.assign(Tensor(np.zeros((1, 2), np.float32)))
    np.testing.assert_array_equal(before.numpy(), want)
    np.testing.assert_array_equal(red(x).numpy(), np.zeros_like(want))
