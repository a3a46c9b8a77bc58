"""Golden tests for the C renderer: literal spelling per dtype (input/expected pairs), a few whole kernels compared
exactly with files in tests/codegen/golden/clang/, and round trips through a second tool: every golden kernel compiles
with the production ClangCompiler, and every literal, compiled and run, stores exactly the bits of its value.

Regenerate the kernel goldens after an intended change with `SPECK_UPDATE_GOLDEN=1 pytest <this file>` and review
the diff."""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
from typing import Any

import numpy as np
import pytest

from speck.codegen import numeric as nm
from speck.codegen.renderer.common import casted_const
from speck.codegen.renderer.cstyle import ClangRenderer, c_literal
from speck.codegen.renderer.llvmir import LLVMRenderer, llvm_literal
from speck.uop import AddrSpace, AxisType, DType, Ops, UOp, dtypes
from test_render_clang_llvm_exec import (
    alu,
    buf,
    cc,
    check_program,
    end,
    idx,
    linear,
    load,
    rng,
    store,
)

pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
GOLDEN = pathlib.Path(__file__).parent / "golden" / "clang"

# ---------------------------------------------------------------------------------------------------------------------
# literals: (value, dtype, expected C)

LITERALS: list[tuple[Any, DType, str]] = [
    (1.0, dtypes.float32, "1.0f"),
    (0.1, dtypes.float32, "0.1f"),
    (-0.0, dtypes.float32, "-0.0f"),
    (-2.5, dtypes.float32, "-2.5f"),
    (1e30, dtypes.float32, "1e+30f"),
    (3.4028234663852886e38, dtypes.float32, "3.4028235e+38f"),
    (1e-45, dtypes.float32, "1e-45f"),
    (16777217.0, dtypes.float32, "16777216.0f"),
    (math.inf, dtypes.float32, "__builtin_inff()"),
    (-math.inf, dtypes.float32, "-__builtin_inff()"),
    (math.nan, dtypes.float32, '__builtin_nanf("")'),
    (1.0, dtypes.float64, "1.0"),
    (0.1, dtypes.float64, "0.1"),
    (1e300, dtypes.float64, "1e+300"),
    (math.inf, dtypes.float64, "__builtin_inf()"),
    (-math.inf, dtypes.float64, "-__builtin_inf()"),
    (math.nan, dtypes.float64, '__builtin_nan("")'),
    (1, dtypes.int32, "1"),
    (-5, dtypes.int32, "-5"),
    (2**31 - 1, dtypes.int32, "2147483647"),
    (-(2**31), dtypes.int32, "(-2147483647-1)"),
    (3000000000, dtypes.int32, "-1294967296"),
    (1, dtypes.int64, "1l"),
    (-7, dtypes.int64, "-7l"),
    (-(2**63), dtypes.int64, "(-9223372036854775807l-1l)"),
    (1, dtypes.uint32, "1u"),
    (2**32 - 1, dtypes.uint32, "4294967295u"),
    (-1, dtypes.uint32, "4294967295u"),
    (1, dtypes.uint64, "1ul"),
    (2**64 - 1, dtypes.uint64, "18446744073709551615ul"),
    (True, dtypes.bool, "1"),
    (False, dtypes.bool, "0"),
    (-3, dtypes.int8, "(signed char)-3"),
    (200, dtypes.int8, "(signed char)-56"),
    (200, dtypes.uint8, "(unsigned char)200"),
    (-300, dtypes.int16, "(short)-300"),
    (65535, dtypes.uint16, "(unsigned short)65535"),
    (1.0, dtypes.float16, "__speck_f32_to_f16(1.0f)"),
    (0.1, dtypes.float16, "__speck_f32_to_f16(0.099975586f)"),
    (70000.0, dtypes.float16, "__speck_f32_to_f16(__builtin_inff())"),
    (math.nan, dtypes.float16, '__speck_f32_to_f16(__builtin_nanf(""))'),
    (1.0, dtypes.bfloat16, "__speck_f32_to_bf16(1.0f)"),
    (0.1, dtypes.bfloat16, "__speck_f32_to_bf16(0.100097656f)"),
    (-math.inf, dtypes.bfloat16, "__speck_f32_to_bf16(-__builtin_inff())"),
    (1.0, dtypes.fp8e4m3, "__speck_f64_to_fp8e4m3(1.0f)"),
    (1000.0, dtypes.fp8e4m3, "__speck_f64_to_fp8e4m3(448.0f)"),
    (0.3, dtypes.fp8e5m2, "__speck_f64_to_fp8e5m2(0.3125f)"),
    (math.nan, dtypes.fp8e5m2, '__speck_f64_to_fp8e5m2(__builtin_nanf(""))'),
]


def _lit_id(case: tuple[Any, DType, str]) -> str:
    return f"{case[1].name}-{case[0]!r}"


