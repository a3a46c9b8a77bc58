"""CPU graph runs on workers that wait for the next run without sleeping: a worker spinning after a graph run takes
the next one natively (no wake-up through Python), the results are the same as launching the kernels one by one,
a direct launch still reaches a spinning worker, and how long workers spin follows the host (idle_spin_ns)."""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from hcq_kernels import ADD_IR, SCALE_IR
from speck.hcq import Buffer, Device
from speck.hcq.cpu import CPUDevice, CPUProgram, WorkerPool, idle_spin_ns, usable_cores
from speck.hcq.graph import CPUGraph
from speck.uop import Context


@given(
    run_ns=st.integers(0, 10**10),
    cap_us=st.integers(0, 10**6),
    cores=st.integers(1, 64),
    workers=st.integers(1, 64),
)
def test_idle_spin_follows_the_run_the_cap_and_the_cores(run_ns: int, cap_us: int, cores: int, workers: int) -> None:
    spin = idle_spin_ns(run_ns, cap_us, cores, workers)
    if cores <= workers or cap_us == 0:  # a spinning worker would take a core the launcher needs, or spinning is off
        assert spin == 0
    else:
        assert spin == min(run_ns, cap_us * 1000)


@pytest.fixture
def pool(cpu: CPUDevice) -> Iterator[WorkerPool]:
    """A private pool for the CPU device (so no other test's workers spin or count), sent back to sleep after."""
    own = WorkerPool()
    cpu.pool = own  # type: ignore[misc]
    try:
        yield own
    finally:
        del cpu.pool  # type: ignore[misc]  # (back to the class's shared POOL)
        own.run(lambda s, e: None, (), 2, 2)  # a direct launch: the workers stop spinning and sleep


@pytest.fixture(scope="module")
def progs() -> dict[str, CPUProgram]:
    dev: Any = Device["CPU"]  # (the programs outlive the graphs that call them)
    return {"add": dev.runtime("add", dev.compiler.compile(ADD_IR)),
            "scale": dev.runtime("scale", dev.compiler.compile(SCALE_IR))}  # fmt: skip


def _add_scale_graph(
    cpu: CPUDevice, progs: dict[str, CPUProgram], n: int
) -> tuple[CPUGraph, list[Buffer], np.ndarray, np.ndarray]:
    add, scale = progs["add"], progs["scale"]
    rng = np.random.default_rng(n)
    a, b = rng.random(n, dtype=np.float32), rng.random(n, dtype=np.float32)
    bufs = [Buffer("CPU", n, np.float32).copyin(x) for x in (a, b, np.zeros(n, np.float32), np.zeros(n, np.float32))]
    g = CPUGraph(cpu)
    g.add_exec(add, [bufs[2], bufs[0], bufs[1]], (n, 1, 1), threads=2)  # out = a + b, split across 2 workers
    g.add_exec(scale, [bufs[3], bufs[2]], (n, 1, 1), (3,), threads=2)  # out2 = out * 3 + i
    g.workers = 2
    return g, bufs, a, b


def _await_spinning(pool: WorkerPool) -> None:
    (w,) = pool._workers
    for _ in range(100_000):  # (the worker enters its native wait right after the run it took through Python)
        if w.slot[0] == 1:
            return
        time.sleep(0.0001)
    raise AssertionError("the worker never started waiting for graph runs")


