"""Probes of the third hostile-input round: each case once gave a silent wrong value or an error that named the
wrong thing (a builtin IndexError from deep inside, a TypeError of a comparison, an op the caller never called)."""

from __future__ import annotations

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
                                         ("DEFAULT_FLOAT", 3), ("BEAM_TIMEOUT", "soon")])  # fmt: skip
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
           ("DEFAULT_FLOAT", "float32", "float32")]  # fmt: skip


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
