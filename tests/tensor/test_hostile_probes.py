"""Probes of the third hostile-input round: each case once gave a silent wrong value or an error that named the
wrong thing (a builtin IndexError from deep inside, a TypeError of a comparison, an op the caller never called)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor import Context, Tensor, dtypes
from speck.uop import DType
from speck.uop.dtype import cast_value
from speck.uop.errors import SettingError

INT_DTYPES = [dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64,
              dtypes.uint64]  # fmt: skip
EDGE_FLOATS = st.one_of(
    st.floats(width=32),  # NaN, +-inf, huge and tiny included
    st.sampled_from([3e10, -3e10, 2.0**31, 2.0**32 + 512, -(2.0**63), 2.0**63, 2.0**64, 1e20, -1e30, -0.9, 255.5]),
)


@given(st.lists(EDGE_FLOATS, min_size=1, max_size=8), st.sampled_from(INT_DTYPES))
def test_float_data_made_int_by_dtype_holds_what_cast_gives(vals: list[float], dt: DType) -> None:
    # Tensor(floats, dtype=int) converts on the host; it gave numpy's INT_MIN for NaN, inf and out-of-range values
    # where cast() (on the device and in constant folding) gives 0 or the wrapped value
    arr = np.array(vals, dtype=np.float32)
    want = [cast_value(float(v), dt) for v in arr]
    assert Tensor(arr, dtype=dt).tolist() == want
    assert Tensor(arr).cast(dt).tolist() == want
    assert Tensor([float(v) for v in arr], dtype=dt).tolist() == want


def test_float_data_made_int_keeps_in_range_values_like_numpy() -> None:
    arr = np.array([-3.9, -0.5, 0.0, 0.7, 126.99, -128.0], dtype=np.float64)
    np.testing.assert_array_equal(Tensor(arr, dtype=dtypes.int8).numpy(), arr.astype(np.int8))


@pytest.mark.parametrize("device", [(), []])
def test_an_empty_device_tuple_is_a_value_error(device: Any) -> None:
    with pytest.raises(ValueError, match="names no device"):
        Tensor([1, 2], device=device)
    with pytest.raises(ValueError, match="names no device"):
        Tensor.ones(4).shard(device)
    assert (Tensor([1, 2]) + 1).tolist() == [2, 3]


@pytest.mark.parametrize("repeats, err", [(-1, ValueError), (-3, ValueError), (1.5, TypeError), ("2", TypeError)])
def test_repeat_interleave_names_its_bad_count(repeats: Any, err: type[Exception]) -> None:
    with pytest.raises(err, match="repeat_interleave"):
        Tensor.ones(3).repeat_interleave(repeats)


@given(st.integers(0, 3), st.integers(1, 4))
def test_repeat_and_repeat_interleave_take_numpy_ints_like_numpy(r: int, n: int) -> None:
    a = np.arange(n, dtype=np.int32)
    assert Tensor(a).repeat_interleave(np.int64(r)).tolist() == np.repeat(a, r).tolist()
    assert Tensor(a).repeat(np.int64(r)).tolist() == np.tile(a, r).tolist()


@pytest.mark.parametrize("name, value", [("DEBUG", "abc"), ("DEBUG", None), ("BEAM", 1.5), ("JIT", [1]),
                                         ("DEFAULT_FLOAT", None), ("BEAM_TIMEOUT", "soon")])  # fmt: skip
def test_context_refuses_a_value_of_the_wrong_kind_and_changes_nothing(name: str, value: Any) -> None:
    from speck.uop import ContextVar

    other = "SPLIT_REDUCEOP" if name == "DEBUG" else "DEBUG"  # a good value next to the bad one isn't set either
    before = {n: ContextVar.get(n).value for n in (other, name)}
    with pytest.raises(TypeError, match=rf"Context\({name}=.*takes") as ei, Context(**{other: 7, name: value}):
        pass
    assert isinstance(ei.value, SettingError)
    assert {n: ContextVar.get(n).value for n in before} == before
    assert (Tensor.ones(3).contiguous() + 1).tolist() == [2.0, 2.0, 2.0]


KIND_OK = [("DEBUG", "0", 0), ("DEBUG", True, True), ("DEBUG", np.int64(0), 0), ("BEAM_TIMEOUT", 3, 3),
           ("DEFAULT_FLOAT", "float32", "float32"), ("PROFILE", 1, 1)]  # fmt: skip


@pytest.mark.parametrize("name, value, want", KIND_OK)
def test_context_takes_values_of_the_settings_kind(name: str, value: Any, want: Any) -> None:
    from speck.uop import ContextVar

    with Context(**{name: value}):
        got = ContextVar.get(name).value
        assert got == want and type(got) is type(want)


_TRUNCATED_CHILD = """
import os, sys, numpy as np
from speck.tensor import Tensor, dtypes
path = sys.argv[1]
t = Tensor(__import__("pathlib").Path(path), dtype=dtypes.float32)
assert t[:4].to("CPU").tolist() == [0.0, 1.0, 2.0, 3.0]
os.truncate(path, int(sys.argv[2]))
try:
    t[-4:].to("CPU").numpy()
