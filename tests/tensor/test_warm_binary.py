"""realize.realize_binary, the one-frame warm route of `(x + y).realize()` (issue 30's fifth pass), against the general
path it shortens (realize_graph, which the route falls back to): bit-identical results for every direct op and
strong dtype, the same GlobalCounters, the route actually taken once warm, and the semantics it must keep (a kept
result is never overwritten, writes between ops are seen in order, MAX_BUFFER_SIZE still refuses, a TinyJit capture
and autograd go their usual way). Values are compared with numpy."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, GlobalCounters, Tensor, TinyJit, dtypes
from speck.tensor import realize as rz
from speck.tensor.metadata import metadata_of
from speck.tensor.schedule import realized_cache

_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "add": lambda x, y: x + y,
    "mul": lambda x, y: x * y,
    "sub": lambda x, y: x - y,
    "maximum": lambda x, y: x.maximum(y) if isinstance(x, Tensor) else np.maximum(x, y),
    "lt": lambda x, y: x < y,
    "ne": lambda x, y: x != y,
}
_DTYPES = {dtypes.float32: np.float32, dtypes.int32: np.int32, dtypes.uint8: np.uint8, dtypes.float16: np.float16,
           dtypes.int64: np.int64}  # fmt: skip


class _Spy:
    """Counts realize_graph's calls (the general path) while it stands in for it."""

    def __init__(self) -> None:
        self.calls, self.real = 0, rz.realize_graph

    def __call__(self, *args: Any) -> Any:
        self.calls += 1
        return self.real(*args)


def _general(monkeypatch: pytest.MonkeyPatch) -> None:
    """Send Tensor.realize's one-op case to realize_graph directly (the route before this pass)."""
    monkeypatch.setattr(rz, "realize_binary", lambda u, a, b, device, kept=(): rz.realize_graph(u, device, True))


def _inputs(dt: Any, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x, y = (rng.integers(0, 50, n) for _ in range(2))
    return x.astype(_DTYPES[dt]), y.astype(_DTYPES[dt])


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(sorted(_OPS)), st.sampled_from(list(_DTYPES)), st.integers(1, 9), st.integers(0, 2**16))
def test_fast_route_is_bit_identical_to_the_general_path(name: str, dt: Any, n: int, seed: int) -> None:
    """Warm runs of the fast route and of realize_graph give the same bytes, and numpy's values."""
    x, y = _inputs(dt, n, seed)
    a, b = Tensor(x, dtype=dt).realize(), Tensor(y, dtype=dt).realize()
    op = _OPS[name]
    fast = [op(a, b).realize().numpy() for _ in range(3)]  # (cold, then warm runs taking the kept output back)
    with pytest.MonkeyPatch.context() as mp:
        _general(mp)
        general = [op(a, b).realize().numpy() for _ in range(3)]
    want = op(x, y)
    for f, g in zip(fast, general):
        assert f.dtype == g.dtype and f.tobytes() == g.tobytes()
        np.testing.assert_array_equal(f, want)


def test_a_warm_op_takes_the_fast_route(monkeypatch: pytest.MonkeyPatch) -> None:
    """Once warm, `(a + b).realize()` runs without realize_graph (the route is taken, not only correct)."""
    a, b = Tensor(np.arange(4, dtype=np.float32)).realize(), Tensor(np.ones(4, np.float32)).realize()
    for _ in range(3):
        (a + b).realize()
    spy = _Spy()
    monkeypatch.setattr(rz, "realize_graph", spy)
    outs = [(a + b).realize().numpy() for _ in range(5)]
    assert spy.calls == 0
    for o in outs:
        np.testing.assert_array_equal(o, np.arange(4, dtype=np.float32) + 1)


def test_counters_match_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each warm op counts one kernel, and the same ops and memory as realize_graph's run."""
    a, b = Tensor(np.arange(6, dtype=np.float32)).realize(), Tensor(np.ones(6, np.float32)).realize()
    for _ in range(3):
        (a * b).realize()

    def totals() -> tuple[int, int, int]:
        k, o, m = GlobalCounters.kernel_count, GlobalCounters.global_ops, GlobalCounters.global_mem
        for _ in range(4):
            (a * b).realize()
        return GlobalCounters.kernel_count - k, GlobalCounters.global_ops - o, GlobalCounters.global_mem - m

    fast = totals()
    _general(monkeypatch)
    assert fast[0] == 4 and fast == totals()


