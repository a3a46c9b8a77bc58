"""Model files and state dicts that would lose data without a word: safetensors entries whose bytes overlap or
whose name appears twice in the header, GGUF files naming a tensor or a metadata key twice, and load_state_dict
given values that are not Tensors or a state dict that is not a mapping. Each is the format's named error (or a
TensorTypeError) saying what is wrong; well-formed files keep loading (hypothesis: any layout safe_save writes)."""

from __future__ import annotations

import json
import pathlib
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.tensor import Tensor
from speck.tensor.errors import GGUFError, SafetensorsError, TensorTypeError
from speck.tensor.nn.state import gguf_load, load_state_dict, safe_load, safe_load_metadata, safe_save

F4 = np.arange(4, dtype=np.float32).tobytes()


def _st(path: pathlib.Path, header: bytes | dict[str, Any], data: bytes = F4) -> pathlib.Path:
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(js)) + js + data)
    return path


def _entry(start: int, end: int, n: int) -> dict[str, Any]:
    return {"dtype": "F32", "shape": [n], "data_offsets": [start, end]}


@pytest.mark.parametrize(("a", "b"), [((0, 16, 4), (8, 16, 2)), ((0, 8, 2), (4, 12, 2)), ((4, 8, 1), (0, 16, 4))])
def test_overlapping_safetensors_entries_are_refused(tmp_path: pathlib.Path, a: tuple[int, ...], b: tuple[int, ...]
                                                     ) -> None:  # fmt: skip
    p = _st(tmp_path / "ovl.safetensors", {"a": _entry(*a), "b": _entry(*b)})
    for load in (safe_load, safe_load_metadata, lambda q: safe_load(q, device="CPU")):
        with pytest.raises(SafetensorsError, match="overlap") as ei:
            load(p)
        assert "'a'" in str(ei.value) and "'b'" in str(ei.value) and "corrupt" in str(ei.value)


def test_a_name_twice_in_the_safetensors_header_is_refused(tmp_path: pathlib.Path) -> None:
    one = json.dumps(_entry(0, 8, 2))
    header = f'{{"w": {one}, "w": {json.dumps(_entry(8, 16, 2))}}}'.encode()
    with pytest.raises(SafetensorsError, match="names 'w' twice"):
        safe_load(_st(tmp_path / "dup.safetensors", header))
    escaped = f'{{"w": {one}, "\\u0077": {json.dumps(_entry(8, 16, 2))}}}'.encode()  # "\u0077" is "w"
    with pytest.raises(SafetensorsError, match="names 'w' twice"):
        safe_load(_st(tmp_path / "dupesc.safetensors", escaped))
    meta = f'{{"__metadata__": {{"k": "1", "k": "2"}}, "w": {one}}}'.encode()
    with pytest.raises(SafetensorsError, match="names 'k' twice"):
        safe_load(_st(tmp_path / "dupmeta.safetensors", meta, F4[:8]))


def test_zero_size_entries_may_share_an_offset(tmp_path: pathlib.Path) -> None:
    p = _st(tmp_path / "z.safetensors", {"e": _entry(8, 8, 0), "f": _entry(8, 8, 0), "w": _entry(0, 16, 4)})
    got = {k: v.to("CPU").numpy() for k, v in safe_load(p).items()}
    np.testing.assert_array_equal(got["w"], np.arange(4, dtype=np.float32))
    assert got["e"].shape == got["f"].shape == (0,)


@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(0, 5), min_size=1, max_size=6))
def test_whatever_safe_save_writes_loads_back(tmp_path_factory: pytest.TempPathFactory, sizes: list[int]) -> None:
    p = tmp_path_factory.mktemp("rt") / "m.safetensors"
    arrays = {f"t{i}": np.arange(n, dtype=np.float32) + i for i, n in enumerate(sizes)}
    safe_save({k: Tensor(v) for k, v in arrays.items()}, p)
    got = safe_load(p, device="CPU")
    for k, v in arrays.items():
        np.testing.assert_array_equal(got[k].numpy(), v)


# ---------------- GGUF ----------------
def _gs(x: str) -> bytes:
    return struct.pack("<Q", len(x)) + x.encode()


def _gguf(path: pathlib.Path, body: bytes, n_tensors: int = 0, n_kv: int = 0) -> Tensor:
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + body + bytes(256))
    return Tensor(path)


def _f32_info(name: str, n: int, offset: int) -> bytes:
    return _gs(name) + struct.pack("<I", 1) + struct.pack("<Q", n) + struct.pack("<IQ", 0, offset)


def test_a_tensor_name_twice_in_a_gguf_file_is_refused(tmp_path: pathlib.Path) -> None:
    t = _gguf(tmp_path / "d.gguf", _f32_info("w", 4, 0) + _f32_info("w", 4, 32), n_tensors=2)
    with pytest.raises(GGUFError, match="tensor name 'w' appears twice"):
        gguf_load(t)
    ok = _gguf(tmp_path / "ok.gguf", _f32_info("w", 4, 0) + _f32_info("v", 4, 32), n_tensors=2)
    assert sorted(gguf_load(ok)[1]) == ["v", "w"]


def test_a_metadata_key_twice_in_a_gguf_file_is_refused(tmp_path: pathlib.Path) -> None:
    kv = _gs("k") + struct.pack("<II", 4, 1) + _gs("k") + struct.pack("<II", 4, 2)
    with pytest.raises(GGUFError, match="metadata key 'k' appears twice"):
        gguf_load(_gguf(tmp_path / "k.gguf", kv, n_kv=2))


# ---------------- load_state_dict ----------------
class _Model:
    def __init__(self) -> None:
        self.w = Tensor.ones(2, 2).contiguous().realize()
        self.b = Tensor.zeros(2).contiguous().realize()


@pytest.mark.parametrize("value", [np.ones((2, 2), np.float32), [[1.0, 1.0], [1.0, 1.0]], 1.0, None])
def test_load_state_dict_values_must_be_tensors(value: Any) -> None:
    m = _Model()
    with pytest.raises(TensorTypeError, match=r"state_dict\['w'\] is a .*not a Tensor"):
        load_state_dict(m, {"w": value, "b": Tensor.ones(2)}, verbose=False)
    np.testing.assert_array_equal(m.b.numpy(), np.zeros(2, np.float32))  # nothing was loaded


@pytest.mark.parametrize("sd", [[("w", 1)], "w", None, 3])
def test_load_state_dict_takes_a_mapping(sd: Any) -> None:
    with pytest.raises(TensorTypeError, match="takes a mapping"):
        load_state_dict(_Model(), sd, verbose=False)


@pytest.mark.parametrize(("a", "b"), [((4, 0), (4, 8)), ((8, 0), (2, 16)), ((4, 32), (4, 32))])
def test_overlapping_gguf_tensors_are_refused(tmp_path: pathlib.Path, a: tuple[int, int], b: tuple[int, int]) -> None:
    t = _gguf(tmp_path / "o.gguf", _f32_info("w", *a) + _f32_info("v", *b), n_tensors=2)
    with pytest.raises(GGUFError, match="overlap") as ei:
        gguf_load(t)
    assert "'w'" in str(ei.value) and "'v'" in str(ei.value)


def test_adjacent_and_empty_gguf_tensors_load(tmp_path: pathlib.Path) -> None:
    t = _gguf(tmp_path / "a.gguf", _f32_info("w", 4, 0) + _f32_info("v", 4, 16) + _f32_info("e", 0, 16), n_tensors=3)
    got = gguf_load(t)[1]
    assert [tuple(got[k].shape) for k in ("w", "v", "e")] == [(4,), (4,), (0,)]
