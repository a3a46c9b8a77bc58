"""LLVMCompiler's short "kernel" pass pipeline (the default since it cut a CNN step's LLVM time ~3x): kernels it
compiles compute what the interpreter computes, accumulators still end up in registers (the pass order matters:
SROA only splits the `alloca T, i32 N` accumulators after InstCombine canonicalized them), the pipeline choice is
validated and part of the cache key, and compiles from several threads give the same objects as serial ones.
Objects run by linking them into a shared library with the system C compiler, as in test_compiler.py."""

from __future__ import annotations

import ctypes
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings

from codegen_strategies import kernel_asts
from speck.codegen.compiler import LLVMCompiler
from speck.codegen.compiler.llvm import KERNEL_PASSES
from speck.codegen.interpret import run_program
from speck.codegen.program import to_program
from speck.codegen.renderer.common import kernel_signature
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.uop import UOp
from test_render_clang_llvm_exec import call, same_bits

needs_cc = pytest.mark.skipif(
    shutil.which("gcc") is None and shutil.which("clang") is None, reason="needs a C compiler to link objects"
)


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("SPECK_LLVM_PIPELINE", raising=False)
    yield


def load_object(obj: bytes, keep: list[Any]) -> ctypes.CDLL:
    """Link a relocatable object into a shared library and load it (the library stays alive through `keep`)."""
    cc = shutil.which("gcc") or shutil.which("clang")
    assert cc is not None
    d = tempfile.mkdtemp(prefix="speck-test-pipe-")
    try:
        o, so = os.path.join(d, "k.o"), os.path.join(d, "k.so")
        pathlib.Path(o).write_bytes(obj)
        subprocess.run([cc, "-shared", o, "-o", so], check=True, capture_output=True)
        lib = ctypes.CDLL(so)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    keep.append(lib)
    return lib


# ---------------------------------------------------------------------------------------------------------------------
# what it computes


