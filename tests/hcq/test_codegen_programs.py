"""Programs from speck.codegen (to_program with the LLVM, C and Python renderers) run on CPU, CPU:CLANG and PYTHON
through `Device.load_program` and agree with each other and with numpy, for any worker count."""

from __future__ import annotations

import functools
import shutil

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen import to_program
from speck.codegen.kernel_info import KernelInfo
from speck.hcq import Buffer, Device, HCQError, Program
from speck.uop import AxisType, Ops, UOp, dtypes

ROWS, COLS = 37, 50
has_cc = shutil.which("gcc") is not None or shutil.which("clang") is not None
DEVICES = ["CPU", "PYTHON"] + (["CPU:CLANG"] if has_cc else [])


def saxpy_ast(n: int) -> UOp:
    r = UOp.range(n, 0, AxisType.GLOBAL)
    o, a, b = (UOp.param(i, dtypes.float32.ptr(n)) for i in range(3))
    val = a.index(r).load() * UOp.const(dtypes.float32, 2.0) + b.index(r).load()
    return UOp.sink(o.index(r).store(val).end(r), arg=KernelInfo(name="saxpy"))


def rowsum_ast() -> UOp:
    # out[r] = sum_k a[r*COLS + k] for r < n, n a variable: a symbolic global size
    n = UOp.variable("n", 1, ROWS)
    r = UOp.range(n, 0, AxisType.GLOBAL)
    k = UOp.range(COLS, 1, AxisType.REDUCE)
    o, a = UOp.param(0, dtypes.float32.ptr(ROWS)), UOp.param(1, dtypes.float32.ptr(ROWS * COLS))
    red = a.index(r * COLS + k).load().reduce(k, op=Ops.ADD)
    return UOp.sink(o.index(r).store(red).end(r), arg=KernelInfo(name="rowsum"))


def renderer_for(device: str):  # type: ignore[no-untyped-def]
    if device == "PYTHON":
        from speck.codegen.renderer.python import PythonRenderer

        return PythonRenderer()
    if device == "CPU:CLANG":
        from speck.codegen.renderer.cstyle import ClangRenderer

        return ClangRenderer()
    from speck.codegen.renderer.llvmir import LLVMRenderer

    return LLVMRenderer()


@functools.cache
def program(device: str, kernel: str) -> Program:
    ast = saxpy_ast(1000) if kernel == "saxpy" else rowsum_ast()
    return Device[device].load_program(to_program(ast, renderer_for(device)))


C_MARKED = [pytest.param(d, marks=pytest.mark.c_backend) if d == "CPU:CLANG" else d for d in DEVICES]


@pytest.mark.parametrize("device", C_MARKED)
def test_saxpy_matches_numpy(device: str) -> None:
    prog = program(device, "saxpy")
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    O, X, Y = Buffer(device, 1000, np.float32), Buffer(device, 1000, np.float32), Buffer(device, 1000, np.float32)
    X.copyin(x)
    Y.copyin(y)
    prog(O, X, Y, wait=True)  # global size and buffer checks come from the ProgramSpec
    np.testing.assert_array_equal(O.numpy(), x * np.float32(2) + y)


@pytest.mark.c_backend
@pytest.mark.slow  # lowering + three compilers on the first example, then the interpreter per slice
@given(n=st.integers(1, ROWS), threads=st.integers(1, 5), seed=st.integers(0, 2**16))
@settings(max_examples=10)  # the PYTHON device interprets every slice: keep the example count small
def test_rowsum_with_a_variable_agrees_across_devices(n: int, threads: int, seed: int) -> None:
    x = np.random.default_rng(seed).standard_normal(ROWS * COLS).astype(np.float32)
    results = {}
    for device in DEVICES:
        A = Buffer(device, ROWS * COLS, np.float32).copyin(x)
        O = Buffer(device, ROWS, np.float32).copyin(np.full(ROWS, -1, np.float32))
        program(device, "rowsum")(O, A, vals=(n,), threads=threads, wait=True)
        results[device] = O.numpy().copy()
    expected = x.reshape(ROWS, COLS)[:n].sum(axis=1, dtype=np.float64)
    for device, got in results.items():
        np.testing.assert_allclose(got[:n], expected, rtol=1e-5, atol=1e-5, err_msg=device)
        assert (got[n:] == -1).all(), f"{device} wrote rows past n={n}"
    if "CPU:CLANG" in results:  # the two compiled paths agree closely (summation order may differ)
        np.testing.assert_allclose(results["CPU"], results["CPU:CLANG"], rtol=1e-6, atol=1e-6)


def test_spec_checks_apply_to_codegen_programs() -> None:
    prog = program("CPU", "rowsum")
    A, O = Buffer("CPU", ROWS * COLS, np.float32), Buffer("CPU", ROWS, np.float32)
    with pytest.raises(HCQError, match=r"variable n must be in \[1, 37\], got 38"):
        prog(O, A, vals=(38,))
    with pytest.raises(HCQError, match="buffer 1 must hold at least 1850 elements, got 100"):
        prog(O, Buffer("CPU", 100, np.float32), vals=(3,))
    with pytest.raises(HCQError, match="rendered by the 'python' renderer"):
        Device["CPU"].load_program(to_program(rowsum_ast(), renderer_for("PYTHON")))
