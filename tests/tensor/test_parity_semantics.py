"""The semantics of issue 28 §3 owned here, each against TENSOR_API: assign (kernel counts of the common patterns,
chained assigns onto unrealized targets, the RuntimeError cases of 4.6, buffer identity), setitem's RuntimeError
cases (6.2), sharded assign and symbolic bounds on sharded tensors (12.2), DISK without a compute renderer (4.1),
`gradient()` shapes and errors (5), and the realize identities of 4.5."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Tensor, Variable, dtypes
from speck.tensor.schedule import KernelCountException, assert_kernel_count, base_buffer
from speck.uop import Ops

DEVS = ("CPU", "CPU:1")


def _realized(*shape: int, dtype: Any = np.float32) -> Tensor:
    return Tensor(np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)).realize()


# ---------------- assign ----------------
@pytest.mark.parametrize("name, write, kernels", [
    ("in-place add", lambda x: x.__iadd__(1), 1),
    ("slice assign", lambda x: x[1:3].assign(Tensor([[5.0] * 4] * 2)), 1),
    ("row += through setitem", lambda x: x.__setitem__(1, x[1] + 2), 1),
    ("x[:, 1:3] += 1", lambda x: x.__setitem__((slice(None), slice(1, 3)), x[:, 1:3].__iadd__(1)), 1),
    ("constant", lambda x: x.assign(3.0), 1),
    ("self-assign", lambda x: x.assign(x), 0),
    ("two chained updates", lambda x: x.assign(x + 1).assign(x * 2), 2),
    ("index-tensor setitem", lambda x: x.__setitem__(Tensor([0, 2]), 7.0), 1),
])  # fmt: skip
def test_assign_kernel_counts(name: str, write: Any, kernels: int) -> None:
    x = _realized(4, 4)
    ref = x.numpy()
    write(x)
    with assert_kernel_count(kernels):
        x.realize()
    assert x.numpy().shape == ref.shape


def test_a_wrong_kernel_count_raises_kernel_count_exception() -> None:
    x = _realized(4)
    x += 1
    with pytest.raises(KernelCountException), assert_kernel_count(5):
        x.realize()


def test_assign_keeps_the_buffer_and_every_view_sees_the_write() -> None:
    x = _realized(6)
    bb, view = base_buffer(x.uop), x[2:4]
    x.assign(x * 10).realize()
    assert base_buffer(x.uop) is bb and x.uop.is_realized
    assert view.tolist() == [20.0, 30.0] and x.tolist() == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]
    x[1:3].assign(Tensor([-1.0, -2.0])).realize()
    assert base_buffer(x.uop) is bb and view.tolist() == [-2.0, 30.0]


def test_chained_assigns_onto_unrealized_targets_run_like_eager_code() -> None:
    a = Tensor.ones(4).contiguous()
    a.assign(a + 1)
    a.assign(a * 2)
    assert a.tolist() == [4.0] * 4
    b = Tensor([1.0, 2.0])
    c = b * 1  # computed before the write: keeps the old value, however late it is read (TENSOR_API A: not matched)
    b += 1
    assert b.tolist() == [2.0, 3.0] and c.tolist() == [1.0, 2.0]
    d = Tensor.empty(3)
    d.assign(Tensor([1.0, 2.0, 3.0])).assign(d + 1)
    assert d.tolist() == [2.0, 3.0, 4.0]
    e = (Tensor([1.0, 2.0]) * 2).uop.after(Tensor.zeros(2).contiguous().uop)  # an ordering node users build
    assert Tensor(e).tolist() == [2.0, 4.0]


@pytest.mark.parametrize("bad, exc, match", [
    (lambda x: x.assign(Tensor(np.zeros(3, np.float32))), ValueError, "broadcast"),
    (lambda x: x.assign(Tensor(np.zeros(4, np.int32))), RuntimeError, "assign dtype mismatch"),
    (lambda x: x.assign(Tensor([1, 2, 3, 4]) * 0.5 + Tensor([1.0]).half()), RuntimeError, "assign dtype mismatch"),
    (lambda x: x.assign(Tensor(np.ones(4, np.float32), device="CPU:1")), RuntimeError, "device mismatch"),
    (lambda x: x.cast(dtypes.int8).assign(Tensor([1, 2, 3, 4]) * 0.5), RuntimeError, "assign dtype mismatch"),
])  # fmt: skip
def test_assign_runtime_errors(bad: Any, exc: type, match: str) -> None:
    x = _realized(4)
    with pytest.raises(exc, match=match):
        bad(x)
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]  # nothing was written


# ---------------- setitem ----------------
@pytest.mark.parametrize("bad, exc, match", [
    (lambda x: x.__setitem__(0, Tensor([1, 2, 3, 4])), RuntimeError, "setitem dtype mismatch"),
    (lambda x: x.__setitem__(0, Tensor([1.0, 2.0])), ValueError, "broadcast"),
    (lambda x: x.__setitem__(0, Tensor([1.0] * 4, device="CPU:1")), RuntimeError, "device mismatch"),
    (lambda x: x.cast(dtypes.uint8).__setitem__(0, 300), OverflowError, "doesn't fit"),
])  # fmt: skip
def test_setitem_runtime_errors(bad: Any, exc: type, match: str) -> None:
    x = _realized(2, 4)
    with pytest.raises(exc, match=match):
        bad(x)
    np.testing.assert_array_equal(x.numpy(), np.arange(8, dtype=np.float32).reshape(2, 4))


def test_setitem_into_weak_and_sharded_targets_raises() -> None:
    with pytest.raises(RuntimeError, match="weak"):
        (Tensor([1, 2]) * 0.5)[0] = 1.0
    s = _realized(4).shard(DEVS, 0)
    for idx in (1, slice(0, 2), Tensor([1])):
        with pytest.raises(RuntimeError, match="sharded"):
            s[idx] = 5.0


def test_setitem_converts_python_values_and_gives_device_less_targets_storage() -> None:
    x = Tensor([1, 2, 3]).realize()
    x[1] = 2.5  # a Python float into an int tensor: converted (TENSOR_API 6.2)
    assert x.tolist() == [1, 2, 3]
    a = Tensor.arange(4)
    a[0] = 9  # device-less: storage on the default device first
    assert a.device is not None and a.tolist() == [9, 1, 2, 3]


# ---------------- several devices ----------------
def test_sharded_assign_needs_the_same_sharding_and_dtype() -> None:
    s = _realized(4, 2).shard(DEVS, 0)
    with pytest.raises(RuntimeError, match="axis"):
        s.assign(_realized(4, 2).shard(DEVS, 1))
    with pytest.raises(RuntimeError, match="assign dtype mismatch"):
        s.assign(Tensor(np.zeros((4, 2), np.int32)).shard(DEVS, 0))
    s.assign(7.0)  # a literal (device-less): placed like the target
    assert s.device == DEVS and s.tolist() == [[7.0, 7.0]] * 4
    s.assign(Tensor.arange(8).reshape(4, 2).float())
    s.assign(s * 2).realize()
    np.testing.assert_array_equal(s.numpy(), np.arange(8).reshape(4, 2) * 2)
    assert s.uop.axis == 0


@given(st.integers(1, 6))
def test_symbolic_bounds_on_sharded_tensors(n: int) -> None:
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    v = Variable("n", 1, 6).bind(n)
    s = Tensor(x).shard(DEVS, axis=0)
    part = s[:, :v]
    np.testing.assert_array_equal(part.sum(1).numpy(), x[:, :n].sum(1))
    np.testing.assert_array_equal(part.max(1).numpy(), x[:, :n].max(1))
    assert part.sum().item() == x[:, :n].sum()
    np.testing.assert_array_equal(s.pad(((0, 0), (0, v))).sum(1).numpy(), x.sum(1))
    np.testing.assert_array_equal(Tensor(x)[:, :v].shard(DEVS, 0).mean(1).numpy(), x[:, :n].mean(1))
    with pytest.raises(RuntimeError, match="uneven"):
        Tensor(x)[:, :v].shard(DEVS, 1)


# ---------------- DISK ----------------
@pytest.fixture
def disk(tmp_path: Path) -> tuple[Path, Tensor]:
    p = tmp_path / "w.bin"
    p.write_bytes(np.arange(16, dtype=np.float32).tobytes())
    return p, Tensor(p, dtype=dtypes.float32)


def _file(p: Path) -> np.ndarray:
    return np.frombuffer(p.read_bytes(), np.float32)


def test_disk_slices_and_strided_views_read_without_computing_on_disk(disk: tuple[Path, Tensor]) -> None:
    _, t = disk
    ref = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(t[3:7].numpy(), ref[3:7])
    np.testing.assert_array_equal(t[::3].numpy(), ref[::3])
    np.testing.assert_array_equal(t.reshape(4, 4)[1:3, ::-2].numpy(), ref.reshape(4, 4)[1:3, ::-2])
    np.testing.assert_array_equal(t[1::2].to("CPU:1").numpy(), ref[1::2])
    assert t[1::2].to("CPU").device == "CPU"


def test_disk_writes_of_constants_and_computed_values(disk: tuple[Path, Tensor]) -> None:
    p, t = disk
    ref = np.arange(16, dtype=np.float32)
    t[4:6].assign(5.0)  # a constant: computed on CPU, its bytes written
    t[8:10] = 3.0
    t[10:12] = Tensor([1, 2]) * 0.5
    t[::4].assign(-1.0)  # through a strided view
    t[0:2].assign(Tensor([7.0, 8.0]))  # from another device: copied
    ref[4:6], ref[8:10], ref[10:12], ref[::4], ref[0:2] = 5, 3, [0.5, 1], -1, [7, 8]
    np.testing.assert_array_equal(_file(p), ref)
    with pytest.raises(RuntimeError, match="index tensors"):
        t[Tensor([1, 2])] = 1.0


def test_disk_bitcasts_are_views_of_the_file(disk: tuple[Path, Tensor]) -> None:
    _, t = disk
    ref = np.arange(16, dtype=np.float32)
    np.testing.assert_array_equal(t.bitcast(dtypes.int32).numpy(), ref.view(np.int32))
    np.testing.assert_array_equal(t[2:4].bitcast(dtypes.uint8).numpy(), ref[2:4].view(np.uint8))
    np.testing.assert_array_equal(t.reshape(4, 4)[1].bitcast(dtypes.uint16).to("CPU").numpy(), ref[4:8].view(np.uint16))


# ---------------- gradients ----------------
@pytest.mark.parametrize("shape", [(), (1,), (3,), (2, 3)])
def test_gradient_has_the_target_shape(shape: tuple[int, ...]) -> None:
    a = np.arange(1, int(np.prod(shape)) + 1, dtype=np.float32).reshape(shape)
    x = Tensor(a.reshape(-1)).reshape(shape)  # (a 0-d view of a buffer: Tensor(0-d array) is a device-less literal)
    (gx,) = (x * x).sum().gradient(x)
    assert gx.shape == shape
    np.testing.assert_allclose(gx.numpy(), 2 * a)
    (gz,) = (x * 2).sum().gradient(Tensor.ones(*shape))  # not in the graph: device-less zeros of its shape
    assert gz.shape == shape and gz.device is None and not gz.numpy().any()


def test_gradient_errors_for_non_differentiable_targets() -> None:
    x = Tensor([1.0, 2.0])
    y = (x * 3).sum()
    with pytest.raises(RuntimeError, match="only float Tensors have gradient"):
        y.gradient(Tensor([1, 2]))
    with pytest.raises(RuntimeError, match="weak"):
        (x * (Tensor([1, 2]) * 0.5)).sum().gradient(Tensor([1, 2]) * 0.5)
    with pytest.raises(RuntimeError, match="only float Tensors have gradient"):
        (Tensor([1, 2]) * 2).sum().gradient(x)
    with pytest.raises(AssertionError):
        (x * 3).gradient(x)
    (g,) = (x * 3).gradient(x, gradient=Tensor([1.0, 2.0]))
    assert g.tolist() == [3.0, 6.0]


# ---------------- realize ----------------
def test_realize_identities() -> None:
    a, b = Tensor([1.0, 2.0]) * 2, Tensor([3.0]) + 1
    assert a.realize() is a and a.uop.is_realized
    assert Tensor.realize(b, a) is b and b.uop.is_realized
    c, d = Tensor([1.0]) * 3, Tensor([2.0]) * 3
    c.realize(d)  # the others are realized too
    assert c.uop.is_realized and d.uop.is_realized
    for lit in (Tensor(3), Tensor.arange(4), Tensor([1, 2]) * 0.5):
        assert lit.realize() is lit and not lit.uop.is_realized  # no storage: nothing to realize


@given(st.integers(1, 4))
def test_reshape_of_a_symbolic_sharded_tensor_keeps_the_shard_boundary(n: int) -> None:
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    rows = Variable("rows", 1, 4).bind(n)
    s = Tensor(x).shard(DEVS, axis=1)[:rows]
    r = s.reshape(rows, 1, 2)
    assert r.uop.axis == 2
    np.testing.assert_array_equal(r.sum(0).numpy(), x[:n].reshape(n, 1, 2).sum(0))
    with pytest.raises(RuntimeError, match="shard boundary"):
        s.reshape(rows * 2)


def test_assign_keeps_the_device_buffer_object() -> None:
    """`t.uop.base.realized` (the device Buffer) is the same object before and after a whole-tensor assign, and a
    view's buffer sees the new contents; a snapshot of the old value still reads it."""
    a, b = _realized(20, 20), _realized(20, 20)
    ba, bb = a.uop.base.realized, b.uop.base.realized
    old = a * 1  # built before the write: keeps the old value
    a += b
    a.realize()
    assert a.uop.base.realized is ba and ba is not bb
    np.testing.assert_array_equal(a.numpy(), np.arange(400, dtype=np.float32).reshape(20, 20) * 2)
    np.testing.assert_array_equal(old.numpy(), np.arange(400, dtype=np.float32).reshape(20, 20))
    x = Tensor([0]).realize()
    buf = x.uop.base.realized
    for _ in range(5):
        x += 1
    x.realize()
    assert x.item() == 5 and x.uop.base.realized is buf
    t = _realized(4, 4).permute(1, 0)
    tb = t.uop.base.realized
    t += _realized(4, 4)
    t.realize()
    assert t.uop.base.realized is tb
    np.testing.assert_array_equal(t.numpy(), np.arange(16).reshape(4, 4).T + np.arange(16).reshape(4, 4))