except RuntimeError as e:
    print("refused:", e)
assert (Tensor([1, 2]) + 1).tolist() == [2, 3]
"""


@pytest.mark.parametrize("left", [100, 4096, 0])
def test_a_disk_tensor_whose_file_was_truncated_is_an_error_not_sigbus(tmp_path: Any, left: int) -> None:
    # the file is memory-mapped: reading a page past its new end killed the process with SIGBUS, and the part of
    # the last page past the end read as zeros
    import subprocess
    import sys

    f = tmp_path / "w.bin"
    f.write_bytes(np.arange(3 * 4096, dtype=np.float32).tobytes())
    proc = subprocess.run([sys.executable, "-c", _TRUNCATED_CHILD, str(f), str(left)], capture_output=True, text=True,
                          timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"shrank to {left} bytes since it was mapped" in proc.stdout and "load it again" in proc.stdout


@pytest.mark.parametrize("device", ["CPU:LLVM", "CPU:CLANG", "CPU:X86", "PYTHON"])
@pytest.mark.parametrize("name", ["a\nb", "a\r\ndefine void @evil() {", "x */ int y; /*", "é"])
def test_a_variable_of_any_name_renders_and_runs(device: str, name: str) -> None:
    # the LLVM renderer wrote the name into a `;` comment as it was: a newline ended the comment (broken IR)
    from speck.tensor import Variable

    v = Variable(name, 1, 10).bind(3)
    assert Tensor.ones(10, device=device).contiguous().shrink(((0, v),)).sum().item() == 3.0


@pytest.mark.parametrize("device", ["CPU:LLVM", "CPU:CLANG", "CPU:X86"])
@pytest.mark.parametrize("name", ["a b", "x(){}; int evil", "a\nb", "", "1st"])
def test_a_custom_kernel_name_that_is_no_identifier_is_named_as_such(device: str, name: str) -> None:
    # the x86 backend wrote "a b" into its program header and then failed to parse it back: "expected an x86
    # program starting with ...", an error about its own text
    from speck.codegen.errors import ProgramFormError
    from speck.codegen.kernel_info import KernelInfo
    from speck.uop import UOp

    def k(C: UOp) -> UOp:
        i = UOp.range(C.size, 0)
        return C[i].store(i.cast(C.dtype.base)).end(i).sink(arg=KernelInfo(name=name))

    with pytest.raises(ProgramFormError, match=r"kernel name .* is not a valid C/LLVM identifier; name kernels"):
        Tensor.custom_kernel(Tensor.empty(4, device=device), fxn=k)[0].realize()
    assert (Tensor([1, 2], device=device) + 1).tolist() == [2, 3]


@pytest.mark.parametrize("dt", [dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2])
def test_a_loaded_bf16_or_fp8_tensor_reads_from_its_file(tmp_path: Any, dt: DType) -> None:
    # numpy() of a dtype numpy lacks converts to float32 first; on a DISK tensor that conversion ran on the file:
    # "DISK:... runs no kernels" for every read of a bf16 checkpoint straight from safe_load
    from speck.tensor.nn.state import safe_load, safe_save

    vals = [1.5, -2.0, 0.25, 8.0]
    safe_save({"w": Tensor(vals, dtype=dt)}, tmp_path / "m.safetensors")
    w = safe_load(tmp_path / "m.safetensors")["w"]
    assert w.device.startswith("DISK:") and w.dtype == dt
    assert w.tolist() == Tensor(vals, dtype=dt).tolist() == vals
    assert w[1:3].numpy().tolist() == vals[1:3]


@pytest.mark.parametrize("where", ["a directory", "a missing directory"])
def test_safe_save_to_a_path_it_cant_write_is_a_save_error_leaving_no_temporary_file(tmp_path: Any, where: str) -> None:
    from speck.tensor.errors import SaveError, TensorError
    from speck.tensor.nn.state import safe_save

    target = tmp_path / "sub"
    target.mkdir()
    path = target if where == "a directory" else target / "no" / "m.safetensors"
    with pytest.raises(OSError, match=rf"safe_save: can't write {path}") as ei:
        safe_save({"w": Tensor([1.0])}, path)
    assert isinstance(ei.value, SaveError) and isinstance(ei.value, TensorError) and ei.value.errno
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["sub"]
    safe_save({"w": Tensor([1.0])}, target / "ok.safetensors")


@pytest.mark.parametrize("low, high, dt", [(0, 2**40, dtypes.int32), (0, 300, dtypes.uint8), (-1, 5, dtypes.uint16),
                                           (-200, 0, dtypes.int8), (0, 2**64, dtypes.int64)])  # fmt: skip
def test_randint_bounds_beyond_the_dtype_are_an_overflow_error(low: int, high: int, dt: DType) -> None:
    # the draws wrapped: randint(high=2**40) gave negative int32s
    with pytest.raises(OverflowError, match=r"randint: \[low, high\).*doesn't fit"):
        Tensor.randint(8, low=low, high=high, dtype=dt)


@given(st.integers(-(2**31), 2**31 - 2), st.integers(1, 2**20))
def test_randint_within_the_dtype_draws_in_range(low: int, span: int) -> None:
    high = min(low + span, 2**31)
    v = Tensor.randint(64, low=low, high=high).numpy()
    assert v.dtype == np.int32 and v.min() >= low and v.max() < high


@pytest.mark.parametrize("shape, start, end", [((2, 3), 1, 0), ((2, 3, 4), -1, 0), ((2, 3, 4), 2, 1)])
def test_flatten_with_start_after_end_is_a_value_error(shape: tuple[int, ...], start: int, end: int) -> None:
    with pytest.raises(ValueError, match="flatten: start_dim .* comes after end_dim"):
        Tensor.ones(*shape).flatten(start, end)
    for s in range(len(shape)):  # start <= end still matches numpy's reshape
        for e in range(s, len(shape)):
            want = np.ones(shape).reshape(shape[:s] + (-1,) + shape[e + 1 :]).shape
            assert Tensor.ones(*shape).flatten(s, e).shape == want


@pytest.mark.parametrize("mask", [True, False])
def test_a_0d_boolean_tensor_index_is_an_index_error(mask: bool) -> None:
    t = Tensor.arange(3).contiguous()
    with pytest.raises(IndexError, match="0-d boolean tensor is not a valid index"):
        t[Tensor(mask)]
    with pytest.raises(IndexError, match="0-d boolean tensor is not a valid index"):
        t[Tensor(mask)] = 5
    assert t.tolist() == [0, 1, 2]


class _Reduce:
    def __init__(self, fn: Any, *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.fn, self.args)


def _zip_checkpoint(path: Any, obj: Any, protocol: int = 2) -> Any:
    import pickle
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr("archive/data.pkl", pickle.dumps(obj, protocol=protocol))
    return path


@pytest.mark.parametrize("args", [(10**11,), (2**62,), (-1,), ("abc", "utf-16"), (5, "x")])
def test_a_checkpoint_bytearray_of_a_size_is_refused_before_it_allocates(tmp_path: Any, args: tuple[Any, ...]) -> None:
    # bytearray is allowed so that bytearray literals load; bytearray(10**11) allocated and zeroed 100 GB
    from speck.tensor.errors import UnsafePickleError
    from speck.tensor.nn.state import torch_load

    path = _zip_checkpoint(tmp_path / "bomb.pth", {"x": _Reduce(bytearray, *args)})
    with pytest.raises(UnsafePickleError, match=r"is not a bytes literal"):
        torch_load(path)


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@given(data=st.binary(max_size=64))
def test_bytearray_literals_in_a_checkpoint_still_load(tmp_path_factory: Any, protocol: int, data: bytes) -> None:
    from speck.tensor.nn.state import torch_load

    path = _zip_checkpoint(tmp_path_factory.mktemp("ba") / "ok.pth", {"x": bytearray(data)}, protocol)
    assert torch_load(path) == {"x": bytearray(data)}


def test_a_variable_left_unbound_in_a_shape_is_named_at_realize() -> None:
    from speck.tensor import Variable

    v = Variable("i", 1, 10)
    with pytest.raises(ValueError, match=r"needs a value for the Variable 'i', which nothing in the graph binds"):
        Tensor.ones(10).contiguous().shrink(((0, v),)).sum().item()
    assert Tensor.ones(10).contiguous().shrink(((0, v.bind(4)),)).sum().item() == 4.0


@pytest.mark.parametrize("value", ["3", 3.0, None, [3]])
def test_binding_a_variable_to_a_non_int_is_a_type_error(value: Any) -> None:
    from speck.tensor import Variable

    with pytest.raises(TypeError, match="variable 'a' is bound to an int"):
        Variable("a", 0, 10).bind(value)


@pytest.mark.parametrize("name", [5, None, b"a"])
def test_a_variable_name_must_be_a_str(name: Any) -> None:
    from speck.tensor import Variable

    with pytest.raises(TypeError, match="a variable's name must be a str"):
        Variable(name, 0, 10)


@given(st.integers(-100, 100), st.integers(0, 100), st.integers(0, 100))
def test_numpy_int_bounds_and_values_work_where_ints_do(lo: int, span: int, off: int) -> None:
    from speck.tensor import Variable

    hi, val = lo + span, lo + min(off, span)
    v = Variable("a", np.int64(lo), np.int32(hi)).bind(np.int16(val) if -(2**15) <= val < 2**15 else val)
    assert v.unbind()[1] == val and type(v.unbind()[1]) is int
    assert v.unbind()[0].arg == ("a", lo, hi) and all(type(x) is int for x in v.unbind()[0].arg[1:])


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda nn: nn.Conv2d(3, 4, kernel_size=0), ValueError, "Conv2d: kernel_size must be >= 1"),
        (lambda nn: nn.Conv2d(3, 4, kernel_size=(3, -1)), ValueError, "Conv2d: kernel_size must be >= 1"),
        (lambda nn: nn.Conv2d(4, 4, 3, groups=0), ValueError, "Conv2d: groups must be >= 1"),
        (lambda nn: nn.Conv2d(3, 4, 2.5), TypeError, "Conv2d: kernel_size must be an int"),
        (lambda nn: nn.Conv1d(0, 4, 3), ValueError, "Conv2d: in_channels must be >= 1"),
        (lambda nn: nn.ConvTranspose2d(3, 4, 0), ValueError, "ConvTranspose2d: kernel_size must be >= 1"),
        (lambda nn: nn.ConvTranspose2d(4, 3, 3, groups=2), ValueError, "must divide by groups"),
        (lambda nn: nn.BatchNorm(-2), ValueError, "BatchNorm: sz must be >= 1"),
        (lambda nn: nn.GroupNorm(0, 4), ValueError, "GroupNorm: num_groups must be >= 1"),
        (lambda nn: nn.Embedding(-1, 3), ValueError, "Embedding: vocab_size must be >= 1"),
        (lambda nn: nn.Embedding(4, 2.5), TypeError, "Embedding: embed_size must be an int"),
    ],
)
def test_layer_sizes_are_checked_when_the_layer_is_made(make: Any, err: type[Exception], match: str) -> None:
    # a kernel_size of 0 divided by zero; a negative size surfaced as "rand needs a concrete shape"
    from speck.tensor import nn

    with pytest.raises(err, match=match):
        make(nn)


@pytest.mark.parametrize("layer, shape", [("BatchNorm", (2, 4, 5, 5)), ("GroupNorm", (1, 5, 3)),
                                          ("InstanceNorm", (1, 5, 3)), ("BatchNorm", (3,))])  # fmt: skip
def test_a_norm_layer_names_an_input_of_the_wrong_channel_count(layer: str, shape: tuple[int, ...]) -> None:
    # it surfaced as "can't reshape shape (3,) to (1, 4, 1, 1)", naming no layer
    from speck.tensor import nn

    m = nn.GroupNorm(2, 4) if layer == "GroupNorm" else getattr(nn, layer)(3 if layer == "BatchNorm" else 2)
    with pytest.raises(ValueError, match=rf"{layer}\(\d\) expects input \(N, \d, \.\.\.\)"):
        m(Tensor.ones(*shape))


def test_layers_of_valid_sizes_still_run() -> None:
    from speck.tensor import nn

    assert nn.Conv2d(3, 4, (3, 3), stride=[1, 1])(Tensor.ones(1, 3, 5, 5)).shape == (1, 4, 3, 3)
    assert nn.ConvTranspose2d(4, 2, 3, groups=2)(Tensor.ones(1, 4, 5, 5)).shape == (1, 2, 7, 7)
    assert nn.BatchNorm(4)(Tensor.ones(2, 4, 5, 5)).shape == (2, 4, 5, 5)
    assert nn.BatchNorm(4, affine=False, track_running_stats=False)(Tensor.ones(2, 6)).shape == (2, 6)
    assert nn.GroupNorm(2, 4)(Tensor.ones(1, 4, 3)).shape == (1, 4, 3)
    assert nn.Embedding(np.int64(5), 3)(Tensor([4])).shape == (1, 3)


@given(st.integers(0, 4), st.integers(1, 4), st.sampled_from([np.int8, np.int32, np.int64, np.uint16]))
def test_numpy_int_sizes_make_shapes_like_ints(a: int, b: int, kind: Any) -> None:
    # every constructor and reshape refused them: "shape must be int, got np.int64(3)"
    na, nb = kind(a), kind(b)
    for t in (Tensor.ones(na, nb), Tensor.zeros((na, nb)), Tensor.empty(na, nb), Tensor.full((na, nb), 2),
              Tensor.rand(na, nb), Tensor.ones(a * b).reshape(na, nb), Tensor.ones(1, b).expand(na, nb)):  # fmt: skip
        assert t.shape == (a, b) and all(type(d) is int for d in t.shape)
    assert Tensor.ones(na, nb).numpy().tolist() == np.ones((a, b)).tolist()


@pytest.mark.parametrize(
    "make, err, match",
    [
        (lambda o, w: o.SGD([w], lr=float("nan")), ValueError, "learning rate must be >= 0 and finite"),
        (lambda o, w: o.SGD([w], lr=float("inf")), ValueError, "learning rate must be >= 0 and finite"),
        (lambda o, w: o.SGD([w], lr="fast"), TypeError, "learning rate must be a number"),
        (lambda o, w: o.SGD([w], lr=Tensor([0.1, 0.2])), ValueError, "a learning rate tensor holds one value"),
        (lambda o, w: o.SGD([w], momentum=float("nan")), ValueError, "momentum must be >= 0"),
        (lambda o, w: o.SGD([w], weight_decay=float("nan")), ValueError, "weight_decay must be >= 0"),
        (lambda o, w: o.Adam([w], b1=1.5), ValueError, "b1 must be >= 0 and < 1"),
        (lambda o, w: o.Adam([w], b2=1.0), ValueError, "b2 must be >= 0 and < 1"),
        (lambda o, w: o.Adam([w], eps=-1e-8), ValueError, "eps must be >= 0"),
        (lambda o, w: o.AdamW([w], weight_decay=float("nan")), ValueError, "weight_decay must be >= 0"),
    ],
)
def test_optimizer_hyperparameters_are_checked(make: Any, err: type[Exception], match: str) -> None:
    # NaN passed the `< 0` checks and every weight was NaN after the first step; a beta >= 1 diverges
    from speck.tensor.nn import optim

    w = Tensor.ones(3, requires_grad=True)
    with pytest.raises(err, match=match):
        make(optim, w)


def test_optimizers_with_valid_hyperparameters_still_step() -> None:
    from speck.tensor.nn import optim

    for make in (lambda w: optim.SGD([w], lr=Tensor(0.5), momentum=0.0), lambda w: optim.Adam([w], lr="0.5", b1=0.0)):
        w = Tensor([1.0, 2.0], requires_grad=True)
        opt = make(w)
        with Tensor.train():
            opt.zero_grad()
            (w * w).sum().backward()
            opt.step()
        assert all(math.isfinite(v) and v < start for v, start in zip(w.tolist(), [1.0, 2.0]))


@given(st.integers(0, 6), st.integers(-9, 3), st.integers(-9, 3))
def test_negative_pads_crop_like_slicing_or_name_the_pad(n: int, b: int, a: int) -> None:
    # cropping more than the dim surfaced as "shrink ((10, 4),) out of bounds", an op the caller never called
    x = np.arange(n)
    if -min(b, 0) - min(a, 0) > n:
        with pytest.raises(ValueError, match=r"pad .*: the negative amounts crop \d+ from dim 0 of size"):
            Tensor(x).pad(((b, a),))
        return
    want = np.pad(x[-min(b, 0) : n + min(a, 0)], (max(b, 0), max(a, 0)))
    assert Tensor(x).pad(((b, a),)).tolist() == want.tolist()


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda x, w: x.conv2d(w, stride=(2,)), r"conv2d: stride \(2,\) needs one int or 2 of them"),
        (lambda x, w: x.conv2d(w, stride=(1, 1, 1)), r"conv2d: stride \(1, 1, 1\) needs one int or 2"),
        (lambda x, w: x.conv2d(w, dilation=()), r"conv2d: dilation \(\) needs one int or 2"),
        (lambda x, w: x.conv2d(w, padding=(1, 1, 1)), r"padding \(1, 1, 1\) for 2 spatial dims needs one int, 2"),
        (lambda x, w: x.conv_transpose2d(w, stride=(1, 1, 1)), r"conv_transpose2d: stride .* needs one int or 2"),
        (lambda x, w: x.max_pool2d(stride=(1, 1, 1)), r"max_pool2d: stride .* needs one int or 2"),
        (lambda x, w: x.avg_pool2d(kernel_size=(2, 2, 2), stride=(1, 1)), r"avg_pool2d: stride .* needs one int or 3"),
    ],
)
def test_per_dim_window_arguments_need_one_value_per_dim(call: Any, match: str) -> None:
    # a short tuple was a bare IndexError, a long one's extra values were ignored
    with pytest.raises(ValueError, match=match):
        call(Tensor.ones(1, 1, 5, 5), Tensor.ones(1, 1, 3, 3))


def test_a_device_less_jit_input_gets_advice_that_works() -> None:
    # the advice was ".contiguous() on a device", which leaves Tensor.arange(5) device-less: the same error again
    from speck.tensor import TinyJit
    from speck.tensor.jit import JitError

    @TinyJit
    def f(x: Tensor) -> Tensor:
        return (x * 2).realize()

    x = Tensor.arange(5).float().contiguous()
    with pytest.raises(JitError, match=r"device-less tensor; give it storage with \.clone\(device\)"):
        f(x)
    for _ in range(3):  # the advice, followed
        assert f(x.clone("CPU")).tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("n, dt", [(300, dtypes.int8), (257, dtypes.uint8), (2**16 + 1, dtypes.uint16)])
def test_randperm_past_its_dtype_is_an_overflow_error(n: int, dt: DType) -> None:
    # the indices wrapped: randperm(300, dtype=int8) held repeats and negatives
    with pytest.raises(OverflowError, match=rf"randperm\({n}\) needs a dtype that holds {n - 1}"):
        Tensor.randperm(n, dtype=dt)


@given(st.integers(0, 256))
def test_randperm_is_a_permutation_in_the_smallest_dtype_that_holds_it(n: int) -> None:
    dt = dtypes.uint8 if n <= 256 else dtypes.int16
    assert sorted(Tensor.randperm(n, dtype=dt).tolist()) == list(range(n))


@pytest.mark.parametrize("n, err", [(-1, ValueError), (2.0, TypeError)])
def test_randperm_needs_a_count(n: Any, err: type[Exception]) -> None:
    with pytest.raises(err, match="randperm"):
        Tensor.randperm(n)


@pytest.mark.parametrize("init", ["scaled_uniform", "glorot_uniform", "kaiming_uniform", "kaiming_normal"])
def test_initialisers_of_empty_shapes_are_empty(init: str) -> None:
    # scaled_uniform(0, 3) raised ZeroDivisionError (0 ** -0.5), glorot_uniform(0, 0) too
    for shape in ((0, 3), (0, 0), (3, 0)):
        assert getattr(Tensor, init)(*shape).numpy().shape == shape


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda t: t.cat(1), "cat: argument 0 must be a Tensor, got int"),
        (lambda t: t.stack((2, 2)), "stack: argument 1 must be a Tensor, got tuple"),
        (lambda t: Tensor.stack_tensors(5), "stack takes a non-empty list or tuple of Tensors"),
        (lambda t: Tensor.stack_tensors([]), "stack takes a non-empty list or tuple of Tensors"),
        (lambda t: t.reshape(1, 1, 3).conv2d(dtypes.int8), "conv2d: weight/bias 0 must be a Tensor, got DType"),
        (lambda t: t.linear((2, 2)), "linear: weight 0 must be a Tensor, got tuple"),
        (lambda t: t.reshape(1, 3).cross_entropy(0), "cross_entropy: target 0 must be a Tensor, got int"),
        (lambda t: t.reshape(1, 3).sparse_categorical_crossentropy([1]), "labels 0 must be a Tensor, got list"),
        (lambda t: t.masked_select(-1), "masked_select: mask 0 must be a Tensor, got int"),
        (lambda t: t.meshgrid([1, 0]), "meshgrid: argument 1 must be a Tensor, got list"),
        (lambda t: Tensor.einsum(2, t), "einsum: the formula must be a str"),
        (lambda t: t.tile(np.array([1, 2])), "repeat: a repeat count must be an int, got ndarray"),
        (lambda t: t.expand(np.array([1, 2]), 3), "shape must be int, got ndarray"),
    ],
)
def test_a_non_tensor_where_a_tensor_belongs_is_a_type_error_naming_it(call: Any, match: str) -> None:
    # each was an AttributeError from deep inside ("'int' object has no attribute 'ndim'") or numpy's own TypeError
    with pytest.raises(TypeError, match=match):
        call(Tensor([1.0, 2.0, 3.0]))
