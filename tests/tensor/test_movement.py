"""Movement ops against numpy (all exact: they only move values)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor
from tensor_helpers import SOME, arrays, assert_matches, shapes


@given(shape=shapes(), seed=st.integers(0, 2**16), data=st.data())
@SOME
def test_reshape_permute_expand_flip(shape: tuple[int, ...], seed: int, data: Any) -> None:
    a = arrays(shape, np.int32, seed, -9, 9)
    t = Tensor(a)
    assert_matches(t.reshape(-1).numpy(), a.reshape(-1))
    assert_matches(t.reshape((1,) + shape + (1,)).numpy(), a.reshape((1,) + shape + (1,)))
    perm = data.draw(st.permutations(range(len(shape))))
    assert_matches(t.permute(tuple(perm)).numpy(), a.transpose(perm))
    if len(shape) >= 2:  # tinygrad's .T is transpose(): it swaps dims 0 and 1 only
        assert_matches(t.T.numpy(), np.swapaxes(a, 0, 1))
    else:
        with pytest.raises(IndexError):
            _ = t.T
    flips = tuple(i for i in range(len(shape)) if data.draw(st.booleans()))
    assert_matches(t.flip(flips).numpy(), np.flip(a, flips) if flips else a)
    target = tuple(3 if s == 1 else s for s in shape)
    assert_matches(t.expand(target).numpy(), np.broadcast_to(a, target))
    assert_matches(t.expand((2,) + target).numpy(), np.broadcast_to(a, (2,) + target))
    assert_matches(t.flatten().numpy(), a.flatten())
    if len(shape) >= 2:
        assert_matches(t.transpose(0, -1).numpy(), np.swapaxes(a, 0, -1))
        assert_matches(t.flatten(1).numpy(), a.reshape(shape[0], -1))


@given(shape=shapes(1, 3), seed=st.integers(0, 2**16), data=st.data())
@SOME
def test_pad_shrink_modes(shape: tuple[int, ...], seed: int, data: Any) -> None:
    a = arrays(shape, np.float32, seed)
    t = Tensor(a)
    pads = tuple((data.draw(st.integers(0, 2)), data.draw(st.integers(0, 2))) for _ in shape)
    assert_matches(t.pad(pads).numpy(), np.pad(a, pads))
    assert_matches(t.pad(pads, value=-1.5).numpy(), np.pad(a, pads, constant_values=-1.5))
    if all(s > 0 for s in shape):
        assert_matches(t.pad(pads, mode="replicate").numpy(), np.pad(a, pads, mode="edge"))
        if all(b <= s and e <= s for (b, e), s in zip(pads, shape)):
            assert_matches(t.pad(pads, mode="circular").numpy(), np.pad(a, pads, mode="wrap"))
        if all(b < s and e < s for (b, e), s in zip(pads, shape)):
            assert_matches(t.pad(pads, mode="reflect").numpy(), np.pad(a, pads, mode="reflect"))
    # negative pads crop
    neg = tuple((-min(b, s // 2), -min(e, s - s // 2)) for (b, e), s in zip(pads, shape))
    sl = tuple(slice(-b, s + e) for (b, e), s in zip(neg, shape))
    assert_matches(t.pad(neg).numpy(), a[sl])
    box = tuple((min(b, s), max(min(b, s), s - e)) for (b, e), s in zip(pads, shape))
    assert_matches(t.shrink(box).numpy(), a[tuple(slice(x, y) for x, y in box)])
    flat = [x for p in reversed(pads) for x in p]
    assert_matches(t.pad(flat).numpy(), np.pad(a, pads))


def test_pad_to_shrink_to() -> None:
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert_matches(Tensor(a).pad_to(4, 5).numpy(), np.pad(a, ((0, 2), (0, 2))))
    assert_matches(Tensor(a).pad_to(None, 4).numpy(), np.pad(a, ((0, 0), (0, 1))))
    assert_matches(Tensor(a).shrink_to(1, 2).numpy(), a[:1, :2])


@given(shape=shapes(1, 3), seed=st.integers(0, 2**16), data=st.data())
@SOME
def test_roll_repeat_tile(shape: tuple[int, ...], seed: int, data: Any) -> None:
    a = arrays(shape, np.int32, seed, -9, 9)
    t = Tensor(a)
    dim = data.draw(st.integers(-len(shape), len(shape) - 1))
    k = data.draw(st.integers(-7, 7))
    assert_matches(t.roll(k, dim).numpy(), np.roll(a, k, dim))
    assert_matches(t.roll(k).numpy(), np.roll(a, k))
    reps = tuple(data.draw(st.integers(1, 2)) for _ in range(len(shape) + data.draw(st.integers(0, 1))))
    assert_matches(t.repeat(reps).numpy(), np.tile(a, reps))
    assert_matches(t.tile(reps[-1]).numpy(), np.tile(a, reps[-1]))
    assert_matches(t.repeat_interleave(2, dim).numpy(), np.repeat(a, 2, dim))
    assert_matches(t.repeat_interleave(3).numpy(), np.repeat(a, 3))


@pytest.mark.parametrize("shape", [(0,), (2, 0, 3)])
@pytest.mark.parametrize("shifts,dims", [(1, 0), (-3, -1), ((1, 2), (0, 0)), (5, None)])
def test_roll_zero_size_is_unchanged(shape: tuple[int, ...], shifts: Any, dims: Any) -> None:
    t = Tensor.ones(*shape)
    out = t.roll(shifts, dims)
    assert out.shape == shape
    assert out.numpy().shape == shape


def test_roll_shift_dim_mismatch_raises() -> None:
    t = Tensor([1, 2, 3])
    with pytest.raises(RuntimeError):
        t.roll((1, 2), 0)
    assert t.roll(1, 0).tolist() == [3, 1, 2]


@given(shape=shapes(1, 3), seed=st.integers(0, 2**16), data=st.data())
@SOME
def test_squeeze_unsqueeze_unflatten(shape: tuple[int, ...], seed: int, data: Any) -> None:
    a = arrays(shape, np.float32, seed)
    t = Tensor(a)
    d = data.draw(st.integers(-len(shape), len(shape) - 1))
    assert_matches(t.unsqueeze(d).numpy(), np.expand_dims(a, d))
    assert_matches(t.squeeze().numpy(), np.squeeze(a))
    assert_matches(t.squeeze(d).numpy(), np.squeeze(a, d) if shape[d] == 1 else a)
    if shape[0] % 1 == 0:
        assert_matches(t.unflatten(0, (1, shape[0])).numpy(), a.reshape((1,) + shape))


@given(shape=shapes(1, 3), seed=st.integers(0, 2**16), data=st.data())
@SOME
def test_cat_stack_split_chunk(shape: tuple[int, ...], seed: int, data: Any) -> None:
    d = data.draw(st.integers(0, len(shape) - 1))
    a, b = arrays(shape, np.float32, seed), arrays(shape, np.int32, seed + 1, -4, 4)
    ta, tb = Tensor(a), Tensor(b)
    assert_matches(ta.cat(tb, ta, dim=d).numpy(), np.concatenate([a, b, a], d))
    assert_matches(ta.stack(tb, dim=d).numpy(), np.stack([a, b.astype(np.float32)], d))
    n = shape[d]
    if n:
        sz = data.draw(st.integers(1, n))
        parts = ta.split(sz, d)
        ref = np.split(a, list(range(sz, n, sz)), d)
        assert len(parts) == len(ref)
        for p, r in zip(parts, ref):
            assert_matches(p.numpy(), r)
        ch = data.draw(st.integers(1, 3))
        refc = np.array_split(a, range(-(-n // ch), n, -(-n // ch)), d)
        for p, r in zip(ta.chunk(ch, d), refc):
            assert_matches(p.numpy(), r)


def test_unfold_diag_diagonal_meshgrid() -> None:
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    t = Tensor(a)
    assert_matches(t.unfold(1, 3, 2).numpy(), np.lib.stride_tricks.sliding_window_view(a, 3, 1)[:, ::2])
    assert_matches(t.unfold(0, 2, 1).numpy(), np.lib.stride_tricks.sliding_window_view(a, 2, 0))
    for k in (-2, 0, 1, 5):
        assert_matches(t.diagonal(k).numpy(), np.diagonal(a, k))
    b = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    assert_matches(Tensor(b).diagonal(0, 1, 2).numpy(), np.diagonal(b, 0, 1, 2))
    assert_matches(Tensor([1.0, 2.0, 3.0]).diag().numpy(), np.diag([1.0, 2.0, 3.0]))
    assert_matches(Tensor([1.0, 2.0]).diag(1).numpy(), np.diag([1.0, 2.0], 1))
    with pytest.raises(ValueError):  # tinygrad's diag() builds a matrix from a 1-D tensor only
        t.diag()
    x, y = Tensor.meshgrid(Tensor([1, 2, 3]), Tensor([4, 5]))
    rx, ry = np.meshgrid([1, 2, 3], [4, 5], indexing="ij")
    assert_matches(x.numpy(), rx)
    assert_matches(y.numpy(), ry)
    x, y = Tensor.meshgrid(Tensor([1, 2, 3]), Tensor([4, 5]), indexing="xy")
    rx, ry = np.meshgrid([1, 2, 3], [4, 5], indexing="xy")
    assert_matches(x.numpy(), rx)
    assert_matches(y.numpy(), ry)


def test_movement_errors_are_clear_and_recoverable() -> None:
    t = Tensor.arange(6)
    with pytest.raises(RuntimeError, match=r"can't reshape shape \(6,\).*\(4,\)"):
        t.reshape(4)
    with pytest.raises(RuntimeError, match="only one dimension can be -1"):
        t.reshape(-1, -1)
    with pytest.raises(RuntimeError, match="can't be broadcast"):
        _ = t + Tensor.ones(4)
    with pytest.raises(RuntimeError, match="can't expand"):
        t.expand(2, 5)
    with pytest.raises(RuntimeError, match="permutation"):
        t.reshape(2, 3).permute(0, 0)
    with pytest.raises(IndexError, match="out of range"):
        t.unsqueeze(3)
    with pytest.raises(RuntimeError, match="shape must be int"):
        t.reshape(2.0, 3)
    assert t.reshape(2, 3).tolist() == [[0, 1, 2], [3, 4, 5]]
    assert (t + 1).tolist() == [1, 2, 3, 4, 5, 6]
