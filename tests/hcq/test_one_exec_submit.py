"""Engine.submit's one-exec route (a single exec command on an idle engine is launched without the command loop: the
runner's kernel launches, a CPU graph's run): it must behave exactly like the general route: ordered after pending
work, errors raised and the engine usable again, the timeline advanced, PROFILE events recorded."""

from __future__ import annotations

import numpy as np
import pytest

from hcq_kernels import ADD_IR
from speck.hcq import Buffer, Device, Signal
from speck.hcq.cpu import CPUDevice
from speck.hcq.queue import EXEC


@pytest.fixture(scope="module")
def add_prog():  # type: ignore[no-untyped-def]
    dev = Device["CPU"]
    return dev.runtime("add", dev.compiler.compile(ADD_IR))


def _bufs(n: int) -> tuple[Buffer, Buffer, Buffer, np.ndarray, np.ndarray]:
    a, b = np.arange(n, dtype=np.float32), np.full(n, 2.0, np.float32)
    out = Buffer("CPU", n, np.float32)
    return out, Buffer("CPU", n, np.float32).copyin(a), Buffer("CPU", n, np.float32).copyin(b), a, b


def test_enqueue_runs_inline_and_advances_the_timeline(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    out, a, b, x, y = _bufs(1000)
    eng = cpu.engines["compute"]
    before = eng.submitted
    add_prog(out, a, b, global_size=(1000, 1, 1))
    assert eng.submitted == before + 1 and eng.idle  # ran on this thread, timeline at the new sequence number
    np.testing.assert_array_equal(out.numpy(), x + y)


def test_exec_waits_behind_a_blocked_submission(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    out, a, b, x, y = _bufs(256)
    gate = Signal(name="one_exec_gate")
    cpu.hw_queue().wait(gate, 1).copy(a, b, a.nbytes).submit(cpu)  # a := b, once the gate opens
    add_prog(out, a, b, global_size=(256, 1, 1))  # must run after the copy although the engine is blocked now
    gate.set(1)
    cpu.synchronize(timeout=10)
    np.testing.assert_array_equal(out.numpy(), y + y)


def test_exec_queued_behind_a_compute_wait_keeps_order(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    out, a, b, x, y = _bufs(128)
    gate = Signal(name="one_exec_gate2")
    cpu.hw_queue().wait(gate, 1).exec(add_prog, add_prog.raw_args([a, a, b]), (128, 1, 1)).submit(cpu)  # a += b
    eng = cpu.engines["compute"]
    eng.submit([(EXEC, add_prog, add_prog.raw_args([out, a, b]), (128, 1, 1), None)])  # out = a + b, after
    assert not eng.idle  # both wait for the gate
    gate.set(1)
    cpu.synchronize(timeout=10)
    np.testing.assert_array_equal(out.numpy(), x + y + y)


def test_failing_exec_raises_and_the_engine_stays_usable(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    class Exploding:
        name, device = "exploding", cpu

        def launch(self, args, global_size, threads):  # type: ignore[no-untyped-def]
            raise RuntimeError("one-exec boom")

    eng = cpu.engines["compute"]
    with pytest.raises(RuntimeError, match="one-exec boom"):
        eng.submit([(EXEC, Exploding(), (), (1, 1, 1), None)])
    assert eng.idle
    cpu.synchronize(timeout=10)
    out, a, b, x, y = _bufs(64)
    add_prog(out, a, b, global_size=(64, 1, 1))
    cpu.synchronize(timeout=10)
    np.testing.assert_array_equal(out.numpy(), x + y)


def test_profiled_exec_is_recorded(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    out, a, b, x, y = _bufs(64)
    cpu.profile = True
    try:
        eng = cpu.engines["compute"]
        n = len(eng.events)
        add_prog(out, a, b, global_size=(64, 1, 1))
        cpu.synchronize(timeout=10)
        assert [(e.kind, e.name) for e in eng.events[n:]] == [("exec", "add")]
    finally:
        cpu.profile = False
        cpu.engines["compute"].events.clear()
    np.testing.assert_array_equal(out.numpy(), x + y)


def test_run_inline_is_submits_inline_run(cpu: CPUDevice) -> None:
    """Engine.run_inline (a settled CPU graph's launch without a command) on an idle engine: one sequence number, the
    timeline at it, fn called once on this thread; busy (blocked behind a wait) or profiling: nothing done, False; an
    error: raised, the timeline advanced and the engine usable."""
    eng = cpu.engines["compute"]
    cpu.synchronize()
    calls: list[int] = []
    before = eng.submitted
    assert eng.run_inline(calls.append, 7) and calls == [7]
    assert eng.submitted == before + 1 and eng.idle
    gate = Signal(name="run_inline_gate")
    cpu.hw_queue().wait(gate, 1).submit(cpu)
    assert not eng.run_inline(calls.append, 8) and calls == [7]  # busy: the caller submits instead
    gate.set(1)
    cpu.synchronize(timeout=10)
    eng.profile = True
    try:
        assert not eng.run_inline(calls.append, 9) and calls == [7]
    finally:
        eng.profile = False

    def boom(_: int) -> None:
        raise ValueError("boom")

    with pytest.raises(ValueError, match="boom"):
        eng.run_inline(boom, 0)
    assert eng.idle
    assert eng.run_inline(calls.append, 10) and calls == [7, 10] and eng.idle


def test_settled_graph_replay_waits_behind_blocked_work(add_prog, cpu: CPUDevice) -> None:  # type: ignore[no-untyped-def]
    """A graph settled on one worker (replay's inline route) still runs after work queued before it."""
    from speck.hcq.graph import CPUGraph

    out, a, b, x, y = _bufs(64)
    g = CPUGraph(cpu)
    g.add_exec(add_prog, [out, a, b], (64, 1, 1), threads=1)
    g.replay()
    g.replay()
    assert g._solo  # (the inline route is the one under test)
    np.testing.assert_array_equal(out.numpy(), x + y)
    gate = Signal(name="graph_gate")
    cpu.hw_queue().wait(gate, 1).copy(a, b, a.nbytes).submit(cpu)  # a := b once the gate opens
    t = __import__("threading").Timer(0.05, gate.set, (1,))
    t.start()
    g.replay()  # queued behind the copy; replay returns once it ran
    t.join()
    np.testing.assert_array_equal(out.numpy(), y + y)
