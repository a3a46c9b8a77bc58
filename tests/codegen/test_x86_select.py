"""x86-64 instruction selection: golden listings of a few kernels (reviewed by a person when they change), the
immediate/displacement forms selection picks, the listing <-> object round trip (objdump decodes the object to the
listing's own text), and the errors for input it cannot select.

Regenerate the goldens after an intended change with `SPECK_UPDATE_GOLDEN=1 pytest tests/codegen/test_x86_select.py`
and review the diff."""

from __future__ import annotations

import ctypes
import os
import pathlib
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speck.codegen.interpret import run_program
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.program import to_program
from speck.codegen.x86 import X86Compiler, X86Renderer, render_x86
from speck.codegen.x86.elf_object import read_listing
from speck.codegen.x86.objdump import disassemble_object, normalise, parse_objdump
from speck.codegen.x86.select import SELECTION_TABLE, op_class, signed_magic32
from speck.uop import AxisType, Context, Ops, UOp, dtypes
from test_render_clang_llvm_exec import alu, buf, cc, end, idx, linear, load, rng, store
from test_x86_kernels import asm, check, link

GOLDEN = pathlib.Path(__file__).parent / "golden" / "x86"


def _k(name: str, *stores: UOp) -> UOp:
    return UOp.sink(*stores, arg=KernelInfo(name=name))


def elementwise_add() -> UOp:
    n = 1024
    r = UOp.range(n, 0, AxisType.GLOBAL)
    a, b = UOp.param(1, dtypes.float32.ptr(n)), UOp.param(2, dtypes.float32.ptr(n))
    return _k(
        "elementwise_add",
        UOp.param(0, dtypes.float32.ptr(n)).index(r).store(a.index(r).load() + b.index(r).load()).end(r),
    )


def row_sum() -> UOp:
    rows, cols = 16, 100
    r = UOp.range(rows, 0, AxisType.GLOBAL)
    k = UOp.range(cols, 1, AxisType.REDUCE)
    x = UOp.param(1, dtypes.float32.ptr(rows * cols)).index(r * cols + k).load()
    return _k("row_sum", UOp.param(0, dtypes.float32.ptr(rows)).index(r).store(x.reduce(k, op=Ops.ADD)).end(r))


def gated_load() -> UOp:
    """out[i] = in[i - 3] for 3 <= i < 20, else 0 (a padded read)."""
    n = 24
    r = UOp.range(n, 0, AxisType.GLOBAL)
    src = UOp.param(1, dtypes.float32.ptr(n))
    v = src.index((r - 3).valid((r < 3).logical_not() & (r < 20))).load()
    return _k("gated_load", UOp.param(0, dtypes.float32.ptr(n)).index(r).store(v * 2.0).end(r))


