"""The warm per-op path (`(a+b).realize()` again and again): it must replay the cached schedule and the compiled
program - no scheduling, no compiling, no fresh memory from the OS - and still count, print and check like the
cold path. No wall-clock asserts: the benchmark (bench/tensor_ops.py) measures the time."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.hcq import Buffer, ProgramArgumentError
from speck.hcq.allocator import BufferOptions, HostAllocator
from speck.tensor import Context, GlobalCounters, Tensor, dtypes
from speck.tensor import schedule_cache as schedule_mod
from speck.tensor.realize import compiled_program_count, get_buffer, program
from speck.uop import Ops


def _realized(values: list[float]) -> Tensor:
    return Tensor(np.array(values, dtype=np.float32)).realize()


class _Counting:
    """Wraps speck.tensor.schedule.Scheduler to count how often the full scheduler runs."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = 0
        real = schedule_mod.Scheduler

        def make(*args: object, **kwargs: object) -> object:
            self.calls += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(schedule_mod, "Scheduler", make)


def test_warm_add_does_not_reschedule_recompile_or_allocate(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _realized([1, 2, 3, 4]), _realized([5, 6, 7, 8])
    (a + b).realize()  # warm: schedule, compile, allocate once
    (a + b).realize()
    programs = compiled_program_count()
    sched = _Counting(monkeypatch)
    os_allocs = 0
    real_alloc = HostAllocator._alloc

    def counting_alloc(self: HostAllocator, nbytes: int, options: BufferOptions) -> object:
        nonlocal os_allocs
        os_allocs += 1
        return real_alloc(self, nbytes, options)

    monkeypatch.setattr(HostAllocator, "_alloc", counting_alloc)
    for _ in range(50):
        (a + b).realize()
    assert sched.calls == 0, "the warm path ran the scheduler"
    assert compiled_program_count() == programs, "the warm path compiled a program"
    assert os_allocs == 0, "the warm path took memory from the OS instead of the LRU cache"


@given(st.lists(st.floats(-1e3, 1e3, width=32), min_size=4, max_size=4),
       st.lists(st.floats(-1e3, 1e3, width=32), min_size=4, max_size=4))  # fmt: skip
def test_warm_path_results_match_numpy(x: list[float], y: list[float]) -> None:
    """Replays write fresh buffers: every result stays right (and distinct) while later ones are computed."""
    a, b = _realized(x), _realized(y)
    outs = [(a + b).realize() for _ in range(3)]
    want = np.array(x, dtype=np.float32) + np.array(y, dtype=np.float32)
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), want)
    assert len({id(get_buffer(o.uop)) for o in outs}) == 3


def test_warm_path_counts_like_the_cold_path() -> None:
    a, b = _realized([1, 2, 3, 4]), _realized([5, 6, 7, 8])
    deltas = []
    for _ in range(3):
        k0, o0, m0 = GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem
        (a + b).realize()
        deltas.append(
            (GlobalCounters.kernel_count - k0, GlobalCounters.global_ops - o0, GlobalCounters.global_mem - m0)
        )
    assert deltas[0][0] == 1 and deltas[0][2] == 3 * 4 * 4  # one kernel over three 4-float buffers
    assert deltas[1] == deltas[0] and deltas[2] == deltas[0]


def test_warm_path_debug2_prints_one_line_per_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    a, b = _realized([1, 2, 3, 4]), _realized([5, 6, 7, 8])
    (a + b).realize()
    capsys.readouterr()
    with Context(DEBUG=2):
        (a + b).realize()
        (a + b).realize()
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("***")]
    assert len(lines) == 2 and all("CPU" in ln for ln in lines)
    (a + b).realize()
    assert "***" not in capsys.readouterr().out


