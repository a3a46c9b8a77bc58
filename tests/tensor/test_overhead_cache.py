"""The dispatch fast paths must never change a result: the warm realize path (a cached plan's precomputed launches,
speck.tensor.realize.realize_graph) and TinyJit's unchecked replay (same input nodes as the last checked replay).
A wrong cache hit is a silent wrong result, so these tests run structurally similar graphs that differ in one
detail - dtype, shape, device, view, offset, constant (0.0 and -0.0), aliasing - interleaved in one process, and
writes, deferred updates, sharded inputs and cleared caches between calls, each result against numpy."""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.hcq import Device
from speck.hcq.allocator import MEMORY
from speck.hcq.cpu import refresh_usable_cores, usable_cores
from speck.tensor import Context, GlobalCounters, Tensor, TinyJit, dtypes, profile
from speck.tensor import jit as jit_mod
from speck.tensor import realize as realize_mod
from speck.tensor.schedule import KernelCountException, assert_kernel_count

# ---------------- the warm realize path ----------------
SHAPES = [(4,), (2, 2), (6,), (2, 3)]
DTYPES = [(dtypes.float32, np.float32), (dtypes.int32, np.int32)]
DEVICES = ["CPU", "CPU:1"]
VIEWS: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any]]] = {
    # name: (on a speck tensor, on a numpy array); each keeps the shape
    "plain": (lambda t: t, lambda a: a),
    "flip0": (lambda t: t.flip(0), lambda a: np.flip(a, 0)),
    "flip-1": (lambda t: t.flip(-1), lambda a: np.flip(a, -1)),
    "transposed": (lambda t: t.T.contiguous().T if t.ndim == 2 else t, lambda a: a),  # other strides, same values
}
OPS: dict[str, tuple[Callable[[Any, Any], Any], Callable[[Any, Any], Any]]] = {
    "add": (lambda x, y: x + y, lambda x, y: x + y),
    "mul": (lambda x, y: x * y, lambda x, y: x * y),
    "sub": (lambda x, y: x - y, lambda x, y: x - y),
    "max": (lambda x, y: x.maximum(y), lambda x, y: np.maximum(x, y)),
}
CONSTS = [0.0, -0.0, 1.0, 2.5, 3]