def int_div_const() -> UOp:
    n = 64
    r = UOp.range(n, 0, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.int32.ptr(n)).index(r).load()
    return _k("int_div_const", UOp.param(0, dtypes.int32.ptr(n)).index(r).store(x // 7 + x % 7).end(r))


GOLDEN_KERNELS = {"elementwise_add": elementwise_add, "row_sum": row_sum, "gated_load": gated_load,
                  "int_div_const": int_div_const}  # fmt: skip


def _inputs(ast: UOp) -> list[np.ndarray]:
    from speck.codegen.numeric import storage_np

    params = sorted((u for u in ast.toposort() if u.op is Ops.PARAM), key=lambda p: p.arg)
    rng_ = np.random.default_rng(0)
    out = []
    for p in params:
        base = p.dtype.base  # type: ignore[attr-defined]
        vals = rng_.integers(-1000, 1000, p.dtype.size) if p.arg else np.zeros(p.dtype.size)  # type: ignore[attr-defined]
        out.append(vals.astype(storage_np(base)))
    return out


@pytest.mark.parametrize("name", sorted(GOLDEN_KERNELS))
def test_golden_listing(name: str) -> None:
    ast = GOLDEN_KERNELS[name]()
    spec = to_program(ast, X86Renderer(), X86Compiler(), optimize=False)
    path = GOLDEN / f"{name}.txt"
    if os.environ.get("SPECK_UPDATE_GOLDEN"):
        path.write_text(asm(spec))
    assert asm(spec) == path.read_text(), f"listing of {name} changed; review and regenerate (see module docstring)"
    check(ast, _inputs(ast), {})


@pytest.mark.parametrize("name", sorted(GOLDEN_KERNELS))
def test_object_disassembles_to_the_listing(name: str) -> None:
    """objdump decodes the object X86Compiler builds from the listing to exactly the listing's instructions."""
    spec = to_program(GOLDEN_KERNELS[name](), X86Renderer(), X86Compiler(), optimize=False)
    assert spec.lib is not None
    theirs = parse_objdump(disassemble_object(spec.lib))
    ours = [(int(m.group(1), 16), normalise(m.group(2))) for m in
            re.finditer(r"^\s*([0-9a-f]+):\t[0-9a-f ]+\t(.*)$", asm(spec), re.M)]  # fmt: skip
    assert [o for o, _ in theirs] == [o for o, _ in ours]
    for (_, t), (_, o) in zip(theirs, ours):
        if o.split()[0].startswith("j"):  # object-mode objdump prints jump targets without 0x
            assert t.split()[0] == o.split()[0] and int(t.split()[1], 16) == int(o.split()[1], 16)
        else:
            assert t == o


def test_gated_load_uses_the_scratch_slot_and_cmov() -> None:
    src = asm(to_program(gated_load(), X86Renderer(), X86Compiler(), optimize=False))
    assert "[rsp-0x40]" in src and "cmove" in src
    assert "test" in src  # the bool gate compared against 0


def test_division_by_a_constant_multiplies_by_the_magic_number() -> None:
    src = asm(to_program(int_div_const(), X86Renderer(), X86Compiler(), optimize=False))
    assert "idiv" not in src and "cmovbe" not in src  # divisor 7: a multiply by the magic number, no fix-ups
    assert "imul" in src and "0xffffffff92492493" in src


def test_immediates_from_casted_consts() -> None:
    """int64 literal fitting int32 -> imm32; uint64 fitting uint32 -> imm32 (zero-extending mov); other -> movabs."""
    n = 8
    r = UOp.range(n, 0, AxisType.GLOBAL)
    i64 = UOp.param(1, dtypes.int64.ptr(n)).index(r).load()
    u64 = UOp.param(2, dtypes.uint64.ptr(n)).index(r).load()
    s0 = UOp.param(0, dtypes.int64.ptr(n)).index(r).store((i64 + UOp.const(dtypes.int64, -5)) ^
                                                          UOp.const(dtypes.int64, 2**40))  # fmt: skip
    s3 = UOp.param(3, dtypes.uint64.ptr(n)).index(r).store(u64 ^ UOp.const(dtypes.uint64, 0xFFFFFFFF))
    ast = _k("imms", s0.end(r), s3.end(r))
    spec = check(ast, [np.zeros(n, np.int64), np.arange(n, dtype=np.int64) * 7 - 3,
                       np.arange(n, dtype=np.uint64) * 2**33, np.zeros(n, np.uint64)], {})  # fmt: skip
    assert "movabs" in asm(spec) and "0x10000000000" in asm(spec)
    assert re.search(r"add\s+r\w+,0xfffffffffffffffb", asm(spec))
    assert re.search(r"mov\s+(e\w\w|r\d+d),0xffffffff\n", asm(spec))


def test_displacements_fold_into_addresses() -> None:
    """in[i + 3] reads [base + i*4 + 0xc] (disp8); in[i + 100] uses a disp32. AVX2 code (8 lanes: a loop with an
    index register) also on an AVX-512 host, where 16 lanes would cover the kernel without one."""
    n = 16
    r = UOp.range(n, 0, AxisType.GLOBAL)
    src = UOp.param(1, dtypes.float32.ptr(n + 100))
    v = src.index(r + 3).load() + src.index(r + 100).load()
    ast = _k("disp", UOp.param(0, dtypes.float32.ptr(n)).index(r).store(v).end(r))
    with Context(X86_AVX512=0):
        spec = check(ast, [np.zeros(n, np.float32), np.arange(n + 100, dtype=np.float32)], {})
    assert re.search(r"\[rsi\+r\w+\*4\+0xc\]", asm(spec)) and re.search(r"\*4\+0x190\]", asm(spec))
    line = next(ln for ln in asm(spec).splitlines() if "*4+0xc]" in ln)
    assert line.split("\t")[1].split()[-1] == "0c"  # one displacement byte


def test_loop_bounds_are_immediates() -> None:
    src = asm(to_program(row_sum(), X86Renderer(), X86Compiler(), optimize=False))
    assert re.search(r"cmp\s+\w+,0x64", src)  # the reduce range end, 100


def unselectable_program() -> list[UOp]:
    """A hand-built program with an int32 vector load: the selector has no rule for it."""
    i4 = dtypes.int32.vec(4)
    r = rng(4, 0)
    v = load(idx(buf(1, dtypes.int32, 16), alu(Ops.MUL, r, cc(4, dtypes.int32))), i4)
    st = store(idx(buf(0, dtypes.int32, 4), r), UOp(Ops.GEP, dtypes.int32, (v,), (1,)))
    return linear(r, st, end(st, r), name="vecky")


def test_unselectable_op_names_op_dtype_and_kernel() -> None:
    """int32 vectors have no vector registers here (the renderer declares 1 lane), so a hand-built one is refused by
    the selector; compiling it raises CompileRefused (the registry then renders it with the fallback, LLVM, whose
    program computes the right result)."""
    from speck.codegen.backends import get_backend
    from speck.codegen.errors import CompileRefused

    uops = unselectable_program()
    with pytest.raises(RuntimeError, match=r"no selection rule for LOAD on dtypes.int.vec\(4\) in kernel 'vecky'"):
        render_x86(uops)
    with pytest.raises(CompileRefused, match=r"no selection rule for LOAD on dtypes.int.vec\(4\)"):
        X86Compiler().compile(X86Renderer().render(uops))
    fallback = get_backend(get_backend("X86").fallback or "")
    lib = fallback.compiler.compile(fallback.renderer.render(uops))
    assert read_listing(lib) is None  # LLVM's object, not the encoder's
    src = np.arange(16, dtype=np.int32) * 3 - 7
    want, got = [np.zeros(4, np.int32), src.copy()], [np.zeros(4, np.int32), src.copy()]
    run_program(uops, want, {})
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(link(lib, "vecky"))
    fn(got[0].ctypes.data, got[1].ctypes.data, 0, 4)
    np.testing.assert_array_equal(got[0], want[0])


def test_selection_table_covers_the_scalar_alu() -> None:
    for op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.CDIV, Ops.CMOD, Ops.MAX, Ops.AND, Ops.OR, Ops.XOR, Ops.SHL, Ops.SHR,
               Ops.CMPLT, Ops.CMPNE, Ops.CMPEQ, Ops.WHERE, Ops.NEG):  # fmt: skip
        assert (op, "int") in SELECTION_TABLE
    for op in (Ops.ADD, Ops.SUB, Ops.MUL, Ops.FDIV, Ops.MAX, Ops.NEG, Ops.SQRT, Ops.TRUNC, Ops.CMPLT, Ops.WHERE):
        assert (op, "float") in SELECTION_TABLE
    assert op_class(UOp(Ops.CMPLT, dtypes.bool, (cc(1.0, dtypes.float32), cc(2.0, dtypes.float32)))) == "float"


def test_compiler_rejects_text_that_is_not_a_program() -> None:
    from speck.codegen.errors import CompileError

    with pytest.raises(CompileError, match="expected an x86 program"):
        X86Compiler().compile("void k() {}")
    src = X86Renderer().render(to_program(elementwise_add(), X86Renderer(), optimize=False).uops)
    with pytest.raises(CompileError, match="edited or truncated"):
        X86Compiler().compile(src.rsplit("\n", 1)[0])
    with pytest.raises(CompileError, match="line 2 of the x86 program is not a UOp"):
        X86Compiler().compile(src.replace("PARAM", "PARAMETER", 2))


def test_stage_times_are_reported() -> None:
    rend = render_x86(to_program(row_sum(), X86Renderer(), optimize=False).uops)
    assert set(rend.times) == {"legalize", "select", "allocate", "encode", "elf"}
    assert all(t >= 0 for t in rend.times.values())


@given(st.integers(2, 2**31 - 1), st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=40))
@settings(max_examples=25)
def test_int32_division_by_constant_matches_truncation(d: int, ns: list[int]) -> None:
    """n // d and n % d with a constant divisor (multiply by the magic number, no idiv) equal C's truncation for
    every int32 n, including the extremes."""
    vals = np.array(ns + [0, 1, -1, d, -d, d - 1, 1 - d, 2**31 - 1, -(2**31)], dtype=np.int32)
    n = len(vals)
    r = UOp.range(n, 0, AxisType.GLOBAL)
    x = UOp.param(2, dtypes.int32.ptr(n)).index(r).load()
    c = UOp.const(dtypes.int32, d)
    ast = _k("divc", UOp.param(0, dtypes.int32.ptr(n)).index(r).store(x // c).end(r),
             UOp.param(1, dtypes.int32.ptr(n)).index(r).store(x % c).end(r))  # fmt: skip
    spec = check(ast, [np.zeros(n, np.int32), np.zeros(n, np.int32), vals], {})
    assert "idiv" not in asm(spec)


def test_signed_magic_numbers() -> None:
    assert signed_magic32(7) == (0x92492493 - 2**32, 2)  # Hacker's Delight table 10-1
    assert signed_magic32(3) == (0x55555556, 0)
    assert signed_magic32(5) == (0x66666667, 1)
    with pytest.raises(ValueError, match="divisor"):
        signed_magic32(1)
