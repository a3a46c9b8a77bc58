"""A kernel reading more buffers than ctypes can pass (1024) runs, through speck.hcq's trampoline, and gives numpy's
values."""

from __future__ import annotations

import numpy as np

from speck.hcq.trampoline import CTYPES_MAX_ARGS
from speck.tensor import Tensor


def test_a_kernel_with_more_buffers_than_ctypes_allows() -> None:
    n = CTYPES_MAX_ARGS + 60
    parts = [np.arange(3, dtype=np.float32) * (i % 7) for i in range(n)]
    ts = [Tensor(p).realize() for p in parts]
    out = ts[0]
    for t in ts[1:]:  # one fused kernel reading n buffers
        out = out + t
    np.testing.assert_array_equal(out.numpy(), np.sum(parts, axis=0))