@pytest.mark.parametrize("case", LITERALS, ids=_lit_id)
def test_c_literal_golden(case: tuple[Any, DType, str]) -> None:
    v, dt, expected = case
    ok, value = casted_const(UOp.cconst(v, dt))
    assert ok
    assert c_literal(value, dt) == expected


def _literal_program(dt: DType, cases: list[tuple[Any, DType, str]]) -> list[UOp]:
    out = buf(0, dt, len(cases))
    stores = [store(idx(out, cc(i, dtypes.int32)), UOp.cconst(v, dt)) for i, (v, _, _) in enumerate(cases)]
    return linear(*stores, name=f"lits_{dt.short_name}")


@pytest.mark.parametrize("dt", sorted({c[1] for c in LITERALS}, key=lambda d: d.name), ids=lambda d: d.name)
def test_literals_store_their_exact_bits(dt: DType) -> None:
    """Second-tool check of the goldens: gcc (and LLVM) compile each literal, the kernel stores it, and the stored
    bits equal those the interpreter stores for the same casted const."""
    cases = [c for c in LITERALS if c[1] == dt]
    uops = _literal_program(dt, cases)
    src = check_program(uops, [np.zeros(len(cases), nm.storage_np(dt))])["clang"]
    for _, _, expected in cases:
        assert expected in src


def test_llvm_literals() -> None:
    assert llvm_literal(1.0, dtypes.float32) == "0x3FF0000000000000"
    assert llvm_literal(1.0, dtypes.float16) == "0xH3C00"
    assert llvm_literal(-1, dtypes.uint32) == "-1"
    assert llvm_literal(True, dtypes.bool) == "true"
    assert llvm_literal(1.0, dtypes.bfloat16) == "16256"
    assert llvm_literal(2.0, dtypes.float32.vec(2)) == "<float 0x4000000000000000, float 0x4000000000000000>"


# ---------------------------------------------------------------------------------------------------------------------
# whole kernels


def k_saxpy() -> list[UOp]:
    n = UOp.variable("n", 1, 4096, dtypes.int32)
    r = rng(n, 0)
    x = load(idx(buf(1, dtypes.float32, 4096), r))
    y = load(idx(buf(2, dtypes.float32, 4096), r))
    st = store(idx(buf(0, dtypes.float32, 4096), r), alu(Ops.ADD, alu(Ops.MUL, x, cc(2.5, dtypes.float32)), y))
    return linear(r, st, end(st, r), name="saxpy")


def k_rowmax() -> list[UOp]:
    r = rng(8, 0)
    k = rng(16, 1, AxisType.REDUCE)
    acc = UOp(Ops.DEFINE_REG, dtypes.float32.ptr(1, AddrSpace.REG), (), 0)
    a0 = idx(acc, cc(0, dtypes.int32))
    init = store(a0, cc(-math.inf, dtypes.float32))
    x = load(idx(buf(1, dtypes.float32, 128), alu(Ops.ADD, alu(Ops.MUL, r, cc(16, dtypes.int32)), k)))
    upd = store(a0, alu(Ops.MAX, load(a0), x))
    out = store(idx(buf(0, dtypes.float32, 8), r), load(a0).replace(tag=("lin", 0)))
    return linear(acc, r, init, k, upd, end(upd, k), out, end(out, r), name="rowmax")


def k_gated_vec4() -> list[UOp]:
    r = rng(32, 0)
    base = alu(Ops.MUL, r, cc(4, dtypes.int32))
    f4 = dtypes.float32.vec(4)
    gate = alu(Ops.CMPLT, r, cc(30, dtypes.int32))
    v = load(idx(buf(1, dtypes.float32, 120), base, gate), f4, alt=UOp.stack(*[cc(0.0, dtypes.float32)] * 4))
    s = alu(Ops.MUL, v, UOp.stack(*[cc(float(i + 1), dtypes.float32) for i in range(4)]))
    tot = alu(Ops.ADD, UOp(Ops.GEP, dtypes.float32, (s,), (0,)), UOp(Ops.GEP, dtypes.float32, (s,), (3,)))
    st = store(idx(buf(0, dtypes.float32, 128), base), s)
    st2 = store(idx(buf(2, dtypes.float32, 32), r, gate), tot)
    return linear(r, st, st2, end(st2, r), name="gated_vec4")


def k_int_semantics() -> list[UOp]:
    r = rng(64, 0)
    a = load(idx(buf(1, dtypes.int32, 64), r))
    b = load(idx(buf(2, dtypes.int32, 64), r))
    wrapped = alu(Ops.ADD, alu(Ops.MUL, a, b), cc(7, dtypes.int32))
    q = alu(Ops.CDIV, wrapped, b)
    m = alu(Ops.CMOD, a, cc(5, dtypes.int32))
    sh = alu(Ops.SHL, q, alu(Ops.AND, b, cc(31, dtypes.int32)))
    sr = alu(Ops.SHR, sh, b)
    st = store(idx(buf(0, dtypes.int32, 64), r), alu(Ops.XOR, sr, m))
    return linear(r, st, end(st, r), name="int_semantics")


