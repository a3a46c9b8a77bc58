"""How the CPU device splits a big kernel: parts taken in turn by the workers (WorkerPool.run(parts=...)) and the
choice between one worker and all of them by measured time (WorkerChoice). Results never depend on the split."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from hcq_kernels import ADD_IR
from speck.hcq import Buffer, Device
from speck.hcq.cpu import POOL, CPUDevice
from speck.hcq.graph import CPUGraph
from speck.hcq.worker_choice import RETUNE_EVERY, TUNE_RUNS, WorkerChoice


@pytest.fixture(scope="module")
def add_prog():  # type: ignore[no-untyped-def]
    dev = Device["CPU"]
    return dev.runtime("add", dev.compiler.compile(ADD_IR))


def _bufs(n: int) -> tuple[Buffer, Buffer, Buffer, np.ndarray, np.ndarray]:
    a, b = np.arange(n, dtype=np.float32), np.full(n, 2.0, np.float32)
    out = Buffer("CPU", n, np.float32)
    return out, Buffer("CPU", n, np.float32).copyin(a), Buffer("CPU", n, np.float32).copyin(b), a, b


def test_pool_parts_cover_the_range_once_across_threads() -> None:
    seen: list[tuple[int, int]] = []
    threads: set[int] = set()
    lock = threading.Lock()

    def fn(start: int, end: int) -> None:
        with lock:
            seen.append((start, end))
            threads.add(threading.get_ident())
        time.sleep(0.001)  # long enough that the workers get parts too

    POOL.run(fn, (), 1000, 2, parts=16)
    covered = sorted(seen)
    assert covered[0][0] == 0 and covered[-1][1] == 1000
    assert all(a[1] == b[0] for a, b in zip(covered, covered[1:]))  # every row exactly once, no overlap
    assert len(threads) == 2


def test_pool_parts_report_a_worker_error() -> None:
    def fn(start: int, end: int) -> None:
        if start >= 500:
            raise ValueError(f"part at {start}")

    with pytest.raises(ValueError, match="part at"):
        POOL.run(fn, (), 1000, 2, parts=8)
    POOL.run(lambda s, e: None, (), 1000, 2, parts=8)  # still usable


def test_big_kernel_split_in_parts_matches_numpy(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    from speck.hcq import cpu as cpu_mod

    out, a, b, x, y = _bufs(1 << 16)
    old = add_prog._parts
    add_prog._parts = cpu_mod.PARTS_PER_THREAD  # as if estimated big
    try:
        add_prog(out, a, b, global_size=(1 << 16, 1, 1), threads=2, wait=True)
    finally:
        add_prog._parts = old
    np.testing.assert_array_equal(out.numpy(), x + y)


def test_worker_choice_splits_first_then_keeps_the_faster() -> None:
    c = WorkerChoice(4, skip_first=True)
    assert c.pick() == 4  # a one-off launch is split as before
    c.record(4, 100.0)  # the first launch (cold) is not counted
    assert c.pick() == 4 and c.trials == {4: [], 1: []}
    times = {4: 2.0, 1: 1.0}  # one worker is faster here (the other cores are busy)
    for _ in range(2 * TUNE_RUNS):
        w = c.pick()
        c.record(w, times[w])
    assert c.chosen == 1 and sorted(len(v) for v in c.trials.values()) == [TUNE_RUNS, TUNE_RUNS]
    for _ in range(RETUNE_EVERY - 1):
        assert c.pick() == 1
        c.record(1, 1.0)
    c.record(1, 1.0)
    assert c.chosen is None and c.pick() == 4  # measured again: the load on a shared machine changes


def test_worker_choice_prefers_the_split_when_it_is_faster() -> None:
    c = WorkerChoice(2, skip_first=True)
    c.record(c.pick(), 5.0)  # a cold first split launch slower than one worker would not decide against the split
    times = {2: 1.0, 1: 1.9}
    for _ in range(2 * TUNE_RUNS):
        w = c.pick()
        c.record(w, times[w])
    assert c.chosen == 2


def test_big_kernel_launches_measure_both_choices(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    from speck.hcq import cpu as cpu_mod

    n = 1 << 17  # 1.5 MiB of buffers: the device splits it (CPUDevice.choose_threads)
    out, a, b, x, y = _bufs(n)
    old_parts, old_threads = add_prog._parts, cpu.threads
    add_prog._parts, add_prog._choice = cpu_mod.PARTS_PER_THREAD, None  # as if estimated big
    cpu.threads = 2
    try:
        for _ in range(2 * TUNE_RUNS + 1):  # (the first launch is a warm-up)
            out.copyin(np.zeros(n, np.float32))
            add_prog(out, a, b, global_size=(n, 1, 1), wait=True)
            np.testing.assert_array_equal(out.numpy(), x + y)
        choice = add_prog._choice
        assert choice is not None and choice.n == 2 and choice.chosen in (1, 2)
        assert sorted(len(v) for v in choice.trials.values()) == [TUNE_RUNS, TUNE_RUNS]
    finally:
        add_prog._parts, add_prog._choice = old_parts, None
        cpu.threads = old_threads


# ---------------- worker placement (pin_worker) ----------------
def test_workers_are_pinned_to_the_allowed_cores_after_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker k goes to allowed core 1 + (k-1) mod (n-1): never the first allowed core (the launcher's), spread over
    the rest, wrapping when there are more workers than cores; nothing is pinned with one core or PIN_WORKERS=0."""
    from speck.hcq import cpu
    from speck.uop import Context

    pinned: list[set[int]] = []
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {4, 6, 9, 11})
    monkeypatch.setattr(cpu.os, "sched_setaffinity", lambda pid, cores: pinned.append(set(cores)))
    assert [cpu.pin_worker(k) for k in (1, 2, 3, 4, 5)] == [6, 9, 11, 6, 9]
    assert pinned == [{6}, {9}, {11}, {6}, {9}]
    with Context(CPU_PIN_WORKERS=0):
        assert cpu.pin_worker(1) is None
    monkeypatch.setattr(cpu.os, "sched_getaffinity", lambda pid: {3})
    assert cpu.pin_worker(1) is None
    assert len(pinned) == 5


