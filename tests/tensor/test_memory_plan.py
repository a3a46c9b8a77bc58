"""Memory planning of multi-target realizes (speck.tensor.engine.memory.plan_memory): a schedule's intermediate
buffers share one arena, two of them overlapping in bytes only when their uses in the schedule don't overlap; the
buffers handed out (targets, `.contiguous()` results) keep memory of their own; results equal numpy's with the
planning on, and a Winograd convolution's training step gives the same losses with it off. The placement is
checked on random lifetimes (hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Context, GlobalCounters, Tensor, TinyJit, winograd
from speck.tensor import realize as R
from speck.tensor.engine.memory import ALIGN, PLAN_MIN_BYTES, place
from speck.tensor.schedule import base_buffer, buffer_map, buffer_views, contiguous_made, scratch_nodes
from speck.tensor.settings import PLAN_MEMORY

N = PLAN_MIN_BYTES // 4 * 2  # float32 elements: every intermediate here is big enough to be planned


def _lifetimes(items: list) -> dict:
    first: dict = {}
    last: dict = {}
    for i, it in enumerate(items):
        for b in it.bufs:
            first.setdefault(b, i)
            last[b] = i
    return {b: (first[b], last[b]) for b in first}


def _check_disjoint(items: list) -> list:
    """The planned buffers of items; asserts no two whose uses overlap share a byte."""
    life = _lifetimes(items)
    planned = [b for b in life if b in buffer_views and buffer_views[b][0] not in life]
    for i, a in enumerate(planned):
        for b in planned[i + 1 :]:
            (ba, oa), (bb, ob) = buffer_views[a], buffer_views[b]
            if ba is not bb:
                continue
            (fa, la), (fb, lb) = life[a], life[b]
            if fa <= lb and fb <= la:  # both live at some item: their byte ranges must not meet
                na, nb = int(a.arg) * a.dtype.itemsize, int(b.arg) * b.dtype.itemsize
                assert oa + na <= ob or ob + nb <= oa, (a, b)
            assert oa % ALIGN == 0
    return planned


def _scratch(t: Tensor) -> Tensor:
    """t in a buffer of its own that no later graph reads back (as speck.tensor.winograd marks its intermediates)."""
    out = t.contiguous()
    scratch_nodes.add(out.uop)
    return out


def _chain(x: Tensor, depth: int) -> list[Tensor]:
    """depth values, each a kernel of its own over the one before (and x)."""
    out, h = [], x
    for k in range(depth):
        h = _scratch(_scratch(h * (k + 2)) + x).exp2().log2() if k % 2 else _scratch((h + k).sqrt()) * 0.5
        out.append(h)
    return out


def test_intermediates_share_an_arena_and_results_match_numpy() -> None:
    rng = np.random.default_rng(1)
    xs = rng.random(N, dtype=np.float32) + 1
    x = Tensor(xs).realize()
    vals = _chain(x, 6)
    a, b = vals[-1].sum(), vals[-2] * 3
    items, views = R.schedule_targets([(a.uop, a.device), (b.uop, b.device)])
    planned = _check_disjoint(items)
    kept = {base_buffer(v) for v in views} | {base_buffer(v) for v in contiguous_made.values()}
    assert planned and not kept & set(planned)
    arena = buffer_views[planned[0]][0]
    assert all(buffer_views[p][0] is arena for p in planned)
    assert int(arena.arg) < sum(int(p.arg) * p.dtype.itemsize for p in planned)  # memory is reused
    Tensor.realize(a, b)  # (scheduled again, planned the same way, and run)
    ref = xs.astype(np.float64)
    h, want = ref, []
    for k in range(6):
        h = np.log2(np.exp2(h * (k + 2) + ref)) if k % 2 else np.sqrt(h + k) * 0.5
        want.append(h)
    np.testing.assert_allclose(a.item(), want[-1].sum(), rtol=1e-4)
    np.testing.assert_allclose(b.numpy(), want[-2] * 3, rtol=1e-5)


def test_user_contiguous_keeps_its_buffer_and_is_read_later() -> None:
    rng = np.random.default_rng(2)
    xs = rng.random(N, dtype=np.float32)
    x = Tensor(xs).realize()
    kept = (x * 3 + 1).contiguous()  # a user's contiguous(): a later realize reads its buffer
    a, b = (kept * 2).sum(), (kept - 1).max()
    items, _ = R.schedule_targets([(a.uop, a.device), (b.uop, b.device)])
    assert not any(b in buffer_views for it in items for b in it.bufs)  # its buffer is kept out of the arena
    Tensor.realize(a, b)
    np.testing.assert_allclose(kept.numpy(), xs * 3 + 1, rtol=1e-6)
    np.testing.assert_allclose(a.item(), ((xs * 3 + 1) * 2).astype(np.float64).sum(), rtol=1e-4)


def test_off_allocates_each_intermediate_apart() -> None:
    x = Tensor(np.ones(N, np.float32)).realize()
    vals = _chain(x, 4)
    with Context(SPECK_PLAN_MEMORY=0):
        assert PLAN_MEMORY.value == 0
        items, _ = R.schedule_targets([(vals[-1].uop, "CPU"), (vals[-2].uop, "CPU")])
    assert not any(b in buffer_views for it in items for b in it.bufs)


def test_jit_free_intermediates_gives_the_arena_back() -> None:
    rng = np.random.default_rng(4)
    xs = rng.random(N, dtype=np.float32)

    @TinyJit
    def f(x: Tensor) -> tuple[Tensor, Tensor]:
        vals = _chain(x, 4)
        return vals[-1].sum(), vals[-3] * 2

    x = Tensor(xs).realize()
    for _ in range(3):
        got = f(x)
    arena = next(hb.base for call in f.captured.entries for u in call[1]
                 if (hb := buffer_map.get(u)) is not None and hb.base is not hb)  # fmt: skip
    assert arena.is_allocated
    before = GlobalCounters.mem_used
    f.captured.free_intermediates()
    assert not arena.is_allocated and before - GlobalCounters.mem_used >= arena.nbytes
    got = f(x)  # the next replay allocates it again
    ref, want = xs.astype(np.float64), []
    h = ref
    for k in range(4):
        h = np.log2(np.exp2(h * (k + 2) + ref)) if k % 2 else np.sqrt(h + k) * 0.5
        want.append(h)
    np.testing.assert_allclose(got[0].item(), want[-1].sum(), rtol=1e-4)
    np.testing.assert_allclose(got[1].numpy(), want[-3] * 2, rtol=1e-5)


def _wino_losses(plan: int, steps: int) -> list[float]:
    from speck.tensor.nn import Conv2d
    from speck.tensor.nn.optim import Adam

    with Context(SPECK_PLAN_MEMORY=plan):
        Tensor.manual_seed(3)
        conv = Conv2d(2, 4, 3)
        opt = Adam([conv.weight, conv.bias], lr=1e-2)
        rng = np.random.default_rng(3)
        x = Tensor(rng.random((8, 2, 12, 12), dtype=np.float32)).realize()
        out = []
        for _ in range(steps):
            with Tensor.train(), Context(WINO=2):
                opt.zero_grad()
                loss = (conv(x) ** 2).mean()
                loss.backward()
                opt.step(loss)
            out.append(loss.item())
        # the weight's gradient read after the step: Winograd's scratch buffers are computed again, not read
        g = conv.weight.grad.numpy()
    return [*out, float(np.abs(g).sum())]


def _split_backward(batch: int) -> int:
    """The kernels of a backward run after its forward was realized (the weight gradient read). Each call a new
    batch size: a graph scheduled before would go through the schedule cache, which remembers no intermediate."""
    with Context(WINO=2):
        rng = np.random.default_rng(5)
        x = Tensor(rng.random((batch, 4, 14, 14), dtype=np.float32))
        w = Tensor(rng.random((8, 4, 3, 3), dtype=np.float32), requires_grad=True)
        loss = (x.conv2d(w) ** 2).mean()
        loss.item()  # the forward, on its own
        loss.backward()
        before = GlobalCounters.kernel_count
        assert w.grad is not None
        w.grad.numpy()
        return GlobalCounters.kernel_count - before


def test_a_later_backward_computes_no_forward_intermediate_again(monkeypatch: pytest.MonkeyPatch) -> None:
    # Winograd's scratch nodes are the ones no later graph needs: the backward runs as many kernels as when every
    # intermediate is remembered (the transformed input, which the weight gradient reads, is not scratch)
    k_scratch = _split_backward(7)
    monkeypatch.setattr(winograd, "_scratch", lambda t: t.contiguous())
    k_all = _split_backward(9)
    assert k_scratch == k_all


def test_winograd_training_is_the_same_planned_or_not() -> None:
    assert _wino_losses(1, 3) == _wino_losses(0, 3)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 20), st.integers(0, 6), st.integers(1, 5 * ALIGN)), min_size=1, max_size=30))
def test_placement_never_overlaps_blocks_in_use_together(spans: list[tuple[int, int, int]]) -> None:
    blocks = [(s, s + d, n) for s, d, n in spans]
    offsets, size = place(blocks)
    live_peak = 0
    for step in range(max(e for _, e, _ in blocks) + 1):
        live_peak = max(live_peak, sum(-(-n // ALIGN) * ALIGN for s, e, n in blocks if s <= step <= e))
    assert live_peak <= size <= sum(-(-n // ALIGN) * ALIGN for _, _, n in blocks)
    for k, ((f1, l1, n1), o1) in enumerate(zip(blocks, offsets)):
        assert o1 % ALIGN == 0 and o1 + n1 <= size
        for (f2, l2, n2), o2 in list(zip(blocks, offsets))[k + 1 :]:
            if f1 <= l2 and f2 <= l1:  # in use at one step together: apart in memory
                assert o1 + n1 <= o2 or o2 + n2 <= o1


def test_gradients_realized_together_keep_no_intermediate_from_the_planner() -> None:
    """Intermediates are kept for later realizes (contiguous_made, which the planner leaves alone) only while a
    gradient of the same backward() is still to be read on its own. An update reading every gradient keeps none, so
    the backward's intermediates can share the arena (a training step that kept them all held 2.5x the memory)."""
    rng = np.random.default_rng(7)
    x = Tensor(rng.random((64, 32), dtype=np.float32), requires_grad=False).realize()  # (no .grad of its own)

    def grads() -> tuple[Tensor, Tensor]:
        w1 = Tensor(np.linspace(-1, 1, 32 * 16, dtype=np.float32).reshape(32, 16), requires_grad=True).realize()
        w2 = Tensor(np.linspace(1, 2, 16 * 8, dtype=np.float32).reshape(16, 8), requires_grad=True).realize()
        ((x @ w1).relu().softmax(-1) @ w2).log_softmax(-1).sum().backward()
        return w1.grad, w2.grad

    g1, g2 = grads()
    before = len(contiguous_made)
    # an optimizer's step realizes the updated weights, which read every gradient: nothing is left to read later
    R.schedule_targets([(v.uop, "CPU") for v in (g1 * 0.1 + 1, g2 * 0.1 + 1)])
    assert len(contiguous_made) == before
    R.schedule_targets([(g1.uop, "CPU")])  # (g2 is still to be read on its own: what they share is kept)
    assert len(contiguous_made) > before
    GlobalCounters.reset()
    Tensor.realize(g1, g2)
    together = GlobalCounters.kernel_count
    h1, h2 = grads()  # read one at a time: the first read keeps what the second shares; the values are the same
    GlobalCounters.reset()
    np.testing.assert_array_equal(h1.numpy(), g1.numpy())
    np.testing.assert_array_equal(h2.numpy(), g2.numpy())
    assert GlobalCounters.kernel_count == together


