"""A corpus of hostile model files, generated here: legacy and zip `.pth` checkpoints whose pickles try to run code
or whose tensor views reach outside their storage, decompression bombs, and truncated, oversized or malformed
safetensors and GGUF files. Loading any of them must end in the format's named error (a CheckpointError), run no
code (the canary file an exploit would create stays absent), crash nothing (the corpus is loaded in a child process
whose exit status is checked) and change no file (every file is hashed before and after)."""

from __future__ import annotations

import collections
import hashlib
import io
import json
import os
import pathlib
import pickle
import struct
import subprocess
import sys
import tempfile
import textwrap
import types
import zipfile
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes
from speck.tensor.errors import CheckpointError, GGUFError, SafetensorsError, TorchLoadError, UnsafePickleError
from speck.tensor.nn.state import safe_load, safe_save, torch_load

MAGIC = 0x1950A86A20F9469CFC6C  # the legacy PyTorch format's magic number


# ---------------- pickles that name torch's classes (written with a stand-in torch module) ----------------
class _Call:
    """Pickles as `fn(*args)`: what an exploit, and torch's own tensors, look like in a pickle."""

    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.fn, self.args)


def _fake_torch() -> types.SimpleNamespace:
    torch = types.ModuleType("torch")
    utils = types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*a: object) -> None:
        pass

    _rebuild_tensor_v2.__module__, _rebuild_tensor_v2.__qualname__ = "torch._utils", "_rebuild_tensor_v2"
    utils._rebuild_tensor_v2 = _rebuild_tensor_v2  # type: ignore[attr-defined]
    torch._utils = utils  # type: ignore[attr-defined]
    for n in ("FloatStorage", "LongStorage"):
        setattr(torch, n, type(n, (), {"__module__": "torch"}))
    return types.SimpleNamespace(torch=torch, utils=utils)


@pytest.fixture
def torch_names(monkeypatch: pytest.MonkeyPatch) -> types.SimpleNamespace:
    ns = _fake_torch()
    monkeypatch.setitem(sys.modules, "torch", ns.torch)
    monkeypatch.setitem(sys.modules, "torch._utils", ns.utils)
    return ns


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj: object) -> object:
        return obj if isinstance(obj, tuple) and len(obj) == 5 and obj[0] == "storage" else None


def _pickle(obj: Any) -> bytes:
    out = io.BytesIO()
    _Pickler(out, protocol=2).dump(obj)
    return out.getvalue()


def _tensor(ns: types.SimpleNamespace, key: str, numel: int, offset: Any, shape: Any, stride: Any) -> _Call:
    pid = ("storage", ns.torch.FloatStorage, key, "cpu", numel)
    return _Call(ns.utils._rebuild_tensor_v2, pid, offset, shape, stride, False, collections.OrderedDict())


def _zip_pth(data_pkl: bytes, storages: dict[str, bytes], deflate: bool = False) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        z.writestr("archive/data.pkl", data_pkl)
        for key, raw in storages.items():
            z.writestr(f"archive/data/{key}", raw)
    return out.getvalue()


