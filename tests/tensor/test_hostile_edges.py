"""Hostile inputs that reached a raw Python error or a silently wrong result: a safetensors header int of more digits
than Python converts, loaders given a path that is no path, safe_save given a list or names the format can't hold,
tensors a file may claim that numpy can't hold (a dim beyond int64 next to a 0, more than 64 dims), a GGUF
alignment spelled as a bool, ggml_data_to_tensor told to read a negative count, a legacy torch checkpoint holding a
tensor in a set or as a dict key, a misspelled device given to `.to` of a device-less tensor, and two Variables of
one name bound to different values in one kernel. Each now raises the package's named error saying what is wrong;
the valid neighbours of each input keep working (checked against numpy)."""

from __future__ import annotations

import io
import json
import math
import pathlib
import pickle
import struct
import sys
import types
import warnings
import zipfile
from typing import Any

import numpy as np
import pytest

from speck.tensor import Tensor, Variable, dtypes, nn
from speck.tensor.errors import (
    ArchiveError,
    DatasetError,
    GGUFError,
    SafetensorsError,
    TensorOverflowError,
    TensorTypeError,
    TensorValueError,
    UnknownDeviceError,
)
from speck.tensor.nn import optim
from speck.tensor.nn.checkpoints import tar_extract, torch_load, zip_extract
from speck.tensor.nn.datasets import parse_idx
from speck.tensor.nn.gguf import ggml_data_to_tensor
from speck.tensor.nn.state import gguf_load, safe_load, safe_save

F4 = np.arange(4, dtype=np.float32)


def _st(path: pathlib.Path, header: bytes | dict[str, Any], data: bytes = F4.tobytes()) -> pathlib.Path:
    js = header if isinstance(header, bytes) else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(js)) + js + data)
    return path


def test_a_header_int_of_too_many_digits_is_a_safetensors_error(tmp_path: pathlib.Path) -> None:
    raw = b'{"a": {"dtype": "U8", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 0]}}'
    with pytest.raises(SafetensorsError, match="not valid JSON"):
        safe_load(_st(tmp_path / "digits.safetensors", raw))


@pytest.mark.parametrize("path", [3, None, 2.5, [b"x"]])
@pytest.mark.parametrize("loader", [safe_load, torch_load, gguf_load, tar_extract, zip_extract])
def test_loaders_refuse_a_path_that_is_no_path(loader: Any, path: Any) -> None:
    with pytest.raises(TensorTypeError, match="path"):
        loader(path)


def test_safe_save_refuses_a_list_and_names_that_are_no_str(tmp_path: pathlib.Path) -> None:
    with pytest.raises(TensorTypeError, match="dict"):
        safe_save([Tensor([1.0])], tmp_path / "list.safetensors")  # type: ignore[arg-type]
    for name in (1, b"w", ("a",)):  # 1 was written as "1"; bytes and a tuple were json.dumps' own TypeError
        with pytest.raises(TensorTypeError, match="names are str"):
            safe_save({name: Tensor([1.0])}, tmp_path / "bad.safetensors")  # type: ignore[dict-item]
        assert not (tmp_path / "bad.safetensors").exists()
    safe_save({"__metadata": Tensor(F4)}, tmp_path / "ok.safetensors")
    np.testing.assert_array_equal(safe_load(tmp_path / "ok.safetensors")["__metadata"].numpy(), F4)


def test_an_empty_tensor_with_a_dim_beyond_int64_is_refused_when_read(tmp_path: pathlib.Path) -> None:
    p = _st(tmp_path / "huge.safetensors", {"a": {"dtype": "U8", "shape": [2**70, 0], "data_offsets": [0, 0]}})
    t = safe_load(p)["a"]
    assert t.shape == (2**70, 0)
    with pytest.raises(TensorValueError, match="empty tensor"):
        t.numpy()
    assert Tensor.zeros(2**20, 0).numpy().shape == (2**20, 0)  # a big but indexable dim still reads


