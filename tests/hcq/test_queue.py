"""HCQ queues and timeline signals: ordering between queues, timeouts, latched errors, profiling, batches."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcq_kernels import ADD_IR, EMPTY_IR, SCALE_IR
from speck.hcq import Buffer, Device, HCQError, HWQueue, Signal, SignalTimeoutError
from speck.hcq.cpu import CPUDevice


@pytest.fixture(scope="module")
def add_prog():  # type: ignore[no-untyped-def]
    dev = Device["CPU"]
    return dev.runtime("add", dev.compiler.compile(ADD_IR))


def test_signal_is_a_timeline() -> None:
    s = Signal(3, name="t")
    s.set(5)
    assert s.value == 5
    with pytest.raises(ValueError, match="cannot go back from 5 to 4"):
        s.set(4)
    s.wait(5, timeout=0.0)  # already satisfied: returns at once


def test_unsatisfiable_wait_times_out_with_the_documented_message() -> None:
    s = Signal(1, name="never")
    with pytest.raises(SignalTimeoutError, match=r"signal 'never' did not reach 2 within 0.05 s \(it is at 1\)") as ei:
        s.wait(2, timeout=0.05)
    assert (ei.value.signal_name, ei.value.awaited, ei.value.seen) == ("never", 2, 1)


def test_synchronize_times_out_naming_the_engine_signal(cpu: CPUDevice) -> None:
    gate = Signal(0, name="gate")
    cpu.hw_queue().wait(gate, 1).submit(cpu)
    with pytest.raises(SignalTimeoutError, match=r"CPU:compute:timeline' did not reach \d+ within 0.05 s"):
        cpu.synchronize(timeout=0.05)
    gate.set(1)  # release the engine so later tests find it idle
    cpu.synchronize(timeout=10)


def test_two_queues_ordered_by_a_signal(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    # queue B (on CPU:1) consumes what queue A (on CPU) produces; B is submitted first and must wait for A
    other = Device["CPU:1"]
    n = 4096
    a = np.arange(n, dtype=np.float32)
    A = Buffer("CPU", n, np.float32).copyin(a)
    T = Buffer("CPU", n, np.float32)
    R = Buffer("CPU:1", n, np.float32)
    prog1 = other.runtime("add", other.compiler.compile(ADD_IR))
    ready, done = Signal(name="ready"), Signal(name="done")
    T1 = Buffer("CPU:1", n, np.float32)
    qb = other.hw_queue().wait(ready, 1).copy(T1, T, T.nbytes).exec(prog1, prog1.raw_args([R, T1, T1]), (n, 1, 1))
    qb.signal(done, 1).submit(other)
    time.sleep(0.01)
    assert done.value == 0  # B is blocked on the signal
    qa = cpu.hw_queue().exec(add_prog, add_prog.raw_args([T, A, A]), (n, 1, 1)).signal(ready, 1)
    qa.submit(cpu)
    done.wait(1, timeout=10)
    np.testing.assert_array_equal(R.numpy(), 4 * a)


def test_copy_engine_waits_for_compute(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    n = 1000
    a = np.arange(n, dtype=np.float32)
    A, O, C = Buffer("CPU", n, np.float32).copyin(a), Buffer("CPU", n, np.float32), Buffer("CPU", n, np.float32)
    s = Signal(name="computed")
    cpu.hw_queue("copy").wait(s, 1).copy(C, O, O.nbytes).submit(cpu)
    cpu.hw_queue().exec(add_prog, add_prog.raw_args([O, A, A]), (n, 1, 1)).barrier().signal(s, 1).submit(cpu)
    cpu.synchronize(timeout=10)
    np.testing.assert_array_equal(C.numpy(), 2 * a)


def test_submissions_from_many_threads_all_complete(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    n = 256
    a = np.ones(n, dtype=np.float32)
    A = Buffer("CPU", n, np.float32).copyin(a)
    outs = [Buffer("CPU", n, np.float32) for _ in range(8)]

    def work(k: int) -> None:
        for _ in range(20):
            add_prog(outs[k], A, A, global_size=(n, 1, 1))

    ts = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    cpu.synchronize(timeout=10)
    assert cpu.engines["compute"].idle
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), 2 * a)


def test_profiling_timestamps_are_monotonic(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    n = 2048
    A, O = Buffer("CPU", n, np.float32).copyin(np.ones(n, np.float32)), Buffer("CPU", n, np.float32)
    cpu.profile = True
    try:
        for e in cpu.engines.values():
            e.events.clear()
        s = Signal(name="stamp")
        q = cpu.hw_queue().timestamp(s)
        for _ in range(5):
            q.exec(add_prog, add_prog.raw_args([O, A, A]), (n, 1, 1))
        q.signal(s, 1).submit(cpu)
        cpu.synchronize()
        events = cpu.profile_events
    finally:
        cpu.profile = False
    kinds = [e.kind for e in events]
    assert kinds == ["timestamp"] + ["exec"] * 5 + ["signal"]
    assert [e.name for e in events if e.kind == "exec"] == ["add"] * 5
    for e in events:
        assert e.start_ns <= e.end_ns
    for prev, nxt in zip(events, events[1:]):
        assert prev.end_ns <= nxt.start_ns
    assert events[0].start_ns <= s.timestamp <= events[0].end_ns


def test_profile_setting_turns_profiling_on() -> None:
    from speck.uop import Context

    with Context(PROFILE="1"):
        assert CPUDevice("CPU:9").profile is True
    with Context(PROFILE="0"):
        assert CPUDevice("CPU:9").profile is False


def test_batch_submission_reports_per_kernel_times(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    empty = cpu.runtime("empty", cpu.compiler.compile(EMPTY_IR))
    scale = cpu.runtime("scale", cpu.compiler.compile(SCALE_IR))
    n = 10000
    a = np.arange(n, dtype=np.float32)
    A, O, P = Buffer("CPU", n, np.float32).copyin(a), Buffer("CPU", n, np.float32), Buffer("CPU", n, np.float32)
    times = cpu.run_batch([(add_prog, [O, A, A], (n, 1, 1)), (empty, [], (1, 1, 1)), (scale, [P, O], (n, 1, 1), (2,))])
    assert [name for name, _ in times] == ["add", "empty", "scale"]
    assert all(t >= 0 for _, t in times)
    np.testing.assert_array_equal(P.numpy(), (a + a) * 2 + np.arange(n, dtype=np.float32))


def test_failed_background_command_is_raised_by_synchronize(cpu: CPUDevice) -> None:
    class Exploding:
        name, device = "exploding", cpu

        def launch(self, args, global_size, threads):  # type: ignore[no-untyped-def]
            raise RuntimeError("kernel blew up")

    gate, after = Signal(name="gate2"), Signal(name="after")
    cpu.hw_queue().wait(gate, 1).exec(Exploding(), (), (1, 1, 1)).signal(after, 1).submit(cpu)
    gate.set(1)
    with pytest.raises(HCQError, match="kernel blew up"):
        cpu.synchronize(timeout=10)
    with pytest.raises(HCQError, match="'after' will not reach 1"):
        after.wait(1, timeout=10)
    cpu.synchronize(timeout=10)  # the error was reported once; the engine works again


def test_inline_failure_raises_from_submit(cpu: CPUDevice) -> None:
    class Exploding:
        name, device = "exploding", cpu

        def launch(self, args, global_size, threads):  # type: ignore[no-untyped-def]
            raise RuntimeError("inline boom")

    with pytest.raises(RuntimeError, match="inline boom"):
        HWQueue().exec(Exploding(), (), (1, 1, 1)).submit(cpu)
    cpu.synchronize(timeout=10)


def test_program_on_the_wrong_device_is_refused_by_the_engine(add_prog) -> None:  # type: ignore[no-untyped-def]
    other = Device["CPU:1"]
    with pytest.raises(HCQError, match="loaded on CPU, not on CPU:1"):
        other.hw_queue().exec(add_prog, (), (1, 1, 1)).submit(other)


def test_batch_times_fit_inside_the_wall_time(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    n = 1 << 16
    A, O = Buffer("CPU", n, np.float32).copyin(np.ones(n, np.float32)), Buffer("CPU", n, np.float32)
    t0 = time.perf_counter()
    times = cpu.run_batch([(add_prog, [O, A, A], (n, 1, 1))] * 10)
    wall = time.perf_counter() - t0
    assert len(times) == 10 and all(t > 0 for _, t in times)
    assert sum(t for _, t in times) <= wall


def test_copy_engine_moves_disk_data_to_cpu(tmp_path, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "w.bin"
    a = np.arange(64, dtype=np.float32)
    a.tofile(path)
    src = Buffer(f"DISK:{path}", 256, np.uint8).view(32, np.float32, offset=128)
    dst = Buffer("CPU", 32, np.float32)
    done = Signal(name="loaded")
    cpu.hw_queue("copy").copy(dst, src, dst.nbytes).signal(done, 1).submit(cpu)
    done.wait(1, timeout=10)
    np.testing.assert_array_equal(dst.numpy(), a[32:])


class _Recorder:
    """A stand-in program that records when it ran (optionally after a short sleep, to let work overlap)."""

    def __init__(self, device: object, log: list[int], lock: threading.Lock) -> None:
        self.name, self.device, self.log, self.lock = "recorder", device, log, lock

    def launch(self, args, global_size, threads):  # type: ignore[no-untyped-def]
        step, delay = args
        if delay:
            time.sleep(delay)
        with self.lock:
            self.log.append(step)


@given(
    steps=st.lists(
        st.tuples(st.integers(0, 3), st.integers(0, 10), st.booleans(), st.sampled_from([0.0, 0.0, 0.001])),
        min_size=1,
        max_size=12,
    )
)
@settings(max_examples=30)
def test_signal_ordered_queues_always_complete_in_dependency_order(steps) -> None:  # type: ignore[no-untyped-def]
    # each step: a queue on one of 4 engines (2 devices x compute/copy) that may wait for an earlier step's signal,
    # then runs a recorder and signals its own signal; waits only point backwards in submission order, so the
    # graph has no cycles and everything must complete
    devs = [Device["CPU:2"], Device["CPU:3"]]
    log: list[int] = []
    lock = threading.Lock()
    recorders = [_Recorder(d, log, lock) for d in devs]
    sigs = [Signal(name=f"step{i}") for i in range(len(steps))]
    deps: dict[int, int] = {}
    for i, (where, dep, has_dep, delay) in enumerate(steps):
        dev = devs[where % 2]
        q = dev.hw_queue("compute" if where < 2 else "copy")
        if has_dep and i > 0:
            deps[i] = dep % i
            q.wait(sigs[deps[i]], 1)
        q.exec(recorders[where % 2], (i, delay), (1, 1, 1)).signal(sigs[i], 1).submit(dev)
    for d in devs:
        d.synchronize(timeout=30)
    assert sorted(log) == list(range(len(steps)))
    pos = {s: k for k, s in enumerate(log)}
    for i, j in deps.items():
        assert pos[j] < pos[i], f"step {i} ran before step {j} it waited for: {log}"
    for engine in range(4):  # each engine executes its submissions in order
        mine = [i for i, st_ in enumerate(steps) if st_[0] == engine]
        assert [pos[i] for i in mine] == sorted(pos[i] for i in mine)


def test_a_submitted_command_list_is_left_intact_for_the_next_submission(cpu: CPUDevice) -> None:
    """A runner Plan submits the same command list on every run: running it (inline or on the engine's thread)
    must not empty it, or the next run of the plan silently launches nothing."""
    from speck.hcq.queue import EXEC

    launches: list[int] = []

    class Counting:
        name, device = "counting", cpu

        def launch(self, args, global_size, threads):  # type: ignore[no-untyped-def]
            launches.append(1)

    cmds = [(EXEC, Counting(), (), (1, 1, 1), None), (EXEC, Counting(), (), (1, 1, 1), None)]
    engine = cpu.engines["compute"]
    for background in (False, True, True, False):
        engine.submit(cmds, background)
        cpu.synchronize(timeout=10)
    assert len(cmds) == 2 and len(launches) == 8
