"""CPU graphs: a batch of kernels and copies run by the native interpreter computes exactly what the same calls
launched one at a time compute, for every worker count, with buffers swapped between runs, and it is one exec
command on the device's compute engine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcq_kernels import ADD_IR, ROWSUM_IR, SCALE_IR
from speck.hcq import Buffer, Device, HCQError, ProgramArgumentError
from speck.hcq.cpu import CPUDevice, CPUProgram
from speck.hcq.graph import MAX_ARGS, CPUGraph
from speck.hcq.worker_choice import TUNE_RUNS


def _wide_ir(nbufs: int) -> str:
    """out[i] = (in1[i] + ... + in_{nbufs-1}[i]) * k + j: enough arguments that several go on the stack."""
    params = ", ".join(f"ptr noalias %b{j}" for j in range(nbufs))
    body = ["  %acc0 = fadd float 0.0, 0.0"]
    for j in range(1, nbufs):
        body += [
            f"  %p{j} = getelementptr float, ptr %b{j}, i64 %i",
            f"  %v{j} = load float, ptr %p{j}",
            f"  %acc{j} = fadd float %acc{j - 1}, %v{j}",
        ]
    last = nbufs - 1
    return f"""
define void @wide({params}, i32 %k, i32 %j, i32 %s, i32 %e) {{
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i32 = phi i32 [%s, %entry], [%n, %loop]
  %i = sext i32 %i32 to i64
{chr(10).join(body)}
  %kf = sitofp i32 %k to float
  %jf = sitofp i32 %j to float
  %m = fmul float %acc{last}, %kf
  %r = fadd float %m, %jf
  %q = getelementptr float, ptr %b0, i64 %i
  store float %r, ptr %q
  %n = add i32 %i32, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  ret void
}}
"""


@pytest.fixture(scope="module")
def progs() -> dict[str, CPUProgram]:
    dev: Any = Device["CPU"]
    return {
        "add": dev.runtime("add", dev.compiler.compile(ADD_IR)),
        "scale": dev.runtime("scale", dev.compiler.compile(SCALE_IR)),
        "rowsum": dev.runtime("rowsum", dev.compiler.compile(ROWSUM_IR)),
        "wide": dev.runtime("wide", dev.compiler.compile(_wide_ir(9))),
    }


def buf(data: np.ndarray) -> Buffer:
    return Buffer("CPU", data.size, data.dtype).copyin(np.ascontiguousarray(data))


def _program(progs: dict[str, CPUProgram], bufs: list[Buffer], n: int, rows: int, cols: int) -> list[tuple[Any, ...]]:
    """A little dependent program over bufs[0..5] as (kind, ...) steps, shared by the graph and the direct run."""
    a, b, o1, o2, r, w = bufs
    return [
        ("exec", progs["add"], [o1, a, b], (n, 1, 1), (), None),
        ("exec", progs["scale"], [o2, o1], (n, 1, 1), (3,), 1),
        ("copy", a, o2),
        ("exec", progs["add"], [o1, o2, a], (n, 1, 1), (), None),
        ("exec", progs["rowsum"], [r, o1], (rows, 1, 1), (cols,), None),
        ("exec", progs["wide"], [w, a, b, o1, o2, a, b, o1, o2], (n, 1, 1), (2, -5), None),
    ]


def _fresh(rng: np.random.Generator, n: int, rows: int) -> list[np.ndarray]:
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    z = np.zeros(n, dtype=np.float32)
    return [a, b, z, z, np.zeros(rows, dtype=np.float32), z]


def _run_direct(steps: list[tuple[Any, ...]]) -> None:
    for s in steps:
        if s[0] == "copy":
            s[1].copy_from(s[2])
        else:
            s[1](*s[2], global_size=s[3], vals=s[4], threads=s[5], wait=True)


def _graph(dev: CPUDevice, steps: list[tuple[Any, ...]]) -> CPUGraph:
    g = CPUGraph(dev)
    for s in steps:
        if s[0] == "copy":
            g.add_buffer_copy(s[1], s[2])
        else:
            g.add_exec(s[1], s[2], s[3], s[4], s[5])
    return g


@pytest.mark.parametrize("threads", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [None, 1, 2, 8])
def test_graph_equals_direct_launches(
    progs: dict[str, CPUProgram], cpu: CPUDevice, threads: int, workers: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    import speck.hcq.cpu as cpu_mod

    monkeypatch.setattr(cpu_mod, "PARALLEL_MIN_BYTES", 0)  # small kernels split across the workers too
    cpu.threads = threads  # type: ignore[attr-defined]
    rng = np.random.default_rng(threads)
    rows, cols = 7, 131
    n = rows * cols
    init = _fresh(rng, n, rows)
    direct, batched = [buf(x) for x in init], [buf(x) for x in init]
    _run_direct(_program(progs, direct, n, rows, cols))
    g = _graph(cpu, _program(progs, batched, n, rows, cols))
    g.workers = workers
    g.run()
    for d, b in zip(direct, batched):
        np.testing.assert_array_equal(b.numpy(), d.numpy())
    a, b0 = init[0], init[1]
    o2 = (a + b0) * np.float32(3) + np.arange(n, dtype=np.float32)
    o1 = o2 + o2  # the copy made a equal o2 before the second add
    np.testing.assert_allclose(batched[2].numpy(), o1, rtol=1e-6)
    np.testing.assert_allclose(batched[4].numpy(), o1.reshape(rows, cols).sum(axis=1), rtol=1e-5)
    a2, o2 = batched[0].numpy(), batched[3].numpy()  # the wide kernel: 9 buffers and 2 variables, some on the stack
    np.testing.assert_allclose(batched[5].numpy(), (a2 + b0 + o1 + o2) * 4 - 5, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [2, 3])
@pytest.mark.parametrize("parts", [1, 3, 8])
def test_parts_taken_in_turn_compute_what_slices_do(
    progs: dict[str, CPUProgram], cpu: CPUDevice, threads: int, parts: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Big kernels (parts per worker > 1) are cut into parts the workers take in turn; consecutive split commands
    share one part counter, so each must read its own part numbers: every buffer ends as direct launches leave it,
    over several runs."""
    import speck.hcq.cpu as cpu_mod
    from speck.hcq.graph import _CMD_WORDS

    monkeypatch.setattr(cpu_mod, "PARALLEL_MIN_BYTES", 0)
    for prog in progs.values():
        monkeypatch.setattr(prog, "_parts", parts)
    cpu.threads = threads  # type: ignore[attr-defined]
    rng = np.random.default_rng(parts)
    rows, cols = 7, 131
    n = rows * cols
    init = _fresh(rng, n, rows)
    direct, batched = [buf(x) for x in init], [buf(x) for x in init]
    _run_direct(_program(progs, direct, n, rows, cols))
    g = _graph(cpu, _program(progs, batched, n, rows, cols))
    g.workers = threads
    g.run()
    for d, b in zip(direct, batched):
        np.testing.assert_array_equal(b.numpy(), d.numpy())
    table = list(g._tables[threads][0])
    words = [table[i : i + _CMD_WORDS] for i in range(0, len(table), _CMD_WORDS)]
    split = [w for w in words if w[4] > 1]
    assert split and all(w[5] == (min(w[3], parts * w[4]) if parts > 1 else 0) for w in split)
    for _ in range(3):  # runs again (the counters reset per launch): the same values as three more direct runs
        _run_direct(_program(progs, direct, n, rows, cols))
        g.run()
    for d, b in zip(direct, batched):
        np.testing.assert_array_equal(b.numpy(), d.numpy())