def test_after_a_store_writes_before_the_read() -> None:
    """`t.uop.after(t.uop.store(v))` (tinygrad's explicit write-then-read node) writes v through the target view."""
    t = Tensor.zeros(10).contiguous().realize()
    t.uop = t.uop.after(t.uop.store((t + 1).uop))
    assert t.tolist() == [1.0] * 10 and t.tolist() == [1.0] * 10
    t = Tensor.zeros(10).contiguous().realize()
    t.uop = t.uop.after(t[:5].uop.after(t[:5].uop.store(Tensor.ones(5).uop)))
    assert t.tolist() == [1.0] * 5 + [0.0] * 5
    a, b = (Tensor(Tensor([0]).realize().uop.buf_uop) for _ in range(2))
    Tensor.realize(a.contiguous().assign(1), b.contiguous().assign(2))
    assert (a + b).item() == 3
    with pytest.raises(RuntimeError, match="buf_uop"):
        _ = (Tensor([1.0]) * 2).uop.buf_uop


@pytest.mark.parametrize("src, dst, n", [(np.uint8, np.int64, 16), (np.int32, np.int16, 4), (np.float32, np.uint8, 3)])
def test_assign_through_a_bitcast_to_another_item_size_writes_the_source(src: Any, dst: Any, n: int) -> None:
    a = Tensor(np.zeros(n, src)).realize()
    view = a.bitcast({np.int64: dtypes.int64, np.int16: dtypes.int16, np.uint8: dtypes.uint8}[dst])
    value = np.arange(1, view.shape[0] + 1).astype(dst) * 37
    view.assign(Tensor(value))
    np.testing.assert_array_equal(a.numpy(), value.view(src))  # the write reached the buffer, byte for byte
    np.testing.assert_array_equal(view.numpy(), value)


