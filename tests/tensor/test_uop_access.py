"""What a tinygrad user reads on `t.uop` (base, device, is_realized, buffer, realized, shape, dtype) and the Tensor
ops a ScheduleItem names in `.metadata`."""

from __future__ import annotations

import numpy as np
import pytest

from speck.tensor import Context, Tensor, dtypes
from speck.tensor.helpers import Metadata
from speck.uop import Ops, UOp

RNG = np.random.default_rng(5)


def test_realized_tensor_exposes_its_buffer() -> None:
    a = RNG.standard_normal((3, 4)).astype(np.float32)
    t = (Tensor(a) * 2).realize()
    u = t.uop
    assert u.is_realized and u.base.op is Ops.BUFFER
    assert u.shape == (3, 4) and u.dtype == dtypes.float32 and u.device == t.device
    np.testing.assert_array_equal(u.buffer.numpy().reshape(3, 4), a * 2)
    assert bytes(u.buffer.as_buffer()) == (a * 2).tobytes()
    assert u.realized is u.buffer


def test_pending_computation_is_not_realized() -> None:
    t = Tensor(RNG.standard_normal(5).astype(np.float32)) + 1
    assert not t.uop.is_realized and t.uop.realized is None
    assert t.uop.device == t.device  # read from the buffer the graph reads
    with pytest.raises(RuntimeError, match="not realized"):
        _ = t.uop.buffer
    t.realize()
    assert t.uop.is_realized and t.uop.realized is not None


def test_view_shares_base_with_its_buffer() -> None:
    t = Tensor(np.arange(12, dtype=np.int32)).realize()
    v = t.reshape(3, 4).permute(1, 0)[1:3]
    assert v.uop.base is t.uop.base and v.uop.is_realized
    assert v.uop.shape == (2, 3) and v.uop.base.shape == (12,)
    np.testing.assert_array_equal(v.uop.buffer.numpy(), np.arange(12))  # the whole buffer, not the view


def test_device_of_graphs() -> None:
    assert UOp.const(dtypes.int32, 3).device is None  # a graph naming no device
    t = Tensor.full((2,), 3.0, device="CPU:1") * 2
    assert t.uop.device == t.device == "CPU:1"
    moved = Tensor(np.ones(3, np.float32)).to("CPU:1")
    assert moved.uop.device == "CPU:1"  # a copy's target, not its source's device


def test_schedule_item_metadata_names_the_fused_ops() -> None:
    x = Tensor(RNG.standard_normal(8).astype(np.float32)).realize()
    (si,) = (x.relu() * 2).schedule()
    names = [m.name for m in si.metadata]
    assert names == ["relu", "__mul__"]  # relu's own maximum/where are not listed: the outermost op names them
    assert all(isinstance(m, Metadata) and not m.backward and m.caller == "" for m in si.metadata)


def test_schedule_metadata_per_kernel() -> None:
    x = Tensor(RNG.standard_normal((4, 4)).astype(np.float32)).realize()
    s = (x.exp().sum(1, keepdim=True) + x).contiguous().softmax()
    items = s.schedule()
    assert len(items) >= 2
    assert {m.name for m in items[0].metadata} >= {"exp", "sum"}
    assert any("softmax" in {m.name for m in it.metadata} for it in items)
    assert all("softmax" not in {m.name for m in it.metadata} for it in items[:1])


def test_backward_kernels_are_marked() -> None:
    x = Tensor(RNG.standard_normal(6).astype(np.float32), requires_grad=True)
    (x * x).sum().backward()
    assert x.grad is not None
    metas = [m for it in x.grad.schedule() for m in it.metadata]
    assert metas and any(m.backward for m in metas)


def test_tracemeta_levels() -> None:
    x = Tensor(RNG.standard_normal(5).astype(np.float32)).realize()
    with Context(TRACEMETA=0):
        assert (x.sqrt() + 7).schedule()[0].metadata == ()
    with Context(TRACEMETA=2):
        (si,) = (x.sin() - 3).schedule()
    assert [m.name for m in si.metadata] == ["sin", "__sub__"]
    assert all(m.caller.startswith(__file__) and m.caller.rsplit(":", 1)[1].isdigit() for m in si.metadata)


