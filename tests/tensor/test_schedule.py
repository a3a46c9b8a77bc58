"""Scheduler contract: kernel counts (fusion, free views, unused work), the pinned behaviours, and the kernel ASTs'
form (KERNEL_CONTRACT section 1) checked by running them through codegen's reference interpreter."""

from __future__ import annotations

import numpy as np
import pytest

from speck.tensor import GlobalCounters, KernelCountException, Tensor, assert_kernel_count
from speck.uop import Ops
from tensor_helpers import assert_matches


def _realized(*shape: int) -> Tensor:
    return Tensor(np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)).realize()


def test_add_then_sum_is_one_kernel() -> None:
    a, b = _realized(4, 5), _realized(4, 5)
    with assert_kernel_count(1):
        out = (a + b).sum().realize()
    assert_matches(out.numpy(), (a.numpy() + b.numpy()).sum(), atol=1e-5)


def test_reshape_and_contiguous_shrink_of_realized_are_free() -> None:
    a = _realized(4, 6)
    with assert_kernel_count(0):
        r = a.reshape(6, 4).realize()
        s = a[1:3].contiguous().realize()
        f = a.reshape(24)[6:12].contiguous().realize()
    assert_matches(r.numpy(), a.numpy().reshape(6, 4))
    assert_matches(s.numpy(), a.numpy()[1:3])
    assert_matches(f.numpy(), a.numpy().reshape(24)[6:12])


def test_non_contiguous_view_needs_a_copy_kernel() -> None:
    a = _realized(4, 6)
    with assert_kernel_count(1):
        t = a.T.contiguous().realize()
    assert_matches(t.numpy(), a.numpy().T)


def test_softmax_last_axis_at_most_three_kernels() -> None:
    x = _realized(8, 16)
    before = GlobalCounters.kernel_count
    out = x.softmax(-1).realize()
    assert GlobalCounters.kernel_count - before <= 3
    e = np.exp(x.numpy() - x.numpy().max(-1, keepdims=True))
    assert_matches(out.numpy(), e / e.sum(-1, keepdims=True), atol=1e-6)


def test_relu_linear_is_one_kernel() -> None:
    x, w, b = _realized(8, 16), _realized(16, 4), _realized(4)
    with assert_kernel_count(1):
        out = (x @ w + b).relu().realize()
    assert_matches(out.numpy(), np.maximum(x.numpy() @ w.numpy() + b.numpy(), 0), atol=1e-5)


def test_elementwise_chain_fuses_and_constants_need_no_input() -> None:
    a = _realized(32)
    with assert_kernel_count(1):
        out = ((a * 2 + 1).exp() - a.sin() * 3).realize()
    assert_matches(out.numpy(), np.exp(a.numpy() * 2 + 1) - np.sin(a.numpy()) * 3, atol=1e-4, rtol=1e-5)
    with assert_kernel_count(1):
        c = (Tensor.ones(3, 4) * 5 + Tensor.arange(4)).realize()
    assert_matches(c.numpy(), np.ones((3, 4), np.float32) * 5 + np.arange(4))
    (item,) = (Tensor.ones(3, 4) * 2).schedule()
    assert item.ast is not None and len(item.bufs) == 1  # no input buffers for a constant


def test_unused_work_never_runs_and_realized_results_are_reused() -> None:
    a = _realized(16)
    unused = (a * 100).exp()  # noqa: F841 - built and dropped: must not run
    with assert_kernel_count(1):
        y = (a + 1).realize()
    with assert_kernel_count(0):
        y.realize()
        y.numpy()
    x = a * 3
    z = x + 1  # built on x's graph before x is realized
    x.realize()
    (item,) = z.schedule()
    xb = x.uop if x.uop.op is Ops.BUFFER else x.uop.src[0]
    assert xb in item.bufs  # z reads x's buffer instead of recomputing it
    with assert_kernel_count(1):
        (y * 2).realize()


def test_reduce_into_reduce_and_broadcast_reduce_materialise() -> None:
    """A reduction seen through a broadcast, or feeding another reduction, gets its own kernel."""
    a = _realized(4, 8)
    with assert_kernel_count(2):
        out = (a - a.mean(1, keepdim=True)).sum(1).realize()
    assert_matches(out.numpy(), (a.numpy() - a.numpy().mean(1, keepdims=True)).sum(1), atol=1e-5)
    with assert_kernel_count(2):
        s2 = a.sum(1).sum(0).realize()
    assert_matches(s2.numpy(), a.numpy().sum(), atol=1e-4)


def _reduce_kernels(*outs: Tensor) -> list[str]:
    from speck.tensor.schedule import Scheduler

    sched = Scheduler()
    for t in outs:
        sched.count_uses(t.uop)
    for t in outs:
        sched.realize(t.uop)
    return [it.ast.arg.name for it in sched.items if any(u.op is Ops.REDUCE for u in it.ast.toposort())]


def test_shared_value_containing_a_reduction_is_computed_once() -> None:
    """y = relu(a @ b + 1) feeds two consumers: its matmul runs in one kernel, not once per consumer."""
    a, b = _realized(8, 16), _realized(16, 8)
    y = (a @ b + 1).relu()
    z = ((y * 0.1).exp().sin().sqrt() * 2).reshape(8, 1, 8).expand(8, 4, 8).sum(1)
    m = y.sum()
    names = _reduce_kernels(z, m)
    assert len(names) == 3, names  # the matmul, z's sum, m's sum
    Tensor.realize_all(z, m)
    yn = np.maximum(a.numpy() @ b.numpy() + 1, 0)
    assert_matches(z.numpy(), (np.sqrt(np.sin(np.exp(yn * 0.1))) * 2) * 4, atol=1e-4, rtol=1e-4)
    assert_matches(m.numpy(), yn.sum(), atol=1e-3, rtol=1e-5)


