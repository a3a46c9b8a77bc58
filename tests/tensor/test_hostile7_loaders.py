"""Archives and checkpoints whose bytes say one thing and a naive reader returns another: a sparse tar member (its
bytes in the archive are its data runs, not its contents), a tar member named twice, a stored zip member whose
central directory claims more bytes than it holds, and a PyTorch zip checkpoint written on a big-endian machine.
Each either reads exactly what the stdlib / numpy read, or is the format's named error. Then hypothesis mutates
valid safetensors, GGUF, tar, zip and PyTorch files: every load ends in the exact bytes a reference reader gives or
in a CheckpointError (a damaged stored zip member: a CorruptFileError when it is read), never a raw
IndexError/struct.error/UnicodeDecodeError/AssertionError."""

from __future__ import annotations

import collections
import gzip
import io
import json
import pathlib
import pickle
import struct
import sys
import tarfile
import types
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from speck.hcq.errors import CorruptFileError
from speck.tensor import Context, Tensor
from speck.tensor.errors import ArchiveError, CheckpointError, DatasetError, GGUFError, TorchLoadError
from speck.tensor.nn.datasets import CIFAR_BATCHES, CIFAR_RECORD, read_cifar_tar, read_idx
from speck.tensor.nn.state import gguf_load, safe_load, safe_save, tar_extract, torch_load, zip_extract


# ---------------- safetensors replaced after a lazy load ----------------
def test_a_lazy_safe_load_reads_the_file_it_loaded_even_after_a_save_over_it(tmp_path: pathlib.Path) -> None:
    # the header was read with open() and the file mapped at first use: a save that replaced it in between gave
    # each lazy tensor the new file's bytes at the old offsets (here "a" read "b"'s new values)
    p = tmp_path / "m.safetensors"
    a, b = np.arange(4, dtype=np.float32), np.arange(4, 10, dtype=np.int16)
    safe_save({"a": Tensor(a), "b": Tensor(b)}, p)
    sd = safe_load(p)
    safe_save({"b": Tensor(np.full(6, 99, np.int16)), "a": Tensor(np.full(4, 77, np.float32))}, p)
    np.testing.assert_array_equal(sd["a"].numpy(), a)
    np.testing.assert_array_equal(sd["b"].numpy(), b)
    new = safe_load(p)  # (and a load now reads the new file)
    np.testing.assert_array_equal(new["a"].numpy(), np.full(4, 77, np.float32))


def test_a_lazy_safe_load_of_no_file_is_still_a_file_not_found_error(tmp_path: pathlib.Path) -> None:
    for p in (tmp_path / "missing.safetensors", tmp_path):
        with pytest.raises(FileNotFoundError, match="not a file"):
            safe_load(p)