@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 2), st.integers(0, 2), st.integers(-3, 3)), max_size=14))
def test_random_write_programs_match_eager_numpy(program: list[tuple[int, int, int, int]]) -> None:
    """Whole assigns (computed, or from another realized tensor: memory shared until written), slice writes,
    setitem, realizes and values read later, against numpy run eagerly: a write never leaks into another tensor and
    every value keeps the contents of its time (the device Buffer a whole assign keeps must not be shared)."""
    ref = [np.arange(4, dtype=np.float32) * (k + 1) for k in range(3)]
    ts = [Tensor(r.copy()).realize() for r in ref]
    later: list[tuple[Tensor, np.ndarray]] = []
    views: list[tuple[Tensor, int]] = []
    for op, i, j, c in program:
        if op == 0:
            ts[i].assign(ts[i] * c + ts[j])
            ref[i] = ref[i] * c + ref[j]
        elif op == 1 and i != j:
            ts[i].assign(ts[j].realize())
            ref[i] = ref[j].copy()
        elif op == 2:
            ts[i][1:3] = ts[j][0:2] + c
            ref[i][1:3] = ref[j][0:2] + c
        elif op == 3:
            ts[i] += c
            ref[i] = ref[i] + c
        elif op == 4:
            later.append((ts[i] * 2 + c, ref[i] * 2 + c))
        elif op == 5:
            views.append((ts[i][1:3], i))  # a pure view: sees every later write
        elif op == 6:
            ts[i][Tensor([j, 3 - j])] = float(c)
            ref[i][[j, 3 - j]] = c
        else:
            ts[i].realize()
    for t, r in zip(ts, ref):
        np.testing.assert_array_equal(t.numpy(), r)
    for t, r in later:
        np.testing.assert_array_equal(t.numpy(), r)
    for v, k in views:
        np.testing.assert_array_equal(v.numpy(), ref[k][1:3])


