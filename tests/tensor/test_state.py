"""Model state: get_state_dict/get_parameters discovery, load_state_dict (strict errors name the keys), and the
safetensors round trip (bit-exact for every dtype, header readable by an independent parser)."""

from __future__ import annotations

import collections
import json
import pathlib
import struct

import numpy as np
import pytest

from speck.tensor import Tensor, dtypes, nn
from speck.tensor.dtype import _from_np_dtype
from speck.tensor.nn.safetensors import SafetensorsError
from speck.tensor.nn.state import (
    get_parameters,
    get_state_dict,
    load_state_dict,
    safe_load,
    safe_load_metadata,
    safe_save,
)


class Small:
    def __init__(self) -> None:
        self.fc = nn.Linear(3, 2)
        self.bn = nn.BatchNorm(2)
        self.blocks = [nn.Linear(2, 2, bias=False), {"emb": nn.Embedding(4, 2)}]


def test_state_dict_keys_and_parameters() -> None:
    m = Small()
    sd = get_state_dict(m)
    assert set(sd) == {"fc.weight", "fc.bias", "bn.weight", "bn.bias", "bn.num_batches_tracked", "bn.running_mean",
                       "bn.running_var", "blocks.0.weight", "blocks.1.emb.weight"}  # fmt: skip
    assert sd["fc.weight"] is m.fc.weight and sd["blocks.1.emb.weight"] is m.blocks[1]["emb"].weight  # type: ignore[index]
    params = get_parameters(m)
    assert len(params) == len(sd) and all(any(p is t for t in sd.values()) for p in params)
    shared = {"a": m.fc.weight, "b": m.fc.weight}
    assert len(get_parameters(shared)) == 1


def test_state_dict_keys_namedtuples_by_field_and_round_trips_them() -> None:
    # TENSOR_API 10: namedtuples are walked via their fields (it keyed them by position: "kv.0")
    kv_t = collections.namedtuple("kv_t", ["key", "value"])
    model = {"kv": kv_t(Tensor([1.0, 2.0]), Tensor([3.0])), "plain": (Tensor([4.0]),)}
    sd = get_state_dict(model)
    assert list(sd) == ["kv.key", "kv.value", "plain.0"] and sd["kv.value"] is model["kv"].value
    other = {"kv": kv_t(Tensor([0.0, 0.0]), Tensor([0.0])), "plain": (Tensor([0.0]),)}
    load_state_dict(other, sd, verbose=False)
    assert other["kv"].key.tolist() == [1.0, 2.0] and other["plain"][0].tolist() == [4.0]


def test_load_state_dict_copies_values() -> None:
    a, b = Small(), Small()
    load_state_dict(b, get_state_dict(a))
    for k, t in get_state_dict(a).items():
        np.testing.assert_array_equal(get_state_dict(b)[k].numpy(), t.numpy(), err_msg=k)


def test_load_state_dict_takes_loaded_dtype_and_keeps_identity() -> None:
    m = nn.Linear(2, 2)
    w = m.weight
    load_state_dict(m, {"weight": Tensor(np.array([[1, 2], [3, 4]], dtype=np.float16)), "bias": Tensor([0.5, 1.5])})
    assert m.weight is w and m.weight.dtype == dtypes.float16
    np.testing.assert_array_equal(m.weight.numpy(), [[1, 2], [3, 4]])


def test_load_state_dict_errors_name_keys() -> None:
    m = nn.Linear(3, 2)
    good = {"weight": Tensor.zeros(2, 3), "bias": Tensor.zeros(2)}
    with pytest.raises(KeyError, match=r"missing keys: \['bias'\]"):
        load_state_dict(m, {"weight": good["weight"]}, verbose=False)
    with pytest.raises(ValueError, match=r"shape mismatch: weight model \(2, 3\) vs state \(3, 2\)"):
        load_state_dict(m, {**good, "weight": Tensor.zeros(3, 2)}, verbose=False)
    # extra keys are ignored; non-strict skips missing ones; the loaded model tensors are returned
    got = load_state_dict(m, {"weight": Tensor.ones(2, 3), "extra": Tensor.zeros(1)}, strict=False, verbose=False)
    assert got == [m.weight]
    np.testing.assert_array_equal(m.weight.numpy(), np.ones((2, 3)))
    with pytest.raises(ValueError, match="shape mismatch"):
        load_state_dict(m, {"weight": Tensor.zeros(1, 3)}, strict=False, verbose=False)