def _same(got: np.ndarray, want: np.ndarray) -> None:
    """Equal values, and for floats equal signs of zero and NaNs in the same places."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if got.dtype.kind == "f":
        np.testing.assert_array_equal(np.signbit(got), np.signbit(want))


case = st.tuples(
    st.sampled_from(SHAPES), st.sampled_from(range(len(DTYPES))), st.sampled_from(DEVICES),
    st.sampled_from(list(VIEWS)), st.sampled_from(list(VIEWS)), st.sampled_from(list(OPS)),
    st.sampled_from(range(len(CONSTS))), st.booleans(), st.integers(0, 2**16),
)  # fmt: skip


@settings(max_examples=40, deadline=None)
@given(st.lists(case, min_size=2, max_size=6))
def test_warm_path_differential_against_numpy(cases: list[tuple[Any, ...]]) -> None:
    """Each case computes op(view(x), view(y)) * c (or op(x, x) * c: one buffer read twice) on freshly realized
    buffers, twice over (the second round hits the cached plans of the first), cases interleaved."""
    for _ in range(2):
        for shape, di, dev, vx, vy, op, ci, alias, seed in cases:
            dt, npdt = DTYPES[di]
            rng = np.random.default_rng(seed)
            a = rng.integers(-5, 6, shape).astype(npdt)
            b = rng.integers(-5, 6, shape).astype(npdt)
            x, y = Tensor(a, device=dev).realize(), Tensor(b, device=dev).realize()
            c = CONSTS[ci] if dt == dtypes.float32 else int(CONSTS[ci])
            xs, ys = (x, x) if alias else (VIEWS[vx][0](x), VIEWS[vy][0](y))
            xn, yn = (a, a) if alias else (VIEWS[vx][1](a), VIEWS[vy][1](b))
            out = (OPS[op][0](xs, ys) * c).realize()
            assert out.dtype == dt and out.device == dev
            want = OPS[op][1](xn, yn) * npdt(c)
            _same(out.numpy(), want.astype(npdt))


def test_same_structure_on_other_devices_dtypes_and_shapes() -> None:
    """Graphs of one shape (x + y, (x + y) * 2) over every combination, twice: each result lives where its inputs
    do."""
    from speck.tensor.schedule import base_buffer

    for _ in range(2):
        for dev in DEVICES:
            for dt, npdt in DTYPES:
                for shape in SHAPES:
                    a = np.arange(int(np.prod(shape))).reshape(shape).astype(npdt)
                    x, y = Tensor(a, device=dev).realize(), Tensor(a + 1, device=dev).realize()
                    for k, out in ((1, (x + y).realize()), (2, ((x + y) * 2).realize())):
                        bb = base_buffer(out.uop)
                        assert bb is not None and realize_mod.get_buffer(bb).device == dev and out.device == dev
                        assert out.shape == shape and out.dtype == dt
                        _same(out.numpy(), ((a + a + 1) * k).astype(npdt))


def test_zero_and_negative_zero_constants_are_different_plans() -> None:
    """Regression: the schedule cache keyed constants by ==, so b * 0.0 after b * -0.0 replayed -0.0's kernel."""
    b = Tensor(np.array([1.0, 2.0, 3.0, 4.0], np.float32)).realize()
    for c in (-0.0, 0.0, -0.0, 0.0):
        _same((b * c).numpy(), np.array([1.0, 2.0, 3.0, 4.0], np.float32) * np.float32(c))
    ints = Tensor(np.array([1, 2, 3, 4], np.int32)).realize()
    floats = Tensor(np.array([1, 2, 3, 4], np.float32)).realize()
    for t, v in ((ints, 1), (floats, 1.0), (ints, True)):  # 1, 1.0 and True are distinct constants
        want = t.numpy() + np.array(v).astype(t.numpy().dtype)
        _same((t + v).numpy(), want)


def test_shrink_offsets_are_part_of_the_plan() -> None:
    base = Tensor(np.arange(12, dtype=np.float32)).realize().reshape(3, 4)
    for row in (0, 2, 1, 0, 2):
        _same((base[row] + 1).numpy(), np.arange(12, dtype=np.float32).reshape(3, 4)[row] + 1)


def test_writes_between_warm_calls_are_seen() -> None:
    an, bn = np.ones(4, np.float32), np.full(4, 2, np.float32)
    a, b = Tensor(an).realize(), Tensor(bn).realize()
    for _ in range(4):
        _same((a + b).numpy(), an + bn)
        a.assign(a + b)  # lazy in-place write: the next warm (a + b) must read its result
        an = an + bn
    _same(a.numpy(), an)
    before = (a + b).realize()
    a.assign(Tensor(np.zeros(4, np.float32)))
    _same(before.numpy(), an + bn)  # computed before the write: keeps its value
    _same((a + b).numpy(), bn)


def test_a_held_graph_node_keeps_its_realization() -> None:
    """A node realized while something else holds it is remembered (realized_cache): rebuilding the same graph
    reads that buffer without a kernel. A node nobody else holds is not remembered (it dies with its last user)."""
    a, b = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.full(4, 3, np.float32)).realize()
    x = a + b
    held = x.uop
    x.realize()
    y = a + b
    assert y.uop is held  # hash-consing: the same node
    with assert_kernel_count(0):
        y.realize()
    _same(y.numpy(), np.full(4, 4, np.float32))
    c = a * b
    d = c * 2  # d's graph holds c's node: realizing c first must let d read c's buffer (one kernel, not two)
    c.realize()
    with assert_kernel_count(1):
        d.realize()
    _same(d.numpy(), np.full(4, 6, np.float32))
    with pytest.raises(KernelCountException), assert_kernel_count(0):
        (a - b).realize()  # nothing holds a - b: it is computed