def test_kept_results_and_writes_between_ops_keep_their_order() -> None:
    """A result still held is never the next op's output; an assign between two ops is seen by the later one only,
    and a lazy op made before the assign reads the values of its time."""
    x = np.arange(4, dtype=np.float32)
    a, b = Tensor(x.copy()).realize(), Tensor(np.full(4, 10, np.float32)).realize()
    for _ in range(3):
        (a + b).realize()
    kept = (a + b).realize()
    before = a + b  # (lazy: reads a as it is now)
    a.assign(Tensor(x * 100)).realize()
    after = (a + b).realize()
    again = (a + b).realize()
    np.testing.assert_array_equal(kept.numpy(), x + 10)
    np.testing.assert_array_equal(before.realize().numpy(), x + 10)
    np.testing.assert_array_equal(after.numpy(), x * 100 + 10)
    np.testing.assert_array_equal(again.numpy(), x * 100 + 10)


def test_max_buffer_size_still_refuses_a_warm_op() -> None:
    """A warm op whose output (taken back from the spare) is larger than MAX_BUFFER_SIZE raises as a cold one does."""
    a, b = Tensor(np.ones(64, np.float32)).realize(), Tensor(np.ones(64, np.float32)).realize()
    for _ in range(3):
        (a + b).realize()
    with Context(MAX_BUFFER_SIZE=32), pytest.raises(RuntimeError, match="larger than MAX_BUFFER_SIZE=32"):
        (a + b).realize()
    np.testing.assert_array_equal((a + b).realize().numpy(), np.full(64, 2, np.float32))


def test_a_capture_goes_its_usual_way() -> None:
    """Inside a TinyJit capture the op is recorded, so replays follow new inputs."""
    x = np.arange(4, dtype=np.float32)

    @TinyJit
    def f(p: Tensor, q: Tensor) -> Tensor:
        return (p + q).realize()

    for i in range(5):
        p, q = Tensor(x + i).realize(), Tensor(x * 2).realize()
        np.testing.assert_array_equal(f(p, q).numpy(), x + i + x * 2)


def _grad_after_warm_realize() -> tuple[bool, Any, Any]:
    x = np.arange(4, dtype=np.float32)
    w = Tensor(x.copy(), requires_grad=True).realize()
    c = Tensor(np.full(4, 3, np.float32)).realize()
    for _ in range(3):
        (w * c).realize()
    out = (w * c).realize()
    rg = out.requires_grad
    out.sum().backward()
    (w * c).sum().backward()  # (a lazy one: through the graph)
    return bool(rg), out.numpy(), None if w.grad is None else w.grad.numpy()


def test_requires_grad_and_backward_as_the_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """A warm result of a tensor needing a gradient needs one too, and backward afterwards gives what the general
    path's gives (numpy's gradient for the lazy product)."""
    fast = _grad_after_warm_realize()
    _general(monkeypatch)
    general = _grad_after_warm_realize()
    assert fast[0] is True and general[0] is True
    np.testing.assert_array_equal(fast[1], general[1])
    assert fast[2] is not None and general[2] is not None
    np.testing.assert_array_equal(fast[2], general[2])
    assert fast[2].min() >= 3  # (at least the lazy product's gradient, c)


def test_same_input_twice_and_other_devices_match_numpy() -> None:
    """`a + a` (one input: the general path) and ops on a second CPU device give numpy's values, warm."""
    x = np.arange(5, dtype=np.float32)
    a = Tensor(x).realize()
    for _ in range(3):
        np.testing.assert_array_equal((a + a).realize().numpy(), x + x)
    c, d = Tensor(x, device="CPU:1").realize(), Tensor(x * 3, device="CPU:1").realize()
    for _ in range(3):
        out = (c * d).realize()
        assert out.device == "CPU:1"
        np.testing.assert_array_equal(out.numpy(), x * x * 3)


# ---------------- the kept node (Tensor.realize keeps the last per-op node nobody else holds) ----------------
_T = sys.modules["speck.tensor.tensor"]


class _NoKeep(list):  # type: ignore[type-arg]
    """A _KEPT_NODE that keeps nothing: the path as it was before nodes were kept."""

    def append(self, x: Any) -> None:
        pass


def _small(n: int = 4) -> tuple[Tensor, Tensor, np.ndarray]:
    x = np.arange(n, dtype=np.float32)
    return Tensor(x + 1).realize(), Tensor(x * 3).realize(), x


def test_the_next_same_op_is_the_kept_node_and_nothing_is_cached() -> None:
    """After a warm `(a + b).realize()` the next `a + b` is the kept node (hash-consing), realize() counts the keep
    out (no realized_cache entry), and every result is numpy's."""
    a, b, x = _small()
    before = len(realized_cache)
    outs = [(a + b).realize() for _ in range(4)]
    kept = _T._KEPT_NODE[-1:]
    assert kept and (a + b).uop is kept[0][0]
    assert len(realized_cache) == before
    for o in outs:
        np.testing.assert_array_equal(o.numpy(), x + 1 + x * 3)


