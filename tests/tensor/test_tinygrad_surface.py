"""The tinygrad import surface (issue 15): every `from tinygrad.X import Y` a tinygrad test file starts with resolves
under the alias to the speck module of the same path, and the names that have behaviour behave as tinygrad documents
(get_program renders a schedule item that compiles and runs, full_rewrite linearizes, type_verify accepts and
rejects, sym simplifies, the dtype conversions, the CIFAR-10 reader, ...). The import table runs in a subprocess so
the alias does not leak into this process; the behaviour tests use the speck module paths, which the subprocess
proves are the same objects."""

from __future__ import annotations

import contextvars
import gc
import io
import os
import pickle
import subprocess
import sys
import tarfile
import types
import weakref
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.codegen.errors import OptError
from speck.hcq import Buffer
from speck.tensor import Context, Device, Tensor, TinyJit, dtypes
from speck.tensor.codegen import full_rewrite, full_rewrite_to_sink, get_program
from speck.tensor.codegen.opt import KernelOptError, Opt, OptOps
from speck.tensor.device import CompileError, LRUAllocator, Runtime
from speck.tensor.dtype import (
    DTYPES_DICT,
    ImageDType,
    _from_torch_dtype,
    _to_np_dtype,
    _to_torch_dtype,
    imagef,
    imageh,
)
from speck.tensor.engine.memory import memory_planner
from speck.tensor.engine.realize import capturing, method_cache
from speck.tensor.helpers import (
    ContextVar,
    Target,
    TracingKey,
    cpu_time_execution,
    get_single_element,
    memsize_to_str,
)
from speck.tensor.nn.datasets import CIFAR_BATCHES, CIFAR_TAR, DatasetError, cifar
from speck.tensor.renderer import Renderer
from speck.tensor.renderer.cstyle import ClangRenderer, CStyleLanguage
from speck.tensor.renderer.llvmir import LLVMRenderer
from speck.tensor.renderer.ptx import PTXRenderer
from speck.tensor.runtime.ops_cpu import CPUDevice
from speck.tensor.runtime.ops_disk import DiskBuffer, DiskDevice
from speck.tensor.runtime.ops_null import NullDevice
from speck.tensor.runtime.ops_python import PythonDevice
from speck.tensor.tensor import _METADATA, all_tensors
from speck.tensor.uop.ops import UOp, graph_rewrite, smin, sym_infer, track_rewrites
from speck.tensor.uop.spec import type_verify
from speck.tensor.uop.symbolic import sym, symbolic, symbolic_simple

# module -> names a tinygrad test file imports from it (the probe of issue 15, plus the names around them)
IMPORTS = {
    "tinygrad.helpers": "CPU_LLVM AMD_LLVM WINDOWS AMX TracingKey cpu_time_execution DEVECTORIZE Target QUANTIZE "
    "FUSE_ARANGE DISABLE_COMPILER_CACHE getenv Context DEBUG GlobalCounters get_single_element memsize_to_str",
    "tinygrad.dtype": "_to_torch_dtype _from_torch_dtype ImageDType _to_np_dtype dtypes DType PtrDType DTypeLike "
    "Invalid InvalidType can_safe_cast",
    "tinygrad.tensor": "Tensor _to_np_dtype _METADATA all_tensors",
    "tinygrad.device": "CompileError Runtime LRUAllocator Allocator Compiler Compiled Device Buffer",
    "tinygrad.engine.realize": "get_program capturing method_cache run_schedule lower_schedule CompiledRunner ExecItem",
    "tinygrad.engine.memory": "memory_planner",
    "tinygrad.uop": "Ops GroupOp UOp AxisType",
    "tinygrad.uop.ops": "track_rewrites smin smax sym_infer UOp Ops graph_rewrite exec_alu python_alu",
    "tinygrad.uop.symbolic": "sym symbolic symbolic_simple",
    "tinygrad.uop.spec": "type_verify",
    "tinygrad.codegen": "full_rewrite full_rewrite_to_sink get_program",
    "tinygrad.codegen.opt": "Opt OptOps KernelOptError",
    "tinygrad.renderer": "Renderer ProgramSpec",
    "tinygrad.renderer.cstyle": "ClangRenderer CStyleLanguage",
    "tinygrad.renderer.llvmir": "LLVMRenderer",
    "tinygrad.renderer.ptx": "PTXRenderer",
    "tinygrad.runtime.ops_cpu": "CPUDevice",
    "tinygrad.runtime.ops_disk": "DiskDevice DiskBuffer",
    "tinygrad.runtime.ops_python": "PythonDevice PythonRenderer",
    "tinygrad.runtime.ops_null": "NullDevice",
    "tinygrad.runtime.support.compiler_cuda": "PTX",
    "tinygrad.nn.datasets": "mnist cifar",
}

