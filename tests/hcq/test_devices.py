"""The device registry and the NULL, DISK and PYTHON devices."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hcq_kernels import ADD_C, ADD_IR
from speck.hcq import Buffer, BufferOptions, Device, DeviceNotFoundError, HCQError
from speck.hcq.registry import canonicalize


@pytest.mark.parametrize(
    "name, canon",
    [("cpu", "CPU"), ("CPU:0", "CPU"), ("cpu:1", "CPU:1"), ("Cpu:llvm", "CPU:LLVM"), ("cpu:clang", "CPU:CLANG"),
     ("null", "NULL"), ("python", "PYTHON"), ("NULL:3", "NULL:3"), ("python:0", "PYTHON"),
     ("disk:/tmp/A.bin", "DISK:/tmp/A.bin")],
)  # fmt: skip
def test_names_are_canonicalised(name: str, canon: str) -> None:
    assert canonicalize(name) == canon


@pytest.mark.parametrize("name", ["GPU", "CPU:FOO", "CPU:-1", "DISK:", "NULL:x", "PYTHON:01", ""])
def test_unknown_device_lists_the_known_ones(name: str) -> None:
    with pytest.raises(DeviceNotFoundError) as ei:
        Device[name]
    assert all(k in str(ei.value) for k in ("CPU:LLVM", "CPU:CLANG", "CPU:X86", "PYTHON", "NULL", "DISK:<path>"))


def test_registry_returns_one_device_per_name() -> None:
    from speck.uop import Context

    assert Device["cpu"] is Device["CPU"] is Device["CPU:0"]
    assert Device["CPU:1"] is not Device["CPU"]
    with Context(DEV=""):
        assert Device.DEFAULT == "CPU"
    with Context(DEV="null"):
        assert Device.DEFAULT == "NULL"
        with Context(DEV="cpu:1"):
            assert Device.DEFAULT == "CPU:1"
        assert Device.DEFAULT == "NULL"


def test_device_default_is_not_assignable_and_unknown_types_are_module_errors() -> None:
    """TENSOR_API 1.1/1.2: `Device.DEFAULT = x` is an AttributeError naming Context(DEV=...); `Device["FOO"]` is a
    ModuleNotFoundError (and still a KeyError and DeviceNotFoundError)."""
    from speck.uop import Context

    before = Device.DEFAULT
    with pytest.raises(AttributeError, match=r"Context\(DEV='CPU:1'\)"):
        Device.DEFAULT = "CPU:1"
    assert Device.DEFAULT == before  # nothing was changed
    for exc in (ModuleNotFoundError, KeyError, DeviceNotFoundError):
        with pytest.raises(exc, match="unknown device 'FOO'"):
            Device["FOO"]
    with Context(DEV="TPU"), pytest.raises(DeviceNotFoundError, match="DEV=TPU"):
        _ = Device.DEFAULT


@pytest.mark.parametrize(
    "dev, default",
    [("CPU", "CPU"), ("cpu:x86", "CPU:X86"), ("CPU:LLVM:x86_64,znver2", "CPU:LLVM"), ("USB2+NULL", "NULL"),
     ("PYTHON;CPU", "PYTHON")],
)  # fmt: skip
def test_dev_targets_pick_the_default_device(dev: str, default: str) -> None:
    from speck.uop import Context

    with Context(DEV=dev):
        assert Device.DEFAULT == default


@pytest.mark.parametrize("dev", ["A+B+CPU", "CPU:LLVM:x:y"])
def test_malformed_dev_targets_are_refused(dev: str) -> None:
    from speck.uop import Context

    with Context(DEV=dev), pytest.raises(RuntimeError, match="DEVICE\\[:RENDERER"):
        _ = Device.DEFAULT


def test_device_objects_describe_themselves() -> None:
    dev = Device["CPU:2"]
    assert dev.device == "CPU:2" and dev.device_id == 2 and Device["CPU"].device_id == 0
    assert dev.count() == 1 and "," in dev.arch
    assert dev.graph is not None and Device["PYTHON"].graph is None
    assert Device.canonicalize(None) == Device.DEFAULT
    assert Device.canonicalize(("cpu:0", "cpu:1")) == ("CPU", "CPU:1") and Device.canonicalize(["null"]) == "NULL"
    assert Device.default is Device[Device.DEFAULT]
    assert "CPU" in list(Device.get_available_devices())
    with pytest.raises(HCQError, match="runs no kernels"):
        _ = Device["DISK:/tmp/speck-device-test.bin"].renderer


def test_plugins_add_device_kinds() -> None:
    from speck.hcq.null import NullDevice
    from speck.hcq.registry import _KINDS, known_devices, register_device

    opened: list[str] = []

    def opener(name: str) -> NullDevice:
        opened.append(name)
        return NullDevice(name)

    register_device("FAKEDEV", opener)
    try:
        assert "FAKEDEV:<n>" in known_devices()
        assert Device["fakedev:2"].name == "FAKEDEV:2" and Device["FAKEDEV:2"] is Device["fakedev:2"]
        assert opened == ["FAKEDEV:2"]
        with pytest.raises(DeviceNotFoundError, match="FAKEDEV names are written FAKEDEV or FAKEDEV:<n>"):
            Device["FAKEDEV:x"]
        with pytest.raises(ValueError, match="letters, digits"):
            register_device("no good", opener)
    finally:
        del _KINDS["FAKEDEV"]
    with pytest.raises(DeviceNotFoundError, match="unknown device 'FAKEDEV'"):
        canonicalize("FAKEDEV")


def test_available_devices_open_probed_kinds_only() -> None:
    """get_available_devices opens every probed kind it lists, and never a kind registered with probe=False."""
    from speck.hcq.null import NullDevice
    from speck.hcq.registry import _KINDS, register_device

    opened: list[str] = []

    def opener(name: str) -> NullDevice:
        opened.append(name)
        return NullDevice(name)

    register_device("PROBEDDEV", opener)
    register_device("BYNAMEDEV", opener, probe=False)
    try:
        available = list(Device.get_available_devices())
        assert "PROBEDDEV" in available and "BYNAMEDEV" not in available and "DISK" not in available
        assert opened == ["PROBEDDEV"]
        assert Device["BYNAMEDEV"].name == "BYNAMEDEV" and opened == ["PROBEDDEV", "BYNAMEDEV"]
    finally:
        del _KINDS["PROBEDDEV"], _KINDS["BYNAMEDEV"]


def test_cpu_devices_expose_compiler_and_renderer() -> None:
    from speck.codegen.compiler import ClangCompiler, LLVMCompiler
    from speck.codegen.renderer.cstyle import ClangRenderer
    from speck.codegen.renderer.llvmir import LLVMRenderer

    assert isinstance(Device["CPU"].compiler, LLVMCompiler) and isinstance(Device["CPU"].renderer, LLVMRenderer)
    assert isinstance(Device["CPU:LLVM"].compiler, LLVMCompiler)
    assert isinstance(Device["CPU:CLANG"].compiler, ClangCompiler)
    assert isinstance(Device["CPU:CLANG"].renderer, ClangRenderer)
    # one renderer object per backend: devices on the same backend share it
    assert Device["CPU:1"].renderer is Device["CPU"].renderer


needs_cc = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("clang") is None, reason="needs a C compiler"
)


@needs_cc
@pytest.mark.c_backend
def test_clang_device_runs_c_kernels() -> None:
    dev = Device["CPU:CLANG"]
    prog = dev.runtime("add", dev.compiler.compile(ADD_C))
    n = 1000
    a = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    A, O = Buffer("CPU:CLANG", n, np.float32).copyin(a), Buffer("CPU:CLANG", n, np.float32)
    prog(O, A, A, global_size=(n, 1, 1), wait=True)
    np.testing.assert_array_equal(O.numpy(), a + a)


def test_x86_device_uses_the_builtin_backend() -> None:
    from speck.codegen.x86 import X86Compiler

    dev = Device["CPU:X86"]
    assert dev.renderer.name == "x86" and isinstance(dev.compiler, X86Compiler)
    assert dev.accepts_renderer("llvm")  # kernels the x86 renderer refuses fall back to LLVM


def test_cpu_device_needs_no_system_compiler(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # a fresh process with an empty PATH: no gcc/clang/ld/objdump; llvmlite alone must compile, link and run
    script = (
        "import numpy as np\n"
        "from speck.hcq import Buffer, Device\n"
        f"ADD_IR = {ADD_IR!r}\n"
        "dev = Device['CPU']\n"
        "p = dev.runtime('add', dev.compiler.compile(ADD_IR))\n"
        "a = Buffer('CPU', 8, np.float32).copyin(np.arange(8, dtype=np.float32))\n"
        "o = Buffer('CPU', 8, np.float32)\n"
        "p(o, a, a, global_size=(8, 1, 1), wait=True)\n"
        "print(o.numpy().tolist())\n"
    )
    env = {**os.environ, "PATH": str(tmp_path), "SPECK_CACHE_DIR": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([2.0 * i for i in range(8)])


def test_python_device_runs_the_interpreter() -> None:
    dev = Device["PYTHON"]
    assert dev.renderer.name == "python"
    b = Buffer("PYTHON", 4, np.float32).copyin(np.arange(4, dtype=np.float32))
    np.testing.assert_array_equal(b.numpy(), np.arange(4, dtype=np.float32))
    with pytest.raises(HCQError, match="from their ProgramSpec"):
        dev.runtime("k", b"src")


def test_null_device_accepts_everything_and_runs_nothing() -> None:
    dev = Device["NULL"]
    used = dev.mem_used
    b = Buffer("NULL", 1 << 20, np.float32).copyin(np.ones(1 << 20, np.float32))
    assert dev.mem_used == used + (4 << 20)
    prog = dev.runtime("k", dev.compiler.compile("void k() {}"))
    prog(b, b, global_size=(1 << 20, 1, 1), wait=True)
    dev.run_batch([(prog, [b], (4, 1, 1))] * 3)
    assert prog.launches == 4  # type: ignore[attr-defined]
    out = np.full(4, 7, np.float32)
    Buffer("NULL", 4, np.float32).copyout(out)
    assert (out == 7).all()
    with pytest.raises(HCQError, match="not visible from the host"):
        b.as_memoryview()


def test_disk_device_round_trip(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "weights.bin"
    a = np.arange(256, dtype=np.float32)
    w = Buffer(f"disk:{path}", 256, np.float32).copyin(a)  # a new file: created and mapped read-write
    assert w.device == f"DISK:{path}"
    del w
    assert path.stat().st_size == 1024
    # reading: the existing file is mapped read-only; views select tensors inside it
    whole = Buffer(f"DISK:{path}", 1024, np.uint8)
    t = whole.view(16, np.float32, offset=64)
    np.testing.assert_array_equal(t.numpy(), a[16:32])
    assert t.numpy().flags.writeable is False
    out = np.empty(16, np.float32)
    t.copyout(out)
    np.testing.assert_array_equal(out, a[16:32])
    cpu = Buffer("CPU", 16, np.float32).copy_from(t)
    np.testing.assert_array_equal(cpu.numpy(), a[16:32])
    with pytest.raises(HCQError, match="read-only"):
        t.copyin(np.zeros(16, np.float32))
    # writable on request
    rw = Buffer(f"DISK:{path}", 256, np.float32, BufferOptions(writable=True))
    rw.view(1, np.float32, offset=0).copyin(np.array([-1], np.float32))
    assert np.fromfile(path, dtype=np.float32)[0] == -1
    with pytest.raises(HCQError, match="runs no programs"):
        Device[f"DISK:{path}"].runtime("k", b"")


def test_disk_read_past_the_end_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "small.bin"
    path.write_bytes(b"\0" * 16)
    with pytest.raises(HCQError, match="16 bytes, smaller than the 64 bytes"):
        Buffer(f"DISK:{path}", 64, np.uint8, BufferOptions(writable=False)).ensure_allocated()


def test_llvm_device_runs_llvm_kernels() -> None:
    dev = Device["CPU:LLVM"]
    prog = dev.runtime("add", dev.compiler.compile(ADD_IR))
    a = np.arange(10, dtype=np.float32)
    A, O = Buffer("CPU:LLVM", 10, np.float32).copyin(a), Buffer("CPU:LLVM", 10, np.float32)
    assert prog(O, A, A, global_size=(10, 1, 1), wait=True) is not None
    np.testing.assert_array_equal(O.numpy(), 2 * a)


def test_load_program_takes_a_program_spec() -> None:
    dev = Device["CPU"]
    spec = types.SimpleNamespace(
        name="add",
        lib=None,
        src=ADD_IR,
        global_size=(16, 1, 1),
        local_size=None,
        buffers=[(0, np.float32, 16, "out"), (1, np.float32, 16, "in"), (2, np.float32, 16, "in")],
        vars=[],
        estimates=types.SimpleNamespace(flops=16, mem=192),
    )
    prog = dev.load_program(spec)  # no lib: compiled from src with the device's compiler
    a = np.arange(16, dtype=np.float32)
    A, O = Buffer("CPU", 16, np.float32).copyin(a), Buffer("CPU", 16, np.float32)
    prog(O, A, A, wait=True)  # global size from the spec
    np.testing.assert_array_equal(O.numpy(), 2 * a)
    assert prog.params is not None and [p.role for p in prog.params] == ["out", "in", "in"]


def test_python_device_hands_programs_to_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def run_program(spec, buffers, var_vals, core_range):  # type: ignore[no-untyped-def]
        calls.append((spec.name, var_vals, core_range))
        lo, hi = core_range if core_range is not None else (0, len(buffers[0]) // 4)
        out = np.frombuffer(buffers[0], dtype=np.float32)
        out[lo:hi] = np.frombuffer(buffers[1], dtype=np.float32)[lo:hi] * var_vals["k"]

    import speck.hcq.python_device

    monkeypatch.setattr(speck.hcq.python_device, "run_program", run_program)
    dev = Device["PYTHON"]
    spec = types.SimpleNamespace(
        name="scale", src="# rendered", lib=None, renderer="python", global_size=(5, 1, 1),
        buffers=[(0, np.float32, 5, "out"), (1, np.float32, 5, "in")], vars=[("k", 0, 9)], estimates=None,
    )  # fmt: skip
    prog = dev.load_program(spec)
    a = np.arange(5, dtype=np.float32)
    A, O = Buffer("PYTHON", 5, np.float32).copyin(a), Buffer("PYTHON", 5, np.float32)
    prog(O, A, vals=(3,), wait=True)
    assert calls == [("scale", {"k": 3}, None)]
    np.testing.assert_array_equal(O.numpy(), 3 * a)
    calls.clear()
    prog(O, A, vals=(2,), threads=8, wait=True)  # sliced like CPU workers, never more slices than rows
    assert [c[2] for c in calls] == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]
    np.testing.assert_array_equal(O.numpy(), 2 * a)
    with pytest.raises(HCQError, match="use Device\\['PYTHON'\\].load_program"):
        dev.runtime("scale", b"# rendered")


def test_spec_for_another_renderer_is_refused() -> None:
    spec = types.SimpleNamespace(name="k", src="", lib=b"", renderer="python", buffers=None, vars=None)
    with pytest.raises(HCQError, match="rendered by the 'python' renderer, but CPU runs 'llvm' programs"):
        Device["CPU"].load_program(spec)
    assert Device["NULL"].load_program(spec).name == "k"  # NULL takes any program and runs none


@needs_cc
@pytest.mark.c_backend
@given(n=st.integers(1, 5000), threads=st.integers(1, 4), seed=st.integers(0, 2**16))
@settings(max_examples=25)
def test_llvm_and_clang_devices_agree(n: int, threads: int, seed: int) -> None:
    progs = _add_on_both()
    a = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    b = np.random.default_rng(seed + 1).standard_normal(n).astype(np.float32)
    outs = []
    for name, prog in progs.items():
        A, B, O = (Buffer(name, n, np.float32) for _ in range(3))
        A.copyin(a)
        B.copyin(b)
        prog(O, A, B, global_size=(n, 1, 1), threads=threads, wait=True)
        outs.append(O.numpy().copy())
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], a + b)


@functools.cache
def _add_on_both() -> dict[str, object]:
    llvm, clang = Device["CPU"], Device["CPU:CLANG"]
    return {
        "CPU": llvm.runtime("add", llvm.compiler.compile(ADD_IR)),
        "CPU:CLANG": clang.runtime("add", clang.compiler.compile(ADD_C)),
    }


def test_synchronize_runs_the_devices_own_wait_even_when_its_engines_are_idle(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """synchronize() always goes through the device's wait_idle: a device whose work outlives its engines' timelines
    (the AMD device: the GPU's own timeline, retired images to free) overrides it, and an idle-looking engine must
    not skip it."""
    dev = Device["CPU"]
    dev.synchronize()
    assert all(e.timeline.mem[0] >= e.submitted for e in dev.engines.values())  # idle
    waited: list[object] = []
    real = dev.wait_idle
    monkeypatch.setattr(dev, "wait_idle", lambda timeout=None: (waited.append(timeout), real(timeout)))
    dev.synchronize()
    dev.synchronize(5.0)
    assert waited == [None, 5.0]