def _legacy_pth(obj_pkl: bytes, keys: list[str], storages: dict[str, bytes], head: list[bytes] | None = None,
                keys_pkl: bytes | None = None) -> bytes:  # fmt: skip
    """The pre-1.6 stream: magic, protocol and system-info pickles, the object, the storage keys, then each storage
    as an 8-byte element count (float32 here) and its bytes."""
    info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    parts = head if head is not None else [pickle.dumps(MAGIC, 2), pickle.dumps(1001, 2), pickle.dumps(info, 2)]
    out = b"".join(parts) + obj_pkl + (keys_pkl if keys_pkl is not None else pickle.dumps(keys, 2))
    for k in keys:
        raw = storages.get(k, b"")
        out += struct.pack("<q", len(raw) // 4) + raw
    return out


# ---------------- the exploits: each creates the canary file if it runs ----------------
def _exploits(canary: pathlib.Path) -> dict[str, bytes]:
    c = str(canary)
    return {
        "open": pickle.dumps(_Call(open, c, "w"), 2),
        "exec": pickle.dumps(_Call(exec, f"open({c!r}, 'w').close()"), 2),
        "os_system": pickle.dumps(_Call(os.system, f"touch {c}"), 2),
        "subprocess": pickle.dumps(_Call(subprocess.call, ["touch", c]), 2),
        # the Python 2 spelling of builtins, and a protocol-0 stream written by hand
        "py2_eval": f"c__builtin__\neval\n(V__import__('os').system('touch {c}')\ntR.".encode(),
        # an allowed container around the exploit: the forbidden name is still refused when it is read
        "nested": pickle.dumps({"model": collections.OrderedDict(w=_Call(open, c, "w"))}, 2),
    }


def _safetensors(header: Any, data: bytes = b"", hlen: int | None = None) -> bytes:
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    return struct.pack("<Q", len(js) if hlen is None else hlen) + js + data


def _gguf(body: bytes, version: int = 3, n_tensors: int = 0, n_kv: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", version, n_tensors, n_kv) + body


def _gs(x: str | bytes) -> bytes:
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def build_corpus(d: pathlib.Path, ns: types.SimpleNamespace, canary: pathlib.Path) -> dict[str, tuple[str, type]]:
    """Write the hostile files into d: name -> (loader, the error class loading it must raise)."""
    cases: dict[str, tuple[bytes, str, type]] = {}
    f4 = np.arange(4, dtype=np.float32).tobytes()
    good_obj = _pickle({"w": _tensor(ns, "0", 4, 0, (4,), (1,))})
    info = {"protocol_version": 1001, "little_endian": True, "type_sizes": {"short": 2, "int": 4, "long": 4}}
    for name, exploit in _exploits(canary).items():
        cases[f"zip_{name}"] = (_zip_pth(exploit, {}), "torch", UnsafePickleError)
        cases[f"legacy_object_{name}"] = (_legacy_pth(exploit, [], {}), "torch", UnsafePickleError)
    # the legacy stream's other pickles went through plain pickle.load: an exploit in each of them
    ex = _exploits(canary)["os_system"]
    m, p, i = pickle.dumps(MAGIC, 2), pickle.dumps(1001, 2), pickle.dumps(info, 2)
    cases["legacy_magic_exploit"] = (ex + p + i + good_obj, "torch", UnsafePickleError)
    cases["legacy_protocol_exploit"] = (_legacy_pth(good_obj, ["0"], {"0": f4}, [m, ex, i]), "torch", UnsafePickleError)
    cases["legacy_sysinfo_exploit"] = (_legacy_pth(good_obj, ["0"], {"0": f4}, [m, p, ex]), "torch", UnsafePickleError)
    cases["legacy_keys_exploit"] = (_legacy_pth(good_obj, ["0"], {"0": f4}, keys_pkl=ex), "torch", UnsafePickleError)
    # views outside their storage (a large stride used to segfault inside numpy)
    views = {
        "huge_stride": (4, 0, (2, 2), (1 << 40, 1)),
        "stride_past_end": (4, 0, (4,), (3,)),
        "negative_offset": (4, -2, (4,), (1,)),
        "offset_past_end": (4, 3, (4,), (1,)),
        "negative_stride": (4, 3, (4,), (-1,)),
        "negative_dim": (4, 0, (-4,), (1,)),
        "rank_mismatch": (4, 0, (2, 2), (1,)),
        "float_shape": (4, 0, (2.5,), (1,)),
        "string_stride": (4, 0, (2,), ("1",)),
        "storage_larger_than_its_bytes": (64, 0, (64,), (1,)),
    }
    for name, (numel, off, shape, stride) in views.items():
        obj = _pickle({"w": _tensor(ns, "0", numel, off, shape, stride)})
        cases[f"zip_{name}"] = (_zip_pth(obj, {"0": f4}), "torch", TorchLoadError)
        cases[f"legacy_{name}"] = (_legacy_pth(obj, ["0"], {"0": f4}), "torch", TorchLoadError)
    cases["zip_missing_storage"] = (_zip_pth(good_obj, {}), "torch", TorchLoadError)
    cases["zip_no_data_pkl"] = (_zip_only({"x": b"1"}), "torch", TorchLoadError)
    cases["zip_truncated"] = (_zip_pth(good_obj, {"0": f4})[:-30], "torch", CheckpointError)
    cases["zip_pickle_garbage"] = (_zip_pth(b"\x80\x02}q\x00(X\x01", {}), "torch", TorchLoadError)
    cases["zip_persistent_id_garbage"] = (_zip_pth(_pickle({"w": ("storage", 1, 2, 3, "x")}), {}), "torch",
                                          TorchLoadError)  # fmt: skip
    cases["zip_build_on_a_dict"] = (_zip_pth(b"\x80\x02}q\x00}q\x01X\x01\x00\x00\x00aK\x01sb.", {}), "torch",
                                    TorchLoadError)  # fmt: skip
    cases["legacy_storage_key_unknown"] = (_legacy_pth(good_obj, ["9"], {"9": f4}), "torch", TorchLoadError)
    cases["legacy_storage_truncated"] = (_legacy_pth(good_obj, ["0"], {"0": f4})[:-8], "torch", TorchLoadError)
    deep = b"\x80\x02" + b"]" * 200_000 + b"a" * (200_000 - 1) + b"."  # a list in a list in a list...
    cases["legacy_deep_nesting"] = (_legacy_pth(deep, [], {}), "torch", TorchLoadError)
    cases["legacy_not_a_checkpoint"] = (pickle.dumps(12345, 2) + b"junk", "torch", TorchLoadError)
    # a deflated member expanding past MAX_DECOMPRESSED_BYTES (set to 1 MiB for the child): 8 MiB from ~8 KiB
    cases["zip_bomb"] = (_zip_pth(good_obj, {"0": bytes(8 << 20)}, deflate=True), "torch", CheckpointError)
    cases["zip_member_size_lies"] = (_lying_zip(), "zip", CheckpointError)
    # safetensors
    st_ok = {"w": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}
    cases["st_truncated"] = (_safetensors(st_ok, f4[:8]), "safetensors", SafetensorsError)
    cases["st_header_past_end"] = (_safetensors(st_ok, f4, hlen=1 << 40), "safetensors", SafetensorsError)
    cases["st_reversed_offsets"] = (_safetensors({"w": {"dtype": "U8", "shape": [0], "data_offsets": [16, 0]}}, f4),
                                    "safetensors", SafetensorsError)  # fmt: skip
    cases["st_negative_dims_reversed"] = (_safetensors({"w": {"dtype": "F32", "shape": [-4], "data_offsets": [16, 0]}},
                                          f4), "safetensors", SafetensorsError)  # fmt: skip
    cases["st_negative_dims_pair"] = (_safetensors({"w": {"dtype": "F32", "shape": [-1, -4], "data_offsets": [0, 16]}},
                                      f4), "safetensors", SafetensorsError)  # fmt: skip
    cases["st_deep_json"] = (_safetensors(b"[" * 100_000 + b"]" * 100_000), "safetensors", SafetensorsError)
    cases["st_float_offsets"] = (_safetensors({"w": {"dtype": "F32", "shape": [4], "data_offsets": [0.5, 16.5]}}, f4),
                                 "safetensors", SafetensorsError)  # fmt: skip
    cases["st_bool_shape"] = (_safetensors({"w": {"dtype": "U8", "shape": [True], "data_offsets": [0, 1]}}, f4),
                              "safetensors", SafetensorsError)  # fmt: skip
    cases["st_list_dtype"] = (_safetensors({"w": {"dtype": ["F32"], "shape": [4], "data_offsets": [0, 16]}}, f4),
                              "safetensors", SafetensorsError)  # fmt: skip
    cases["st_entry_not_object"] = (_safetensors({"w": [1, 2]}, f4), "safetensors", SafetensorsError)
    cases["st_metadata_list"] = (_safetensors({"__metadata__": [1], **st_ok}, f4), "safetensors", SafetensorsError)
    cases["st_metadata_values"] = (_safetensors({"__metadata__": {"a": {"b": 1}}, **st_ok}, f4), "safetensors",
                                   SafetensorsError)  # fmt: skip
    cases["st_not_utf8"] = (_safetensors(b"\xff\xfe{}"), "safetensors", SafetensorsError)
    # GGUF
    nested = struct.pack("<I", 9) + b"".join(struct.pack("<IQ", 9, 1) for _ in range(50_000)) + struct.pack("<IQ", 4, 0)
    cases["gguf_deep_arrays"] = (_gguf(_gs("k") + nested, n_kv=1), "gguf", GGUFError)
    cases["gguf_truncated"] = (_gguf(_gs("k") + struct.pack("<I", 8) + struct.pack("<Q", 1 << 20), n_kv=1), "gguf",
                               GGUFError)  # fmt: skip
    cases["gguf_huge_counts"] = (_gguf(b"", n_tensors=1 << 62, n_kv=1 << 62), "gguf", GGUFError)
    cases["gguf_bad_magic"] = (b"GGML" + bytes(40), "gguf", GGUFError)
    cases["gguf_bad_utf8"] = (_gguf(_gs(b"\xff\xfe") + struct.pack("<I", 4) + bytes(4), n_kv=1), "gguf", GGUFError)
    cases["gguf_unknown_value_type"] = (_gguf(_gs("k") + struct.pack("<I", 99) + bytes(8), n_kv=1), "gguf", GGUFError)
    tensor_info = _gs("w") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 0, 1 << 60)
    cases["gguf_tensor_past_end"] = (_gguf(tensor_info + bytes(64), n_tensors=1), "gguf", GGUFError)
    unknown_type = _gs("w") + struct.pack("<I", 1) + struct.pack("<Q", 4) + struct.pack("<IQ", 77, 0)
    cases["gguf_unknown_tensor_type"] = (_gguf(unknown_type + bytes(64), n_tensors=1), "gguf", GGUFError)
    bad_align = _gs("general.alignment") + struct.pack("<I", 4) + struct.pack("<I", 0)
    cases["gguf_zero_alignment"] = (_gguf(bad_align, n_kv=1), "gguf", GGUFError)
    dims = _gs("w") + struct.pack("<I", 2) + struct.pack("<QQ", 1 << 40, 1 << 40) + struct.pack("<IQ", 0, 0)
    cases["gguf_dims_overflow"] = (_gguf(dims + bytes(64), n_tensors=1), "gguf", GGUFError)
    out: dict[str, tuple[str, type]] = {}
    for name, (blob, loader, err) in cases.items():
        (d / name).write_bytes(blob)
        out[name] = (loader, err)
    return out


def _zip_only(members: dict[str, bytes], deflate: bool = False) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED if deflate else zipfile.ZIP_STORED) as z:
        for k, v in members.items():
            z.writestr(k, v)
    return out.getvalue()