def test_cleared_program_cache_takes_the_general_path_and_recompiles(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.full(4, 5, np.float32)).realize()
    for _ in range(3):
        (a * b + a).realize()
    monkeypatch.setattr(realize_mod, "_program_cache", realize_mod.ProgramCache(16))
    _same((a * b + a).numpy(), np.full(4, 6, np.float32))
    assert realize_mod.compiled_program_count() == 1  # compiled again into the new cache
    _same((a * b + a).numpy(), np.full(4, 6, np.float32))


def test_warm_ops_still_record_under_profile_and_capture() -> None:
    a, b = Tensor(np.ones(4, np.float32)).realize(), Tensor(np.full(4, 7, np.float32)).realize()
    for _ in range(3):
        (a + b).realize()
    profile.clear()
    with Context(PROFILE=1):
        (a + b).realize()
    assert [e.kind for e in profile.EVENTS] == ["kernel"]
    profile.clear()

    @TinyJit
    def f(x: Tensor, y: Tensor) -> Tensor:
        return x + y  # warm before the capture: the capture must still record its kernel

    for k in range(4):
        x = Tensor(np.full(4, k, np.float32)).realize()
        _same(f(x, b).numpy(), np.full(4, k + 7, np.float32))
    assert f.captured is not None and len(f.jit_cache) == 1


def test_warm_ops_give_their_memory_back() -> None:
    a, b = Tensor(np.ones(256, np.float32)).realize(), Tensor(np.ones(256, np.float32)).realize()
    (a + b).realize()
    alloc = Device["CPU"].allocator
    used, total = alloc.mem_used, MEMORY.used
    outs = [(a + b).realize() for _ in range(20)]
    assert alloc.mem_used == used + 20 * 1024
    del outs
    assert alloc.mem_used == used and MEMORY.used == total
    for _ in range(50):
        (a + b).realize()
    assert alloc.mem_used == used and MEMORY.used == total


def test_kernel_counts_and_estimates_match_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = Tensor(np.ones((8, 8), np.float32)).realize(), Tensor(np.ones((8, 8), np.float32)).realize()

    def counted() -> tuple[int, int, int]:
        k, o, m = GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem
        (a @ b + a).softmax(-1).realize()
        return GlobalCounters.kernel_count - k, GlobalCounters.global_ops - o, GlobalCounters.global_mem - m

    first = counted()  # scheduled and compiled: the general path
    warm = counted()
    with Context(DEBUG=2):  # the general path again (timed, printed)
        general = counted()
    assert warm == first == general and warm[0] >= 2


# ---------------- TinyJit's unchecked replay ----------------
def _count_checks(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = jit_mod._prepare

    def counting(inputs: Any) -> Any:
        calls.append(1)
        return real(inputs)

    monkeypatch.setattr(jit_mod, "_prepare", counting)
    return calls


@TinyJit
def _three(x: Tensor, y: Tensor) -> Tensor:
    s = (x + y).contiguous()
    return ((s * x).contiguous() - y).contiguous()


def _three_np(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    return (x + y) * x - y


def test_jit_same_inputs_replay_unchecked_and_see_new_contents(monkeypatch: pytest.MonkeyPatch) -> None:
    @TinyJit
    def f(x: Tensor, y: Tensor) -> Tensor:
        return _three.fxn(x, y)  # type: ignore[misc]

    xs = np.arange(4, dtype=np.float32)
    ys = np.full(4, 2, np.float32)
    x, y = Tensor(xs).realize(), Tensor(ys).realize()
    for _ in range(3):
        f(x, y)
    checks = _count_checks(monkeypatch)
    for _ in range(5):
        _same(f(x, y).numpy(), _three_np(xs, ys))
        x.assign(x + 1)  # an in-place write between calls: the next replay reads it
        xs = xs + 1
    assert checks == []  # every call after the first checked replay skipped the checks
    other = Tensor(ys * 3).realize()
    _same(f(x, other).numpy(), _three_np(xs, ys * 3))  # another tensor: checked again
    assert checks == [1]
    _same(f(x, other).numpy(), _three_np(xs, ys * 3))
    assert checks == [1]


def test_jit_unchecked_replay_still_refuses_changed_inputs() -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 2).contiguous()

    x = Tensor(np.ones(4, np.float32)).realize()
    for _ in range(4):
        _same(f(x).numpy(), np.full(4, 2, np.float32))
    with pytest.raises(jit_mod.JitError, match="args mismatch"):
        f(Tensor(np.ones(5, np.float32)).realize())
    with pytest.raises(jit_mod.JitError, match="args mismatch"):
        f(Tensor(np.ones(4, np.int32)).realize())
    with pytest.raises(jit_mod.JitError, match="args mismatch"):
        f(x, x)
    _same(f(x).numpy(), np.full(4, 2, np.float32))
    x2 = Tensor(np.full(4, 3, np.float32), device="CPU:1").realize()
    with pytest.raises(jit_mod.JitError, match="args mismatch"):
        f(x2)


def test_jit_output_fed_back_is_copied_each_call() -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x + 1).contiguous()

    x = Tensor(np.zeros(4, np.float32)).realize()
    out = f(x)
    for k in range(6):
        out = f(out)  # an output of the capture as its input: copied first, every call (never unchecked)
        _same(out.numpy(), np.full(4, k + 2, np.float32))