def test_spinning_worker_takes_the_next_graph_runs_natively(
    cpu: CPUDevice, progs: dict[str, CPUProgram], pool: WorkerPool, monkeypatch: pytest.MonkeyPatch
) -> None:
    import speck.hcq.cpu as cpu_mod

    cpu.threads = 2  # type: ignore[attr-defined]
    n = 1000
    g, bufs, a, b = _add_scale_graph(cpu, progs, n)
    spins = idle_spin_ns(1, 1, usable_cores(), 1) > 0
    if spins:  # a long budget (the rule gives as long as the last run took): still spinning at every next run
        monkeypatch.setattr(cpu_mod, "idle_spin_ns", lambda *a: 10**10)
    g.run()  # the first runs wake the worker through Python: after the second, it waits for the next spinning
    g.run()
    if spins:
        _await_spinning(pool)
    for k in range(20):
        x = np.full(n, k, np.float32)
        bufs[0].copyin(x)
        g.run()
        np.testing.assert_array_equal(bufs[2].numpy(), x + b)
        np.testing.assert_array_equal(bufs[3].numpy(), (x + b) * np.float32(3) + np.arange(n, dtype=np.float32))
    # every run after the first two was taken by the spinning worker (none where the host has no core to spare)
    assert pool.posted == (20 if spins else 0)
    # a direct launch reaches the spinning worker (it goes back to Python for it), and the worker then sleeps
    seen: list[tuple[int, int]] = []
    pool.run(lambda s, e: seen.append((s, e)), (), 2, 2)
    assert sorted(seen) == [(0, 1), (1, 2)]
    (w,) = pool._workers
    assert w.slot[2] == 0


def test_no_spinning_when_turned_off(cpu: CPUDevice, progs: dict[str, CPUProgram], pool: WorkerPool) -> None:
    cpu.threads = 2  # type: ignore[attr-defined]
    g, bufs, a, b = _add_scale_graph(cpu, progs, 257)
    with Context(CPU_IDLE_SPIN_US=0):
        for _ in range(5):
            g.run()
            np.testing.assert_array_equal(bufs[3].numpy(), (a + b) * np.float32(3) + np.arange(257, dtype=np.float32))
    (w,) = pool._workers
    assert w.slot[2] == 0 and pool.posted == 0


def _child_launch(q: multiprocessing.Queue) -> None:  # type: ignore[type-arg]
    from speck.hcq.cpu import POOL

    seen: list[int] = []
    POOL.run(lambda s, e: seen.append(s), (), 2, 2)
    q.put(sorted(seen))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX-only")
def test_a_forked_child_gets_workers_of_its_own() -> None:
    """The parent's worker threads do not exist in a forked child: its pool makes new ones (a launch there used to
    wait forever for the parent's)."""
    from speck.hcq.cpu import POOL

    POOL.run(lambda s, e: None, (), 2, 2)  # the parent has a worker
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child_launch, args=(q,))
    p.start()
    p.join(120)  # (a guard against a hang, not a time limit on the launch)
    if p.is_alive():
        p.kill()
        p.join()
        raise AssertionError("the forked child's launch never finished")
    assert p.exitcode == 0
    assert q.get(timeout=10) == [0, 1]


EXIT_WHILE_SPINNING = """
import sys
sys.path.insert(0, {here!r})
import numpy as np
from hcq_kernels import ADD_IR
from speck.hcq import Buffer, Device
import speck.hcq.cpu as cpu_mod
from speck.hcq.graph import CPUGraph

cpu_mod.idle_spin_ns = lambda *a: 10**10  # the worker is still spinning when the process exits
dev = Device["CPU"]
dev.threads = 2
add = dev.runtime("add", dev.compiler.compile(ADD_IR))
bufs = [Buffer("CPU", 64, np.float32).copyin(np.ones(64, np.float32)) for _ in range(3)]
g = CPUGraph(dev)
g.add_exec(add, bufs, (64, 1, 1), threads=2)
g.workers = 2
for _ in range(3):
    g.run()
print(bufs[0].numpy().sum())
"""


def test_the_process_exits_cleanly_while_workers_spin(tmp_path: Any) -> None:
    """At exit the workers leave the interpreter's code before it is unmapped (a worker spinning in it crashed the
    exiting process)."""
    import subprocess
    import sys

    script = EXIT_WHILE_SPINNING.format(here=os.path.dirname(__file__))
    env = {**os.environ, "SPECK_CACHE_DIR": str(tmp_path)}
    for _ in range(3):
        proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert proc.stdout.strip() == "128.0"