def test_copy_items_have_empty_metadata() -> None:
    x = Tensor(np.arange(4, dtype=np.float32), device="CPU").realize()
    (item,) = x.to("CPU:1").schedule()
    assert item.ast is None and item.metadata == ()


def test_shared_constants_do_not_carry_another_ops_name() -> None:
    """Constants are hash-consed across graphs: the 0 that another live graph's op made must not name relu's
    kernel."""
    other = Tensor(RNG.standard_normal(8).astype(np.float32))
    keep = other.maximum(0.0)  # alive during the test: its graph holds the shared constant 0
    x = Tensor(RNG.standard_normal(8).astype(np.float32)).realize()
    (si,) = (x.relu() * 2).schedule()
    assert [m.name for m in si.metadata] == ["relu", "__mul__"]
    assert keep.shape == (8,)


def test_metadata_entries_die_with_their_nodes() -> None:
    """A node's metadata entry goes when the node does (the per-op record keeps no dead node's entry), and a new node
    made at a dead one's address never inherits its op name."""
    from speck.tensor.metadata import metadata_of, node_metadata_data

    x = Tensor(RNG.standard_normal(8).astype(np.float32)).realize()
    before = len(node_metadata_data)
    for _ in range(200):
        (x.relu() * 2).exp()
    assert len(node_metadata_data) <= before + 4
    kept = [x * float(i) for i in range(50)]  # live nodes keep theirs
    assert all(m is not None and m.name == "__mul__" for m in (metadata_of(t.uop) for t in kept))
    for _ in range(50):
        y = x.sqrt()
        assert (m := metadata_of(y.uop)) is not None and m.name == "sqrt"
        del y


def test_metadata_names_ops_called_from_short_lived_code() -> None:
    """The op-name walk caches what it learnt per code object by id: code made and dropped in a loop (exec'd
    functions, whose ids CPython reuses) must still be told apart from speck's op methods."""
    from speck.tensor.metadata import metadata_of

    x = Tensor(RNG.standard_normal(8).astype(np.float32)).realize()
    for i in range(50):
        ns: dict[str, object] = {}
        exec(f"def user_fn_{i}(t):\n    return t.exp2() * {i + 1}.5\n", ns)  # a fresh code object each time
        fn = ns[f"user_fn_{i}"]
        y = fn(x)  # type: ignore[operator]
        assert (m := metadata_of(y.uop)) is not None and m.name == "__mul__"
        assert (m := metadata_of(y.uop.src[0])) is not None and m.name == "exp2"
        del fn, ns, y


def test_buffer_is_read_from_uops_table_not_a_tensor_service() -> None:
    """speck.uop owns the BUFFER -> device buffer table; UOp.buffer only reads it (no service of speck.tensor)."""
    from speck.uop import uop as uop_module

    assert "uop_buffer" not in uop_module._SERVICES
    t = (Tensor(np.arange(4, dtype=np.float32)) + 1).realize()
    assert uop_module.buffers.get(t.uop.base) is t.uop.buffer
    np.testing.assert_array_equal(t.uop.buffer.numpy(), np.arange(4) + 1)


def test_empty_gets_its_buffer_when_realized() -> None:
    """A Tensor.empty's BUFFER has no storage until realized or written: `realized` is None and `buffer` says to
    realize; after .realize() both give the device buffer, and reading the data gives the same one."""
    e = Tensor.empty(4)
    assert e.uop.is_realized and e.uop.realized is None
    with pytest.raises(RuntimeError, match="no storage attached yet"):
        _ = e.uop.buffer
    b = e.realize().uop.buffer
    assert b is e.uop.realized and b.size == 4
    e.numpy()
    assert e.uop.buffer is b
    e2 = Tensor.empty(2, 3)
    Tensor.realize_all(e2)
    assert e2.uop.realized is not None and e2.uop.buffer.size == 6


def test_region_view_gets_its_buffer_when_realized() -> None:
    """A bitcast view of another buffer's memory is realized into a buffer object of its own over that memory."""
    src = np.arange(8, dtype=np.int32)
    v = Tensor(src).realize().bitcast(dtypes.float32).realize()
    np.testing.assert_array_equal(v.uop.buffer.numpy().view(np.int32), src)