def test_load_state_dict_consume_and_scalar_shapes() -> None:
    class M:
        def __init__(self) -> None:
            self.s = Tensor.zeros(()).contiguous().realize()
            self.v = Tensor.zeros(3).contiguous().realize()

    m = M()
    sd = {"s": Tensor([2.5]), "v": Tensor([1.0, 2.0, 3.0]), "other": Tensor([0.0])}
    load_state_dict(m, sd, consume=True, verbose=False)
    assert list(sd) == ["other"]
    assert m.s.shape == () and m.s.item() == 2.5
    np.testing.assert_array_equal(m.v.numpy(), [1, 2, 3])


ROUND_TRIP = [
    (np.float32, (2, 3)), (np.float16, (4,)), (np.float64, ()), (np.int8, (3, 1)), (np.uint8, (5,)),
    (np.int16, (2, 2)), (np.int32, (3,)), (np.int64, (2,)), (np.uint32, (2,)), (np.bool_, (2, 2)), (np.float32, (0, 3)),
]  # fmt: skip


def _values(dt: type, shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dt is np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dt, np.integer):
        info = np.iinfo(dt)
        return rng.integers(info.min, info.max, shape, dtype=np.int64 if info.min < 0 else np.uint64).astype(dt)
    x = rng.standard_normal(shape).astype(dt)
    if x.size:  # specials survive bit-exactly
        x.reshape(-1)[0] = np.inf if x.size > 1 else -0.0
    return x


def test_safetensors_round_trip_exact(tmp_path: pathlib.Path) -> None:
    arrays = {f"t{i}.{np.dtype(dt).name}": _values(dt, sh, i) for i, (dt, sh) in enumerate(ROUND_TRIP)}
    path = tmp_path / "m.safetensors"
    safe_save({k: Tensor(v) for k, v in arrays.items()}, path, {"note": "hi"})
    loaded = safe_load(path)
    assert list(loaded) == list(arrays)
    for k, v in arrays.items():
        got = loaded[k].numpy()
        assert got.dtype == v.dtype and got.shape == v.shape, k
        assert got.tobytes() == v.tobytes(), k
    src, data_start, header = safe_load_metadata(path)
    assert header["__metadata__"] == {"note": "hi"}
    assert header["t0.float32"]["shape"] == [2, 3]
    # the file tensor and offset locate each tensor's bytes
    lo, hi = header["t0.float32"]["data_offsets"]
    raw = src[data_start + lo : data_start + hi].to("CPU").numpy().tobytes()
    assert raw == arrays["t0.float32"].tobytes()


def test_safetensors_bfloat16_round_trip(tmp_path: pathlib.Path) -> None:
    bits = np.array([0x3F80, 0xC000, 0x7F80, 0x0001, 0x4049], dtype=np.uint16)  # 1, -2, inf, tiny subnormal, ~3.14
    t = Tensor(bits).bitcast(dtypes.bfloat16)
    path = tmp_path / "bf16.safetensors"
    safe_save({"w": t}, path)
    back = safe_load(path)["w"]
    assert back.dtype == dtypes.bfloat16 and back.shape == (5,)
    np.testing.assert_array_equal(back.bitcast(dtypes.uint16).numpy(), bits)
    # values: bfloat16 is the top half of a float32
    with pytest.raises(RuntimeError, match="runs no kernels"):  # a DISK view computes nothing
        back.float().numpy()
    np.testing.assert_array_equal(back.to("CPU").float().numpy(), (bits.astype(np.uint32) << 16).view(np.float32))