def test_a_started_worker_runs_on_the_core_it_was_pinned_to() -> None:
    import os

    from speck.hcq.cpu import WorkerPool

    pool, seen = WorkerPool(), []
    pool.run(lambda i, j: seen.append(threading.get_native_id()), (), 2, 2)
    (w,) = pool._workers
    allowed = os.sched_getaffinity(0)
    expected = {w.core} if w.core is not None else allowed
    assert os.sched_getaffinity(w.thread.native_id) == expected
    assert w.core is None or (w.core in allowed and w.core != min(allowed))
    assert w.thread.native_id in seen  # (the pinned worker ran its slice)


def test_the_launcher_stays_off_pinned_workers_cores_during_a_split_launch() -> None:
    """While the workers run their slices the launching thread is held on a core none of them is pinned to, and
    gets its own affinity back afterwards (it may have woken on a worker's core after a sleep)."""
    import os

    from speck.hcq.cpu import WorkerPool

    pool, me = WorkerPool(), threading.get_native_id()
    during: list[set[int]] = []

    def slice_(i: int, j: int) -> None:
        if threading.get_native_id() == me:
            during.append(os.sched_getaffinity(0))

    before = os.sched_getaffinity(0)
    pool.run(slice_, (), 2, 2)  # makes (and pins) the worker
    during.clear()
    pool.run(slice_, (), 2, 2)
    (w,) = pool._workers
    assert os.sched_getaffinity(0) == before
    if w.core is None:  # one core (or pinning off): the launcher's affinity is never touched
        assert during == [before]
    else:
        assert during == [{min(before - {w.core})}]


@pytest.mark.parametrize("first", [1, 2])
def test_worker_choice_times_each_candidate_back_to_back(first: int) -> None:
    """A split graph run right after a one-worker run pays for waking the workers (they spin only after a split
    run): each candidate's timed runs come in a row, so the best of them is its steady time."""
    other = 2 if first == 1 else 1
    for in_a_row in (True, False):
        c = WorkerChoice(2, first=first, in_a_row=in_a_row)
        order = []
        for _ in range(2 * TUNE_RUNS):
            w = c.pick()
            order.append(w)
            c.record(w, 1.0 if w == 2 else 2.0)
        # a graph's choice (in a row) vs a direct launch's (alternating: a cold launch either way)
        assert order == ([first] * TUNE_RUNS + [other] * TUNE_RUNS if in_a_row else [first, other] * TUNE_RUNS)
        assert c.chosen == 2


def test_a_graph_times_its_candidates_in_a_row() -> None:
    g = CPUGraph(Device["CPU"])
    g._build()
    assert g._choice.in_a_row