def test_a_kept_node_is_parked_memory() -> None:
    """A kept node holds its inputs' buffers only as a parked spare: reading mem_used drops it, and the inputs'
    BUFFER nodes die with their tensors."""
    a, b, _ = _small()
    for _ in range(3):
        (a + b).realize()
    assert _T._KEPT_NODE
    ra, rb = weakref.ref(a.uop), weakref.ref(b.uop)
    del a, b
    GlobalCounters.mem_used  # noqa: B018  # (a mem_used reader releases parked spares)
    gc.collect()
    assert not _T._KEPT_NODE and ra() is None and rb() is None


def test_nothing_is_kept_under_lru0_big_inputs_or_a_capture() -> None:
    """LRU=0 keeps nothing, nor an op over inputs bigger than SPARE_MAX_BYTES, nor one realized in a capture."""
    _T._KEPT_NODE.clear()
    a, b, _ = _small()
    with Context(LRU=0):
        for _ in range(3):
            (a + b).realize()
    assert not _T._KEPT_NODE
    big = np.ones(rz.SPARE_MAX_BYTES // 4 + 1, np.float32)
    c, d = Tensor(big).realize(), Tensor(big).realize()
    for _ in range(3):
        np.testing.assert_array_equal((c + d).realize().numpy(), big * 2)
    assert not _T._KEPT_NODE

    @TinyJit
    def f(p: Tensor, q: Tensor) -> Tensor:
        return (p * q).realize()

    for _ in range(3):
        f(a, b)
        assert not _T._KEPT_NODE


def test_a_node_someone_holds_is_cached_as_without_the_keep(monkeypatch: pytest.MonkeyPatch) -> None:
    """A node a lazy tensor also holds gets its realized_cache entry whether or not it is kept (the keep is counted
    out, not anyone's hold)."""

    def run() -> tuple[bool, np.ndarray]:
        realized_cache.clear()
        a, b, _ = _small(5)
        for _ in range(3):
            (a + b).realize()
        lazy = a + b
        r = (a + b).realize()
        return lazy.uop in realized_cache, r.numpy()

    kept = run()
    monkeypatch.setattr(_T, "_KEPT_NODE", _NoKeep())
    plain = run()
    assert kept[0] is True and plain[0] is True
    np.testing.assert_array_equal(kept[1], plain[1])


_PROGRAM = st.lists(st.tuples(st.sampled_from(["add", "mul", "sub", "keep", "assign", "lazy", "both"]),
                              st.integers(0, 2), st.integers(0, 2)), min_size=1, max_size=14)  # fmt: skip


def _run_program(prog: list[tuple[str, int, int]]) -> tuple[list[bytes], int]:
    """Run prog over three small tensors; every value read, and the kernels counted."""
    xs = [np.arange(4, dtype=np.float32) * (i + 1) for i in range(3)]
    ts = [Tensor(x.copy()).realize() for x in xs]
    held: list[Tensor] = []
    got: list[bytes] = []
    k0 = GlobalCounters.kernel_count
    for op, i, j in prog:
        if op == "assign":
            ts[i].assign(Tensor(np.full(4, i + j, np.float32))).realize()
        elif op == "keep":  # a result kept alive across later ops
            held.append((ts[i] + ts[j]).realize())
        elif op == "lazy":  # a lazy node of the same inputs, realized later
            held.append(ts[i] * ts[j])
        elif op == "both":
            Tensor.realize_all(p := ts[i] + ts[j], q := ts[j] - ts[i])
            got += [p.numpy().tobytes(), q.numpy().tobytes()]
        else:
            got.append(_OPS[op](ts[i], ts[j]).realize().numpy().tobytes())
    got += [h.realize().numpy().tobytes() for h in held]
    return got, GlobalCounters.kernel_count - k0


@settings(max_examples=40, deadline=None)
@given(_PROGRAM)
def test_programs_give_the_same_values_with_and_without_the_keep(prog: list[tuple[str, int, int]]) -> None:
    """Any sequence of per-op realizes, kept results, lazy ops, assigns and realize_all gives the same bytes and
    kernel count with nodes kept as without (the values themselves are checked against numpy elsewhere)."""
    kept = _run_program(prog)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_T, "_KEPT_NODE", _NoKeep())
        plain = _run_program(prog)
    assert kept == plain


def _names_after_keeps() -> list[object]:
    """The metadata of `a + b` nodes: made under TRACEMETA=0 and kept (no entry), then made again with it on; and
    of a node kept with its entry."""
    a, b, _ = _small(6)
    with Context(TRACEMETA=0):
        for _ in range(3):
            (a + b).realize()
        first = metadata_of((a + b).uop)
    named = [(a + b).uop for _ in range(2)]  # (TRACEMETA on: the kept node gets its entry now, as record gives it)
    for _ in range(3):
        (a * b).realize()
    again = a * b
    return [first, *(metadata_of(n) for n in named), metadata_of(again.uop)]