def test_a_tensor_of_more_dims_than_numpy_holds_is_refused_when_read() -> None:
    with pytest.raises(TensorValueError, match="64"):
        Tensor.ones(*(1,) * 65).numpy()
    np.testing.assert_array_equal(Tensor.ones(*(1,) * 64).numpy(), np.ones((1,) * 64, np.float32))


def _gs(x: str) -> bytes:
    return struct.pack("<Q", len(x)) + x.encode()


def test_a_gguf_alignment_spelled_as_a_bool_is_refused() -> None:
    def gguf(kv: bytes) -> Tensor:
        head = b"GGUF" + struct.pack("<IQQ", 3, 1, 1) + _gs("general.alignment") + kv
        head += _gs("a") + struct.pack("<IQIQ", 1, 4, 0, 0)
        return Tensor(head + b"\0" * (-len(head) % 32) + F4.tobytes())

    with pytest.raises(GGUFError, match="alignment"):
        gguf_load(gguf(struct.pack("<IB", 7, 1)))  # type 7: bool True (read as alignment 1, the data was misread)
    np.testing.assert_array_equal(gguf_load(gguf(struct.pack("<II", 4, 32)))[1]["a"].numpy(), F4)  # uint32 32


@pytest.mark.parametrize("n", [-1, -5, 1.5, "2"])
def test_ggml_data_to_tensor_refuses_a_count_that_is_no_count(n: Any) -> None:
    with pytest.raises(GGUFError, match="non-negative int"):
        ggml_data_to_tensor(Tensor(F4.tobytes()), n, 0)
    np.testing.assert_array_equal(ggml_data_to_tensor(Tensor(F4.tobytes()), np.int64(3), 0).numpy(), F4[:3])


# ---- a legacy (pre-zip) torch checkpoint, pickled with stand-ins for torch's rebuild function and storage class
class _Storage:
    def __init__(self, key: str, numel: int) -> None:
        self.key, self.numel = key, numel


class _Reduce:
    def __init__(self, fn: Any, args: tuple[Any, ...]) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """torch._utils._rebuild_tensor_v2 and torch.FloatStorage as importable names (pickle saves them by name)."""
    torch, utils = types.ModuleType("torch"), types.ModuleType("torch._utils")

    def _rebuild_tensor_v2(*args: Any) -> None: ...

    _rebuild_tensor_v2.__module__ = "torch._utils"
    _rebuild_tensor_v2.__qualname__ = "_rebuild_tensor_v2"
    storage = type("FloatStorage", (), {"__module__": "torch"})
    utils._rebuild_tensor_v2, torch.FloatStorage = _rebuild_tensor_v2, storage  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "torch._utils", utils)
    return _rebuild_tensor_v2, storage


