"""Pickling: realized tensors carry their data (loading runs no kernel), unrealized tensors carry their graph,
DISK tensors their path; Variables, dtypes, UOps and PatternMatchers come back as the identical objects; a captured
TinyJit replays after loading without tracing. Round trips run in this process and in a fresh one."""

from __future__ import annotations

import gc
import os
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Device, GlobalCounters, Tensor, TinyJit, UOp, Variable, assert_kernel_count, dtypes
from speck.tensor.pickling import TensorPickleError
from speck.uop import Ops, PatternMatcher, UPat
from tensor_helpers import FEW


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-2, 2, shape).astype(np.float32)


def _roundtrip(x: Any, protocol: int = pickle.HIGHEST_PROTOCOL) -> Any:
    return pickle.loads(pickle.dumps(x, protocol=protocol))


def _buffers(t: Tensor) -> list[UOp]:
    return [n for n in t.uop.toposort() if n.op is Ops.BUFFER]


@FEW
@given(
    shape=st.sampled_from([(), (1,), (7,), (2, 3), (3, 1, 2)]),
    dtype=st.sampled_from([dtypes.float32, dtypes.int32, dtypes.bool, dtypes.float16, dtypes.uint8]),
    protocol=st.sampled_from([2, 4, 5]),
)
def test_realized_roundtrip(shape: tuple[int, ...], dtype: Any, protocol: int) -> None:
    ref = (_rand(*shape, seed=len(shape)) * 10).astype(np.dtype(dtype.fmt) if dtype != dtypes.bool else np.bool_)
    # (a 0-d array alone is a device-less constant, which has no buffer: a 0-d view of one element has)
    t = Tensor(ref.reshape(-1), dtype=dtype).reshape(shape).realize()
    data = pickle.dumps(t, protocol=protocol)
    # earlier tests' buffers are freed when their submissions complete and when the collector runs: settle both, so
    # the count below moves only by what the load allocates
    Device[t.device].synchronize()
    gc.collect()
    used = GlobalCounters.mem_used_bytes()
    with assert_kernel_count(0):  # the data is copied in: no kernel
        back = pickle.loads(data)
        got = back.numpy()
    assert back.shape == t.shape and back.dtype == t.dtype and back.device == t.device
    np.testing.assert_array_equal(got, ref)
    assert GlobalCounters.mem_used_bytes() >= used  # allocated at load, on the original device
    assert _buffers(back) != _buffers(t)  # its own buffer


@pytest.mark.parametrize("value", [3, 2.5, True, 2**40])
def test_device_less_literals_roundtrip_device_less(value: Any) -> None:
    t = Tensor(value)
    back = pickle.loads(pickle.dumps(t))
    assert back.device is None and back.dtype == t.dtype and back.item() == value


def test_out_of_band_buffers() -> None:
    t = Tensor(_rand(4096, seed=1)).realize()
    oob: list[pickle.PickleBuffer] = []
    data = pickle.dumps(t, protocol=5, buffer_callback=oob.append)
    assert oob and len(data) < 2000  # the 16 KiB of data went out of band
    np.testing.assert_array_equal(pickle.loads(data, buffers=oob).numpy(), t.numpy())


def test_unrealized_graph_travels() -> None:
    an, bn = _rand(4, 5, seed=2), _rand(5, seed=3)
    a = Tensor(an).realize()
    lazy = ((a * 2 + Tensor(bn)).relu().sum(axis=0) + Tensor.arange(5).float()).contiguous()
    data = pickle.dumps(lazy)
    with assert_kernel_count(0):
        back = pickle.loads(data)
    assert back.uop.op is not Ops.BUFFER and base_is_lazy(back)
    np.testing.assert_allclose(back.numpy(), np.maximum(an * 2 + bn, 0).sum(0) + np.arange(5), rtol=1e-6)
    np.testing.assert_allclose(lazy.numpy(), back.numpy())


def base_is_lazy(t: Tensor) -> bool:
    return any(n.op in (Ops.ADD, Ops.REDUCE_AXIS) for n in t.uop.toposort())


def test_views_grad_and_shared_buffers() -> None:
    an = _rand(4, 6, seed=4)
    a = Tensor(an, requires_grad=True)
    (a * a).sum().backward()
    view = a[1:3, ::2]
    b_a, b_view, b_flat = _roundtrip([a, view, a.reshape(24)])
    np.testing.assert_array_equal(b_view.numpy(), an[1:3, ::2])
    assert b_a.requires_grad and b_a.grad is not None
    np.testing.assert_allclose(b_a.grad.numpy(), 2 * an, rtol=1e-6)
    assert _buffers(b_a) == _buffers(b_view) == _buffers(b_flat)  # shared before, shared after