def test_costly_elementwise_read_through_an_expand_is_realized_once() -> None:
    """A reduction that reads each element of an expanded value many times gets a costly elementwise value from a
    buffer (2 kernels); a cheap one is still fused (1 kernel)."""
    x = _realized(4, 8)
    with assert_kernel_count(2):
        costly = ((x * 0.1).exp().sin().sqrt() + 1).reshape(4, 1, 8).expand(4, 16, 8).sum(1).realize()
    assert_matches(costly.numpy(), (np.sqrt(np.sin(np.exp(x.numpy() * 0.1))) + 1) * 16, atol=1e-4, rtol=1e-4)
    with assert_kernel_count(1):
        cheap = (x * 2).reshape(4, 1, 8).expand(4, 16, 8).sum(1).realize()
    assert_matches(cheap.numpy(), x.numpy() * 32, atol=1e-4)


def test_assert_kernel_count_raises_with_expected_and_got() -> None:
    a = _realized(4)
    with pytest.raises(KernelCountException) as ei:
        with assert_kernel_count(3):
            (a + 1).realize()
    assert (ei.value.expected, ei.value.got) == (3, 1)
    assert isinstance(ei.value, AssertionError)


@pytest.mark.parametrize("bad", [2.0, 2.5])
def test_ones_with_float_shape_raises(bad: float) -> None:
    with pytest.raises(RuntimeError, match="shape must be int"):
        Tensor.ones(bad)  # type: ignore[arg-type]


def test_kernel_asts_follow_the_contract() -> None:
    """Every scheduled kernel is SINK(END(STORE(INDEX(PARAM, idx), value), *ranges)), and running it through
    codegen's eval_ast gives the same values as the realize engine."""
    interpret = pytest.importorskip("speck.codegen.interpret")
    x = _realized(3, 5)
    out = (x.pad(((1, 0), (0, 2))).flip(1)[:, ::2] * x.max()).softmax(0)
    items = out.schedule()
    got = out.numpy()
    bufs: dict[int, np.ndarray] = {}
    for it in items:
        assert it.ast is not None and it.ast.op is Ops.SINK
        for e in it.ast.src:
            st = e.src[0] if e.op is Ops.END else e  # a kernel with no output range stores without END
            assert st.op is Ops.STORE and st.src[0].op is Ops.INDEX and st.src[0].src[0].op is Ops.PARAM
            assert e.op is Ops.END or not any(u.op is Ops.RANGE and u.arg[-1].name == "GLOBAL" for u in st.toposort())
        arrays = []
        for b in it.bufs:
            if id(b) not in bufs:
                from speck.tensor.realize import buffer_numpy
                from speck.tensor.schedule import buffer_map

                bufs[id(b)] = buffer_numpy(b).copy() if b in buffer_map else np.zeros(int(b.arg), dtype=got.dtype)
            arrays.append(bufs[id(b)])
        interpret.eval_ast(it.ast, arrays, it.var_vals)
    assert_matches(bufs[id(items[-1].bufs[0])].reshape(got.shape), got, atol=1e-6)


def test_schedule_cache_replays_on_new_buffers() -> None:
    """The same computation on other buffers reuses the scheduled kernel list with fresh outputs."""
    from speck.tensor.schedule_cache import _schedule_cache

    xs = [_realized(6, 7 + i % 1) for i in range(3)]
    w = _realized(7, 2)
    outs = []
    for x in xs:
        before = len(_schedule_cache)
        outs.append(((x @ w).softmax(-1) * 2).realize())
        if x is not xs[0]:
            assert len(_schedule_cache) == before  # a hit: nothing new cached
    for x, o in zip(xs, outs):
        logits = x.numpy() @ w.numpy()
        e = np.exp(logits - logits.max(-1, keepdims=True))
        assert_matches(o.numpy(), e / e.sum(-1, keepdims=True) * 2, atol=1e-5)
    assert len({id(o.uop) for o in outs}) == 3  # each result has its own buffer


def test_contiguous_value_read_directly_elsewhere_is_computed_once() -> None:
    """A reduction made contiguous for one consumer and read directly by another is computed once: the contiguous
    buffer serves both (a conv gradient made contiguous for the convolution kernels and summed for the bias)."""
    x = _realized(8, 16)
    y = (x * 2).sum(axis=1)
    with assert_kernel_count(2):
        out = (y.contiguous() * 3 + y.exp()).realize()
    xn = x.numpy().astype(np.float64)
    yn = (xn * 2).sum(axis=1)
    assert_matches(out.numpy(), yn * 3 + np.exp(yn), rtol=1e-4, atol=1e-4)


def test_contiguous_of_contiguous_is_one_copy() -> None:
    """x.contiguous().contiguous() materializes once: the second call has nothing left to copy."""
    a = _realized(4, 6)
    with assert_kernel_count(1):
        out = (a * 2).T.contiguous().contiguous().realize()
    assert_matches(out.numpy(), (a.numpy() * 2).T)
    c = (a + 1).contiguous()
    assert c.contiguous() is c
    assert c.clone() is not c  # a clone is a copy of its own