def k_narrow_casts() -> list[UOp]:
    r = rng(16, 0)
    h = load(idx(buf(1, dtypes.float16, 16), r))
    f = UOp(Ops.CAST, dtypes.float32, (h,))
    d = UOp(Ops.CAST, dtypes.float64, (alu(Ops.SQRT, f),))
    st0 = store(idx(buf(0, dtypes.bfloat16, 16), r), UOp(Ops.CAST, dtypes.bfloat16, (f,)))
    st2 = store(idx(buf(2, dtypes.fp8e4m3, 16), r), UOp(Ops.CAST, dtypes.fp8e4m3, (f,)))
    st3 = store(idx(buf(3, dtypes.float16, 16), r), UOp(Ops.CAST, dtypes.float16, (d,)))
    st4 = store(idx(buf(4, dtypes.uint8, 16), r), UOp(Ops.CAST, dtypes.uint8, (f,)))
    return linear(r, st0, st2, st3, st4, end(st4, r), name="narrow_casts")


def k_half_select() -> list[UOp]:
    r = rng(16, 0)
    a = load(idx(buf(1, dtypes.float16, 16), r))
    b = load(idx(buf(2, dtypes.float16, 16), r))
    big = UOp(Ops.WHERE, dtypes.float16, (alu(Ops.CMPLT, a, b), b, a))
    st0 = store(idx(buf(0, dtypes.float16, 16), r), big)
    st3 = store(idx(buf(3, dtypes.float64, 16), r), UOp(Ops.CAST, dtypes.float64, (a,)))
    st4 = store(idx(buf(4, dtypes.int32, 16), r), UOp(Ops.CAST, dtypes.int32, (b,)))
    st5 = store(idx(buf(5, dtypes.bool, 16), r), alu(Ops.CMPNE, a, a))
    return linear(r, st0, st3, st4, st5, end(st5, r), name="half_select")


KERNELS = {"saxpy": k_saxpy, "rowmax": k_rowmax, "gated_vec4": k_gated_vec4, "int_semantics": k_int_semantics,
           "narrow_casts": k_narrow_casts, "half_select": k_half_select}  # fmt: skip


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_kernel_golden(name: str) -> None:
    src = ClangRenderer().render(KERNELS[name]())
    path = GOLDEN / f"{name}.c"
    if os.environ.get("SPECK_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src)
    assert path.exists(), f"missing golden {path}; run with SPECK_UPDATE_GOLDEN=1 to create it"
    assert src == path.read_text(), (
        f"rendered C differs from {path}; if intended, regenerate with SPECK_UPDATE_GOLDEN=1"
    )


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_golden_kernels_compile_to_objects(name: str, tmp_path: pathlib.Path, monkeypatch: Any, c_compiler: str
                                           ) -> None:  # fmt: skip
    """Each golden is valid C for the production compiler (an ELF relocatable defining the kernel symbol) and,
    rendered as LLVM IR, compiles through LLVMCompiler too. Neither object needs any external symbol: no libgcc
    half/bfloat helpers (__nehf2, __extendhfdf2, __truncdfhf2...), no libm, nothing for the loader to resolve."""
    from speck.codegen.compiler import ClangCompiler, LLVMCompiler

    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path))
    uops = KERNELS[name]()
    for compiler, renderer in ((ClangCompiler(), ClangRenderer()), (LLVMCompiler(), LLVMRenderer())):
        lib = compiler.compile(renderer.render(uops))
        assert lib[:4] == b"\x7fELF" and lib[16] == 1  # ET_REL
        obj = tmp_path / f"{renderer.name}.o"
        obj.write_bytes(lib)
        syms = subprocess.run(["nm", str(obj)], capture_output=True, text=True, check=True).stdout.split("\n")
        assert any(line.endswith(f" T {name}") for line in syms), syms
        undefined = [line.split()[-1] for line in syms if line.strip().startswith("U ")]
        assert [u for u in undefined if u != "_GLOBAL_OFFSET_TABLE_"] == [], f"{renderer.name}: {undefined}"


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_golden_kernels_run_like_the_interpreter(name: str, c_compiler: str) -> None:
    uops = KERNELS[name]()
    g = np.random.default_rng(7)
    bufs = []
    for p in sorted((u for u in uops if u.op is Ops.PARAM), key=lambda u: u.arg):
        base, size = p.dtype.base, p.dtype.size
        if dtypes.is_float(base):
            vals = nm.to_storage(nm.round_to(g.normal(0, 20, size), base), base)
        else:
            vals = g.integers(-(2**31), 2**31, size).astype(nm.storage_np(base))
        bufs.append(vals)
    check_program(uops, bufs, {"n": 1000})