def _lying_zip() -> bytes:
    """A deflated member of 4 MiB whose headers say it holds 16 bytes."""
    blob = bytearray(_zip_only({"m": bytes(4 << 20)}, deflate=True))
    struct.pack_into("<I", blob, 22, 16)  # the local header's uncompressed size
    cd = blob.find(b"PK\x01\x02")
    struct.pack_into("<I", blob, cd + 24, 16)  # the central directory's
    return bytes(blob)


# ---------------- running the corpus in a child process ----------------
CHILD = textwrap.dedent("""
    import json, sys, pathlib
    from speck.tensor import Tensor
    from speck.tensor.nn.state import gguf_load, safe_load, torch_load, zip_extract
    loaders = {"torch": torch_load, "safetensors": lambda p: {k: v.numpy() for k, v in safe_load(p).items()},
               "gguf": lambda p: gguf_load(Tensor(pathlib.Path(p))), "zip": zip_extract}
    out = {}
    for name, loader in json.loads(sys.argv[2]).items():
        try:
            loaders[loader](pathlib.Path(sys.argv[1]) / name)
            out[name] = ["no error", [], ""]
        except BaseException as e:
            out[name] = [type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)[:300]]
    print(json.dumps(out))
""")


def _hashes(d: pathlib.Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def _build_with_torch_names(d: pathlib.Path, canary: pathlib.Path) -> dict[str, tuple[str, type]]:
    """build_corpus with the stand-in torch module importable while the pickles are written (and removed after)."""
    ns = _fake_torch()
    saved = {k: sys.modules.get(k) for k in ("torch", "torch._utils")}
    sys.modules["torch"], sys.modules["torch._utils"] = ns.torch, ns.utils
    try:
        return build_corpus(d, ns, canary)
    finally:
        for k, v in saved.items():
            if v is None:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v


@pytest.fixture(scope="module")
def corpus_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], dict[str, tuple[str, type]],
                                                                             pathlib.Path]]:  # fmt: skip
    d = tmp_path_factory.mktemp("hostile")
    canary = tmp_path_factory.mktemp("canary") / "pwned"
    cases = _build_with_torch_names(d, canary)
    before = _hashes(d)
    env = {**os.environ, "MAX_DECOMPRESSED_BYTES": str(1 << 20)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(d), json.dumps({k: v[0] for k, v in cases.items()})],
                          capture_output=True, text=True, env=env)  # fmt: skip
    assert proc.returncode == 0, f"the loader process died (status {proc.returncode}):\n{proc.stderr[-3000:]}"
    assert not canary.exists(), f"an exploit ran: {canary} was created"
    assert _hashes(d) == before, "loading changed a file of the corpus"
    yield json.loads(proc.stdout.splitlines()[-1]), cases, canary


