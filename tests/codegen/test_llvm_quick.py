"""The LLVM backend's quick compile: kernels too small for optimization to pay (speck.codegen.compiler.llvm's
quick_enough) compile with LLVMCompiler(opt=QUICK_OPT). Its objects must compute what the optimized ones do, the
choice must follow the estimates (and LLVM_QUICK), and every path that compiles a spec (Backend.to_program,
compiler_for) must make the same choice."""

from __future__ import annotations

import ctypes
import pathlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from codegen_strategies import kernel_asts
from speck.codegen import KernelInfo
from speck.codegen.backends import get_backend
from speck.codegen.compiler import LLVMCompiler
from speck.codegen.compiler.llvm import QUICK_BYTES, QUICK_OPS, QUICK_OPT, quick_enough
from speck.codegen.interpret import run_program
from speck.codegen.kernel_info import Estimates
from speck.codegen.program import to_program
from speck.codegen.renderer.common import kernel_signature
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import AxisType, Context, UOp, dtypes
from test_compile_speed_pipeline import load_object, needs_cc
from test_render_clang_llvm_exec import call, same_bits


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    yield


def scaled_add(n: int) -> UOp:
    """out[i] = a[i] * 2 + b[i] over n float32 elements."""
    i = UOp.range(n, 0, AxisType.GLOBAL)
    a, b = (UOp.param(k, dtypes.float32.ptr(n)).index(i).load() for k in (1, 2))
    v = a * 2.0 + b
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(i).store(v).end(i), arg=KernelInfo("scaled_add"))


class _Spec:
    def __init__(self, est: Estimates | None) -> None:
        self.estimates = est


def test_quick_enough_follows_the_estimates_and_the_setting() -> None:
    assert quick_enough(_Spec(Estimates(ops=QUICK_OPS, mem=QUICK_BYTES, lds=QUICK_BYTES)))
    assert not quick_enough(_Spec(Estimates(ops=QUICK_OPS + 1, mem=8, lds=8)))
    assert not quick_enough(_Spec(Estimates(ops=8, mem=QUICK_BYTES + 1, lds=8)))
    assert not quick_enough(_Spec(Estimates(ops=8, mem=8, lds=QUICK_BYTES + 1)))
    assert not quick_enough(_Spec(None))  # (a duck-typed spec without estimates)
    n = UOp.variable("n", 1, 1 << 30)
    assert not quick_enough(_Spec(Estimates(ops=n * 3, mem=8, lds=8)))  # symbolic: the variable may be large
    with Context(LLVM_QUICK=0):
        assert not quick_enough(_Spec(Estimates(ops=1, mem=8, lds=8)))


def test_backend_compiles_small_kernels_quick_and_large_ones_optimized() -> None:
    be = get_backend("LLVM")
    small, large = be.to_program(scaled_add(64)), be.to_program(scaled_add(1 << 20))
    quick, full = be.compiler_for(small), be.compiler_for(large)
    assert isinstance(quick, LLVMCompiler) and quick.opt == QUICK_OPT
    assert isinstance(full, LLVMCompiler) and full.opt == 2 and full is be.compiler
    assert quick.flags != full.flags  # (so their objects are cached under different keys)
    # Backend.to_program compiled each with the compiler compiler_for names
    assert small.lib == quick.compile(small.src) and large.lib == full.compile(large.src)
    with Context(LLVM_QUICK=0):
        assert be.compiler_for(small) is be.compiler


def _run(spec: Any, obj: bytes, inputs: list[np.ndarray], var_vals: dict[str, int]) -> list[np.ndarray]:
    keep: list[Any] = []
    lib = load_object(obj, keep)
    addr = ctypes.cast(getattr(lib, spec.name), ctypes.c_void_p).value
    assert addr is not None
    n = spec.launch_dims(var_vals)[0] if spec.global_size else 1
    got = [b.copy() for b in inputs]
    for core in [(0, n // 2), (n // 2, n)]:
        call(addr, spec.uops, got, var_vals, core)
    return got


@needs_cc
@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(kernel_asts())
def test_quick_objects_match_the_interpreter(case: tuple[Any, list[np.ndarray], dict[str, int]]) -> None:
    """Random kernels (speck's upcasts and accumulators included) compiled at opt=QUICK_OPT and run as two worker
    slices: every buffer equals the interpreter's, bit for bit."""
    ast, inputs, var_vals = case
    spec = to_program(ast, LLVMRenderer())
    want = [b.copy() for b in inputs]
    run_program(spec.uops, want, var_vals)
    got = _run(spec, LLVMCompiler(opt=QUICK_OPT).compile_uncached(spec.src), inputs, var_vals)
    for b in kernel_signature(spec.uops, "test").buffers:
        slot = b.arg if isinstance(b.arg, int) else b.arg[0]
        assert same_bits(got[slot], want[slot], b.dtype.base), f"buffer {slot} differs\n{spec.src}"