def test_jit_deferred_updates_run_before_an_unchecked_replay() -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 10).contiguous()

    x = Tensor(np.ones(4, np.float32)).realize()
    for _ in range(3):
        f(x)
    x.assign_deferred(x + 1)
    _same(f(x).numpy(), np.full(4, 20, np.float32))
    _same(f(x).numpy(), np.full(4, 20, np.float32))


def test_jit_views_and_keywords_stay_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    def sub(x: Tensor, y: Tensor) -> Tensor:
        return (x - y).contiguous()

    f, g = TinyJit(sub), TinyJit(sub)
    base_np = np.arange(8, dtype=np.float32)
    base = Tensor(base_np).realize()
    y = Tensor(np.ones(4, np.float32)).realize()
    checks = _count_checks(monkeypatch)
    for k in range(4):
        src = Tensor(base_np + k).realize()
        _same(f(src[4:8], y).numpy(), base_np[4:8] + k - 1)  # a view: copied into a buffer of its own
        lo = k % 2 * 4
        _same(g(x=base[lo : lo + 4].contiguous(), y=y).numpy(), base_np[lo : lo + 4] - 1)
    assert len(checks) == 8  # neither a fresh view nor keyword arguments skip the checks


def test_jit_sharded_inputs_replay_right() -> None:
    devs = ("CPU", "CPU:1")

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 3 + 1).contiguous()

    a = np.arange(8, dtype=np.float32)
    x = Tensor(a).shard(devs, 0).realize()
    for k in range(5):
        _same(f(x).numpy(), (a + k) * 3 + 1)
        x.assign(x + 1)
        x.realize()


# ---------------- runtime pieces ----------------
def test_usable_cores_is_read_once_and_refreshable() -> None:
    import os

    n = usable_cores()
    assert n == refresh_usable_cores() == len(os.sched_getaffinity(0))


def test_warm_ops_take_back_the_previous_output_only_when_nothing_holds_it() -> None:
    """A warm plan keeps its small output's Buffer for the next run and takes it back only once its tensor, every
    view of it and every holder of the Buffer are gone: live results never share memory (checked against numpy)."""
    rng = np.random.default_rng(3)
    bn = rng.standard_normal(6).astype(np.float32)
    b = Tensor(bn).realize()
    xs = [rng.standard_normal(6).astype(np.float32) for _ in range(12)]
    for _ in range(3):
        (Tensor(xs[0]).realize() * b).realize()  # the plan is warm
    kept, views, bufs = [], [], []
    for i, x in enumerate(xs):
        out = (Tensor(x).realize() * b).realize()
        if i % 3 == 0:
            kept.append((i, out))
        elif i % 3 == 1:
            views.append((i, out.reshape(2, 3)))  # a view holds the BUFFER, so the Buffer
        else:
            bufs.append((i, out.uop.buffer))  # the Buffer itself, held without its tensor
        del out
    for i, t in kept:
        np.testing.assert_array_equal(t.numpy(), xs[i] * bn)
    for i, v in views:
        np.testing.assert_array_equal(v.numpy(), (xs[i] * bn).reshape(2, 3))
    for i, hb in bufs:
        np.testing.assert_array_equal(hb.numpy().view(np.float32), xs[i] * bn)
    assert len({id(t.uop.buffer) for _, t in kept} | {id(v.uop.buffer) for _, v in views} | {id(h) for _, h in bufs}) \
        == len(xs)  # fmt: skip
    x0 = Tensor(xs[0]).realize()
    first = (x0 * b).realize()
    gone = weakref.ref(first.uop.buffer)
    del first
    again = (x0 * b).realize()
    assert again.uop.buffer is gone()  # the dead output's Buffer (and memory) is used again
    np.testing.assert_array_equal(again.numpy(), xs[0] * bn)