def test_runs_repeat_and_choose_a_worker_count(progs: dict[str, CPUProgram], cpu: CPUDevice) -> None:
    cpu.threads = 2  # type: ignore[attr-defined]
    rng = np.random.default_rng(7)
    n = 4099
    a, b = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    A, B, O = buf(a), buf(b), Buffer("CPU", n, np.float32)
    g = CPUGraph(cpu)
    g.add_exec(progs["add"], [O, A, B], (n, 1, 1), threads=2)
    g.add_exec(progs["add"], [O, O, A], (n, 1, 1), threads=1)
    assert g.chosen_workers is None  # measuring until both candidates were timed
    for _ in range(2 * TUNE_RUNS + 3):
        g.run()
        np.testing.assert_array_equal(O.numpy(), (a + b) + a)
    assert g.chosen_workers in (1, 2)


def test_set_arg_swaps_buffers_between_runs(progs: dict[str, CPUProgram], cpu: CPUDevice) -> None:
    rng = np.random.default_rng(1)
    n = 1000
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
    A, B, O = buf(xs[0]), buf(xs[1]), Buffer("CPU", n, np.float32)
    g = CPUGraph(cpu)
    c0 = g.add_exec(progs["add"], [O, A, B], (n, 1, 1))
    c1 = g.add_exec(progs["scale"], [O, O], (n, 1, 1), vals=(2,))
    g.run()
    np.testing.assert_array_equal(O.numpy(), (xs[0] + xs[1]) * 2 + np.arange(n, dtype=np.float32))
    C, D = buf(xs[2]), buf(xs[3])
    g.set_arg(c0, 1, C.ptr)
    g.set_arg(c0, 2, D.ptr)
    g.set_arg(c1, 2, -1)  # the variable value
    g.run()
    np.testing.assert_array_equal(O.numpy(), (xs[2] + xs[3]) * -1 + np.arange(n, dtype=np.float32))
    with pytest.raises(IndexError, match="has 3 arguments"):
        g.set_arg(c1, 3, 0)
    g.args[g.arg_index(c0, 1)] = A.ptr  # a write straight into the live table survives appending a command
    g.add_exec(progs["add"], [O, O, A], (n, 1, 1))
    g.run()
    want = (xs[0] + xs[3]) * -1 + np.arange(n, dtype=np.float32)
    np.testing.assert_array_equal(O.numpy(), want + xs[0])


