"""tinygrad-parity system API: helpers utilities, engine.realize objects, JIT cache view, checkpoint readers
(torch_load/tar/zip/TensorIO), Tensor.test/schedule, fp8 helpers. Values are checked against numpy/the stdlib."""

from __future__ import annotations

import collections
import io
import math
import pathlib
import pickle
import sys
import tarfile
import types
import zipfile

import numpy as np
import pytest

from speck.tensor import Context, Tensor, TinyJit, dtypes
from speck.tensor import helpers as H
from speck.tensor.dtype import float_to_fp8, fp8_to_float
from speck.tensor.engine.jit import graph_class
from speck.tensor.engine.realize import BufferCopy, CompiledRunner, ExecItem, lower_schedule, run_schedule
from speck.tensor.nn.state import TensorIO, tar_extract, torch_load, zip_extract
from speck.uop import Ops


def test_sequence_and_string_helpers() -> None:
    assert H.partition(range(6), lambda x: x % 2 == 0) == ([0, 2, 4], [1, 3, 5])
    obj = types.SimpleNamespace(layers=[{"w": 7}])
    assert H.get_child(obj, "layers.0.w") == 7
    assert H.merge_dicts([{"a": 1}, {"b": 2}, {"a": 1}]) == {"a": 1, "b": 2}
    with pytest.raises(ValueError, match="two values"):
        H.merge_dicts([{"a": 1}, {"a": 2}])
    assert H.strip_parens("(a+b)") == "a+b" and H.strip_parens("(a)+(b)") == "(a)+(b)"
    assert H.ansilen(H.colored("abc", "red")) == 3
    assert H.to_function_name("r_4:x") == "r_43Ax"
    assert H.fully_flatten([[1, [2]], np.array([[3, 4]])]) == [1, 2, 3, 4]
    assert H.make_tuple(3, 2) == (3, 3) and H.make_tuple((1, 2), 2) == (1, 2)
    assert H.getbits(0b101100, 2, 4) == 0b011 and H.i2u(8, -1) == 255
    assert H.ceildiv(7, 2) == 4 and H.ceildiv(-7, 2) == -3


def test_polyN_matches_numpy() -> None:
    p = [0.5, -2.0, 3.0, 1.25]
    xs = np.linspace(-2, 2, 9)
    np.testing.assert_allclose([H.polyN(float(x), p) for x in xs], np.polyval(p, xs))
    np.testing.assert_allclose(H.polyN(Tensor(xs.astype(np.float32)), p).numpy(), np.polyval(p, xs), rtol=1e-5)


def test_memoryview_helpers_alias_memory() -> None:
    buf = bytearray(b"\x01\x02\x03\x04")
    mv = memoryview(buf)
    assert bytes(H.to_mv(H.mv_address(mv), 4)) == b"\x01\x02\x03\x04"
    H.from_mv(mv)[0] = b"\x09"
    assert buf[0] == 9