IMPORT_SCRIPT = """
import importlib, sys, speck.tensor.compat as c
c.install_tinygrad_alias()
table = {table!r}
for mod, names in table.items():
    m = importlib.import_module(mod)
    real = "speck.tensor" + mod[len("tinygrad"):]
    assert m is sys.modules[real] is importlib.import_module(real), (mod, m, real)
    missing = [n for n in names.split() if not hasattr(m, n)]
    assert not missing, (mod, missing)
from tinygrad.helpers import AMX, PTX as P1
from tinygrad.runtime.support.compiler_cuda import PTX
assert PTX is P1
print(AMX.value, PTX.value)
"""


def test_every_tinygrad_path_imports_as_the_speck_module_with_its_names() -> None:
    env = {**os.environ, "AMX": "1", "PTX": "2"}  # new settings read the environment like every other one
    proc = subprocess.run([sys.executable, "-c", IMPORT_SCRIPT.format(table=IMPORTS)], capture_output=True, text=True,
                          env=env)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1", "2"]


@pytest.mark.parametrize(
    "name", ["CPU_LLVM", "AMD_LLVM", "AMX", "PTX", "DEVECTORIZE", "FUSE_ARANGE", "QUANTIZE", "DISABLE_COMPILER_CACHE"]
)
def test_new_settings_are_context_scoped_and_unknown_names_still_raise(name: str) -> None:
    cv = ContextVar.get(name)
    before = cv.value
    with Context(**{name: 7}):
        assert cv.value == 7
    assert cv.value == before
    with pytest.raises(Exception, match="NOT_A_SETTING"):
        with Context(NOT_A_SETTING=1):
            pass


# ---------------- codegen: get_program / full_rewrite / renderers ----------------
def _schedule_item_ast() -> tuple[UOp, np.ndarray, np.ndarray]:
    x = np.arange(1, 9, dtype=np.float32)
    a = Tensor(x).realize()
    out = a * 3 + 1
    sched = out.schedule()
    assert len(sched) == 1
    return sched[0].ast, x, x * 3 + 1