def test_global_size_smaller_than_workers_and_empty_kernels(progs: dict[str, CPUProgram], cpu: CPUDevice) -> None:
    cpu.threads = 8  # type: ignore[attr-defined]
    a = np.arange(3, dtype=np.float32)
    A, O = buf(a), Buffer("CPU", 3, np.float32)
    g = CPUGraph(cpu)
    g.add_exec(progs["add"], [O, A, A], (3, 1, 1), threads=8)
    g.add_exec(progs["add"], [O, O, A], (0, 1, 1))  # an empty launch: called with (0, 0), as directly
    g.add_kernel(progs["add"], [O.ptr, O.ptr, A.ptr], ())  # no global dimension: called once with (0, 1)
    g.workers = 8
    g.run()
    np.testing.assert_array_equal(O.numpy(), np.array([0, 2, 4], dtype=np.float32))
    assert g.nworkers == 3
    CPUGraph(cpu).run()  # an empty graph runs


def test_graph_is_one_exec_command(progs: dict[str, CPUProgram], cpu: CPUDevice) -> None:
    n = 64
    A, O = buf(np.ones(n, dtype=np.float32)), Buffer("CPU", n, np.float32)
    g = CPUGraph(cpu, name="mygraph")
    for _ in range(10):
        g.add_exec(progs["add"], [O, A, A], (n, 1, 1))
    engine = cpu.engines["compute"]
    before = engine.submitted
    cpu.profile = True
    try:
        engine.events.clear()
        g.run()
        events = [e for e in cpu.profile_events if e.kind == "exec"]
    finally:
        cpu.profile = False
    assert engine.submitted == before + 1
    assert [e.name for e in events] == ["mygraph"]
    assert engine.timeline.value == engine.submitted


def test_bad_arguments_raise_before_anything_runs(progs: dict[str, CPUProgram], cpu: CPUDevice) -> None:
    A = buf(np.ones(8, dtype=np.float32))
    I8 = Buffer("CPU", 8, np.int32)
    g = CPUGraph(cpu)
    checked = cpu.runtime(
        "scale", progs["scale"].lib, buffers=[(0, np.float32, 8, "out"), (1, np.float32, 8, "in")],
        vars=[("k", -10, 10)],
    )  # fmt: skip
    with pytest.raises(ProgramArgumentError, match="takes 1 variable"):
        g.add_exec(checked, [A, A], (8, 1, 1))
    with pytest.raises(ProgramArgumentError, match="buffer 1 must hold float32"):
        g.add_exec(checked, [A, I8], (8, 1, 1), vals=(1,))
    with pytest.raises(ProgramArgumentError, match=r"must be in \[-10, 10\]"):
        g.add_exec(checked, [A, A], (8, 1, 1), vals=(11,))
    with pytest.raises(ProgramArgumentError, match="global size"):
        g.add_kernel(progs["add"], [A.ptr, A.ptr, A.ptr], (2**31, 1, 1))
    with pytest.raises(ProgramArgumentError, match=f"at most {MAX_ARGS}"):
        g.add_kernel(progs["add"], [0] * (MAX_ARGS + 1), (1, 1, 1))
    with pytest.raises(Exception, match="copy"):
        g.add_buffer_copy(A, I8.view(4, np.int32))
    assert len(g) == 0
    with pytest.raises(HCQError, match="CPU graphs run on CPU devices"):
        CPUGraph(Device["NULL"])  # type: ignore[arg-type]
    not_cpu: Any = SimpleNamespace(
        name="k", device=Device["NULL"], address=0
    )  # (a program of a device with no CPU graph)
    with pytest.raises(HCQError, match="loaded on NULL, which is no CPU device"):
        g.add_kernel(not_cpu, [A.ptr, A.ptr, A.ptr], (8, 1, 1))


