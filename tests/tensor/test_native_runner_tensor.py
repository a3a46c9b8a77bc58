"""speck.hcq's native short route (speck.hcq._native_runner) at the tensor level: random small graphs and repeated
per-op realizes give numpy's values and the same GlobalCounters growth with the native route on (NATIVE_RUNNER=1)
and off (NATIVE_RUNNER=0, the Python route), op for op; the warm per-op path does take the native route when it is
built."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.hcq import Device, runner
from speck.hcq.counters import COUNTS
from speck.tensor import Tensor
from speck.uop import Context

_OPS: list[tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = [
    (lambda x, y: x + y, np.add),
    (lambda x, y: x * y, np.multiply),
    (lambda x, y: x - y, np.subtract),
    (lambda x, y: x.maximum(y), np.maximum),
]


def _sequence(steps: list[tuple[int, int, int]], xs: list[np.ndarray]) -> list[tuple[bytes, int, int, int]]:
    """Run (op, left, right) steps: each realizes op over two of the tensors (earlier results join the pool), twice
    (the second warm); per realize: the result's bytes and the counters' growth."""
    dev = Device["CPU"]
    pool = [Tensor(x).realize() for x in xs]
    ref = [x.copy() for x in xs]
    out = []
    for op, i, j in steps:
        i, j = i % len(pool), j % len(pool)
        for _ in range(2):
            before = (COUNTS.kernel_count, COUNTS.global_ops, COUNTS.global_mem)
            r = _OPS[op][0](pool[i], pool[j]).realize()
            dev.synchronize()
            grew = (COUNTS.kernel_count - before[0], COUNTS.global_ops - before[1], COUNTS.global_mem - before[2])
            expect = _OPS[op][1](ref[i], ref[j])
            got = r.numpy()
            np.testing.assert_allclose(got, expect, rtol=1e-6)
            out.append((got.tobytes(), *grew))
        pool.append(r)
        ref.append(expect)
    return out


@settings(max_examples=20, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(0, 9), st.integers(0, 9)), min_size=1, max_size=6),
    st.integers(1, 9),
    st.integers(0, 2**16),
)
def test_random_realize_sequences_agree_with_the_native_route_on_and_off(
    steps: list[tuple[int, int, int]], n: int, seed: int
) -> None:
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    with Context(NATIVE_RUNNER=1):
        on = _sequence(steps, xs)
    with Context(NATIVE_RUNNER=0):
        off = _sequence(steps, xs)
    assert on == off


def test_a_warm_eager_op_takes_the_native_route_when_built() -> None:
    native = runner._native_runner
    a, b = Tensor(np.arange(4, dtype=np.float32)).realize(), Tensor(np.ones(4, np.float32)).realize()
    for _ in range(3):
        (a + b).realize()
    if native is None:  # (not built: the Python route, checked by the test above)
        np.testing.assert_array_equal((a + b).realize().numpy(), np.arange(4) + 1)
        return
    before = native.taken()
    for _ in range(5):
        r = (a + b).realize()
    Device["CPU"].synchronize()
    assert native.taken() == before + 5
    np.testing.assert_array_equal(r.numpy(), np.arange(4) + 1)
    with Context(NATIVE_RUNNER=0):
        before = native.taken()
        r = (a + b).realize()
        assert native.taken() == before
    np.testing.assert_array_equal(r.numpy(), np.arange(4) + 1)
