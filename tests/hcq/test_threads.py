"""The CPU worker pool: results do not depend on the worker count or on how the outermost dimension is split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hcq_kernels import ADD_IR, ROWSUM_IR, SCALE_IR
from speck.hcq import Buffer, Device
from speck.hcq.cpu import POOL, CPUDevice, CPUProgram


@pytest.fixture(scope="module")
def progs() -> dict[str, CPUProgram]:
    dev = Device["CPU"]
    return {
        "add": dev.runtime("add", dev.compiler.compile(ADD_IR)),
        "scale": dev.runtime("scale", dev.compiler.compile(SCALE_IR)),
        "rowsum": dev.runtime("rowsum", dev.compiler.compile(ROWSUM_IR)),
    }


def fresh(dev: CPUDevice, data: np.ndarray) -> Buffer:
    return Buffer(dev.name, data.size, data.dtype).copyin(data)


@pytest.mark.parametrize("threads", range(1, 9))
def test_results_identical_for_1_to_8_threads(progs: dict[str, CPUProgram], cpu: CPUDevice, threads: int) -> None:
    rng = np.random.default_rng(threads)
    rows, cols = 37, 129
    a = rng.standard_normal(rows * cols).astype(np.float32)
    b = rng.standard_normal(rows * cols).astype(np.float32)
    A, B, O = fresh(cpu, a), fresh(cpu, b), Buffer("CPU", rows * cols, np.float32)
    progs["add"](O, A, B, global_size=(rows * cols, 1, 1), threads=threads, wait=True)
    np.testing.assert_array_equal(O.numpy(), a + b)
    progs["scale"](O, A, global_size=(rows * cols, 1, 1), vals=(3,), threads=threads, wait=True)
    np.testing.assert_array_equal(O.numpy(), a * np.float32(3) + np.arange(rows * cols, dtype=np.float32))
    R = Buffer("CPU", rows, np.float32)
    progs["rowsum"](R, A, global_size=(rows, 1, 1), vals=(cols,), threads=threads, wait=True)
    expected = np.zeros(rows, np.float32)
    for j in range(cols):  # sequential float32 accumulation, the kernel's order
        expected += a.reshape(rows, cols)[:, j]
    np.testing.assert_array_equal(R.numpy(), expected)


@pytest.mark.parametrize("n", [1, 2, 3, 5, 7])
def test_global_size_smaller_than_thread_count(progs: dict[str, CPUProgram], cpu: CPUDevice, n: int) -> None:
    cpu.threads = 8
    a = np.arange(n, dtype=np.float32) + 0.5
    A, O = fresh(cpu, a), Buffer("CPU", n, np.float32).copyin(np.full(n, -7, np.float32))
    progs["add"](O, A, A, global_size=(n, 1, 1), threads=8, wait=True)
    np.testing.assert_array_equal(O.numpy(), a + a)


@given(n=st.integers(0, 3000), threads=st.integers(1, 8))
def test_any_split_covers_every_index_once(progs: dict[str, CPUProgram], n: int, threads: int) -> None:
    dev = Device["CPU"]
    a = np.arange(max(n, 1), dtype=np.float32)
    A, O = fresh(dev, a), Buffer("CPU", max(n, 1), np.float32).copyin(np.full(max(n, 1), 99, np.float32))
    progs["scale"](O, A, global_size=(n, 1, 1), vals=(2,), threads=threads, wait=True)
    expected = np.full(max(n, 1), 99, np.float32)
    expected[:n] = a[:n] * 2 + np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(O.numpy(), expected)


def test_pool_runs_slices_in_parallel_threads() -> None:
    import threading

    calls: dict[int, list[tuple[int, int]]] = {}
    lock = threading.Lock()

    def fn(start: int, end: int) -> None:
        with lock:
            calls.setdefault(threading.get_ident(), []).append((start, end))

    POOL.run(fn, (), 10, 4)
    # each thread covers its slice in order, in one call or in consecutive pieces (so an interrupt can stop it)
    slices = []
    for pieces in calls.values():
        assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
        slices.append((pieces[0][0], pieces[-1][1]))
    assert sorted(slices) == [(0, 2), (2, 5), (5, 7), (7, 10)]
    assert len(calls) == 4  # the caller plus three workers


def test_worker_error_reaches_the_launcher() -> None:
    def fn(start: int, end: int) -> None:
        if start > 0:
            raise ValueError(f"slice {start}")

    with pytest.raises(ValueError, match="slice"):
        POOL.run(fn, (), 4, 2)
    POOL.run(lambda s, e: None, (), 4, 2)  # the pool is still usable


def test_num_cpu_threads_sets_the_default() -> None:
    from speck.uop import Context

    dev = CPUDevice("CPU:7")
    with Context(NUM_CPU_THREADS=3):
        assert dev.threads == 3
    dev.threads = 5  # an explicit count wins over the setting
    with Context(NUM_CPU_THREADS=3):
        assert dev.threads == 5


def test_small_kernels_stay_on_the_calling_thread(cpu: CPUDevice) -> None:
    from speck.hcq.cpu import PARALLEL_MIN_BYTES, PARALLEL_MIN_FLOPS

    prog = cpu.runtime("add", cpu.compiler.compile(ADD_IR))
    small = [Buffer("CPU", 16, np.float32)] * 3
    big = [Buffer("CPU", PARALLEL_MIN_BYTES // 4, np.float32)] * 3
    assert cpu.choose_threads(prog, small) == 1 and cpu.choose_threads(prog, big) is None
    prog.est_flops, prog.est_bytes = PARALLEL_MIN_FLOPS, 64  # compute-heavy on small buffers: parallel
    assert cpu.choose_threads(prog, small) is None
    prog.est_flops = 10  # estimates win over buffer sizes
    assert cpu.choose_threads(prog, big) == 1


def test_waited_kernel_does_not_wait_for_the_devices_copies(progs: dict[str, CPUProgram]) -> None:
    # prog(wait=True) waits for the compute engine only: a copy of a later allreduce step queued on the device's
    # copy engine (blocked on a gate here) must not hold a kernel of this step back
    import threading

    from speck.hcq.signal import Signal

    dev = Device["CPU"]
    a = np.arange(64, dtype=np.float32)
    A, O = fresh(dev, a), Buffer("CPU", 64, np.float32)
    gate = Signal(0, name="gate")
    dev.hw_queue("copy").wait(gate, 1).submit(dev, background=True)
    release = threading.Timer(60.0, gate.set, (1,))  # (only so that a wrong implementation fails instead of hanging)
    release.start()
    try:
        progs["scale"](O, A, global_size=(64, 1, 1), vals=(2,), wait=True)
        assert gate.value == 0, "the kernel waited for the copy engine"
    finally:
        release.cancel()
        gate.set(1)
        dev.synchronize()
    np.testing.assert_array_equal(O.numpy(), a * 2 + np.arange(64, dtype=np.float32))


def test_cpu_devices_share_one_core_budget() -> None:
    # every CPU device launches on the one shared pool: two devices launching at once from two threads never run
    # more slices at a time than one launch's thread count (the second launch waits for the pool)
    import threading
    import time

    assert Device["CPU"].pool is Device["CPU:1"].pool is POOL
    lock, running, peak = threading.Lock(), [0], [0]

    def fn(start: int, end: int) -> None:
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        time.sleep(0.002)  # (holds the slice so that launches from the two threads would overlap if they could)
        with lock:
            running[0] -= 1

    threads = [threading.Thread(target=POOL.run, args=(fn, (), 8, 2)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert peak[0] == 2