def test_warm_ops_on_threads_never_share_an_output() -> None:
    """Threads running one warm plan at once each take a spare Buffer only when nothing holds it (the pool's pop is
    atomic): every result, kept or dropped, is its own inputs' sum."""
    import threading

    b = Tensor(np.arange(8, dtype=np.float32)).realize()
    (Tensor(np.ones(8, np.float32)).realize() + b).realize()  # warm
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        kept = []
        for i in range(200):
            x = rng.standard_normal(8).astype(np.float32)
            out = (Tensor(x).realize() + b).realize()
            if i % 4 == 0:
                kept.append((x, out))
            elif not np.array_equal(out.numpy(), x + np.arange(8, dtype=np.float32)):
                errors.append(f"thread {seed}: op {i}")
        for x, out in kept:
            if not np.array_equal(out.numpy(), x + np.arange(8, dtype=np.float32)):
                errors.append(f"thread {seed}: a kept result changed")

    threads = [threading.Thread(target=work, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors


@settings(deadline=None, max_examples=25)
@given(st.lists(st.integers(0, 7), min_size=1, max_size=24), st.integers(0, 2**31 - 1))
def test_warm_outputs_taken_back_never_change_a_live_value(actions: list[int], seed: int) -> None:
    """A warm plan takes its previous output (BUFFER node and Buffer) back only when nothing holds either: whatever
    the results went through (kept, viewed, their Buffer held, assigned into, assigned from, used as a TinyJit input,
    pickled, dropped), every live one still reads its own value (against numpy) after more runs of the plan."""
    import pickle

    from speck.tensor import TinyJit

    rng = np.random.default_rng(seed)
    bn = np.arange(6, dtype=np.float32)
    b = Tensor(bn).realize()

    @TinyJit
    def twice(t: Tensor) -> Tensor:
        return (t * 2).contiguous()

    live: list[tuple[Any, np.ndarray]] = []  # (tensor or Buffer, expected values)
    for act in actions:
        x = rng.standard_normal(6).astype(np.float32)
        out = (Tensor(x).realize() + b).realize()
        want = x + bn
        if act == 1:
            live.append((out, want))
        elif act == 2:
            live.append((out.reshape(2, 3), want.reshape(2, 3)))
        elif act == 3:
            live.append((out.uop.buffer, want))
        elif act == 4 and live and isinstance(live[0][0], Tensor) and live[0][0].shape == (6,):
            live[0][0].assign(out).realize()  # an older result takes this one's value (and maybe its memory)
            live[0] = (live[0][0], want)
        elif act == 5:
            y = rng.standard_normal(6).astype(np.float32)
            out.assign(Tensor(y)).realize()
            live.append((out, y))
        elif act == 6:
            np.testing.assert_array_equal(twice(out).numpy(), want * 2)
        elif act == 7:
            live.append((pickle.loads(pickle.dumps(out)), want))
        del out
    for _ in range(3):
        (Tensor(rng.standard_normal(6).astype(np.float32)).realize() + b).realize()
    for obj, want in live:
        got = obj.numpy() if isinstance(obj, Tensor) else obj.numpy().view(np.float32)
        np.testing.assert_array_equal(got.reshape(want.shape), want)
