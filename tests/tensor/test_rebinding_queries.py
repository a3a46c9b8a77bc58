"""backward() and a TinyJit capture ask every live tensor which buffers its graph reads. A tensor built before a
write to one of them is rebound by Tensor.uop (its graph rebuilt over the write's snapshot); these questions are
answered from the graph as built and the swaps the rebinding would make (speck.tensor.writes.rebinding), without
rebuilding. The answers must be the ones the rebuilt graphs give."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor
from speck.tensor.jit import _observed_buffers
from speck.tensor.live import tensors
from speck.tensor.multi import MultiUOp
from speck.tensor.schedule import base_buffer
from speck.tensor.writes import buffers_read
from speck.uop import Ops, UOp


def observed_by_rebuilding() -> set[UOp]:
    """_observed_buffers the slow way: every live graph rebound first."""
    out: set[UOp] = set()
    for t in tensors():
        u = t.uop
        for s in u.shards if isinstance(u, MultiUOp) else (u,):
            b = base_buffer(s)
            out |= {b} if b is not None else {x for x in s.toposort() if x.op is Ops.BUFFER}
    return out


@settings(max_examples=20, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["build", "write"]), st.integers(0, 2)), min_size=1, max_size=8))
def test_observed_buffers_are_those_of_the_rebound_graphs(ops: list[tuple[str, int]]) -> None:
    bufs = [Tensor([float(i), 1.0, 2.0]).realize() for i in range(3)]
    held = []
    for op, i in ops:  # lazy graphs over the buffers, interleaved with in-place writes to them
        if op == "build":
            held.append(bufs[i] * 2 + bufs[(i + 1) % 3])
        else:
            bufs[i].assign(bufs[i] + 1).realize()
    fast = _observed_buffers()  # (first: the slow way rebinds the graphs it looks at)
    assert fast == observed_by_rebuilding()
    assert len(held) == sum(op == "build" for op, _ in ops)


def test_backward_does_not_rebuild_an_unrelated_stale_graph() -> None:
    w = Tensor([1.0, 2.0]).realize()
    s = w * 3  # built before the write below: stale
    built = s._uop
    w.assign(w * 2).realize()
    x = Tensor([1.0, 4.0]).realize()
    (x * x).sum().backward()
    assert s._uop is built and s.grad is None  # not a node of that graph, and not rebuilt to find that out
    np.testing.assert_array_equal(s.numpy(), [3.0, 6.0])  # still the value of its time
    np.testing.assert_array_equal(x.grad.numpy(), [2.0, 8.0])  # type: ignore[union-attr]


def test_backward_reaches_a_stale_tensor_whose_rebound_graph_the_root_uses() -> None:
    w = Tensor([1.0, 2.0]).realize()
    h = w * 2
    h2 = h.reshape(2)  # another tensor of the same graph node
    assert h2.uop is h.uop
    w.assign(w + 10).realize()
    root = (h * h).sum()  # h is rebound (to w's old value) as the root is built; h2 is not touched
    root.backward()
    assert buffers_read(root.uop) >= buffers_read(h.uop)
    np.testing.assert_allclose(h.grad.numpy(), [4.0, 8.0])  # type: ignore[union-attr]
    np.testing.assert_allclose(h2.grad.numpy(), [4.0, 8.0])  # type: ignore[union-attr]
