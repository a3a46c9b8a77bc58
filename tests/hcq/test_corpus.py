"""Differential: the codegen hypothesis corpus (tests/codegen/codegen_strategies.py) runs through speck.hcq on CPU
(LLVM), CPU:CLANG, CPU:X86 and PYTHON, split across a random number of workers, and agrees with the interpreter's
result on the unlowered AST. The x86 backend has no half/bfloat16/fp8 registers, so it sits out kernels that use
those dtypes (it raises naming the op and dtype; tests/codegen/test_x86_kernels.py checks that error)."""

from __future__ import annotations

import shutil
from typing import Any

import numpy as np
import pytest
from codegen_helpers import assert_same, out_dtype, run_ast
from codegen_strategies import kernel_asts
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen import to_program
from speck.codegen.renderer import UnsupportedOpError
from speck.hcq import Buffer, Device
from speck.uop import PtrDType, dtypes

DEVICES = ["CPU", "PYTHON", "CPU:X86"] + (["CPU:CLANG"] if shutil.which("gcc") or shutil.which("clang") else [])
NARROW_FLOATS = {dtypes.float16, dtypes.bfloat16, dtypes.fp8e4m3, dtypes.fp8e5m2}


def x86_can_run(ast: Any) -> bool:
    return not any((u.dtype.base if isinstance(u.dtype, PtrDType) else u.dtype).scalar() in NARROW_FLOATS
                   for u in ast.toposort())  # fmt: skip


def renderer_for(device: str) -> Any:
    if device == "PYTHON":
        from speck.codegen.renderer.python import PythonRenderer

        return PythonRenderer()
    if device == "CPU:CLANG":
        from speck.codegen.renderer.cstyle import ClangRenderer

        return ClangRenderer()
    if device == "CPU:X86":
        from speck.codegen.x86 import X86Renderer

        return X86Renderer()
    from speck.codegen.renderer.llvmir import LLVMRenderer

    return LLVMRenderer()


def run_on(
    device: str, ast: Any, inputs: list[np.ndarray], var_vals: dict[str, int], threads: int
) -> np.ndarray | None:
    try:
        spec = to_program(ast, renderer_for(device))
    except UnsupportedOpError:
        return None  # the renderer cannot express this kernel (it says so); other devices still run it
    prog = Device[device].load_program(spec)
    bufs = []  # in the program's buffer order (CPU_ABI), each holding the input of its PARAM slot
    for arg in spec.buffers:
        arr = np.ascontiguousarray(inputs[arg.slot])
        bufs.append(Buffer(device, arr.size, arg.dtype).copyin(arr))
    prog(*bufs, vals=tuple(var_vals[n] for n in spec.var_names), threads=threads, wait=True)
    out = np.empty_like(inputs[0])
    bufs[[a.slot for a in spec.buffers].index(0)].copyout(out)
    return out


@pytest.mark.slow  # three lowerings and compilations per example
@pytest.mark.c_backend
@given(case=kernel_asts(max_depth=2), threads=st.integers(1, 4))
@settings(max_examples=25)
def test_corpus_agrees_across_devices(case: tuple[Any, list[np.ndarray], dict[str, int]], threads: int) -> None:
    ast, inputs, var_vals = case
    expected = run_ast(ast, inputs, var_vals)
    ran = 0
    for device in DEVICES:
        if device == "CPU:X86" and not x86_can_run(ast):
            continue
        got = run_on(device, ast, inputs, var_vals, threads)
        if got is None:
            continue
        ran += 1
        assert_same(expected, got, out_dtype(ast), exact=False)
    assert ran >= 1