def test_graph_joins_kernels_and_copies_of_several_cpu_devices() -> None:
    """A CPU graph holds kernels loaded on other CPU devices and copies between their buffers (one memory, one worker
    pool): the commands run in order, as they would one by one on their devices."""
    cpu0, cpu1 = Device["CPU"], Device["CPU:1"]
    add0 = cpu0.runtime("add", cpu0.compiler.compile(ADD_IR))
    add1 = cpu1.runtime("add", cpu1.compiler.compile(ADD_IR))
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    A0, B1 = Buffer("CPU", 64, np.float32).copyin(a), Buffer("CPU:1", 64, np.float32).copyin(b)
    S0, A1, S1 = Buffer("CPU", 64, np.float32), Buffer("CPU:1", 64, np.float32), Buffer("CPU:1", 64, np.float32)
    g = CPUGraph(cpu0)
    g.add_copy(A1.ptr, A0.ptr, A0.nbytes)  # a -> CPU:1
    g.add_exec(add1, [S1, A1, B1], (64, 1, 1))  # a + b on CPU:1
    g.add_copy(S0.ptr, S1.ptr, S1.nbytes)  # -> CPU
    g.add_exec(add0, [S0, S0, A0], (64, 1, 1))  # (a + b) + a on CPU
    for _ in range(2):
        g.run()
        np.testing.assert_array_equal(S1.numpy(), a + b)
        np.testing.assert_array_equal(S0.numpy(), (a + b) + a)


@settings(max_examples=15, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["add", "scale", "copy"]),
            st.integers(0, 3),
            st.integers(0, 3),
            st.sampled_from([None, 1, 2, 3]),
        ),
        min_size=1,
        max_size=12,
    ),
    st.integers(1, 4),
    st.integers(1, 300),
)
def test_random_batches_match_direct(
    progs: dict[str, CPUProgram], ops: list[tuple[str, int, int, int | None]], threads: int, n: int
) -> None:
    """Any sequence of kernels and copies among four buffers: the graph leaves them as direct launches do."""
    cpu: Any = Device["CPU"]
    saved = cpu.threads
    cpu.threads = threads
    try:
        rng = np.random.default_rng(n)
        init = [rng.standard_normal(n).astype(np.float32) for _ in range(4)]
        direct, batched = [buf(x) for x in init], [buf(x) for x in init]
        for bufs, use_graph in ((direct, False), (batched, True)):
            steps: list[tuple[Any, ...]] = []
            for kind, i, j, t in ops:
                if kind == "copy":
                    steps.append(("copy", bufs[i], bufs[j]))
                elif kind == "add":
                    steps.append(("exec", progs["add"], [bufs[i], bufs[j], bufs[(i + 1) % 4]], (n, 1, 1), (), t))
                else:
                    steps.append(("exec", progs["scale"], [bufs[i], bufs[j]], (n, 1, 1), (j - 1,), t))
            if use_graph:
                g = _graph(cpu, steps)
                g.workers = threads  # splits as chosen (not the one-worker first run of the automatic choice)
                g.run()
            else:
                _run_direct(steps)
        for d, b in zip(direct, batched):
            np.testing.assert_array_equal(b.numpy(), d.numpy())
    finally:
        cpu.threads = saved