# ---------------- tar ----------------
def _tar(members: list[tuple[str, bytes]], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _sparse_tar(runs: list[tuple[int, bytes]], realsize: int, after: bytes) -> bytes:
    """A PAX 1.0 sparse member "x" (its data: a sparse map in decimal lines, padded to a block, then the runs),
    followed by a regular member "after"."""
    smap = f"{len(runs)}\n" + "".join(f"{off}\n{len(b)}\n" for off, b in runs)
    body = smap.encode().ljust(-(-len(smap) // 512) * 512, b"\0") + b"".join(b for _, b in runs)
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tf:
        info = tarfile.TarInfo("GNUSparseFile.0/x")
        info.size = len(body)
        info.pax_headers = {"GNU.sparse.major": "1", "GNU.sparse.minor": "0", "GNU.sparse.name": "x",
                            "GNU.sparse.realsize": str(realsize)}  # fmt: skip
        tf.addfile(info, io.BytesIO(body))
        info = tarfile.TarInfo("after")
        info.size = len(after)
        tf.addfile(info, io.BytesIO(after))
    return out.getvalue()


def test_a_sparse_tar_member_reads_as_its_contents(tmp_path: pathlib.Path) -> None:
    # its archive bytes are the sparse map and the runs: the slice read them as the file (and past them into
    # the next member) where tar gives the runs at their offsets and zeros between
    runs = [(0, b"A" * 1000), (60000, b"B" * 1536)]
    want = bytearray(61536)
    for off, b in runs:
        want[off : off + len(b)] = b
    after = bytes(range(256)) * 400
    p = tmp_path / "sparse.tar"
    p.write_bytes(_sparse_tar(runs, len(want), after))
    got = tar_extract(p)
    assert sorted(got) == ["after", "x"]
    assert got["x"].numpy().tobytes() == bytes(want)
    assert got["after"].numpy().tobytes() == after


def test_a_sparse_tar_member_beyond_the_ceiling_is_refused(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "sparse.tar"
    p.write_bytes(_sparse_tar([(0, b"A" * 512)], 10**6, b""))
    with Context(MAX_DECOMPRESSED_BYTES=10**5), pytest.raises(ArchiveError, match="MAX_DECOMPRESSED_BYTES"):
        tar_extract(p)


def test_a_tar_member_named_twice_is_refused(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "dup.tar"
    p.write_bytes(_tar([("w", b"first"), ("v", b"other"), ("w", b"second")]))
    with pytest.raises(ArchiveError, match="'w' appears twice"):
        tar_extract(p)
    p.write_bytes(_tar([("w", b"first"), ("v", b"other")]))
    assert {k: v.numpy().tobytes() for k, v in tar_extract(p).items()} == {"w": b"first", "v": b"other"}


# ---------------- zip ----------------
def _zip(members: list[tuple[str, bytes]]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        for name, data in members:
            z.writestr(name, data)
    return out.getvalue()


def test_a_stored_zip_member_claiming_more_bytes_than_it_holds_is_refused(tmp_path: pathlib.Path) -> None:
    raw = bytearray(_zip([("a", b"hello"), ("b", b"world!")]))
    cd = raw.index(b"PK\x01\x02")  # member a's central directory entry: uncompressed size at +24
    raw[cd + 24 : cd + 28] = struct.pack("<I", 40)  # (the slice would run into b's local header and data)
    p = tmp_path / "bad.zip"
    p.write_bytes(bytes(raw))
    with pytest.raises(ArchiveError, match="claims 40 bytes but holds 5"):
        zip_extract(p)


def test_a_stored_zip_member_whose_local_header_names_another_file_is_refused(tmp_path: pathlib.Path) -> None:
    # zipfile refuses such a member when it reads it; the slice read it as it stood
    raw = bytearray(_zip([("a", b"hello"), ("b", b"world!")]))
    raw[30] = ord("z")  # member a's local header name (its central directory still says "a")
    p = tmp_path / "renamed.zip"
    p.write_bytes(bytes(raw))
    with pytest.raises(zipfile.BadZipFile):
        zipfile.ZipFile(p).read("a")
    with pytest.raises(ArchiveError, match="local header naming b'z'"):
        zip_extract(p)


# ---------------- torch zip checkpoints written on a big-endian machine ----------------
class _Call:
    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.fn, self.args)


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> object:
        return obj if isinstance(obj, tuple) and len(obj) in (5, 6) and obj[0] == "storage" else None


STORAGES = {"float32": "FloatStorage", "float16": "HalfStorage", "int64": "LongStorage", "int16": "ShortStorage",
            "uint8": "ByteStorage", "float64": "DoubleStorage"}  # fmt: skip


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    """torch's names for the pickler to write (torch itself is not needed to make a checkpoint)."""
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*a: object) -> None:
        pass

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2  # type: ignore[attr-defined]
    torch._utils = utils  # type: ignore[attr-defined]
    for n in STORAGES.values():
        setattr(torch, n, type(n, (), {"__module__": "torch", "__qualname__": n}))
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return types.SimpleNamespace(torch=torch, rebuild=_rebuild_tensor_v2)


def _pth(ns: types.SimpleNamespace, arrays: dict[str, np.ndarray], byteorder: bytes | None, order: str) -> bytes:
    """A zip checkpoint of `arrays` (each its own storage, its bytes in `order` '<' or '>'), with a byteorder
    record saying `byteorder` (None: no record, as older torch wrote)."""
    obj, storages = {}, {}
    for i, (name, a) in enumerate(arrays.items()):
        kind = getattr(ns.torch, STORAGES[a.dtype.name])
        strides = tuple(s // a.itemsize for s in a.strides)
        pid = ("storage", kind, str(i), "cpu", a.size)
        obj[name] = _Call(ns.rebuild, pid, 0, a.shape, strides, False, collections.OrderedDict())
        storages[str(i)] = a.astype(a.dtype.newbyteorder(order)).tobytes()
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(obj)
    files = {"archive/data.pkl": out.getvalue(), **{f"archive/data/{k}": v for k, v in storages.items()}}
    if byteorder is not None:
        files["archive/byteorder"] = byteorder
    return _zip(list(files.items()))


ARRAYS = {
    "f32": np.linspace(-3, 7, 12, dtype=np.float32).reshape(3, 4),
    "f16": np.array([1.5, -2.25, 65504.0], dtype=np.float16),
    "i64": np.array([[1, -2], [2**40 + 3, -(2**62)]], dtype=np.int64),
    "i16": np.array([-300, 7, 32767], dtype=np.int16),
    "u8": np.array([1, 2, 250], dtype=np.uint8),
    "f64": np.array([np.pi, -1e300], dtype=np.float64),
}


@pytest.mark.parametrize(("byteorder", "order"), [(b"big", ">"), (b"little", "<"), (None, "<"), (b"big\n", ">")])
def test_a_zip_checkpoint_reads_its_values_in_the_byte_order_it_records(
    tmp_path: pathlib.Path, fake_torch: types.SimpleNamespace, byteorder: bytes | None, order: str
) -> None:
    # a big-endian checkpoint's storages were read as little-endian: every multi-byte value came back garbled
    p = tmp_path / "m.pth"
    p.write_bytes(_pth(fake_torch, ARRAYS, byteorder, order))
    got = torch_load(p)
    for name, a in ARRAYS.items():
        have = got[name].numpy()
        assert have.dtype == a.dtype
        np.testing.assert_array_equal(have, a)


def test_a_big_endian_bfloat16_storage_and_a_permuted_view_read_right(
    tmp_path: pathlib.Path, fake_torch: types.SimpleNamespace
) -> None:
    want = np.array([1.0, -2.5, 2.0**40 * 1.5, 0.0], dtype=np.float32)
    bf16_be = (want.view(np.uint32) >> 16).astype(">u2").tobytes()  # (exact: these values need only 8 mantissa bits)
    fake_torch.torch.BFloat16Storage = type("BFloat16Storage", (), {"__module__": "torch",
                                                                     "__qualname__": "BFloat16Storage"})  # fmt: skip
    f32 = np.arange(6, dtype=np.float32)
    obj = {"bf": _Call(fake_torch.rebuild, ("storage", fake_torch.torch.BFloat16Storage, "0", "cpu", 4), 0, (4,),
                       (1,), False, collections.OrderedDict()),
           "t": _Call(fake_torch.rebuild, ("storage", fake_torch.torch.FloatStorage, "1", "cpu", 6), 0, (3, 2),
                      (1, 3), False, collections.OrderedDict())}  # fmt: skip
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(obj)
    p = tmp_path / "bf.pth"
    p.write_bytes(_zip([("archive/data.pkl", out.getvalue()), ("archive/byteorder", b"big"),
                        ("archive/data/0", bf16_be), ("archive/data/1", f32.astype(">f4").tobytes())]))  # fmt: skip
    got = torch_load(p)
    np.testing.assert_array_equal(got["bf"].float().numpy(), want)
    np.testing.assert_array_equal(got["t"].numpy(), f32.reshape(2, 3).T)


@pytest.mark.parametrize("record", [b"middle", b"", b"\xff\xfe"])
def test_a_byteorder_record_of_neither_order_is_refused(
    tmp_path: pathlib.Path, fake_torch: types.SimpleNamespace, record: bytes
) -> None:
    p = tmp_path / "m.pth"
    p.write_bytes(_pth(fake_torch, {"f32": ARRAYS["f32"]}, record, "<"))
    with pytest.raises(TorchLoadError, match="byteorder"):
        torch_load(p)


def _legacy(obj: Any, storages: dict[str, np.ndarray]) -> bytes:
    """The pre-1.6 stream: magic, protocol, system info, the object, the storage keys, then each storage as an
    8-byte element count and its bytes."""
    info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(obj)
    raw = pickle.dumps(0x1950A86A20F9469CFC6C, 2) + pickle.dumps(1001, 2) + pickle.dumps(info, 2) + out.getvalue()
    raw += pickle.dumps(list(storages), 2)
    for a in storages.values():
        raw += struct.pack("<q", a.size) + a.tobytes()
    return raw


def _nest(leaf: Any, depth: int) -> Any:
    """depth levels of pairs of one shared tuple: a pickle of a few bytes a level, 2**depth paths to the leaf."""
    t = leaf
    for _ in range(depth):
        t = (t, t)
    return t


@pytest.mark.parametrize("depth", [3, 64])
def test_a_legacy_checkpoint_of_shared_nested_tuples_resolves_each_once(
    tmp_path: pathlib.Path, fake_torch: types.SimpleNamespace, depth: int
) -> None:
    # every path through the shared pairs was walked (and the tensor rebuilt on each): 2**64 of them for 64 levels
    # of a 700-byte file. Shared stays shared, as in the pickle
    a = np.arange(6, dtype=np.float32)
    leaf = _Call(fake_torch.rebuild, ("storage", fake_torch.torch.FloatStorage, "0", "cpu", 6), 0, (2, 3), (3, 1),
                 False, collections.OrderedDict())  # fmt: skip
    p = tmp_path / "nested.pt"
    p.write_bytes(_legacy({"t": _nest(leaf, depth), "u": [leaf, leaf]}, {"0": a}))
    got = torch_load(p)
    t = got["t"]
    for _ in range(depth):
        assert t[0] is t[1]
        t = t[0]
    assert t is got["u"][0] and got["u"][1] is t
    np.testing.assert_array_equal(t.numpy(), a.reshape(2, 3))


def test_a_legacy_storage_view_is_refused_not_read_from_its_roots_start(
    tmp_path: pathlib.Path, fake_torch: types.SimpleNamespace
) -> None:
    # a legacy persistent id's 6th field (view key, offset, size) was ignored: the tensor read the root storage
    # from element 0. A view of no storage (None, what torch has written since 0.4) still loads
    a = np.arange(8, dtype=np.float32)
    for view, want in [(("v", 4, 4), None), (None, a[:4])]:
        pid = ("storage", fake_torch.torch.FloatStorage, "0", "cpu", 8, view)
        leaf = _Call(fake_torch.rebuild, pid, 0, (4,), (1,), False, collections.OrderedDict())
        p = tmp_path / "view.pt"
        p.write_bytes(_legacy({"w": leaf}, {"0": a}))
        if want is None:
            with pytest.raises(TorchLoadError, match="view of another storage"):
                torch_load(p)
        else:
            np.testing.assert_array_equal(torch_load(p)["w"].numpy(), want)


@pytest.mark.parametrize("legacy", [False, True])
def test_a_broadcast_view_expanding_past_the_ceiling_is_refused(
    tmp_path: pathlib.Path, fake_torch: types.SimpleNamespace, legacy: bool
) -> None:
    # a stride of 0 over one stored float claimed 2**40 elements: the host gather tried to allocate 4 TiB
    def view(shape: tuple[int, ...], stride: tuple[int, ...]) -> _Call:
        return _Call(fake_torch.rebuild, ("storage", fake_torch.torch.FloatStorage, "0", "cpu", 3), 0, shape, stride,
                     False, collections.OrderedDict())  # fmt: skip

    a = np.array([1.5, -2.0, 3.0], dtype=np.float32)

    def write(obj: Any) -> pathlib.Path:
        p = tmp_path / "view.pt"
        if legacy:
            p.write_bytes(_legacy(obj, {"0": a}))
        else:
            out = io.BytesIO()
            _Pickler(out, protocol=2).dump(obj)
            p.write_bytes(_zip([("archive/data.pkl", out.getvalue()), ("archive/data/0", a.tobytes())]))
        return p

    with pytest.raises(TorchLoadError, match="MAX_DECOMPRESSED_BYTES"):
        torch_load(write({"w": view((2**20, 2**20), (0, 0))}))
    with Context(MAX_DECOMPRESSED_BYTES=1000), pytest.raises(TorchLoadError, match="1200 bytes"):
        torch_load(write({"w": view((100, 3), (0, 1))}))
    got = torch_load(write({"w": view((100, 3), (0, 1)), "t": view((3, 2), (1, 0))}))
    np.testing.assert_array_equal(got["w"].numpy(), np.broadcast_to(a, (100, 3)))
    np.testing.assert_array_equal(got["t"].numpy(), np.broadcast_to(a[:, None], (3, 2)))


@pytest.mark.parametrize("version", [2, 3])
def test_a_big_endian_gguf_is_named_as_such(tmp_path: pathlib.Path, version: int) -> None:
    p = tmp_path / "be.gguf"
    p.write_bytes(b"GGUF" + struct.pack(">IQQ", version, 0, 0))
    with pytest.raises(GGUFError, match=f"big-endian it is version {version}"):
        gguf_load(p)
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", version, 0, 0))  # (the same file little-endian: empty, and loads)
    assert gguf_load(p) == ({}, {})


@pytest.mark.parametrize("claim", ["key", "array", "ndim", "n_kv", "n_tensors"])
def test_a_gguf_length_past_the_file_is_refused_from_the_first_read(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, claim: str
) -> None:
    # a string length, array count, dim count or entry count beyond the file grew the header read 4x at a time
    # until it held the whole file (a 100 GB model read into memory) before saying "truncated"
    size = 5 << 20
    array = struct.pack("<Q", 1) + b"k" + struct.pack("<IIQ", 9, 4, 2**40)  # (key "k": an array of 2**40 uint32)
    ndim = struct.pack("<Q", 1) + b"t" + struct.pack("<I", 2**32 - 1)  # (tensor "t" of 2**32 - 1 dims)
    head = {"key": (0, 1, struct.pack("<Q", 2**40)), "array": (0, 1, array), "ndim": (1, 0, ndim),
            "n_kv": (0, size // 2, b""), "n_tensors": (size // 2, 0, b"")}  # fmt: skip
    n_tensors, n_kv, body = head[claim]
    p = tmp_path / "long.gguf"
    p.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body + bytes(size))
    reads: list[int] = []
    data = Tensor.data
    monkeypatch.setattr(Tensor, "data", lambda self: reads.append(self.numel()) or data(self))
    with pytest.raises(GGUFError, match="claims .* more bytes, but the file has"):
        gguf_load(p)
    assert max(reads) <= 1 << 20


# ---------------- mutation fuzzing: the exact bytes of a reference reader, or a named error ----------------
def _gguf() -> bytes:
    def s(x: str) -> bytes:
        return struct.pack("<Q", len(x)) + x.encode()

    kv = (s("general.name") + struct.pack("<I", 8) + s("m") + s("general.alignment") + struct.pack("<II", 4, 32)
          + s("arr") + struct.pack("<IIQ", 9, 5, 3) + struct.pack("<3i", 1, 2, 3))  # fmt: skip
    tensors = [("a", (4, 2), 0, np.arange(8, dtype=np.float32).tobytes()), ("b", (32,), 8, bytes(range(34))),
               ("c", (3,), 1, np.ones(3, np.float16).tobytes())]  # fmt: skip
    info, data = b"", b""
    for name, dims, gtype, raw in tensors:
        data += b"\0" * (-len(data) % 32)
        info += s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims)
        info += struct.pack("<IQ", gtype, len(data))
        data += raw
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), 3) + kv + info
    return head + b"\0" * (-len(head) % 32) + data


def _safetensors(d: pathlib.Path) -> bytes:
    p = d / "base.safetensors"
    safe_save({"a": Tensor(np.arange(6, dtype=np.float32).reshape(2, 3)), "b": Tensor(np.array([1, -2, 3])),
               "e": Tensor.empty(0, 3), "h": Tensor(np.ones(2, np.float16))}, p, metadata={"k": "v"})  # fmt: skip
    return p.read_bytes()


ST_NP = {"F32": "<f4", "F16": "<f2", "F64": "<f8", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1",
         "U16": "<u2", "U32": "<u4", "U64": "<u8", "BOOL": "u1"}  # fmt: skip


def _check_safetensors(raw: bytes, got: dict[str, Tensor]) -> None:
    """What a loaded mutant holds is what its header says, read by json and numpy."""
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header.pop("__metadata__", None)
    assert sorted(got) == sorted(header)
    for name, e in header.items():
        start, end = e["data_offsets"]
        t = got[name]
        assert t.shape == tuple(e["shape"])
        if e["dtype"] in ST_NP:  # (a little-endian host: numpy's bytes are the file's)
            want = np.frombuffer(raw[8 + n + start : 8 + n + end], dtype=ST_NP[e["dtype"]]).reshape(e["shape"])
            if e["dtype"] == "BOOL":
                np.testing.assert_array_equal(t.numpy(), want.astype(bool))
            else:
                assert t.numpy().tobytes() == want.tobytes()


def _check_tar(raw: bytes, got: dict[str, Tensor]) -> None:
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tf:
        want = {}
        for m in tf:
            if m.isfile():
                f = tf.extractfile(m)
                assert f is not None
                want[m.name] = f.read()
    assert {k: v.numpy().tobytes() for k, v in got.items()} == want


def _check_zip(raw: bytes, got: dict[str, Tensor]) -> None:
    # a member reads as the stdlib reads it (CRC-32 checked), or it is refused as the stdlib refuses it
    with zipfile.ZipFile(io.BytesIO(raw)) as zf:
        for i in zf.infolist():
            if i.is_dir():
                continue
            try:
                want = zf.read(i)
            except zipfile.BadZipFile:
                with pytest.raises(CorruptFileError):
                    got[i.filename].numpy()
                continue
            assert got[i.filename].numpy().tobytes() == want
    assert set(got) == {i.filename for i in zf.infolist() if not i.is_dir()}


def _realize(obj: Any) -> None:
    if isinstance(obj, Tensor):
        obj.numpy()
    elif isinstance(obj, dict):
        for v in obj.values():
            _realize(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            _realize(v)


INTS = [0, 1, 2, 7, 8, 31, 32, 255, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
MUTATION = st.tuples(st.sampled_from(["byte", "cut", "insert", "delete", "int"]), st.floats(0, 1, exclude_max=True),
                     st.integers(0, 255), st.sampled_from([1, 2, 4, 8]), st.sampled_from(INTS))  # fmt: skip


def _mutate(raw: bytes, ops: list[tuple[str, float, int, int, int]]) -> bytes:
    b = bytearray(raw)
    for op, where, byte, width, value in ops:
        if not b:
            break
        p = int(where * len(b))
        if op == "byte":
            b[p] = byte
        elif op == "cut":
            del b[p:]
        elif op == "insert":
            b[p:p] = bytes([byte]) * width
        elif op == "delete":
            del b[p : p + width]
        else:
            b[p : p + width] = (value % 256**width).to_bytes(width, "little")
    return bytes(b)


def _pth_base() -> bytes:
    ns = types.SimpleNamespace(torch=types.ModuleType("torch"), rebuild=None)
    saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*a: object) -> None:
        pass

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2  # type: ignore[attr-defined]
    for n in STORAGES.values():
        setattr(ns.torch, n, type(n, (), {"__module__": "torch", "__qualname__": n}))
    ns.rebuild = _rebuild_tensor_v2
    sys.modules["torch"], sys.modules["torch._utils"] = ns.torch, utils
    try:
        return _pth(ns, {"f32": ARRAYS["f32"], "i16": ARRAYS["i16"]}, b"big", ">")
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


Format = tuple[Callable[[pathlib.Path], bytes], Callable[[Any], Any], Callable[[bytes, Any], None] | None]
FORMATS: dict[str, Format] = {
    "safetensors": (_safetensors, safe_load, _check_safetensors),
    "gguf": (lambda d: _gguf(), gguf_load, None),
    "tar": (lambda d: _tar([("a.bin", b"hello"), ("d/b.bin", bytes(range(256)) * 3)]), tar_extract, _check_tar),
    "zip": (lambda d: _zip([("a", b"hello"), ("b", bytes(300))]), zip_extract, _check_zip),
    "pth": (lambda d: _pth_base(), torch_load, None),
}


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=st.lists(MUTATION, min_size=1, max_size=3))
def test_a_mutated_file_loads_exactly_or_is_a_checkpoint_error(tmp_path: pathlib.Path, fmt: str,
                                                              ops: list[Any]) -> None:  # fmt: skip
    make, load, check = FORMATS[fmt]
    raw = _mutate(make(tmp_path), ops)
    p = tmp_path / f"mutant.{fmt}"
    p.write_bytes(raw)
    try:
        got = load(p)
        _realize(got)
    except (CheckpointError, CorruptFileError) as e:  # (a damaged stored member: when it is read)
        assert str(e)  # (a message that says something)
        return
    if check is not None:
        check(raw, got)


# ---------------- dataset files ----------------
def _idx(a: np.ndarray) -> bytes:
    return struct.pack(">HBB", 0, 8, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape) + a.tobytes()


def test_a_gzipped_idx_file_reads_as_numpy_and_a_corrupt_or_bomb_one_is_a_dataset_error(tmp_path: pathlib.Path) -> None:
    a = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    p = tmp_path / "t.gz"
    good = gzip.compress(_idx(a))
    p.write_bytes(good)
    np.testing.assert_array_equal(read_idx(p), a)
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # (a corrupt deflate stream was a bare zlib.error)
    p.write_bytes(bytes(bad))
    with pytest.raises(DatasetError, match="delete it and retry"):
        read_idx(p)
    p.write_bytes(gzip.compress(_idx(np.zeros((100, 1000), np.uint8))))  # 100 kB of zeros: a few hundred bytes
    with Context(MAX_DECOMPRESSED_BYTES=50_000), pytest.raises(DatasetError, match="MAX_DECOMPRESSED_BYTES"):
        read_idx(p)


def _cifar(tmp_path: pathlib.Path, batches: dict[str, bytes], level: int = 9) -> pathlib.Path:
    p = tmp_path / "cifar.tar.gz"
    with tarfile.open(p, "w:gz", compresslevel=level) as tf:
        for name, data in batches.items():
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return p


def test_a_cifar_tarball_reads_its_records_and_a_corrupt_or_huge_one_is_a_dataset_error(
    tmp_path: pathlib.Path,
) -> None:
    rng = np.random.default_rng(3)
    records = {n: rng.integers(0, 256, (2, CIFAR_RECORD), dtype=np.uint8) for n in CIFAR_BATCHES}
    p = _cifar(tmp_path, {n: r.tobytes() for n, r in records.items()})
    xtr, ytr, xte, yte = read_cifar_tar(p)
    train = np.concatenate([records[n] for n in CIFAR_BATCHES[:5]])
    np.testing.assert_array_equal(xtr, train[:, 1:].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(ytr, train[:, 0])
    np.testing.assert_array_equal(xte, records["test_batch.bin"][:, 1:].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(yte, records["test_batch.bin"][:, 0])
    raw = bytearray(p.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    p.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="delete it and retry"):
        read_cifar_tar(p)
    # stored deflate blocks hold the pixels as they are: one flipped there read as a changed pixel, since tarfile
    # stops before the gzip trailer whose CRC would catch it
    p = _cifar(tmp_path, {n: r.tobytes() for n, r in records.items()}, level=0)
    raw = bytearray(p.read_bytes())
    at = raw.index(records["data_batch_3.bin"][1, 100:140].tobytes()) + 7
    raw[at] ^= 0x01
    p.write_bytes(bytes(raw))
    with pytest.raises(DatasetError, match="CRC"):
        read_cifar_tar(p)
    p = _cifar(tmp_path, {n: r.tobytes() for n, r in records.items()})
    with Context(MAX_DECOMPRESSED_BYTES=1000), pytest.raises(DatasetError, match="MAX_DECOMPRESSED_BYTES"):
        read_cifar_tar(p)
