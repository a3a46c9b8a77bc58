"""runner.run's short route in C (speck.hcq._native_runner) against the Python route, its reference: the same plans
run by both give the same buffers, counters, sequence numbers and timeline values, and the same errors; the native
route is taken exactly where the Python short route would be (a plan that is one settled batch, nothing to time or
record) and leaves everything else to the Python route."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcq_kernels import ADD_IR
from speck.hcq import Buffer, Device, Signal, runner
from speck.hcq.counters import COUNTS
from speck.hcq.errors import HCQError
from speck.hcq.queue import EXEC
from speck.hcq.runner import Exec, Plan
from speck.uop import Context

NATIVE = runner._native_runner
N = 16


@pytest.fixture(scope="module")
def add_prog() -> Any:
    dev = Device["CPU"]
    return dev.runtime("add", dev.compiler.compile(ADD_IR))


@pytest.fixture(params=["native", "python"])
def route(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Each test once per route: "python" runs with the module reference cleared, as when it was not built."""
    if request.param == "python":
        monkeypatch.setattr(runner, "_native", None)
    elif NATIVE is None:
        pytest.skip("speck.hcq._native_runner is not built (no C compiler at install time)")
    yield request.param


def taken() -> int:
    return int(NATIVE.taken()) if NATIVE is not None else 0


def _chain(prog: Any, k: int) -> Plan:
    """k kernels over slots 0..k+1: slot i+2 = slot i+1 + slot 0 (slot 1 the input, slot k+1 the result)."""
    calls = [Exec(prog, (i + 2, i + 1, 0), global_size=(N, 1, 1), ops=N, mem=12 * N, writes=frozenset({0}))
             for i in range(k)]  # fmt: skip
    return Plan(calls, k + 2, name=f"chain{k}")


def _buf(x: np.ndarray) -> Buffer:
    return Buffer("CPU", N, np.float32).copyin(np.ascontiguousarray(x, np.float32))


def _state() -> tuple[int, int, int, int, int]:
    eng = Device["CPU"].engines["compute"]
    return COUNTS.kernel_count, COUNTS.global_ops, COUNTS.global_mem, eng.submitted, int(eng.timeline.mem[0])


