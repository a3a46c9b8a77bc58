"""The remaining tinygrad incompatibilities of issue 28 (round three), each against TENSOR_API or tinygrad's
documented behaviour: pending writes run when something depending on them is realized (4.6)."""

from __future__ import annotations

import numpy as np

from speck.tensor import GlobalCounters, Tensor


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