def test_diskcache_round_trip_and_off(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    H.diskcache_put("probe table", ("k", 1), {"v": [1, 2]})
    assert H.diskcache_get("probe table", ("k", 1)) == {"v": [1, 2]}
    assert H.diskcache_get("probe table", ("k", 2)) is None
    calls = []

    @H.diskcache
    def square(x: int) -> int:
        calls.append(x)
        return x * x

    assert square(5) == 25 and square(5) == 25 and calls == [5]
    with Context(CACHELEVEL=0):
        assert H.diskcache_get("probe table", ("k", 1)) is None


def test_tqdm_iterates_and_counts() -> None:
    bar = H.tqdm(range(4), disable=True)
    assert list(bar) == [0, 1, 2, 3] and bar.n == 4
    assert list(H.trange(3, disable=True)) == [0, 1, 2]


def test_fetch_offline_raises_connection_error(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    with pytest.raises(ConnectionError, match="127.0.0.1"):
        H.fetch("http://127.0.0.1:9/nothing.bin")
    local = tmp_path / "x.bin"
    local.write_bytes(b"hi")
    assert H.fetch(f"file://{local}").read_bytes() == b"hi"


def test_lower_schedule_runs_exec_items() -> None:
    a = Tensor([1.0, 2.0, 3.0]).realize()
    b = a * 2 + 1
    items = [ei for _, ei in lower_schedule(b.schedule())]
    assert items and all(isinstance(ei, ExecItem) for ei in items)
    assert any(isinstance(ei.prg, CompiledRunner) for ei in items)
    for ei in items:
        ei.run()
    np.testing.assert_array_equal(b.numpy(), [3, 5, 7])


def test_schedule_of_several_tensors_and_run_schedule() -> None:
    x = Tensor([1.0, 2.0]).realize()
    a, b = x + 1, x * 3
    sched = a.schedule(b)
    run_schedule(sched)
    np.testing.assert_array_equal(a.numpy(), [2, 3])
    np.testing.assert_array_equal(b.numpy(), [3, 6])
    _, var_vals = (x + 1).schedule_with_vars()
    assert var_vals == {}


def test_jit_cache_is_exec_items() -> None:
    f = TinyJit(lambda x: (x * 2 + 1).realize())
    for _ in range(3):
        x = Tensor.rand(8).realize()
        np.testing.assert_allclose(f(x).numpy(), x.numpy() * 2 + 1, rtol=1e-6)
    cache = f.jit_cache
    assert cache and all(isinstance(ei, ExecItem) for ei in cache)
    assert f.captured is not None and [type(ei.prg) for ei in f.captured.jit_cache] == [type(ei.prg) for ei in cache]
    assert all(isinstance(ei.prg, (CompiledRunner, BufferCopy)) for ei in cache)
    # each kernel's ExecItem carries the kernel's AST (what tools that re-lower a capture read)
    kernels = [ei for ei in cache if isinstance(ei.prg, CompiledRunner)]
    assert kernels and all(ei.si.ast is not None and ei.si.ast.op is Ops.SINK for ei in kernels)
    from speck.tensor import Device

    assert graph_class(Device[Device.DEFAULT]) is Device[Device.DEFAULT].graph


def test_buffer_as_buffer() -> None:
    t = Tensor(np.arange(5, dtype=np.int32)).realize()
    from speck.tensor.realize import get_buffer

    buf = get_buffer(t.uop.base if hasattr(t.uop, "base") else t.uop)
    assert np.frombuffer(buf.as_buffer(), dtype=np.int32).tolist() == list(range(5))
    assert np.frombuffer(buf.as_buffer(allow_zero_copy=True), dtype=np.int32).tolist() == list(range(5))


def test_train_and_test_contexts() -> None:
    assert not Tensor.training
    with Tensor.train():
        assert Tensor.training
        with Tensor.test():
            assert not Tensor.training
        assert Tensor.training
    assert not Tensor.training


def test_fp8_helpers_round_trip_every_pattern() -> None:
    for dt in (dtypes.fp8e4m3, dtypes.fp8e5m2):
        for bits in range(256):
            v = fp8_to_float(bits, dt)
            if math.isnan(v):
                continue
            assert float_to_fp8(v, dt) == bits, (dt, bits, v)
    assert fp8_to_float(float_to_fp8(1e6, dtypes.fp8e4m3), dtypes.fp8e4m3) == 448.0  # saturates (no inf)
    with pytest.raises(ValueError, match="not an fp8"):
        float_to_fp8(1.0, dtypes.float32)


# ---------------- checkpoint readers ----------------
def _fake_torch(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Just enough of a `torch` module for pickle to name its classes while writing a checkpoint by hand."""
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*a: object) -> None:
        pass

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2  # type: ignore[attr-defined]
    torch._utils = utils  # type: ignore[attr-defined]
    for n in ("FloatStorage", "LongStorage", "HalfStorage"):
        setattr(torch, n, type(n, (), {"__module__": "torch"}))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return torch


class _Rebuild:
    def __init__(self, fn: object, args: tuple[object, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[object, ...]:
        return (self.fn, self.args)


def test_torch_load_zip_checkpoint(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    torch = _fake_torch(monkeypatch)
    base = np.arange(12, dtype=np.float32).reshape(3, 4)
    arrays = {"w": base, "wt": base.T, "i": np.array([5, -7], dtype=np.int64), "h": np.array([1.5, -2], np.float16)}
    kinds = {np.float32: torch.FloatStorage, np.int64: torch.LongStorage, np.float16: torch.HalfStorage}
    storages = {"w": ("0", base), "wt": ("0", base), "i": ("1", arrays["i"]), "h": ("2", arrays["h"])}
    od: collections.OrderedDict[str, object] = collections.OrderedDict()
    for k, a in arrays.items():
        key, st = storages[k]
        pid = ("storage", kinds[st.dtype.type], key, "cpu", st.size)
        strides = tuple(s // a.itemsize for s in a.strides)
        od[k] = _Rebuild(torch._utils._rebuild_tensor_v2, (pid, 0, a.shape, strides, False, collections.OrderedDict()))

    class P(pickle.Pickler):
        def persistent_id(self, obj: object) -> object:
            return obj if isinstance(obj, tuple) and len(obj) == 5 and obj[0] == "storage" else None

    data = io.BytesIO()
    P(data, protocol=2).dump({"model": od, "epoch": 3})
    fn = tmp_path / "ck.pt"
    with zipfile.ZipFile(fn, "w") as z:
        z.writestr("ck/data.pkl", data.getvalue())
        for key, st in {"0": base, "1": arrays["i"], "2": arrays["h"]}.items():
            z.writestr(f"ck/data/{key}", st.tobytes())
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delitem(sys.modules, "torch._utils")
    out = torch_load(fn)
    assert out["epoch"] == 3
    for k, a in arrays.items():
        got = out["model"][k].to("CPU").numpy()
        assert got.dtype == a.dtype, k
        np.testing.assert_array_equal(got, a, err_msg=k)


def test_torch_load_rejects_other_files(tmp_path: pathlib.Path) -> None:
    fn = tmp_path / "x.bin"
    fn.write_bytes(b"\x00" * 64)
    with pytest.raises(ValueError, match="PyTorch"):
        torch_load(fn)


def test_tar_zip_extract_and_tensorio(tmp_path: pathlib.Path) -> None:
    payload = {"a.txt": b"hello world", "dir/b.bin": bytes(range(200))}
    tfn = tmp_path / "a.tar"
    with tarfile.open(tfn, "w") as tf:
        for name, data in payload.items():
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    got = tar_extract(tfn)
    assert {k: v.to("CPU").numpy().tobytes() for k, v in got.items()} == payload
    zfn = tmp_path / "a.zip"
    with zipfile.ZipFile(zfn, "w") as z:
        z.writestr("stored", payload["a.txt"], compress_type=zipfile.ZIP_STORED)
        z.writestr("deflated", payload["dir/b.bin"] * 4, compress_type=zipfile.ZIP_DEFLATED)
    zgot = zip_extract(zfn)
    assert zgot["stored"].to("CPU").numpy().tobytes() == payload["a.txt"]
    assert zgot["deflated"].to("CPU").numpy().tobytes() == payload["dir/b.bin"] * 4
    f = TensorIO(Tensor(np.frombuffer(b"0123456789", dtype=np.uint8).copy()))
    assert f.read(3) == b"012"
    f.seek(-2, io.SEEK_END)
    assert f.read() == b"89"
    with pytest.raises(ValueError, match="1-D uint8"):
        TensorIO(Tensor([1.0, 2.0]))