def test_multi_kernel_plan_replays_with_fresh_intermediates(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached plan with an intermediate buffer (softmax: several kernels) replays on new inputs correctly."""
    xs = [Tensor(np.random.default_rng(i).standard_normal((3, 5)).astype(np.float32)).realize() for i in range(3)]
    xs[0].softmax(-1).realize()
    sched = _Counting(monkeypatch)
    outs = []
    for x in xs[1:]:
        k0 = GlobalCounters.kernel_count
        outs.append(x.softmax(-1).realize())
        assert GlobalCounters.kernel_count - k0 >= 2  # the intermediate really is a kernel of its own
    assert sched.calls == 0
    for x, o in zip(xs[1:], outs):
        v = x.numpy()
        e = np.exp(v - v.max(-1, keepdims=True))
        np.testing.assert_allclose(o.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_signature_lists_inputs_in_toposort_order() -> None:
    a, b, c = _realized([1, 2, 3, 4]), _realized([5, 6, 7, 8]), _realized([0, 1, 0, 1])
    u = ((b * a + c) * b - a.exp()).uop
    sig = schedule_mod._signature(u)
    assert sig is not None
    want = [n for n in u.toposort(gate=lambda x: x.op is not Ops.BUFFER) if n.op is Ops.BUFFER]
    assert sig[1] == want
    # structurally equal graphs over other buffers share the key; a different structure does not
    d, e, f = _realized([9, 9, 9, 9]), _realized([8, 8, 8, 8]), _realized([7, 7, 7, 7])
    sig2 = schedule_mod._signature(((e * d + f) * e - d.exp()).uop)
    sig3 = schedule_mod._signature(((e * d + f) * d - d.exp()).uop)
    assert sig2 is not None and sig3 is not None
    assert sig2[0] == sig[0] and sig3[0] != sig[0]


def test_program_fast_check_still_rejects_bad_buffers() -> None:
    """The precomputed argument check of a compiled program refuses what the full check refuses."""
    a, b = _realized([1, 2, 3, 4]), _realized([5, 6, 7, 8])
    out = a + b
    items, _ = schedule_mod.schedule_with_cache(out.uop, "CPU")
    prog = program("CPU", items[0].ast).prog  # type: ignore[union-attr]
    good = [get_buffer(u).ensure_allocated() for u in items[0].bufs]
    prog.check_args(good, ())  # accepted
    with pytest.raises(ProgramArgumentError, match="must hold float32"):
        prog.check_args([Buffer("CPU", 4, dtypes.int32), *good[1:]], ())  # same itemsize, other type
    with pytest.raises(ProgramArgumentError, match="at least 4 elements, got 3"):
        prog.check_args([*good[:2], Buffer("CPU", 3, dtypes.float32)], ())
    with pytest.raises(ProgramArgumentError, match="lives on CPU:1"):
        prog.check_args([Buffer("CPU:1", 4, dtypes.float32), *good[1:]], ())
    with pytest.raises(ProgramArgumentError, match="takes 3 buffers, got 2"):
        prog.check_args(good[:2], ())


def test_buffer_options_hash_and_lru_reuse() -> None:
    assert BufferOptions() == BufferOptions(lru=True) and hash(BufferOptions()) == hash(BufferOptions(lru=True))
    assert hash(BufferOptions(writable=True)) == hash(BufferOptions(True, True))
    alloc = HostAllocator("CPU:overhead-test")
    opts = BufferOptions(writable=True)
    first = alloc.alloc(64, opts)
    alloc.free(first, 64, opts)
    assert alloc.alloc(64, BufferOptions(writable=True)) is first  # an equal options object finds the cached one
    assert alloc.mem_used == 64 and alloc.cached == 0


def _plan_of(u: object) -> object:
    found = schedule_mod.cached_plan(u, "CPU")  # type: ignore[arg-type]
    assert found is not None and found[2] is not None
    return found[2].plan  # the runner Plan of the cached schedule


def test_warm_plan_graph_equals_kernel_by_kernel_launches() -> None:
    """From its second warm run a plan of small kernels launches as one CPU graph: a multi-kernel plan (softmax)
    on new inputs and fresh intermediates each run gives numpy's result, counts what the kernel-by-kernel launch
    counts, and an input whose storage a kernel refuses still raises the launch's error."""
    rng = np.random.default_rng(3)
    xs = [Tensor(rng.standard_normal((3, 5)).astype(np.float32)).realize() for _ in range(6)]
    deltas, outs = [], []
    for x in xs:
        k0 = GlobalCounters.kernel_count
        outs.append(x.softmax(-1).realize())
        deltas.append(GlobalCounters.kernel_count - k0)
    fp = _plan_of(xs[0].softmax(-1).uop)
    assert fp.batches and all(not b.failed for b in fp.batches)  # type: ignore[attr-defined]  # graphs in use
    assert len(set(deltas)) == 1 and deltas[0] >= 2
    for x, o in zip(xs, outs):
        v = x.numpy()
        e = np.exp(v - v.max(-1, keepdims=True))
        np.testing.assert_allclose(o.numpy(), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-6)


def test_warm_plan_graph_from_threads() -> None:
    """Threads realizing the same structure at once (one of them through the plan's graph, the others launching
    kernel by kernel while its table is in use) each get their own result."""
    import threading

    rng = np.random.default_rng(4)
    pairs = [(rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)) for _ in range(4)]
    for x, y in pairs[:1]:
        a, b = Tensor(x).realize(), Tensor(y).realize()
        for _ in range(3):
            (a * b + a).realize()
    assert _plan_of((a * b + a).uop).single is not None  # type: ignore[attr-defined]  # one graph
    errors: list[BaseException] = []

    def work(x: np.ndarray, y: np.ndarray) -> None:
        try:
            a, b = Tensor(x).realize(), Tensor(y).realize()
            for _ in range(200):
                np.testing.assert_allclose((a * b + a).realize().numpy(), x * y + x, rtol=1e-5, atol=1e-6)
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=p) for p in pairs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]


def test_warm_plan_without_a_graph_launches_kernel_by_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """A graph that can't be prepared (say the interpreter does not compile) leaves the plan on kernel-by-kernel
    launches: no error reaches realize, results and counts stay right."""
    from speck.hcq import HCQError
    from speck.hcq.graph import CPUGraph

    def broken(self: CPUGraph) -> None:
        raise HCQError("could not build the CPU graph interpreter: test")

    monkeypatch.setattr(CPUGraph, "prepare", broken)
    rng = np.random.default_rng(8)
    a = Tensor(rng.standard_normal((2, 7)).astype(np.float32)).realize()
    b = Tensor(rng.standard_normal((2, 7)).astype(np.float32)).realize()
    deltas = []
    for _ in range(4):
        k0 = GlobalCounters.kernel_count
        out = (a.exp() * b + a).realize()
        deltas.append(GlobalCounters.kernel_count - k0)
        np.testing.assert_allclose(out.numpy(), np.exp(a.numpy()) * b.numpy() + a.numpy(), rtol=1e-5, atol=1e-6)
    assert deltas[0] >= 1 and len(set(deltas)) == 1
    assert all(b.failed for b in _plan_of((a.exp() * b + a).uop).batches)  # type: ignore[attr-defined]