def test_run_timed_gives_per_command_times(progs: dict[str, CPUProgram], cpu: CPUDevice) -> None:
    """Per-kernel timing inside one batch: the stamps come from the clock perf_counter_ns reads, so the command
    times are non-negative, sum to at most the wall time of the run, and a big kernel takes longer than an empty
    one. The results are those of an untimed run."""
    import time

    cpu.threads = 2  # type: ignore[attr-defined]
    rows, cols = 64, 4096
    a = np.random.default_rng(3).standard_normal(rows * cols).astype(np.float32)
    A, R, O = buf(a), Buffer("CPU", rows, np.float32), Buffer("CPU", 1, np.float32)
    g = CPUGraph(cpu)
    g.add_exec(progs["rowsum"], [R, A], (rows, 1, 1), vals=(cols,), threads=2)
    g.add_exec(progs["add"], [O, O, O], (0, 1, 1))
    g.add_copy(O.ptr, R.ptr, 4)
    t0 = time.perf_counter_ns()
    times = g.run_timed()
    wall = (time.perf_counter_ns() - t0) * 1e-9
    assert [n for n, _ in times] == ["rowsum", "add", "copy 4B"]
    assert all(t >= 0 for _, t in times) and sum(t for _, t in times) <= wall
    assert times[0][1] > times[1][1]
    np.testing.assert_allclose(R.numpy(), a.reshape(rows, cols).sum(axis=1), rtol=1e-4, atol=1e-3)
    assert O.numpy()[0] == R.numpy()[0]
    assert g.chosen_workers is None  # the timed run was no trial of the automatic choice


def test_worker_choice_is_measured_again(
    progs: dict[str, CPUProgram], cpu: CPUDevice, monkeypatch: pytest.MonkeyPatch
) -> None:
    import speck.hcq.worker_choice as choice_mod

    monkeypatch.setattr(choice_mod, "RETUNE_EVERY", 3)
    cpu.threads = 2  # type: ignore[attr-defined]
    n = 512
    a = np.arange(n, dtype=np.float32)
    A, O = buf(a), Buffer("CPU", n, np.float32)
    g = CPUGraph(cpu)
    g.add_exec(progs["add"], [O, A, A], (n, 1, 1), threads=2)
    seen = []
    for _ in range(2 * TUNE_RUNS + 3 + 1):
        g.run()
        seen.append(g.chosen_workers)
        np.testing.assert_array_equal(O.numpy(), a + a)
    assert seen[2 * TUNE_RUNS - 1] in (1, 2) and seen[-1] is None  # chosen, then three runs later measuring again


def test_a_confirmed_clear_choice_is_measured_more_rarely() -> None:
    """The re-measurement interval doubles (up to RETUNE_MAX) while measurements confirm a choice by a clear margin,
    and drops back to RETUNE_EVERY when the choice changes or the candidates come close."""
    from speck.hcq.worker_choice import CLEAR_MARGIN, RETUNE_EVERY, RETUNE_MAX, next_retune_interval

    clear = {1: [0.30, 0.31], 2: [0.15, 0.16]}  # two workers twice as fast
    assert next_retune_interval(RETUNE_EVERY, None, 2, clear) == RETUNE_EVERY  # a first choice: nothing confirmed
    assert next_retune_interval(RETUNE_EVERY, 2, 2, clear) == 2 * RETUNE_EVERY
    assert next_retune_interval(RETUNE_MAX, 2, 2, clear) == RETUNE_MAX
    assert next_retune_interval(4 * RETUNE_EVERY, 1, 2, clear) == RETUNE_EVERY  # the choice changed
    close = {1: [0.15 * CLEAR_MARGIN * 0.99], 2: [0.15]}
    assert next_retune_interval(4 * RETUNE_EVERY, 2, 2, close) == RETUNE_EVERY