@needs_cc
@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(kernel_asts())
def test_kernel_pipeline_objects_match_the_interpreter(case: tuple[UOp, list[np.ndarray], dict[str, int]]) -> None:
    """Random kernels, optimized by speck (upcasts, accumulators), compiled with the kernel pipeline through
    emit_object and run over the whole range and as two worker slices: every buffer equals the interpreter's."""
    ast, inputs, var_vals = case
    spec = to_program(ast, LLVMRenderer())
    obj = LLVMCompiler(pipeline="kernel").compile_uncached(spec.src)
    keep: list[Any] = []
    lib = load_object(obj, keep)
    addr = ctypes.cast(getattr(lib, spec.name), ctypes.c_void_p).value
    assert addr is not None
    want = [b.copy() for b in inputs]
    run_program(spec.uops, want, var_vals)
    n = spec.launch_dims(var_vals)[0] if spec.global_size else 1
    sig = kernel_signature(spec.uops, "test")
    for slices in ([(0, n)], [(0, n // 2), (n // 2, n)]):
        got = [b.copy() for b in inputs]
        for core in slices:
            call(addr, spec.uops, got, var_vals, core)
        for b in sig.buffers:
            slot = b.arg if isinstance(b.arg, int) else b.arg[0]
            assert same_bits(got[slot], want[slot], b.dtype.base), f"buffer {slot} differs\n{spec.src}"


# two accumulators declared the way the LLVM renderer declares them (`alloca float, i32 16`), updated in a loop
ACC_IR = """
define void @acc(ptr noalias %out, ptr noalias readonly %a, i32 %s, i32 %e) {
entry:
  %acc0 = alloca float, i32 16, align 4
  %p0 = getelementptr float, ptr %acc0, i32 0
  %p1 = getelementptr float, ptr %acc0, i32 8
  store <8 x float> zeroinitializer, ptr %p0, align 4
  store <8 x float> zeroinitializer, ptr %p1, align 4
  br label %loop
loop:
  %i = phi i32 [ 0, %entry ], [ %n, %latch ]
  %c = icmp slt i32 %i, 64
  br i1 %c, label %body, label %exit
body:
  %o = mul i32 %i, 16
  %q0 = getelementptr float, ptr %a, i32 %o
  %o1 = add i32 %o, 8
  %q1 = getelementptr float, ptr %a, i32 %o1
  %x0 = load <8 x float>, ptr %q0, align 4
  %x1 = load <8 x float>, ptr %q1, align 4
  %a0 = load <8 x float>, ptr %p0, align 4
  %a1 = load <8 x float>, ptr %p1, align 4
  %s0 = fadd <8 x float> %a0, %x0
  %s1 = fadd <8 x float> %a1, %x1
  store <8 x float> %s0, ptr %p0, align 4
  store <8 x float> %s1, ptr %p1, align 4
  br label %latch
latch:
  %n = add nsw i32 %i, 1
  br label %loop
exit:
  %r0 = load <8 x float>, ptr %p0, align 4
  %r1 = load <8 x float>, ptr %p1, align 4
  store <8 x float> %r0, ptr %out, align 4
  %out1 = getelementptr float, ptr %out, i32 8
  store <8 x float> %r1, ptr %out1, align 4
  ret void
}
"""


def _stack_accesses(asm: str) -> int:
    """Instructions of the function body that address the stack (spills, or accumulators left in memory)."""
    return len([ln for ln in asm.splitlines() if re.search(r"\(%rsp\)|\(%rbp\)", ln)])


def test_accumulators_are_promoted_to_registers() -> None:
    """The kernel pipeline keeps the loop's accumulators in vector registers; without IR passes (opt=0's
    pipeline) they stay on the stack - which is what the pass order guards against."""
    fast = LLVMCompiler(pipeline="kernel").to_asm(ACC_IR)
    assert _stack_accesses(fast) == 0, fast
    assert "vaddps" in fast
    unoptimized_ir = LLVMCompiler(opt=0).to_asm(ACC_IR)
    assert _stack_accesses(unoptimized_ir) > 0  # the check can fail


@needs_cc
def test_accumulator_kernel_computes_column_sums() -> None:
    a = np.random.default_rng(0).standard_normal((64, 16)).astype(np.float32)
    for pipeline in ("kernel", "default"):
        keep: list[Any] = []
        fn = load_object(LLVMCompiler(pipeline=pipeline).compile_uncached(ACC_IR), keep).acc
        fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32]
        out = np.zeros(16, np.float32)
        fn(out.ctypes.data, a.ctypes.data, 0, 1)
        want = np.zeros(16, np.float32)
        for row in a:  # the kernel's own order of float additions
            want += row
        np.testing.assert_array_equal(out, want)


SCALAR_IR = """
define void @twice(ptr noalias %o, ptr noalias %a, i32 %s, i32 %e) {
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i = phi i32 [%s, %entry], [%n, %loop]
  %pa = getelementptr float, ptr %a, i32 %i
  %va = load float, ptr %pa
  %r = fadd float %va, %va
  %q = getelementptr float, ptr %o, i32 %i
  store float %r, ptr %q
  %n = add nsw i32 %i, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""


def test_scalar_modules_still_get_llvm_vectorizer() -> None:
    """A kernel speck left scalar goes through LLVM's standard pipeline, whose loop vectorizer widens it; a
    vectorized one keeps the short pass list (no vectorizer: its scalar tail stays scalar)."""
    asm = LLVMCompiler(pipeline="kernel").to_asm(SCALAR_IR)
    assert "vaddps" in asm and "ymm" in asm
    vectorized = SCALAR_IR.replace(
        "%r = fadd float %va, %va",
        "%w = insertelement <1 x float> poison, float %va, i32 0\n"
        "  %w2 = extractelement <1 x float> %w, i32 0\n  %r = fadd float %w2, %w2",
    )
    assert "vaddps" not in LLVMCompiler(pipeline="kernel").to_asm(vectorized)


# ---------------------------------------------------------------------------------------------------------------------
# configuration


def test_pipeline_is_validated_and_named_in_the_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    kernel, default = LLVMCompiler(), LLVMCompiler(pipeline="default")
    assert kernel.pipeline == "kernel" and default.pipeline == "default"
    assert kernel.flags[0] == default.flags[0] == "O2"
    assert kernel.flags[-1] == "passes=" + ",".join(KERNEL_PASSES) + "|scalar:default"
    assert kernel.cache_key(ACC_IR) != default.cache_key(ACC_IR)  # objects of the two pipelines never mix
    monkeypatch.setenv("SPECK_LLVM_PIPELINE", "default")
    assert LLVMCompiler().pipeline == "default"
    assert LLVMCompiler(pipeline="kernel").pipeline == "kernel"  # the argument wins over the environment
    monkeypatch.setenv("SPECK_LLVM_PIPELINE", "O3")
    with pytest.raises(ValueError, match=r"pipeline must be one of kernel, default .*got 'O3'"):
        LLVMCompiler()


def test_every_kernel_pass_exists_in_llvmlite() -> None:
    import llvmlite.binding as llvm

    mpm = llvm.create_new_module_pass_manager()
    for name in KERNEL_PASSES:
        assert callable(getattr(mpm, f"add_{name}_pass", None)), name


# ---------------------------------------------------------------------------------------------------------------------
# threads


def _sources(n: int) -> list[str]:
    """n distinct kernels (the accumulator kernel with different trip counts)."""
    return [ACC_IR.replace("@acc(", f"@acc{i}(").replace("%i, 64", f"%i, {64 + i}") for i in range(n)]


def test_concurrent_compiles_give_the_serial_objects() -> None:
    """Compiles run from several threads at once (each parses into its own LLVM context) produce byte-identical
    objects to the same compiles run one after another, with one compiler or one per thread."""
    srcs = _sources(8)
    shared = LLVMCompiler()
    serial = [shared.compile_uncached(s) for s in srcs]
    got: dict[tuple[str, int], bytes] = {}
    errors: list[BaseException] = []

    def work(tag: str, compiler: LLVMCompiler, idxs: list[int]) -> None:
        try:
            for i in idxs:
                got[(tag, i)] = compiler.compile_uncached(srcs[i])
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=work, args=("shared", shared, list(range(k, 8, 2)))) for k in range(2)]
    threads += [threading.Thread(target=work, args=(f"own{k}", LLVMCompiler(), list(range(8)))) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for (_, i), obj in got.items():
        assert obj == serial[i]
    assert len(got) == 8 + 16


def test_unroll_threshold_is_in_the_flags_and_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process-wide unroll threshold is part of every object's cache key; a bad override says what it wants."""
    import speck.codegen.compiler.llvm as llvm_compiler

    assert f"unroll-threshold={llvm_compiler.UNROLL_THRESHOLD}" in LLVMCompiler().flags
    monkeypatch.setenv("SPECK_LLVM_UNROLL_THRESHOLD", "lots")
    with pytest.raises(ValueError, match=r"SPECK_LLVM_UNROLL_THRESHOLD must be a non-negative integer.*got 'lots'"):
        llvm_compiler._unroll_threshold()
    monkeypatch.setenv("SPECK_LLVM_UNROLL_THRESHOLD", "90")
    assert llvm_compiler._unroll_threshold() == 90


# ---------------------------------------------------------------------------------------------------------------------
# unrolling: short constant loops fully, loops of unknown trip count never (no runtime unrolling)

ONE_LOOP_IR = """
define void @scale(ptr noalias %o, ptr noalias %a, i32 %s, i32 %e) {
entry:
  %s64 = sext i32 %s to i64
  %e64 = sext i32 %e to i64
  br label %head
head:
  %i = phi i64 [ %s64, %entry ], [ %n, %body ]
  %c = icmp slt i64 %i, %e64
  br i1 %c, label %body, label %exit
body:
  %off = mul nsw i64 %i, 8
  %pa = getelementptr float, ptr %a, i64 %off
  %va = load <8 x float>, ptr %pa, align 4
  %r = fadd <8 x float> %va, %va
  %po = getelementptr float, ptr %o, i64 %off
  store <8 x float> %r, ptr %po, align 4
  %n = add nsw i64 %i, 1
  br label %head
exit:
  ret void
}
"""

# the same body inside a second loop (over rows, n of them): two loop counters, two phis
TWO_LOOP_IR = """
define void @scale2(ptr noalias %o, ptr noalias %a, i32 %s, i32 %e) {
entry:
  %s64 = sext i32 %s to i64
  %e64 = sext i32 %e to i64
  br label %rows
rows:
  %r0 = phi i64 [ 0, %entry ], [ %rn, %latch ]
  %rc = icmp slt i64 %r0, 4
  br i1 %rc, label %head, label %exit
head:
  %i = phi i64 [ %s64, %rows ], [ %n, %body ]
  %c = icmp slt i64 %i, %e64
  br i1 %c, label %body, label %latch
body:
  %row = mul nsw i64 %r0, 4096
  %col = mul nsw i64 %i, 8
  %off = add nsw i64 %row, %col
  %pa = getelementptr float, ptr %a, i64 %off
  %va = load <8 x float>, ptr %pa, align 4
  %r = fadd <8 x float> %va, %va
  %po = getelementptr float, ptr %o, i64 %off
  store <8 x float> %r, ptr %po, align 4
  %n = add nsw i64 %i, 1
  br label %head
latch:
  %rn = add nsw i64 %r0, 1
  br label %rows
exit:
  ret void
}
"""


def _loop_counters(ir: str) -> int:
    """Loops in optimized IR: runtime unrolling adds a remainder loop (and an unrolled main loop) to the one."""
    return len(re.findall(r"^\s+%\S+ = phi i64", ir, re.M))


# a 3-step window sum in the renderer's loop form (exit test in the header, an empty latch)
WINDOW_IR = """
define void @win(ptr noalias %o, ptr noalias %a, i32 %s, i32 %e) {
entry:
  br label %head
head:
  %k = phi i64 [ 0, %entry ], [ %kn, %latch ]
  %acc = phi float [ 0.0, %entry ], [ %acc2, %latch ]
  %c = icmp slt i64 %k, 3
  br i1 %c, label %body, label %exit
body:
  %p = getelementptr float, ptr %a, i64 %k
  %v = load float, ptr %p, align 4
  %acc2 = fadd float %acc, %v
  br label %latch
latch:
  %kn = add nsw i64 %k, 1
  br label %head
exit:
  store float %acc, ptr %o, align 4
  ret void
}
"""


def test_loops_of_unknown_trip_count_are_not_runtime_unrolled() -> None:
    import speck.codegen.compiler.llvm as llvm_compiler

    c = LLVMCompiler()
    one, two = str(c._optimized_module(ONE_LOOP_IR)), str(c._optimized_module(TWO_LOOP_IR))
    assert _loop_counters(one) == 1, one  # no unrolled copy, no remainder loop
    # the constant 4-row loop is unrolled fully: 4 copies of the inner loop, none of them runtime-unrolled
    assert _loop_counters(two) == 4, two
    assert not any(w in ir for ir in (one, two) for w in ("prol", "epil", "unr")), two
    assert llvm_compiler.RUNTIME_UNROLL in c.flags  # the policy is part of every object's cache key


def test_short_constant_loops_in_the_renderers_form_are_fully_unrolled() -> None:
    """Without loop_rotate in the pipeline, a constant 3-step loop with its exit test in the header still unrolls
    fully: no loop is left, the three loads have constant offsets."""
    opt = str(LLVMCompiler()._optimized_module(WINDOW_IR))
    assert " phi " not in opt and "br " not in opt.split("define", 1)[1], opt
    assert opt.count("load float") == 3, opt


@needs_cc
def test_loop_objects_do_not_depend_on_compile_order() -> None:
    """Each module's object is the same whichever module was compiled before it (LLVM's options are process-wide),
    and the one-loop and the two-loop kernels compute the same sums."""
    c = LLVMCompiler()
    first = [c.compile_uncached(ONE_LOOP_IR), c.compile_uncached(TWO_LOOP_IR)]
    again = [c.compile_uncached(TWO_LOOP_IR), c.compile_uncached(ONE_LOOP_IR)][::-1]
    assert first == again
    keep: list[Any] = []
    a = np.arange(4 * 4096, dtype=np.float32)
    for obj, name, n in ((first[0], "scale", 4096 // 8), (first[1], "scale2", 4096 // 8)):
        out = np.zeros_like(a)
        fn = getattr(load_object(obj, keep), name)
        fn(out.ctypes.data_as(ctypes.c_void_p), a.ctypes.data_as(ctypes.c_void_p), ctypes.c_int32(3),
           ctypes.c_int32(n))  # fmt: skip
        rows = 1 if name == "scale" else 4
        want = np.zeros_like(a).reshape(4, 4096)
        want[:rows, 24:] = 2 * a.reshape(4, 4096)[:rows, 24:]
        np.testing.assert_array_equal(out.reshape(4, 4096), want)
