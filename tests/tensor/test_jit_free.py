"""CapturedJit.free_intermediates: the memory of the buffers every replay computes from scratch (intermediates and
returned tensors) goes back to the allocator, the next replay allocates it again and computes numpy's values;
inputs, state carried between replays (assign targets, implicit inputs) and what prune=True computed once stay."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from speck.tensor import GlobalCounters, Tensor, TinyJit
from speck.tensor.jit import JitError

RNG = np.random.default_rng(11)


def arr(n: int) -> np.ndarray:
    return RNG.standard_normal(n).astype(np.float32)


def _three_stage(ext: Tensor) -> TinyJit[Tensor]:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        t1 = (x * 2).contiguous().realize()
        t2 = (t1 + ext).contiguous().realize()
        return (t2.exp().sum() * 3).realize()

    return f


def _want(x: np.ndarray, e: np.ndarray) -> np.float32:
    return np.float32(np.exp(x.astype(np.float64) * 2 + e).sum() * 3)


def test_free_gives_the_memory_back_and_the_next_replay_recomputes() -> None:
    e = arr(64)
    ext = Tensor(e).realize()
    f = _three_stage(ext)
    for _ in range(3):
        x = arr(64)
        np.testing.assert_allclose(f(Tensor(x)).numpy(), _want(x, e), rtol=1e-5)
    assert f.captured is not None
    out = f(Tensor(arr(64)))
    before = GlobalCounters.mem_used
    f.captured.free_intermediates()
    assert before - GlobalCounters.mem_used >= 2 * 64 * 4 + 4  # t1, t2 and the output at least
    with pytest.raises(JitError, match="free_intermediates"):
        out.numpy()  # its memory is gone: an error, not whatever reuses it
    np.testing.assert_array_equal(ext.numpy(), e)  # an implicit input keeps its memory and values
    for _ in range(2):
        f.captured.free_intermediates()  # again, and twice in a row
        x = arr(64)
        got = f(Tensor(x))
        assert got is out  # replays still return the captured objects
        np.testing.assert_allclose(got.numpy(), _want(x, e), rtol=1e-5)


def test_free_keeps_state_updated_across_replays() -> None:
    acc = Tensor(np.zeros(8, dtype=np.float32)).realize()
    w = Tensor(arr(8)).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        acc.assign(acc + x * w).realize()
        return (acc * 2).realize()

    want = np.zeros(8, dtype=np.float32)
    for i in range(6):
        x = arr(8)
        want = want + x * w.numpy()
        got = step(Tensor(x)).numpy()
        np.testing.assert_allclose(got, want * 2, rtol=1e-5)
        if i >= 2:
            assert step.captured is not None
            step.captured.free_intermediates()
            np.testing.assert_allclose(acc.numpy(), want, rtol=1e-5)  # the state kept its values


def test_free_keeps_what_prune_computed_once() -> None:
    w = Tensor(arr(16)).realize()

    @TinyJit(prune=True)
    def f(x: Tensor) -> Tensor:
        w2 = (w * 2 + 1).contiguous().realize()  # input-independent: computed at the capture only
        return (x * w2).realize()

    for _ in range(3):
        f(Tensor(arr(16)))
    assert f.captured is not None
    f.captured.free_intermediates()
    x = arr(16)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), x * (w.numpy() * 2 + 1), rtol=1e-6)


def test_a_freed_capture_pickles_and_replays() -> None:
    e = arr(32)
    f = _three_stage(Tensor(e).realize())
    for _ in range(3):
        f(Tensor(arr(32)))
    assert f.captured is not None
    f.captured.free_intermediates()
    g = pickle.loads(pickle.dumps(f))
    x = arr(32)
    np.testing.assert_allclose(g(Tensor(x)).numpy(), _want(x, e), rtol=1e-5)
    np.testing.assert_allclose(f(Tensor(x)).numpy(), _want(x, e), rtol=1e-5)


def test_free_of_a_pure_state_update_gives_nothing_back() -> None:
    """x += y returning x: the target is state and the new value is its update (tinygrad writes it in place): nothing
    is freed, and later replays keep accumulating."""
    x = Tensor(np.array([1], dtype=np.int32)).realize()

    @TinyJit
    def f(y: Tensor) -> Tensor:
        nonlocal x
        x += y
        return x

    for _ in range(5):
        f(Tensor(np.array([1], dtype=np.int32)))
    assert x.item() == 6 and f.captured is not None
    before = GlobalCounters.mem_used
    f.captured.free_intermediates()
    assert before - GlobalCounters.mem_used == 0
    f(Tensor(np.array([2], dtype=np.int32)))
    assert x.item() == 8