def test_replay_equals_run_and_waits_when_queued(progs: dict[str, CPUProgram], cpu: CPUDevice) -> None:
    """replay() (untimed: one worker does it all, launched through the packed entry point) computes what run()
    computes, runs as one exec command, and a replay queued behind a blocked submission returns only after the
    graph has run there."""
    from speck.hcq import Signal

    rng = np.random.default_rng(9)
    n = 64
    xs = [rng.standard_normal(n).astype(np.float32) for _ in range(3)]
    A, B, O = buf(xs[0]), buf(xs[1]), Buffer("CPU", n, np.float32)
    g = CPUGraph(cpu)
    c0 = g.add_exec(progs["add"], [O, A, B], (n, 1, 1), threads=1)
    g.add_exec(progs["scale"], [O, O], (n, 1, 1), vals=(3,), threads=1)
    want = (xs[0] + xs[1]) * 3 + np.arange(n, dtype=np.float32)
    engine = cpu.engines["compute"]
    for _ in range(3):
        O.copyin(np.zeros(n, np.float32))
        before = engine.submitted
        g.replay()
        assert engine.submitted == before + 1 and engine.idle
        np.testing.assert_array_equal(O.numpy(), want)
    assert g.chosen_workers == 1
    gate = Signal(name="graph_replay_gate")
    cpu.hw_queue().wait(gate, 1).copy(A, buf(xs[2]), A.nbytes).submit(cpu)  # A := xs[2] once the gate opens
    import threading

    threading.Timer(0.05, gate.set, (1,)).start()
    g.replay()  # queued behind the blocked copy: returns after both ran
    assert gate.value == 1 and engine.idle
    np.testing.assert_array_equal(O.numpy(), (xs[2] + xs[1]) * 3 + np.arange(n, dtype=np.float32))
    g.set_arg(c0, 1, B.ptr)  # swapped buffers reach replays as runs
    g.replay()
    np.testing.assert_array_equal(O.numpy(), (xs[1] + xs[1]) * 3 + np.arange(n, dtype=np.float32))
    g.add_exec(progs["add"], [O, O, A], (n, 1, 1), threads=1)  # a command appended after replays runs too
    g.replay()
    np.testing.assert_array_equal(O.numpy(), (xs[1] + xs[1]) * 3 + np.arange(n, dtype=np.float32) + xs[2])


@given(st.permutations(range(5)), st.lists(st.permutations(range(5)), min_size=1, max_size=5))
@settings(max_examples=15, deadline=None)
def test_batched_plan_binds_slots_used_out_of_order(order: list[int], runs: list[list[int]]) -> None:
    """A plan whose kernels use its slots in any order (an eager op's: the output first) is batched with its slots
    in slot order; each run writes where its own buffer list says, whatever the lists before it were (a stale or
    misordered slot would write another run's buffer)."""
    from speck.hcq import runner

    dev: Any = Device["CPU"]
    add = dev.runtime("add", dev.compiler.compile(ADD_IR))
    o, x, y, p, q = order  # out = x + y, then p = out + q: slots first used in `order`
    n = 4
    w = frozenset({0})
    calls = [runner.Exec(add, (o, x, y), global_size=(n, 1, 1), threads=1, writes=w),
             runner.Exec(add, (p, o, q), global_size=(n, 1, 1), threads=1, writes=w)]  # fmt: skip
    plan = runner.Plan(calls, 5)
    pool = [buf(np.arange(n, dtype=np.float32) * (k + 1) + k) for k in range(5)]
    for perm in [list(range(5)), *runs, *runs]:  # (the first run is unbatched; later ones replay one batch)
        bufs = [pool[k] for k in perm]
        vals = [b.numpy().copy() for b in bufs]
        runner.run(plan, bufs)
        want_out = vals[x] + vals[y]
        np.testing.assert_array_equal(bufs[o].numpy(), want_out)
        np.testing.assert_array_equal(bufs[p].numpy(), want_out + vals[q])
    assert plan.single is not None and plan.single.every  # (the batched route is the one tested)


def test_batched_plan_follows_memory_that_moved() -> None:
    """Between runs of a batched plan on the same Buffer objects, memory that moved (exchange_memory, deallocate and
    a new allocation) is what the next run writes and reads: the bind's cached addresses are not trusted."""
    from speck.hcq import runner

    dev: Any = Device["CPU"]
    add = dev.runtime("add", dev.compiler.compile(ADD_IR))
    n = 4
    plan = runner.Plan([runner.Exec(add, (2, 0, 1), global_size=(n, 1, 1), threads=1, writes=frozenset({0}))], 3)
    a, b = buf(np.arange(n, dtype=np.float32)), buf(np.full(n, 10, np.float32))
    out, spare = Buffer("CPU", n, np.float32), buf(np.zeros(n, np.float32))
    for _ in range(3):
        runner.run(plan, [a, b, out])
    np.testing.assert_array_equal(out.numpy(), np.arange(n) + 10)
    out.exchange_memory(spare)  # out now holds zeros, spare the sum
    a.copyin(np.full(n, 5, np.float32))
    runner.run(plan, [a, b, out])
    np.testing.assert_array_equal(out.numpy(), np.full(n, 15, np.float32))
    np.testing.assert_array_equal(spare.numpy(), np.arange(n) + 10)  # (the old memory was not written)
    b.deallocate()
    b.copyin(np.full(n, 1, np.float32))  # (new memory)
    runner.run(plan, [a, b, out])
    np.testing.assert_array_equal(out.numpy(), np.full(n, 6, np.float32))