def test_disk_tensor_by_path(tmp_path: Path) -> None:
    path = tmp_path / "weights.bin"
    ref = np.arange(4096, dtype=np.float32)
    path.write_bytes(ref.tobytes())
    t = Tensor.empty(4096, dtype=dtypes.float32, device=f"disk:{path}")
    np.testing.assert_array_equal(t.numpy(), ref)  # the file was read: it still pickles by path
    data = pickle.dumps(t[3:7])
    assert len(data) < 2000 and str(path).encode() in data
    back = pickle.loads(data)
    assert back.device == t.device
    np.testing.assert_array_equal(back.to("CPU").numpy(), ref[3:7])
    os.remove(path)
    with pytest.raises(TensorPickleError, match="weights.bin.*missing"):
        pickle.loads(data)


def test_device_that_cannot_be_opened() -> None:
    data = pickle.dumps(Tensor([1.0, 2.0], device="PYTHON").realize())
    broken = data.replace(b"PYTHON", b"NOPEXY")
    with pytest.raises(TensorPickleError, match="'NOPEXY' can't be opened"):
        pickle.loads(broken)


def test_variables_dtypes_uops_identical() -> None:
    v = Variable("pickled_n", 1, 10)
    assert _roundtrip(v) is v and _roundtrip(v.bind(4)) is v.bind(4)
    for dt in (dtypes.float32, dtypes.bfloat16, dtypes.int8.vec(4), dtypes.float32.ptr(16)):
        assert _roundtrip(dt) is dt
    u = (UOp.range(8, 0) * 3 + v).simplify()
    assert _roundtrip(u) is u


def test_symbolic_tensor_graph() -> None:
    n = Variable("pickled_len", 1, 8)
    t = Tensor(_rand(8, seed=5)).realize()
    part = t.shrink(((0, n.bind(3)),)) * 2
    back = _roundtrip(part)
    assert back.shape == part.shape == (n.bind(3),)
    np.testing.assert_allclose(back.sum().item(), (t.numpy()[:3] * 2).sum(), rtol=1e-6)


module_level_pm = PatternMatcher([(UPat(Ops.NEG, name="x"), lambda x: x.src[0] * -1)])


def test_pattern_matchers_by_name() -> None:
    from speck.uop.symbolic import symbolic

    assert _roundtrip(symbolic) is symbolic
    assert _roundtrip(module_level_pm) is module_level_pm
    local = PatternMatcher([(UPat(Ops.NEG, name="x"), lambda x: x)])
    with pytest.raises(pickle.PicklingError, match="no module-level name"):
        pickle.dumps(local)


def _make_jit() -> tuple[TinyJit[Any], list[int], Tensor]:
    traced: list[int] = []
    w = Tensor(_rand(4, 3, seed=6)).realize()

    @TinyJit
    def step(x: Tensor) -> Tensor:
        traced.append(1)
        return (x @ w).relu() + x.sum()

    for seed in range(3):
        step(Tensor(_rand(2, 4, seed=seed)).realize())
    return step, traced, w


def test_captured_jit_replays_without_tracing() -> None:
    from speck.tensor.realize import compiled_program_count

    step, traced, w = _make_jit()
    assert len(traced) == 2
    compiled = compiled_program_count()
    back = _roundtrip(step)
    for seed in (10, 11):
        xn = _rand(2, 4, seed=seed)
        with assert_kernel_count(2):  # the captured kernels, loaded with their object code: nothing compiles
            got = back(Tensor(xn).realize()).numpy()
        np.testing.assert_allclose(got, np.maximum(xn @ w.numpy(), 0) + xn.sum(), rtol=1e-5, atol=1e-5)
    assert len(traced) == 2 and compiled_program_count() == compiled  # neither traced nor compiled again
    with pytest.raises(AssertionError, match="no function"):  # the function was not pickled: no new capture
        back.reset()
    np.testing.assert_allclose(step(Tensor(_rand(2, 4, seed=11)).realize()).numpy(), got, rtol=1e-6)


def test_uncaptured_jit_is_an_error() -> None:
    @TinyJit
    def f(x: Tensor) -> Tensor:
        return x + 1

    with pytest.raises(TensorPickleError, match="TinyJit .*f.* has not captured yet"):
        pickle.dumps(f)
    f(Tensor([1.0]).realize())
    with pytest.raises(TensorPickleError, match="1 more time"):
        pickle.dumps(f)


def test_custom_kernel_graph_pickles_without_grad_fxn() -> None:
    from test_custom_kernel import add_one_kernel

    a = Tensor(_rand(5, seed=7), requires_grad=True)
    out = Tensor.custom_kernel(Tensor.empty(5), a, fxn=add_one_kernel, grad_fxn=lambda g, c: (None, g))[0]
    back = _roundtrip(out)
    (call,) = [n for n in back.uop.toposort() if n.op is Ops.KERNEL]
    with pytest.raises(RuntimeError, match="no grad_fxn"):  # dropped: differentiating is an error, not a pass-through
        back.sum().gradient(Tensor(call.src[1]))
    np.testing.assert_allclose(back.numpy(), a.numpy() + 1, rtol=1e-6)