def test_safe_load_gives_lazy_views_of_the_file(tmp_path: pathlib.Path) -> None:
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7, -8, 9], dtype=np.int64),
              "c": np.array([1, 2, 3], dtype=np.uint8), "d": np.array([0.5, -1.5], dtype=np.float16)}  # fmt: skip
    path = tmp_path / "lazy.safetensors"
    safe_save({k: Tensor(v) for k, v in arrays.items()}, path)
    loaded = safe_load(path)
    assert all(t.device == f"DISK:{path.resolve()}" for t in loaded.values())
    assert {k: (t.shape, t.dtype) for k, t in loaded.items()} == {
        k: (v.shape, _from_np_dtype(v.dtype)) for k, v in arrays.items()
    }
    # nothing was read yet: bytes written into the file after safe_load are what the views give
    _, data_start, header = safe_load_metadata(path)
    lo, _ = header["b"]["data_offsets"]
    with open(path, "r+b") as f:
        f.seek(data_start + lo)
        f.write(np.array([70], dtype=np.int64).tobytes())
    arrays["b"][0] = 70
    for k, v in arrays.items():
        np.testing.assert_array_equal(loaded[k].to("CPU").numpy(), v)
    # a DISK tensor of the file works as the argument too
    np.testing.assert_array_equal(safe_load(Tensor(path))["a"].numpy(), arrays["a"])
    with pytest.raises(SafetensorsError, match="1-D uint8 tensor"):
        safe_load(Tensor([1, 2, 3]))


def test_safe_load_of_the_file_bytes_in_a_compute_tensor(tmp_path: pathlib.Path) -> None:
    """tinygrad's safe_load takes any uint8 tensor of the file (e.g. bytes fetched into memory), not only DISK."""
    arrays = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array([7, -(2**40)], dtype=np.int64),
              "h": np.array([0.5, -1.5, 3.0], dtype=np.float16), "u": np.array([255, 1], dtype=np.uint8)}  # fmt: skip
    path = tmp_path / "mem.safetensors"
    safe_save({**{k: Tensor(v) for k, v in arrays.items()}, "bf": Tensor([1.0, -2.5]).cast(dtypes.bfloat16)}, path,
              {"format": "pt"})  # fmt: skip
    raw = Tensor(np.frombuffer(path.read_bytes(), np.uint8))
    loaded = safe_load(raw)
    assert list(loaded) == [*arrays, "bf"]
    for k, v in arrays.items():
        assert loaded[k].device == raw.device and loaded[k].shape == v.shape
        np.testing.assert_array_equal(loaded[k].numpy(), v)
    assert loaded["bf"].dtype == dtypes.bfloat16 and loaded["bf"].float().tolist() == [1.0, -2.5]
    src, start, header = safe_load_metadata(raw)
    assert src is raw and header["__metadata__"] == {"format": "pt"}
    assert start == 8 + int.from_bytes(path.read_bytes()[:8], "little")
    with pytest.raises(SafetensorsError, match="too short"):
        safe_load(raw[:5].contiguous())


@pytest.mark.parametrize("start,stop,dt", [(4, 12, np.int32), (1, 9, np.uint16), (3, 7, np.float32), (8, 24, np.int64)])
def test_disk_bitcast_of_a_slice_reads_those_bytes(tmp_path: pathlib.Path, start: int, stop: int, dt: type) -> None:
    raw = np.random.default_rng(start).integers(0, 256, 32, dtype=np.uint8)
    path = tmp_path / "bytes.bin"
    path.write_bytes(raw.tobytes())
    t = Tensor(path)[start:stop].bitcast(_from_np_dtype(np.dtype(dt)))
    assert t.device.startswith("DISK")
    np.testing.assert_array_equal(t.to("CPU").numpy(), raw[start:stop].view(dt))
    rows = Tensor(path).reshape(4, 8)[1:3].bitcast(_from_np_dtype(np.dtype(np.int16)))
    np.testing.assert_array_equal(rows.numpy(), raw.reshape(4, 8)[1:3].copy().view(np.int16))
    with pytest.raises(RuntimeError, match="contiguous view"):
        Tensor(path).reshape(4, 8)[:, 1:5].bitcast(_from_np_dtype(np.dtype(np.int32)))
    with pytest.raises(RuntimeError, match="don't split"):
        Tensor(path)[0:6].bitcast(_from_np_dtype(np.dtype(np.int32)))