def test_disk_writes_of_python_values_land_where_they_are_written(tmp_path: Path) -> None:
    """Lists and arrays written into a DISK tensor are staged on the host (a buffer made on the file's device would
    be the file itself: writing [3] into row 1 wrote row 0 too); a lazy copy onto a file is written first."""
    dt = Tensor([[1], [2]]).to(f"disk:{tmp_path / 'a'}")
    dt[1] = [3]
    assert dt.tolist() == [[1], [3]] and (tmp_path / "a").read_bytes() == np.array([1, 3], np.int32).tobytes()
    t = Tensor.empty(10, device=f"disk:{tmp_path / 'b'}", dtype=dtypes.int64)
    for i in range(5):
        t[2 * i : 2 * i + 2].assign(np.array([3, i]))
    assert t.tolist() == [3, 0, 3, 1, 3, 2, 3, 3, 3, 4]
    h = Tensor.empty(16, device=f"disk:{tmp_path / 'c'}", dtype=dtypes.uint8)
    h[0:8].bitcast(dtypes.int64).assign([12345])
    assert int.from_bytes(h[0:8].data(), "little") == 12345 and h[8:].tolist() == [0] * 8


def test_gradients_of_implicitly_broadcast_sources_have_their_shape() -> None:
    """A graph node combining a 0-d source with a bigger one (no EXPAND node between) passes the source a gradient
    summed back to its shape; a seed with the root's elements in another shape is accepted."""
    x, w = Tensor([1.0, 2.0, 3.0]), Tensor(2.0, dtype=dtypes.float32)
    (dw,) = Tensor(x.uop.alu(Ops.MUL, w.uop)).sum().gradient(w)
    assert dw.shape == () and dw.item() == 6.0
    cond, p = Tensor([True, False, True]), Tensor(4.0, dtype=dtypes.float32)
    (dp,) = Tensor(cond.uop.alu(Ops.WHERE, x.uop, p.uop)).sum().gradient(p)
    assert dp.shape == () and dp.item() == 1.0
    s = Tensor(0.5, dtype=dtypes.float32)
    sin = s.sin()
    (ds,) = (Tensor(x.uop.alu(Ops.MUL, sin.uop)).sum() + sin).gradient(s)
    assert ds.shape == () and abs(ds.item() - 7 * np.cos(0.5)) < 1e-5
    (dx,) = (x * x).sum().gradient(x, gradient=Tensor([3.0]))
    assert dx.tolist() == [6.0, 12.0, 18.0]
    with pytest.raises(RuntimeError, match="broadcast"):
        (x * x).gradient(x, gradient=Tensor([1.0, 2.0]))