def _run(spec, device: str, inputs: list[np.ndarray], out_size: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    dev = Device[device]
    prog = dev.load_program(spec)
    assert isinstance(prog, Runtime)
    out = Buffer(device, out_size, dtypes.float32)
    bufs = [out] + [Buffer(device, len(x), dtypes.float32).copyin(x) for x in inputs]
    prog(*bufs, wait=True)
    return out.numpy().view(np.float32).copy()


@pytest.mark.parametrize(
    "device, renderer",
    [("CPU", None), pytest.param("CPU:CLANG", ClangRenderer, marks=pytest.mark.c_backend), ("CPU:LLVM", LLVMRenderer)],
)
def test_get_program_of_a_schedule_item_compiles_and_runs(device: str, renderer: type | None) -> None:
    ast, x, want = _schedule_item_ast()
    spec = get_program(ast, renderer() if renderer is not None else None)
    assert spec.lib is None and spec.src and spec.name in spec.src  # rendered, not compiled
    np.testing.assert_allclose(_run(spec, device, [x], len(x)), want, rtol=1e-6)


@pytest.mark.c_backend
def test_get_program_applies_the_given_opts_and_rejects_bad_ones() -> None:
    ast, x, want = _schedule_item_ast()
    upcast = get_program(ast, ClangRenderer(), opts=[Opt(OptOps.UPCAST, 0, 4)])
    assert tuple(upcast.applied_opts) == (Opt(OptOps.UPCAST, 0, 4),)
    assert tuple(get_program(ast, ClangRenderer(), opts=[]).applied_opts) == ()
    np.testing.assert_allclose(_run(upcast, "CPU:CLANG", [x], len(x)), want, rtol=1e-6)
    assert KernelOptError is OptError
    with pytest.raises(KernelOptError):
        get_program(ast, ClangRenderer(), opts=[Opt(OptOps.UPCAST, 0, 3)])  # 3 does not divide 8


def test_full_rewrite_linearizes_and_clang_renders_it() -> None:
    ast, _, _ = _schedule_item_ast()
    r = ClangRenderer()
    uops = full_rewrite(ast, r)
    assert isinstance(uops, list) and uops[-1].op.name == "SINK"
    assert [u.op.name for u in uops].count("RANGE") == [u.op.name for u in uops].count("END")
    src = r.render(uops)
    assert f"void {uops[-1].arg.name}(" in src
    lowered = full_rewrite_to_sink(ast, r)
    assert isinstance(lowered, UOp) and lowered.op.name == "SINK"
    assert {u.op for u in lowered.toposort()} >= {u.op for u in uops if u.op.name in ("STORE", "LOAD", "RANGE")}


def test_renderer_classes_are_the_devices_renderers() -> None:
    assert isinstance(Device["CPU"].renderer, Renderer)
    assert isinstance(Device["CPU:CLANG"].renderer, ClangRenderer)
    assert isinstance(Device["CPU:LLVM"].renderer, LLVMRenderer)
    assert isinstance(ClangRenderer(), CStyleLanguage)
    for name in ("CPU", "CPU:CLANG", "CPU:LLVM", "CPU:X86", "PYTHON", "NULL"):
        assert not isinstance(Device[name].renderer, PTXRenderer)
    with pytest.raises(NotImplementedError, match="PTX"):
        PTXRenderer()


@pytest.mark.c_backend
def test_compile_errors_are_compile_error() -> None:
    with pytest.raises(CompileError):
        Device["CPU:CLANG"].compiler.compile("this is not C {")


# ---------------- uop: type_verify, sym, smin, sym_infer, track_rewrites ----------------
def test_type_verify_accepts_a_linearized_program_and_rejects_a_broken_one() -> None:
    ast, _, _ = _schedule_item_ast()
    uops = full_rewrite(ast, ClangRenderer())
    type_verify(uops)  # a program from the pipeline follows the program spec
    type_verify(ast)  # a kernel AST follows the kernel spec
    bare = UOp.const(dtypes.int32, 3)  # a literal that is not casted: programs never have one
    with pytest.raises(RuntimeError, match="casted"):
        type_verify([*uops[:-1], bare, uops[-1]])


@given(st.integers(0, 50), st.integers(-20, 20))
def test_sym_simplifies_identities_and_sym_infer_evaluates(v: int, c: int) -> None:
    x = UOp.variable("x", 0, 50)
    for pm in (sym, symbolic, symbolic_simple):
        assert graph_rewrite(x + 0, pm) is x
        assert graph_rewrite(x * 1, pm) is x
    e = x * 3 + c
    assert sym_infer(e, {"x": v}) == 3 * v + c
    assert sym_infer(e, {x: v}) == 3 * v + c  # keyed by the Variable, as tinygrad code passes it
    assert sym_infer(c, {}) == c


@given(st.lists(st.integers(-100, 100), min_size=1, max_size=5))
def test_smin_is_min_for_ints(xs: list[int]) -> None:
    assert smin(*xs) == min(xs)


def test_smin_of_symbolic_ints_uses_bounds() -> None:
    x = UOp.variable("x", 0, 10)
    assert smin(x, 20) is x  # x never exceeds 20
    m = smin(x, 5)
    assert isinstance(m, UOp) and (m.vmin, m.vmax) == (0, 5)
    assert sym_infer(m, {"x": 8}) == 5 and sym_infer(m, {"x": 2}) == 2


def test_track_rewrites_leaves_the_function_working() -> None:
    def f(a: int) -> int:
        return a + 1

    assert track_rewrites()(f)(1) == 2
    assert track_rewrites(name=lambda *a, **k: TracingKey("f"))(f) is f


# ---------------- tensor / engine / device names ----------------
def test_to_np_dtype_matches_numpy_layouts() -> None:
    assert _to_np_dtype(dtypes.float32) is np.float32
    assert _to_np_dtype(dtypes.bfloat16) is None
    for dt in DTYPES_DICT.values():
        npt = _to_np_dtype(dt)
        assert npt is None or np.dtype(npt).itemsize == dt.itemsize, dt


def test_to_torch_dtype_maps_names_and_imports_torch_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = types.ModuleType("torch")
    for n in ("float32", "bfloat16", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2"):
        setattr(fake, n, f"torch.{n}")
    monkeypatch.setitem(sys.modules, "torch", fake)
    assert _to_torch_dtype(dtypes.float32) == "torch.float32"
    assert _to_torch_dtype(dtypes.bfloat16) == "torch.bfloat16"
    assert _to_torch_dtype(dtypes.fp8e4m3) == "torch.float8_e4m3fn"
    assert _to_torch_dtype(dtypes.uint8) == "torch.uint8"  # numpy's spelling, not the C name "unsigned char"
    assert _to_torch_dtype(dtypes.uint16) is None  # this (fake) torch has no uint16
    assert _to_torch_dtype(dtypes.weakint) is None
    assert _from_torch_dtype("torch.bfloat16") is dtypes.bfloat16 and _from_torch_dtype("torch.int64") is dtypes.int64
    with pytest.raises(KeyError):
        _from_torch_dtype("torch.complex64")


def test_image_dtypes_are_distinct_markers() -> None:
    img = imagef((2, 3, 4))
    assert isinstance(img, ImageDType) and img.shape == (2, 3, 4) and img.base is dtypes.float32
    assert img is imagef((2, 3, 4)) and img is not imageh((2, 3, 4))
    assert pickle.loads(pickle.dumps(img)) is img
    assert not any(isinstance(d, ImageDType) for d in DTYPES_DICT.values())
    assert not isinstance(dtypes.float32.ptr(24), ImageDType)


def test_all_tensors_sees_live_tensors_only() -> None:
    t = Tensor([1.0, 2.0])
    assert any(r() is t for r in all_tensors) and weakref.ref(t) in all_tensors
    n = len(all_tensors)
    assert n >= 1
    ref = weakref.ref(t)
    del t
    gc.collect()
    assert ref() is None and not any(r() is None for r in all_tensors)


def test_metadata_var_is_a_context_var() -> None:
    assert isinstance(_METADATA, contextvars.ContextVar) and _METADATA.get() is None


def test_capturing_is_non_empty_exactly_while_a_jit_captures() -> None:
    seen: list[int] = []

    @TinyJit
    def step(a: Tensor) -> Tensor:
        seen.append(len(capturing))
        return (a * 2).realize()

    assert len(capturing) == 0 and not capturing
    for i in range(4):
        np.testing.assert_allclose(step(Tensor([float(i), 1.0]).realize()).numpy(), [2.0 * i, 2.0])
    assert seen == [0, 1]  # eager first call, then the capture; replays don't call the function
    assert len(capturing) == 0


def test_memory_planner_returns_the_schedule() -> None:
    sched = (Tensor([1.0, 2.0]) + 1).schedule()
    assert memory_planner(sched) is sched


def test_device_classes_are_the_devices() -> None:
    assert isinstance(Device["CPU"], CPUDevice) and isinstance(Device["PYTHON"], PythonDevice)
    assert isinstance(Device["NULL"], NullDevice)
    alloc = Device["CPU"].allocator
    assert isinstance(alloc, LRUAllocator)
    a = alloc.alloc(4096)
    alloc.free(a, 4096)
    assert alloc.alloc(4096) is a  # freed memory comes back from the cache


def test_disk_allocations_are_disk_buffers(tmp_path: Path) -> None:
    path = tmp_path / "w.bin"
    t = Tensor(np.arange(6, dtype=np.float32)).to(f"DISK:{path}").realize()
    dev = Device[f"DISK:{path}"]
    assert isinstance(dev, DiskDevice)
    opaque = dev.allocator.alloc(24)
    assert isinstance(opaque, DiskBuffer)
    np.testing.assert_array_equal(t.numpy(), np.arange(6, dtype=np.float32))


def test_cpu_time_execution_and_target() -> None:
    calls: list[int] = []
    took = cpu_time_execution(lambda: calls.append(1), enable=True)
    assert isinstance(took, float) and took >= 0
    assert cpu_time_execution(lambda: calls.append(1), enable=False) is None and calls == [1, 1]
    t = Target.parse("usb+amd:llvm:gfx950")
    assert (t.interface, t.device, t.renderer, t.arch) == ("usb", "AMD", "LLVM", "gfx950")
    assert str(Target.parse("CPU:X86")) == "CPU:X86" and Target.parse_all("CPU;NULL")[1].device == "NULL"
    with pytest.raises(RuntimeError, match="INTERFACE"):
        Target.parse("a:b:c:d")


@given(st.integers(0, 1 << 50) | st.sampled_from([1023, 1024, 1048575, 1048576, (1 << 30) - 1]))
def test_memsize_to_str_reads_back_the_size(n: int) -> None:
    num, unit = memsize_to_str(n).split()
    scale = 1024 ** ["B", "KB", "MB", "GB", "TB"].index(unit)
    assert abs(float(num) * scale - n) <= 0.005 * scale and (float(num) < 1024 or unit == "TB")


def test_get_single_element() -> None:
    assert get_single_element((7,)) == 7
    with pytest.raises(ValueError, match="found 2"):
        get_single_element([1, 2])


def test_method_cache_holds_compiled_programs_and_can_be_cleared() -> None:
    a = Tensor(np.arange(5, dtype=np.float32)).realize()
    np.testing.assert_allclose((a * 7 - 2).numpy(), np.arange(5) * 7 - 2)
    assert method_cache  # the kernel just run was compiled into it
    method_cache.clear()
    np.testing.assert_allclose((a * 7 - 2).numpy(), np.arange(5) * 7 - 2)
    assert method_cache


# ---------------- nn.datasets.cifar ----------------
def _fake_cifar(path: Path, n: int, rng: np.random.Generator) -> list[np.ndarray]:
    records = []
    with tarfile.open(path, "w:gz") as tar:
        for name in CIFAR_BATCHES:
            rec = rng.integers(0, 256, (n, 3073), dtype=np.uint8)
            rec[:, 0] %= 10
            records.append(rec)
            data = rec.tobytes()
            info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return records


def test_cifar_reads_the_binary_tarball(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cifar-10").mkdir()
    recs = _fake_cifar(tmp_path / "cifar-10" / CIFAR_TAR, 3, np.random.default_rng(0))
    monkeypatch.setenv("SPECK_DATASETS", str(tmp_path))
    xtr, ytr, xte, yte = cifar()
    train = np.concatenate(recs[:5])
    assert xtr.shape == (15, 3, 32, 32) and xtr.dtype == dtypes.uint8 and ytr.dtype == dtypes.int32
    np.testing.assert_array_equal(xtr.numpy(), train[:, 1:].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(ytr.numpy(), train[:, 0])
    np.testing.assert_array_equal(xte.numpy(), recs[5][:, 1:].reshape(-1, 3, 32, 32))
    np.testing.assert_array_equal(yte.numpy(), recs[5][:, 0])


def test_cifar_reports_a_corrupt_tarball(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "cifar-10").mkdir()
    (tmp_path / "cifar-10" / CIFAR_TAR).write_bytes(b"\x1f\x8b not really gzip")
    monkeypatch.setenv("SPECK_DATASETS", str(tmp_path))
    with pytest.raises(DatasetError, match="delete it and retry"):
        cifar()