# ---------------- a fresh process ----------------
_LOADER = textwrap.dedent(
    """
    import pickle, sys
    import numpy as np
    from speck.tensor import GlobalCounters, Tensor
    d = pickle.load(open(sys.argv[1], "rb"))
    k0 = GlobalCounters.kernel_count
    realized = d["realized"].numpy()
    assert GlobalCounters.kernel_count == k0, "loading a realized tensor ran a kernel"
    lazy = d["lazy"].numpy()
    x = np.load(sys.argv[2])
    out = d["jit"](Tensor(x).realize()).numpy()
    np.savez(sys.argv[3], realized=realized, lazy=lazy, jit=out, traced=len(d["traced"]))
    """
)


def test_fresh_process_roundtrip(tmp_path: Path) -> None:
    step, traced, w = _make_jit()
    a = Tensor(_rand(3, 3, seed=8)).realize()
    lazy = (a.exp() - a).max(axis=1)
    path = tmp_path / "state.pkl"
    path.write_bytes(pickle.dumps({"realized": a, "lazy": lazy, "jit": step, "traced": traced}))
    xn = _rand(2, 4, seed=9)
    np.save(tmp_path / "x.npy", xn)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    subprocess.run([sys.executable, "-c", _LOADER, str(path), str(tmp_path / "x.npy"), str(tmp_path / "out.npz")],
                   check=True, env=env, timeout=600)  # fmt: skip
    res = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(res["realized"], a.numpy())
    np.testing.assert_allclose(res["lazy"], lazy.numpy(), rtol=1e-6)
    np.testing.assert_allclose(res["jit"], np.maximum(xn @ w.numpy(), 0) + xn.sum(), rtol=1e-5, atol=1e-5)
    assert int(res["traced"]) == 2


def test_copy_and_deepcopy() -> None:
    import copy

    an = _rand(5, seed=21)
    a = Tensor(an).realize()
    shallow, deep = copy.copy(a), copy.deepcopy(a)
    assert _buffers(shallow) == _buffers(a) and _buffers(deep) != _buffers(a)
    np.testing.assert_array_equal(deep.numpy(), an)
    a.assign(Tensor(an + 1))
    np.testing.assert_array_equal(shallow.numpy(), an + 1)
    np.testing.assert_array_equal(deep.numpy(), an)


def test_sharded_tensor() -> None:
    an = _rand(4, 3, seed=22)
    x = Tensor(an).shard(("CPU", "CPU:1"), axis=0)
    back = _roundtrip(x)
    assert back.device == ("CPU", "CPU:1") and back.uop.axis == 0  # type: ignore[attr-defined]
    np.testing.assert_array_equal(back.numpy(), an)


class _OldBuffer:
    """A BUFFER as pickles written before the tensor's class was pickled name it: speck.tensor.pickling._load_buffer."""

    def __init__(self, buf: UOp, data: bytes) -> None:
        self.buf, self.data = buf, data

    def __reduce__(self) -> tuple[Any, ...]:
        from speck.tensor import pickling

        return (pickling._load_buffer, (str(self.buf.src[1].arg), self.buf.arg, self.buf.dtype, self.data))


class _OldTensor:
    """A tensor as those pickles name it: _load_tensor / _load_sharded, with no class among the arguments."""

    def __init__(self, t: Tensor) -> None:
        self.t = t

    def __reduce__(self) -> tuple[Any, ...]:
        from speck.tensor import pickling

        t = self.t
        if isinstance(t.device, tuple):
            return (pickling._load_sharded, (t.numpy(), t.dtype, t.device, t.uop.axis, None, None, True))  # type: ignore[attr-defined]
        (buf,) = _buffers(t)
        graph = (pickling._load_graph, (t.uop, (buf,), (_OldBuffer(buf, t.numpy().tobytes()),)))
        return (pickling._load_tensor, (_Reduced(graph), t.device, t.requires_grad, None, t.is_param))


class _Reduced:
    def __init__(self, rv: tuple[Any, ...]) -> None:
        self.rv = rv

    def __reduce__(self) -> tuple[Any, ...]:
        return self.rv


def test_pickles_naming_the_old_loaders_still_load() -> None:
    """Pickles written before a tensor's class went into the stream name speck.tensor.pickling's loaders, without a
    class: they still load, as Tensors with the data they held."""
    an = _rand(3, 4, seed=23)
    back = pickle.loads(pickle.dumps(_OldTensor(Tensor(an).realize())))
    assert type(back) is Tensor and back.device == Device.DEFAULT
    np.testing.assert_array_equal(back.numpy(), an)
    sharded = pickle.loads(pickle.dumps(_OldTensor(Tensor(an).shard(("CPU", "CPU:1"), axis=1))))
    assert type(sharded) is Tensor and sharded.device == ("CPU", "CPU:1") and sharded.uop.axis == 1  # type: ignore[attr-defined]
    np.testing.assert_array_equal(sharded.numpy(), an)


def test_a_tensor_pickle_names_its_class() -> None:
    """A tensor's pickle carries the class it loads as (Tensor, also for an instance of a subclass)."""

    class Sub(Tensor):
        __slots__ = ()

    an = _rand(2, 3, seed=24)
    data = pickle.dumps(Sub(an))
    assert b"speck.tensor.tensor" in data and b"Sub" not in data
    back = pickle.loads(data)
    assert type(back) is Tensor
    np.testing.assert_array_equal(back.numpy(), an)