def test_a_kept_node_is_named_as_record_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """_binary skips metadata.record only for the kept node that has its entry: names come out as without the keep
    (a node kept unnamed is named when an op makes it again with TRACEMETA on)."""
    kept = _names_after_keeps()
    monkeypatch.setattr(_T, "_KEPT_NODE", _NoKeep())
    plain = _names_after_keeps()
    assert kept[0] is None and kept[1] is not None and kept[-1] is not None
    assert [m and m.name for m in kept] == [m and m.name for m in plain]


def test_threads_sharing_the_keep_get_numpy_values() -> None:
    """Threads running warm ops over their own inputs (and one pair shared) take, replace and drop the one kept
    node under each other; every result is numpy's and nothing is cached for nodes nobody holds."""
    import threading

    x = np.arange(8, dtype=np.float32)
    shared = (Tensor(x).realize(), Tensor(x * 2).realize())
    errors: list[BaseException] = []

    def work(k: int) -> None:
        try:
            own = (Tensor(x + k).realize(), Tensor(x * k).realize())
            for i in range(200):
                p, q = own if i % 3 else shared
                want = (x + k) * (x * k) if i % 3 else x * (x * 2)
                np.testing.assert_array_equal((p * q).realize().numpy(), want)
                if i % 50 == 0:
                    GlobalCounters.mem_used  # noqa: B018  # (releases the parked spares meanwhile)
        except BaseException as e:  # (reported by the main thread)
            errors.append(e)

    before = len(realized_cache)
    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
    assert len(realized_cache) <= before + 1  # (a race may count the keep as someone's hold once: never wrong)


def test_the_keep_notes_its_schedule_and_a_stale_note_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kept node's keep notes the schedule the warm route ran it with: while that is the LRU's newest, the next
    same op looks no key up (a spy on the cache's get). Once another schedule is the newest (`a * b`, `a - b`,
    realized while their nodes are held, so the keep stays `a + b`'s), the note is not trusted: the key is looked up
    again and the results stay numpy's, one kernel per op."""
    a, b, x = _small()
    for _ in range(3):
        (a + b).realize()
    lookups = []
    real_get = rz._plan_get
    monkeypatch.setattr(rz, "_plan_get", lambda key: lookups.append(key) or real_get(key))
    for _ in range(3):
        GlobalCounters.reset()
        np.testing.assert_array_equal((a + b).realize().numpy(), x + 1 + x * 3)
        assert GlobalCounters.kernel_count == 1
    assert not lookups
    for op, want in (("mul", (x + 1) * (x * 3)), ("sub", (x + 1) - (x * 3))):
        held = _OPS[op](a, b)
        node = held.uop  # (someone else holds its node: realized into realized_cache, not kept)
        held.realize()
        assert _T._KEPT_NODE[-1][0] is (a + b).uop and node is not None
        GlobalCounters.reset()
        lookups.clear()
        np.testing.assert_array_equal((a + b).realize().numpy(), x + 1 + x * 3)
        assert GlobalCounters.kernel_count == 1 and len(lookups) == 1
        np.testing.assert_array_equal(held.numpy(), want)


def test_binary_takes_the_kept_node_only_for_its_own_op(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tensor._binary takes the kept node without hash-consing's lookup (a spy on the constructor sees no call) only
    when it is that op's node: the same op, operands in order, dtype. Any other op over the same inputs (another
    ALU op, the operands swapped, a comparison, another input) gets its own node and numpy's values."""
    a, b, x = _small()
    c = Tensor(x - 2).realize()
    calls = []
    real_new = _T._uop_new
    monkeypatch.setattr(_T, "_uop_new", lambda *args: calls.append(args[1]) or real_new(*args))
    for _ in range(3):
        (a + b).realize()
    calls.clear()
    np.testing.assert_array_equal((a + b).realize().numpy(), (x + 1) + (x * 3))
    assert not calls
    others = [(lambda: a * b, (x + 1) * (x * 3)), (lambda: b + a, (x * 3) + (x + 1)), (lambda: a < b, x + 1 < x * 3),
              (lambda: a + c, (x + 1) + (x - 2)), (lambda: b - a, (x * 3) - (x + 1))]  # fmt: skip
    for make, want in others:
        (a + b).realize()  # (the keep: `a + b`'s node)
        assert (kept := _T._KEPT_NODE[-1][0]).src[0] is a.uop and kept.src[1] is b.uop
        out = make()
        assert out.uop is not _T._KEPT_NODE[-1][0]
        np.testing.assert_array_equal(out.realize().numpy(), want)
