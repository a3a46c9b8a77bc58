"""Copies between host devices in a runner plan: a small one runs on the calling thread (a data-parallel step's
allreduces of batch-norm statistics move a few hundred bytes, and handing each to the copy engine's thread cost
two thread wake-ups), a large one on the copy engine's thread; either way the bytes arrive, and a copy whose source
a queued kernel still writes waits for it. A replayed plan's kernels on several CPU devices and the small copies
between them run as one CPU graph, in order."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcq_kernels import ADD_IR
from speck.hcq import Buffer, Device, runner
from speck.hcq.runner import Batch, Copy, Exec, Plan
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


@given(st.integers(1, 3 * runner.SMALL_COPY_BYTES // 2), st.integers(0, 2**32 - 1))
def test_copy_between_devices_arrives_on_the_thread_its_size_picks(nbytes: int, seed: int) -> None:
    a, b, data = _pair(nbytes, seed)
    with copy_threads() as seen:
        runner.run(Plan([Copy(1, 0, 0, nbytes)], 2, replayed=True), [a, b])
    np.testing.assert_array_equal(b.numpy(), data)
    assert len(seen) == 1
    assert (seen[0] == threading.get_ident()) == (nbytes < runner.SMALL_COPY_BYTES), (nbytes, seen)


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


def test_copy_over_memory_a_copy_in_flight_still_reads_waits_for_it() -> None:
    """Write after read between devices: copy 1 (DST's buffer x into SRC) is held in SRC's busy copy engine; copy 2
    overwrites x from SRC on DST's idle copy engine. Copy 2 must wait until copy 1 has read x (it overwrote x first,
    and copy 1 delivered the new bytes)."""
    src = Device[SRC]
    old, new = np.arange(64, dtype=np.uint8), np.full(64, 7, np.uint8)
    x, got = Buffer(DST, 64, np.uint8).copyin(old), Buffer(SRC, 64, np.uint8)
    b = Buffer(SRC, 64, np.uint8).copyin(new)
    gate = Signal(0, name="gate")
    src.hw_queue("copy").wait(gate, 1).submit(src, background=True)
    release = threading.Timer(0.2, gate.set, (1,))
    release.start()
    try:
        runner.run(Plan([Copy(1, 0, 0, 64), Copy(0, 2, 0, 64)], 3, replayed=True), [x, got, b])
    finally:
        release.cancel()
        gate.set(1)
        src.synchronize()
    np.testing.assert_array_equal(got.numpy(), old)
    np.testing.assert_array_equal(x.numpy(), new)


@pytest.fixture(scope="module")
def adds() -> dict[str, Any]:
    """out = a + b (hcq_kernels.ADD_IR) loaded on CPU:5 and on CPU:6."""
    return {d: Device[d].runtime("add", Device[d].compiler.compile(ADD_IR)) for d in (SRC, DST)}


OPS = st.lists(
    st.tuples(
        st.sampled_from(["add", "copy", "big", "take"]),
        st.integers(0, 1),
        st.integers(0, 3),
        st.integers(0, 3),
        st.integers(0, 3),
    ),  # fmt: skip
    min_size=1,
    max_size=16,
)


@settings(max_examples=25, deadline=None)
@given(ops=OPS)
def test_replayed_plan_over_two_cpu_devices_matches_numpy(adds: dict[str, Any], ops: list[tuple[Any, ...]]) -> None:
    """Random kernels on CPU:5 and CPU:6 over 16-float buffers, copies between the devices of 16 floats (under the
    small-copy size, patched to 128 bytes here: they join one graph with the kernels of both devices) and of
    64-float buffers (run alone on the copy engine), and the first 16 floats of those copied into a small buffer of
    the other device, replayed three times: every run leaves what running the calls in order does (numpy)."""
    devs = (SRC, DST)
    rng = np.random.default_rng(len(ops))
    sizes = (16, 16, 16, 16, 64, 64)  # per device: four small buffers, two big ones
    slot = {(d, k): i for i, (d, k) in enumerate((d, k) for d in range(2) for k in range(len(sizes)))}
    init = [rng.standard_normal(sizes[k]).astype(np.float32) for _, k in slot]
    bufs = [Buffer(devs[d], sizes[k], np.float32).copyin(init[i]) for (d, k), i in slot.items()]
    calls: list[Any] = []
    for kind, d, x, y, z in ops:
        if kind == "add":  # small buffer x of device d = y + z (x distinct from both: the pointers are noalias)
            if x not in (y, z):
                calls.append(Exec(adds[devs[d]], (slot[(d, x)], slot[(d, y)], slot[(d, z)]), global_size=(16, 1, 1),
                                  writes=frozenset({0})))  # fmt: skip
        elif kind == "copy":  # small buffer y of the other device into small buffer x of device d
            calls.append(Copy(slot[(d, x)], slot[(1 - d, y)], 0, 64))
        elif kind == "big":  # big buffer of the other device into a big buffer of device d
            calls.append(Copy(slot[(d, 4 + x % 2)], slot[(1 - d, 4 + y % 2)], 0, 256))
        else:  # floats 16z..16z+15 of a big buffer of the other device into small buffer x of device d
            calls.append(Copy(slot[(d, x)], slot[(1 - d, 4 + y % 2)], 64 * z, 64))
    plan = Plan(calls, len(bufs), replayed=True)
    want = [a.copy() for a in init]
    old = runner.SMALL_COPY_BYTES
    runner.SMALL_COPY_BYTES = 128
    try:
        for _ in range(3):
            for c in calls:
                if type(c) is Exec:
                    want[c.args[0]] = want[c.args[1]] + want[c.args[2]]
                else:
                    want[c.dst][:] = want[c.src][c.offset // 4 : (c.offset + c.nbytes) // 4]
            runner.run(plan, bufs)
            for got, ref in zip(bufs, want):
                np.testing.assert_array_equal(got.numpy(), ref)
    finally:
        runner.SMALL_COPY_BYTES = old
    batched = [c for s in plan.steps or () if type(s) is Batch for c in s.calls]
    assert not any(type(c) is Copy and c.nbytes >= 128 for c in batched)  # large copies run alone
    if any(type(c) is Exec for c in calls) and all(type(c) is Exec or c.nbytes < 128 for c in calls):
        assert len(plan.steps or ()) == 1 and len(batched) == len(calls)  # everything else: one graph