def _delta(before: tuple[int, ...], after: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(b - a for a, b in zip(before, after))


def test_the_extension_is_built_where_a_compiler_is() -> None:
    """Installed with a C compiler, the extension is there (its absence would silently cost the native route)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the install leaves the Python route alone")
    assert NATIVE is not None and runner._native is NATIVE.run_short


def _record(prog: Any, k: int, picks: list[int], seed: int) -> list[tuple[Any, ...]]:
    """Run a k-kernel chain once per pick (which set of fresh or earlier buffers it is bound to); per run: the
    result, what the run added to the counters, sequence numbers and timeline, and whether the plan was one batch."""
    rng = np.random.default_rng(seed)
    plan = _chain(prog, k)
    sets: list[list[Buffer]] = []
    out = []
    for p in picks:
        if p >= len(sets):  # fresh buffers (new addresses for the table)
            sets.append([_buf(rng.standard_normal(N)) for _ in range(k + 2)])
        bufs = sets[min(p, len(sets) - 1)]
        x0, x1 = bufs[0].numpy().copy(), bufs[1].numpy().copy()
        before = _state()
        runner.run(plan, bufs)
        after = _state()
        expect = x1 + k * x0
        np.testing.assert_allclose(bufs[k + 1].numpy(), expect, rtol=1e-5, atol=1e-5)
        out.append((bufs[k + 1].numpy().tobytes(), _delta(before, after), after[3] == after[4],
                    plan.single is not None))  # fmt: skip
    return out


@settings(max_examples=25, deadline=None)
@given(k=st.integers(1, 3), picks=st.lists(st.integers(0, 3), min_size=1, max_size=8), seed=st.integers(0, 2**16))
def test_both_routes_give_the_same_runs(add_prog: Any, k: int, picks: list[int], seed: int) -> None:
    """Random chains run on random sequences of bound buffers (the same, fresh, or earlier ones again): the native
    route and the Python route give identical results, counter growth, sequence numbers and timeline values, and the
    native route is taken on exactly the runs the short route covers (from the second run, when the plan is one
    batch)."""
    Device["CPU"].synchronize()
    before = taken()
    native = _record(add_prog, k, picks, seed)
    ran_native = taken() - before
    saved = runner._native
    runner._native = None
    try:
        python = _record(add_prog, k, picks, seed)
    finally:
        runner._native = saved
    assert native == python
    if NATIVE is not None:  # the short route: from the third run (the second builds the graph, the first none)
        assert ran_native == max(0, len(picks) - 2)
    with Context(NATIVE_RUNNER=0):
        before = taken()
        assert _record(add_prog, k, picks, seed) == python
        assert taken() == before  # the setting turns the native route off


def test_the_native_route_is_taken_only_where_the_short_route_is(add_prog: Any, route: str) -> None:
    """Timing, DEBUG>=2, PROFILE, count=False or variable values each send a run down the Python route (never the
    native one), with the same results; a plain run after them takes the native route when it is there."""
    plan = _chain(add_prog, 1)
    x, y = np.arange(N, dtype=np.float32), np.ones(N, np.float32)
    bufs = [_buf(x), _buf(y), Buffer("CPU", N, np.float32)]
    runner.run(plan, bufs)
    runner.run(plan, bufs)  # (settled: one batch, replayed)
    for kwargs, ctx in (({"timing": True}, {}), ({}, {"DEBUG": 2}), ({}, {"PROFILE": "1"}),
                        ({"count": False}, {}), ({"var_vals": {"unused": 1}}, {})):  # fmt: skip
        bufs[2].copyin(np.zeros(N, np.float32))
        before = taken()
        with Context(**ctx):
            runner.run(plan, bufs, **kwargs)
        Device["CPU"].synchronize()
        assert taken() == before, (kwargs, ctx)
        np.testing.assert_array_equal(bufs[2].numpy(), x + y)
    runner.EVENTS.clear()
    before = taken()
    runner.run(plan, bufs)
    assert taken() == before + (route == "native")


def test_a_bad_buffer_raises_the_same_error_and_frees_the_plan(add_prog: Any, route: str) -> None:
    """Something bound that is no Buffer: the same AttributeError on both routes, nothing counted, the plan's lock
    released, and the next run with Buffers fine."""
    plan = _chain(add_prog, 1)
    x, y = np.arange(N, dtype=np.float32), np.ones(N, np.float32)
    bufs = [_buf(x), _buf(y), Buffer("CPU", N, np.float32)]
    runner.run(plan, bufs)
    runner.run(plan, bufs)
    before = _state()
    with pytest.raises(AttributeError, match="'object' object has no attribute '_base'"):
        runner.run(plan, [bufs[0], object(), bufs[2]])  # type: ignore[list-item]
    assert _state() == before and not plan.lock.locked()
    runner.run(plan, [bufs[1], bufs[0], bufs[2]])
    np.testing.assert_array_equal(bufs[2].numpy(), x + y)


def test_a_latched_engine_error_is_raised_after_the_run(add_prog: Any, route: str) -> None:
    """An error latched by the engine's thread (a background submission that failed) is raised by the run that
    finds it (replay's wait_idle), on both routes; the graph itself ran and the device is usable after."""
    cpu = Device["CPU"]
    plan = _chain(add_prog, 1)
    x, y = np.arange(N, dtype=np.float32), np.full(N, 3, np.float32)
    bufs = [_buf(x), _buf(y), Buffer("CPU", N, np.float32)]
    runner.run(plan, bufs)
    runner.run(plan, bufs)

    class Exploding:
        name, device = "exploding", cpu

        def launch(self, args: Any, global_size: Any, threads: Any) -> None:
            raise RuntimeError("latched boom")

    bufs[2].copyin(np.zeros(N, np.float32))
    cpu.engines["compute"].submit([(EXEC, Exploding(), (), (1, 1, 1), None)], background=True)
    cpu.engines["compute"].timeline.wait(cpu.engines["compute"].submitted, timeout=30)
    with pytest.raises(HCQError, match="latched boom"):
        runner.run(plan, bufs)
    np.testing.assert_array_equal(bufs[2].numpy(), x + y)
    assert not plan.lock.locked()
    cpu.synchronize()
    runner.run(plan, [bufs[1], bufs[0], bufs[2]])
    np.testing.assert_array_equal(bufs[2].numpy(), x + y)


def test_a_busy_engine_queues_the_graph_behind_its_work(add_prog: Any, route: str) -> None:
    """The engine blocked behind a wait: the run submits its graph behind it and returns once it ran (the copy
    queued first is seen by the kernel); the sequence numbers grow by one per submission."""
    cpu = Device["CPU"]
    plan = _chain(add_prog, 1)
    x, y = np.arange(N, dtype=np.float32), np.full(N, 5, np.float32)
    bufs = [_buf(x), _buf(y), Buffer("CPU", N, np.float32)]
    runner.run(plan, bufs)
    runner.run(plan, bufs)
    gate = Signal(name="native_gate")
    eng = cpu.engines["compute"]
    before = eng.submitted
    cpu.hw_queue().wait(gate, 1).copy(bufs[1], bufs[0], bufs[0].nbytes).submit(cpu)  # y := x once the gate opens
    done = threading.Event()
    errors: list[BaseException] = []

    def go() -> None:
        try:
            runner.run(plan, bufs)
        except BaseException as e:  # (re-raised on the main thread)
            errors.append(e)
        done.set()

    t = threading.Thread(target=go)
    t.start()
    while eng.submitted < before + 2 and not done.is_set():  # (the run has submitted its graph behind the copy)
        threading.Event().wait(0.001)
    assert not done.is_set()
    gate.set(1)
    t.join()
    assert not errors
    assert eng.submitted == before + 2 and eng.idle
    np.testing.assert_array_equal(bufs[2].numpy(), x + x)


def test_threads_racing_on_one_plan_get_their_own_results(add_prog: Any, route: str) -> None:
    """Two threads replay one plan on their own buffers many times: the plan's lock keeps each run's table its own
    (a run that finds the plan busy goes the Python route, which waits for it)."""
    plan = _chain(add_prog, 2)
    failures: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        bufs = [_buf(rng.standard_normal(N)) for _ in range(4)]
        for i in range(300):
            bufs[0].copyin(np.full(N, i, np.float32))
            runner.run(plan, bufs)
            if not np.allclose(bufs[3].numpy(), bufs[1].numpy() + 2 * i):
                failures.append(f"thread {seed} run {i}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_threads_on_plans_of_their_own_get_their_own_results(add_prog: Any, route: str) -> None:
    """Two threads, each alternating between a plan of its own and a shared one (the native route's cache of the
    last graph changes hands while graphs run without the GIL): every result is its thread's."""
    shared = _chain(add_prog, 1)
    failures: list[str] = []

    def work(seed: int) -> None:
        own = _chain(add_prog, 2)
        rng = np.random.default_rng(seed)
        bufs = [_buf(rng.standard_normal(N)) for _ in range(4)]
        for i in range(300):
            bufs[0].copyin(np.full(N, i, np.float32))
            runner.run(own, bufs)
            if not np.allclose(bufs[3].numpy(), bufs[1].numpy() + 2 * i):
                failures.append(f"thread {seed} own run {i}")
            runner.run(shared, bufs[:3])
            if not np.allclose(bufs[2].numpy(), bufs[1].numpy() + i):
                failures.append(f"thread {seed} shared run {i}")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_a_replayed_graph_is_not_kept_alive_by_the_native_route(add_prog: Any, route: str) -> None:
    """The native route remembers the last graph it ran weakly: a plan dropped after its runs takes its graph with
    it."""
    import gc
    import weakref

    plan = _chain(add_prog, 1)
    bufs = [_buf(np.ones(N)), _buf(np.ones(N)), Buffer("CPU", N, np.float32)]
    for _ in range(4):
        runner.run(plan, bufs)
    assert plan.single is not None
    graph = weakref.ref(plan.single.graph)
    del plan
    gc.collect()
    assert graph() is None


def test_an_engine_lock_held_elsewhere_sends_the_run_to_the_python_route(add_prog: Any, route: str) -> None:
    """Another thread inside the engine's locked lines (here: the engine's lock held by this thread): the run waits
    for the lock in Engine.run_inline, the Python code, and then runs as usual (one submission, the counters grown)."""
    import sys

    cpu = Device["CPU"]
    plan = _chain(add_prog, 1)
    x, y = np.arange(N, dtype=np.float32), np.full(N, 7, np.float32)
    bufs = [_buf(x), _buf(y), Buffer("CPU", N, np.float32)]
    for _ in range(3):
        runner.run(plan, bufs)
    bufs[2].copyin(np.zeros(N, np.float32))
    eng = cpu.engines["compute"]
    before = _state()
    errors: list[BaseException] = []

    def go() -> None:
        try:
            runner.run(plan, bufs)
        except BaseException as e:  # (re-raised on the main thread)
            errors.append(e)

    t = threading.Thread(target=go)
    with eng._lock:
        t.start()
        while True:  # until the run waits for the lock in run_inline's Python code
            frame = sys._current_frames().get(t.ident or -1)
            names = []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            if "run_inline" in names or not t.is_alive():
                break
            threading.Event().wait(0.001)
        assert "run_inline" in names
    t.join()
    assert not errors
    np.testing.assert_array_equal(bufs[2].numpy(), x + y)
    assert _delta(before, _state()) == (1, N, 12 * N, 1, 1)