def test_a_clone_of_a_detached_tensor_gets_a_gradient() -> None:
    base = Tensor([1.0, 2.0, 3.0, 4.0])
    x = base.detach().clone()
    (x * 2.0).sum().backward()
    assert x.grad is not None and x.grad.tolist() == [2.0] * 4
    assert base.grad is None or base.grad.tolist() == [0.0] * 4  # detach blocks the flow back to base


def test_reading_a_view_of_a_pending_copy_onto_a_file(tmp_path: Path) -> None:
    """`x.to("disk:...")[10:20]` read (or moved) before the copy ran: the copy writes the file first (the file's device
    computes nothing), then the slice is read from it."""
    ref = np.arange(30, dtype=np.float32) * 1.5
    t = (Tensor(ref) * 1).to(f"disk:{tmp_path / 'a'}")
    a = t[10:20]
    np.testing.assert_array_equal(a.numpy(), ref[10:20])
    np.testing.assert_array_equal(a.to("CPU").numpy(), ref[10:20])
    assert (tmp_path / "a").read_bytes() == ref.tobytes()
    u = (Tensor(ref) + 0).to(f"disk:{tmp_path / 'b'}")[::3]
    np.testing.assert_array_equal(u.to("CPU:1").numpy(), ref[::3])


def test_schedule_lists_the_pending_whole_assigns_of_a_tensor() -> None:
    """`a.assign(a + 1).schedule()` lists the kernel computing the new value (it was empty: the write waits for the
    next realize); running those items writes nothing a tensor holds, the assign still happens once."""
    from speck.tensor.engine.realize import run_schedule

    a = Tensor([1.0, 2.0]).realize()
    a.assign(a + 1)
    items = a.schedule()
    assert len([it for it in items if it.ast is not None]) == 1
    run_schedule(items)
    assert a.tolist() == [2.0, 3.0]
    b = Tensor([1.0, 2.0]).realize()
    b += 1
    b *= 2
    assert len(b.schedule()) == 2 and b.tolist() == [4.0, 6.0]
    c, d = Tensor([1.0, 2.0]).realize(), Tensor([3.0, 4.0]).realize()
    c.assign(d)
    assert [it.ast for it in c.schedule()] == [None] and c.tolist() == [3.0, 4.0]  # a copy