def _legacy(obj: Any, storage_type: Any, data: bytes) -> Tensor:
    class Pickler(pickle.Pickler):
        def persistent_id(self, o: Any) -> Any:
            return ("storage", storage_type, o.key, "cpu", o.numel) if isinstance(o, _Storage) else None

    b = io.BytesIO()
    for x in (0x1950A86A20F9469CFC6C, 1001, {"little_endian": True}):
        pickle.dump(x, b, protocol=2)
    Pickler(b, protocol=2).dump(obj)
    pickle.dump(["0"], b, protocol=2)
    b.write(struct.pack("<q", len(data) // 4) + data)
    return Tensor(b.getvalue())


def test_a_legacy_torch_tensor_in_a_set_or_as_a_key_is_rebuilt(fake_torch: tuple[Any, Any]) -> None:
    rebuild, storage = fake_torch
    tensor = _Reduce(rebuild, (_Storage("0", 4), 0, (4,), (1,), False, {}))
    out = torch_load(_legacy({"s": _Reduce(frozenset, ([tensor],)), "k": {tensor: 1}}, storage, F4.tobytes()))
    (in_set,) = out["s"]
    (as_key,) = out["k"]
    for t in (in_set, as_key):  # were the loader's internal placeholder objects, not tensors
        assert isinstance(t, Tensor)
        np.testing.assert_array_equal(t.numpy(), F4)


@pytest.mark.parametrize("device", ["GPU", "", "CPU:X", ("CPU", "bogus")])
def test_to_a_misspelled_device_is_refused_for_a_device_less_tensor(device: Any) -> None:
    t = Tensor.arange(4)  # device-less until it meets a device: `.to` used to return it as is for any name
    with pytest.raises(UnknownDeviceError):
        t.to(device)
    np.testing.assert_array_equal(t.to("cpu").numpy(), np.arange(4))


def test_one_variable_name_bound_to_two_values_in_one_kernel_is_refused() -> None:
    a, b = Variable("i", 1, 10), Variable("i", 1, 10)  # the same variable (same name and bounds)
    with pytest.raises(TensorValueError, match="bound to 2 and to 3"):
        (Tensor.ones(10)[: a.bind(2)].sum() + Tensor.ones(10)[: b.bind(3)].sum()).item()  # was 6.0, silently
    assert (Tensor.ones(10)[: a.bind(3)].sum() + Tensor.ones(10)[: b.bind(3)].sum()).item() == 6.0
    x = Tensor.arange(10, dtype=dtypes.int32)
    j = Variable("j", 1, 10)
    assert (x[: a.bind(2)].sum() + x[: j.bind(3)].sum()).item() == int(np.arange(2).sum() + np.arange(3).sum())


@pytest.mark.parametrize("device", ["CPU", "CPU:LLVM", "CPU:CLANG", "CPU:X86", "PYTHON"])
def test_one_variable_name_with_two_ranges_in_one_kernel_compiles_on_every_backend(device: str) -> None:
    a, b = Variable("i", 1, 10).bind(3), Variable("i", 1, 20).bind(3)  # one name, two ranges: two kernel arguments
    t = Tensor.arange(20, dtype=dtypes.float32, device=device).contiguous().realize()
    got = (t[:a].sum() + t[:b].sum()).item()  # LLVM's IR declared "%var.i" twice: a CompileError
    assert got == float(2 * np.arange(3).sum())


_NORMS: dict[str, Any] = {
    "BatchNorm": lambda **kw: nn.BatchNorm(3, **kw),
    "LayerNorm": lambda **kw: nn.LayerNorm(4, **kw),
    "GroupNorm": lambda **kw: nn.GroupNorm(1, 3, **kw),
    "InstanceNorm": lambda **kw: nn.InstanceNorm(3, **kw),
    "RMSNorm": lambda **kw: nn.RMSNorm(4, **kw),
}


@pytest.mark.parametrize("layer", sorted(_NORMS))
def test_norm_layers_refuse_an_eps_that_is_no_nonnegative_number(layer: str) -> None:
    for eps in ("a", "1e-5", None, [1e-5]):  # were a raw TypeError or "can't make a Tensor from str" at the call
        with pytest.raises(TensorTypeError, match="eps must be a number"):
            _NORMS[layer](eps=eps)
    for eps in (-1.0, math.nan, math.inf):  # gave NaN outputs
        with pytest.raises(TensorValueError, match="eps must be finite"):
            _NORMS[layer](eps=eps)
    assert _NORMS[layer](eps=np.float32(1e-3)).eps == np.float32(1e-3)


def test_batchnorm_refuses_a_momentum_that_is_no_number() -> None:
    with pytest.raises(TensorTypeError, match="momentum must be a number"):
        nn.BatchNorm(3, momentum="a")  # was a raw TypeError ('int' - 'str') at the first training step
    with pytest.raises(TensorValueError, match="momentum must be finite"):
        nn.BatchNorm(3, momentum=math.nan)
    bn, x = nn.BatchNorm(3, momentum=0.5), np.arange(24, dtype=np.float32).reshape(2, 3, 2, 2)
    with Tensor.train():
        bn(Tensor(x)).realize()
    np.testing.assert_allclose(bn.running_mean.numpy(), 0.5 * x.mean(axis=(0, 2, 3)), rtol=1e-6)


def test_rmsnorm_refuses_a_dim_that_is_no_size() -> None:
    with pytest.raises(TensorTypeError, match="dim must be an int"):
        nn.RMSNorm("4")  # type: ignore[arg-type]
    with pytest.raises(TensorValueError, match="dim must be >= 0"):
        nn.RMSNorm(-1)


def test_optimizer_group_takes_optimizers() -> None:
    with pytest.raises(TensorTypeError, match="OptimizerGroup takes optimizers"):
        optim.OptimizerGroup(optim.SGD([Tensor.ones(2, requires_grad=True)]), 1)  # type: ignore[arg-type]


@pytest.mark.parametrize("device", ["CPU:CLANG", "CPU:X86", "CPU:LLVM", "PYTHON"])
def test_bool_bytes_other_than_0_and_1_read_as_true(tmp_path: pathlib.Path, device: str) -> None:
    raw = bytes([2, 0, 255, 1])  # a hostile file's BOOL bytes, or a numpy view of foreign bytes
    want = np.array([1, 0, 1, 1])
    p = _st(tmp_path / "bools.safetensors", {"a": {"dtype": "BOOL", "shape": [4], "data_offsets": [0, 4]}}, raw)
    for t in (Tensor(np.frombuffer(raw, dtype=bool), device=device), safe_load(p, device=device)["a"]):
        # CLANG and X86 kernels took the bytes as they were: int() gave 2 and 255, logical_not() True, sum() 258
        np.testing.assert_array_equal(t.int().numpy(), want)
        np.testing.assert_array_equal(t.logical_not().numpy(), 1 - want)
        assert t.sum().item() == 3


def _logits() -> tuple[Tensor, Tensor]:
    return Tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(4, 5)), Tensor([0, 1, 2, 3])


@pytest.mark.parametrize(
    "call",
    [
        lambda x, y: x.cross_entropy(y, label_smoothing=None),  # was '<=' between float and NoneType
        lambda x, y: x.sparse_categorical_crossentropy(y, label_smoothing=np.zeros(3)),
        lambda x, y: x.sparse_categorical_crossentropy(y, ignore_index=b"x"),  # failed inside the scheduler
        lambda x, y: x.log_softmax().nll_loss(y, ignore_index=[1]),  # an unhashable constant in the graph
        lambda x, y: x.cross_entropy(y, reduction=np.zeros(3)),  # numpy's "truth value ... is ambiguous"
        lambda x, y: x.scaled_dot_product_attention(x, x, attn_mask="causal"),  # 'str' has no attribute 'dtype'
        lambda x, y: x.reshape(1, 4, 5).batchnorm(None, None, Tensor.zeros(4), Tensor.ones(4), axis=None),
        lambda x, y: y.one_hot(np.array([3, 4])),  # "only integer scalar arrays can be converted"
        lambda x, y: x.pad((1, 1), value=np.zeros(3)),
        lambda x, y: x.reshape(1, 1, 4, 5).avg_pool2d(padding=np.zeros(2, dtype=int)),
        lambda x, y: x.meshgrid(y, indexing=np.array(["ij", "xy"])),
        lambda x, y: x.scatter(0, Tensor([[0]]), 1.0, reduce=np.array(["add", "add"])),
        lambda x, y: x.reshape(1, 1, 4, 5).conv2d(Tensor.ones(1, 1, 2, 2), groups=None),  # int * NoneType
        lambda x, y: x.reshape(1, 1, 4, 5).conv_transpose2d(Tensor.ones(1, 1, 2, 2), groups=None),
    ],
)
def test_op_arguments_of_the_wrong_kind_are_named_errors(call: Any) -> None:
    with pytest.raises((TensorTypeError, TensorValueError)):
        call(*_logits()).realize()


def test_conv_groups_below_one_are_a_value_error() -> None:
    x, w = Tensor.ones(1, 4, 3, 3), Tensor.ones(4, 1, 2, 2)
    for groups in (0, -1):  # conv_transpose2d's 0 was a ZeroDivisionError, -1 a reshape to -4 channels
        for op in (Tensor.conv2d, Tensor.conv_transpose2d):
            with pytest.raises(TensorValueError, match="groups must be >= 1"):
                op(x, w, groups=groups)
    xn = np.arange(36, dtype=np.float32).reshape(1, 4, 3, 3)
    wn = np.arange(16, dtype=np.float32).reshape(4, 1, 2, 2)
    want = np.zeros((1, 4, 2, 2), np.float32)
    for c, i, j in np.ndindex(4, 2, 2):  # depthwise: each channel with its own kernel
        want[0, c, i, j] = (xn[0, c, i : i + 2, j : j + 2] * wn[c, 0]).sum()
    np.testing.assert_allclose(Tensor(xn).conv2d(Tensor(wn), groups=np.int64(4)).numpy(), want, rtol=1e-6)


def test_loss_and_pad_arguments_of_the_right_kind_still_work() -> None:
    x, y = _logits()
    xn = x.numpy()
    logp = xn - np.log(np.exp(xn).sum(1, keepdims=True))
    want = -logp[np.arange(4), y.numpy()].mean()
    np.testing.assert_allclose(x.cross_entropy(y, label_smoothing=np.float32(0.0)).item(), want, rtol=1e-5)
    np.testing.assert_allclose(x.sparse_categorical_crossentropy(y, ignore_index=np.int64(-1)).item(), want, rtol=1e-5)
    np.testing.assert_array_equal(
        x.pad((1, 1), value=np.float32(2)).numpy(), np.pad(xn, ((0, 0), (1, 1)), constant_values=2)
    )
    np.testing.assert_array_equal(y.one_hot(np.int64(4)).numpy(), np.eye(4, dtype=np.int32)[y.numpy()])


@pytest.mark.parametrize(("dt", "value"), [(dtypes.int32, 1e30), (dtypes.int32, 2.0**31), (dtypes.int64, 2.0**63),
                                           (dtypes.uint8, -1.0), (dtypes.int16, [1.0, 4e4])])  # fmt: skip
def test_storing_a_float_beyond_an_int_dtype_is_refused(dt: Any, value: Any) -> None:
    t = Tensor.zeros(2, dtype=dt).contiguous().realize()
    with pytest.raises(TensorOverflowError, match="outside"):  # stored 0 (or a wrapped value) where numpy raises
        if isinstance(value, list):
            t[: len(value)] = value
        else:
            t[0] = value
    assert t.tolist() == [0, 0]
    with pytest.raises(TensorOverflowError, match="outside"):  # assign of a host value: the same check as setitem
        t.assign(value if not isinstance(value, list) else [value[1]] * 2).realize()
    assert t.tolist() == [0, 0]


def test_storing_floats_within_an_int_dtype_truncates_like_numpy() -> None:
    for dt, values in [(dtypes.int32, [3.7, -2147483648.9]), (dtypes.uint8, [255.9, -0.5]), (dtypes.int8, [-128.5, 1])]:
        t = Tensor.zeros(2, dtype=dt).contiguous().realize()
        t[:] = values
        want = np.zeros(2, dtype=np.dtype(dt.fmt))
        want[:] = np.trunc(values)
        np.testing.assert_array_equal(t.numpy(), want)


@pytest.mark.parametrize(
    "header",
    [
        struct.pack(">HBB", 0, 8, 65) + struct.pack(">I", 1) * 65,  # 65 dims of 1: numpy's "maximum ... is 64"
        struct.pack(">HBBIII", 0, 8, 3, 2**22, 2**22, 2**20),  # 2**64 bytes: numpy's int64 product wrapped to 0
    ],
)
def test_an_idx_header_numpy_cannot_hold_is_a_dataset_error(header: bytes) -> None:
    with pytest.raises(DatasetError, match="IDX"):
        parse_idx(header + b"\0")
    with pytest.raises(DatasetError, match="IDX"):
        parse_idx(header)
    np.testing.assert_array_equal(parse_idx(struct.pack(">HBBII", 0, 8, 2, 2, 3) + bytes(range(6))),
                                  np.arange(6, dtype=np.uint8).reshape(2, 3))  # fmt: skip


def _zip(members: list[tuple[str, bytes]]) -> bytearray:
    b = io.BytesIO()
    with zipfile.ZipFile(b, "w", zipfile.ZIP_STORED) as z, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (zipfile warns of the duplicate name it is asked to write)
        for name, data in members:
            z.writestr(name, data)
    return bytearray(b.getvalue())


def test_a_zip_member_named_twice_is_refused() -> None:
    with pytest.raises(ArchiveError, match="appears twice"):  # the second silently replaced the first
        zip_extract(Tensor(bytes(_zip([("a", b"first"), ("a", b"second")]))))
    out = zip_extract(Tensor(bytes(_zip([("a", b"first"), ("b", b"second")]))))
    assert {k: v.numpy().tobytes() for k, v in out.items()} == {"a": b"first", "b": b"second"}


def test_a_zip_member_that_is_encrypted_or_has_no_local_header_is_refused() -> None:
    z = _zip([("a", b"hello")])
    cd = z.rfind(b"PK\x01\x02")  # the central directory entry of "a"
    enc = bytearray(z)
    struct.pack_into("<H", enc, cd + 8, 1)  # general purpose flag bit 0: encrypted (came back as its ciphertext)
    with pytest.raises(ArchiveError, match="encrypted"):
        zip_extract(Tensor(bytes(enc)))
    moved = bytearray(z)
    struct.pack_into("<I", moved, cd + 42, 5)  # the local header offset points into the middle of something else
    with pytest.raises(ArchiveError, match="no local header"):
        zip_extract(Tensor(bytes(moved)))


@pytest.mark.parametrize("args", [(2**53 + 1,), (0, 2**60 + 1, 1), (2**60, 0, -3), (-(2**58), 2**58, 7), (10, 0, -3)])
def test_arange_counts_big_int_ranges_exactly(args: tuple[int, ...]) -> None:
    # the count was a float quotient: arange(2**53 + 1) lost an element, arange(2**60, 0, -3) ended at 67, not 1
    t, want = Tensor.arange(*args), range(*args)
    assert t.shape == (len(want),)
    assert t[-1].item() == want[-1] and t[0].item() == want[0]


@pytest.mark.parametrize("args", [(2**64,), (0, 1, 1e-300), (-(2**63), 2**63)])
def test_an_arange_of_more_elements_than_int64_counts_is_refused(args: tuple[Any, ...]) -> None:
    with pytest.raises(TensorOverflowError, match="more than int64 can count"):  # arange(2**64)[-1] read -1
        Tensor.arange(*args)


@pytest.mark.parametrize(
    "make",
    [
        lambda: Tensor.eye(2**32),  # 2**64 elements
        lambda: Tensor.ones(3).pad((2**63, 0)),
        lambda: Tensor.ones(2**62).cat(Tensor.zeros(2**62)),  # (cat pads each part to the whole)
    ],
)
def test_eye_pad_and_cat_past_int64_elements_are_refused(make: Any) -> None:
    with pytest.raises(TensorOverflowError, match="more than int64 can count"):  # as ones/expand/arange refuse
        make()
    assert Tensor.ones(2**61).cat(Tensor.zeros(2**61))[-(2**61) - 1 :][:2].tolist() == [1.0, 0.0]


@pytest.mark.parametrize("call", [lambda t: t.softplus(beta=b"x"), lambda t: t.normalize(p=b"x", dim=0),
                                  lambda t: t.normalize(dim=0, eps="1")])  # fmt: skip
def test_numeric_parameters_of_the_wrong_kind_are_type_errors(call: Any) -> None:
    with pytest.raises(TensorTypeError, match="must be a real number"):  # softplus: a raw TypeError from 1 / b"x"
        call(Tensor([1.0, 2.0]))