def test_safetensors_file_layout(tmp_path: pathlib.Path) -> None:
    """Parse the written file by hand: the format is a u64 LE header length, JSON, then the raw bytes."""
    a, b = np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7, 8], dtype=np.int64)
    path = tmp_path / "x.safetensors"
    safe_save({"a": Tensor(a), "b": Tensor(b)}, path)
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    assert (8 + n) % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    data = raw[8 + n :]
    assert header["a"]["dtype"] == "F32" and header["a"]["shape"] == [2, 3]
    assert header["b"]["dtype"] == "I64"
    s, e = header["a"]["data_offsets"]
    assert data[s:e] == a.tobytes()
    s, e = header["b"]["data_offsets"]
    assert data[s:e] == b.tobytes()
    assert sorted(f.name for f in tmp_path.iterdir()) == ["x.safetensors"]  # no temporary file left behind


def test_safe_save_never_writes_through_a_planted_temporary_name(tmp_path: pathlib.Path) -> None:
    # the old fixed temporary name <file>.tmp followed a symlink placed there, so saving wrote into its target
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me")
    (tmp_path / "x.safetensors.tmp").symlink_to(victim)
    safe_save({"a": Tensor([1.0, 2.0])}, tmp_path / "x.safetensors")
    assert victim.read_bytes() == b"keep me"
    np.testing.assert_array_equal(safe_load(tmp_path / "x.safetensors")["a"].numpy(), [1.0, 2.0])


def test_safetensors_save_lazy_and_view_tensors(tmp_path: pathlib.Path) -> None:
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    path = tmp_path / "v.safetensors"
    safe_save({"t": x.T[1:, ::2] * 2}, path)
    np.testing.assert_array_equal(
        safe_load(path)["t"].numpy(), np.arange(12, dtype=np.float32).reshape(3, 4).T[1:, ::2] * 2
    )


def test_safetensors_corrupt_files(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "c.safetensors"
    safe_save({"a": Tensor(np.arange(8, dtype=np.float32))}, path)
    raw = path.read_bytes()
    (tmp_path / "trunc.safetensors").write_bytes(raw[:-4])
    with pytest.raises(SafetensorsError, match="trunc.safetensors.*truncated"):
        safe_load(tmp_path / "trunc.safetensors")
    (tmp_path / "short.safetensors").write_bytes(raw[:5])
    with pytest.raises(SafetensorsError, match="too short"):
        safe_load(tmp_path / "short.safetensors")
    (tmp_path / "json.safetensors").write_bytes(raw[:8] + b"{" * (len(raw) - 8))
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        safe_load_metadata(tmp_path / "json.safetensors")


def test_model_save_load_round_trip(tmp_path: pathlib.Path) -> None:
    a, b = Small(), Small()
    path = tmp_path / "model.safetensors"
    safe_save(get_state_dict(a), path)
    load_state_dict(b, safe_load(path))
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32))
    np.testing.assert_array_equal(b.fc(x).numpy(), a.fc(x).numpy())


def test_to_disk_writes_an_existing_file_again(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "again.bin"
    for vals in ([1, 2, 3], [-4, 5, -6]):  # the second write finds the file there, as large as needed
        Tensor(vals, dtype=dtypes.int32).to(f"disk:{path}").realize()
        assert np.fromfile(path, dtype=np.int32).tolist() == vals
    # reading it back never changes it
    assert Tensor.empty(3, dtype=dtypes.int32, device=f"disk:{path}").to("CPU").tolist() == [-4, 5, -6]
    assert np.fromfile(path, dtype=np.int32).tolist() == [-4, 5, -6]


def test_reading_a_loaded_file_leaves_no_open_file_behind(tmp_path: pathlib.Path) -> None:
    """The DISK mapping keeps its own handle: no file object is left for the garbage collector to warn about
    ("ResourceWarning: unclosed file" in the output of a user's test run)."""
    import gc
    import warnings

    path = tmp_path / "w.safetensors"
    safe_save({"a": Tensor([1.0, 2.0]), "b": Tensor([3, 4], dtype=dtypes.int8)}, path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = safe_load(path)
        assert loaded["a"].to("CPU").tolist() == [1.0, 2.0] and loaded["b"].to("CPU").tolist() == [3, 4]
        del loaded
        gc.collect()
    assert not [w for w in caught if issubclass(w.category, ResourceWarning)]