def _case_names() -> list[str]:
    with tempfile.TemporaryDirectory(prefix="speck-corpus-names-") as d:
        return sorted(_build_with_torch_names(pathlib.Path(d), pathlib.Path(d) / "canary"))


CASE_NAMES = _case_names()


@pytest.mark.parametrize("name", CASE_NAMES)
def test_hostile_file_raises_its_formats_named_error(corpus_run: Any, name: str) -> None:
    results, cases, _ = corpus_run
    cls, mro, msg = results[name]
    want = cases[name][1]
    assert want.__name__ in mro, f"{name}: expected {want.__name__}, got {cls}: {msg}"
    assert "CheckpointError" in mro and msg, f"{name}: {cls}: {msg}"


# ---------------- reading never writes ----------------
def test_a_file_truncated_after_safe_load_is_an_error_and_stays_as_it_is(tmp_path: pathlib.Path) -> None:
    from speck.hcq.errors import HCQError

    path = tmp_path / "m.safetensors"
    safe_save({"w": Tensor(np.arange(1024, dtype=np.float32))}, path)
    sd = safe_load(path)  # lazy: nothing is read yet (the file is mapped)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the file shrinks before the tensor is read
    with pytest.raises(HCQError, match="smaller than|shrank to"):
        sd["w"].numpy()
    assert path.read_bytes() == data[: len(data) // 2]  # not extended with zeros


def test_reading_a_disk_tensor_maps_the_file_read_only(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "x.bin"
    path.write_bytes(np.arange(16, dtype=np.float32).tobytes())
    t = Tensor.empty(16, dtype=dtypes.float32, device=f"disk:{path}")
    before = path.stat().st_mtime_ns
    arr = t.numpy()
    if arr.flags.writeable:  # a copy, or a view of the mapping: writing it must not reach the file
        arr[0] = 99
    assert path.read_bytes() == np.arange(16, dtype=np.float32).tobytes()
    np.testing.assert_array_equal(t.to("CPU").numpy(), np.arange(16, dtype=np.float32))
    assert path.stat().st_mtime_ns == before
    # writing the tensor still works (the mapping becomes read-write then), reads see the new values
    t[2:4].assign(Tensor(np.array([-1, -2], np.float32)).to(t.device))
    assert np.fromfile(path, np.float32)[:5].tolist() == [0, 1, -1, -2, 4]
    np.testing.assert_array_equal(t.to("CPU").numpy()[2:4], [-1, -2])


def test_a_larger_tensor_written_to_an_existing_smaller_file_extends_it(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "grow.bin"
    path.write_bytes(b"\0" * 8)
    Tensor(np.arange(6, dtype=np.int32)).to(f"disk:{path}").realize()  # a write: the file grows to fit
    assert np.fromfile(path, np.int32).tolist() == list(range(6))


# ---------------- linear-time header parsing ----------------
def _python_calls(fn: Callable[[], Any]) -> int:
    """How many Python and C functions fn calls: a deterministic measure of its work."""
    count = 0

    def prof(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event in ("call", "c_call"):
            count += 1

    sys.setprofile(prof)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return count


def _many_entries(path: pathlib.Path, n: int) -> None:
    hdr = {f"t{i}": {"dtype": "F32", "shape": [1], "data_offsets": [4 * i, 4 * i + 4]} for i in range(n)}
    path.write_bytes(_safetensors(hdr, bytes(4 * n)))


def test_safe_load_work_grows_linearly_with_the_entries(tmp_path: pathlib.Path) -> None:
    for n in (50, 400, 800):
        _many_entries(tmp_path / f"{n}.safetensors", n)
    safe_load(tmp_path / "50.safetensors")  # warm: first-use imports and caches
    small = _python_calls(lambda: safe_load(tmp_path / "400.safetensors"))
    large = _python_calls(lambda: safe_load(tmp_path / "800.safetensors"))
    assert large <= 2.2 * small, (small, large)
    assert small <= 400 * 60, f"{small} calls for 400 entries: more than 60 per entry"


# ---------------- things that must still load ----------------
def test_legacy_checkpoint_loads_with_the_restricted_unpickler(torch_names: types.SimpleNamespace,
                                                              tmp_path: pathlib.Path) -> None:  # fmt: skip
    a = np.arange(6, dtype=np.float32)
    obj = _pickle(collections.OrderedDict(w=_tensor(torch_names, "0", 6, 0, (2, 3), (3, 1)),
                                          wt=_tensor(torch_names, "0", 6, 0, (3, 2), (1, 3)), step=7))  # fmt: skip
    path = tmp_path / "legacy.pth"
    path.write_bytes(_legacy_pth(obj, ["0"], {"0": a.tobytes()}))
    sd = torch_load(path)
    np.testing.assert_array_equal(sd["w"].numpy(), a.reshape(2, 3))
    np.testing.assert_array_equal(sd["wt"].numpy(), a.reshape(2, 3).T)
    assert sd["step"] == 7


def test_views_at_the_edge_of_their_storage_load(torch_names: types.SimpleNamespace, tmp_path: pathlib.Path) -> None:
    a = np.arange(8, dtype=np.float32)
    views = {"tail": (6, (2,), (1,)), "strided": (1, (4,), (2,)), "broadcast": (7, (3, 2), (0, 0)),
             "empty_at_end": (8, (0,), (1,))}  # fmt: skip
    obj = _pickle({k: _tensor(torch_names, "0", 8, off, shape, stride) for k, (off, shape, stride) in views.items()})
    path = tmp_path / "edge.pth"
    path.write_bytes(_zip_pth(obj, {"0": a.tobytes()}))
    sd = torch_load(path)
    for k, (off, shape, stride) in views.items():
        want = np.lib.stride_tricks.as_strided(a[off:], shape, tuple(4 * s for s in stride)) if off < 8 else a[:0]
        np.testing.assert_array_equal(sd[k].numpy().reshape(shape), want.reshape(shape), err_msg=k)


def test_a_deflated_checkpoint_within_the_ceiling_loads(torch_names: types.SimpleNamespace,
                                                       tmp_path: pathlib.Path) -> None:  # fmt: skip
    from speck.uop import Context

    a = np.arange(1 << 16, dtype=np.float32)
    path = tmp_path / "deflated.pth"
    path.write_bytes(_zip_pth(_pickle({"w": _tensor(torch_names, "0", a.size, 0, a.shape, (1,))}), {"0": a.tobytes()},
                              deflate=True))  # fmt: skip
    np.testing.assert_array_equal(torch_load(path)["w"].numpy(), a)
    with Context(MAX_DECOMPRESSED_BYTES=a.nbytes - 1), pytest.raises(CheckpointError, match="MAX_DECOMPRESSED_BYTES"):
        torch_load(path)
