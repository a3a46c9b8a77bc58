"""Copies between host devices in a runner plan: a small one runs on the calling thread (a data-parallel step's
allreduces of batch-norm statistics move a few hundred bytes, and handing each to the copy engine's thread cost
two thread wake-ups), a large one on the copy engine's thread; either way the bytes arrive, and a copy whose source
a queued kernel still writes waits for it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from speck.hcq import Buffer, Device, runner
from speck.hcq.runner import Copy, Plan
from speck.hcq.signal import Signal

SRC, DST = "CPU:5", "CPU:6"


@contextmanager
def copy_threads() -> Iterator[list[int]]:
    """Thread idents of the copy commands DST's engines run (DST's _copy wrapped meanwhile)."""
    dev = Device[DST]
    seen: list[int] = []
    plain = type(dev)._copy

    def recording(dest: object, src: object, nbytes: int) -> None:
        seen.append(threading.get_ident())
        plain(dev, dest, src, nbytes)

    dev._copy = recording  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del dev._copy
        dev.synchronize()


def _pair(nbytes: int, seed: int) -> tuple[Buffer, Buffer, np.ndarray]:
    data = np.random.default_rng(seed).integers(0, 256, nbytes, dtype=np.uint8)
    return Buffer(SRC, nbytes, np.uint8).copyin(data), Buffer(DST, nbytes, np.uint8), data


@given(st.integers(1, 3 * runner.INLINE_COPY_BYTES // 2), st.integers(0, 2**32 - 1))
def test_copy_between_devices_arrives_on_the_thread_its_size_picks(nbytes: int, seed: int) -> None:
    a, b, data = _pair(nbytes, seed)
    with copy_threads() as seen:
        runner.run(Plan([Copy(1, 0, 0, nbytes)], 2, replayed=True), [a, b])
    np.testing.assert_array_equal(b.numpy(), data)
    assert len(seen) == 1
    assert (seen[0] == threading.get_ident()) == (nbytes < runner.INLINE_COPY_BYTES), (nbytes, seen)


def test_small_copy_waits_for_a_write_still_queued_on_its_source() -> None:
    """The source device's compute engine is busy (a submission held on a gate, then a write into the source): the
    copy can't run on the calling thread at once, so the copy engine's thread runs it once the write is done."""
    src = Device[SRC]
    a, b, _ = _pair(256, 1)
    new = np.arange(256, dtype=np.uint8)
    staged = Buffer(SRC, 256, np.uint8).copyin(new)
    gate = Signal(0, name="gate")
    src.hw_queue().wait(gate, 1).copy(a, staged, 256).submit(src, background=True)
    release = threading.Timer(0.2, gate.set, (1,))
    release.start()
    try:
        with copy_threads() as seen:
            runner.run(Plan([Copy(1, 0, 0, 256)], 2, replayed=True), [a, b])
    finally:
        release.cancel()
        gate.set(1)
        src.synchronize()
    np.testing.assert_array_equal(b.numpy(), new)
    assert seen and seen[-1] != threading.get_ident()