def test_a_schedule_over_several_devices_is_planned_and_sums_right() -> None:
    """Items on several devices run on their own queues, not in item order: the ring allreduce's copies read chunks
    a later kernel of their device reuses, so the runner makes that kernel wait for them (planned without that
    wait, the sum over CPU:0..3 was wrong in 2-25% of its elements, the first rows of some chunk). Each device's
    intermediates share an arena of its own, and every result is the unplanned one."""
    devices = ("CPU", "CPU:1", "CPU:2", "CPU:3")
    rng = np.random.default_rng(5)
    arrays = rng.random((4, 1 << 20), dtype=np.float32)
    x = Tensor(arrays).shard(devices, axis=0).realize()
    with Context(RING=2):
        for _ in range(3):
            np.testing.assert_allclose(x.sum(0).numpy(), arrays.sum(0), rtol=1e-5)
    # intermediates on both sides of a copy are planned, each device's in its own arena
    y = Tensor(arrays[0]).realize()
    moved = ((y * 2).exp2() + 1).to("CPU:1")
    out = ((moved * 3).sqrt() + moved).log2()
    items, _ = R.schedule_targets([(out.uop, "CPU:1"), ((out * 2).uop, "CPU:1")])
    arenas = {b: buffer_views[b][0] for it in items for b in it.bufs if b in buffer_views}
    assert {str(b.src[1].arg) for b in arenas} == {"CPU", "CPU:1"}
    assert all(str(a.src[1].arg) == str(b.src[1].arg) for b, a in arenas.items())
    m = np.exp2(arrays[0] * 2) + 1
    want = np.log2(np.sqrt(m * 3) + m)
    np.testing.assert_allclose(out.numpy(), want, rtol=1e-5)
    np.testing.assert_allclose((out * 2).numpy(), want * 2, rtol=1e-5)
