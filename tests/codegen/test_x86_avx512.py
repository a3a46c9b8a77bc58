"""The x86 backend's AVX-512 path, checked without running it (this host has no avx512f): the renderer's declarations
and the switch between AVX-512 and AVX2, the early refusal that hands a kernel to the AVX2 renderer, and the objects
the zmm selector builds for the whole kernel corpus - each listing identical to objdump's decoding of its bytes,
every zmm value in zmm16..31 and never a 128/256-bit EVEX form (AVX-512F alone runs it). Execution of these
objects is tested through the emulator in test_x86_avx512_emulated.py.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings

from codegen_strategies import kernel_asts
from speck.codegen import cpu_features
from speck.codegen.backends import get_backend
from speck.codegen.errors import X86UnsupportedError
from speck.codegen.kernel_info import KernelInfo
from speck.codegen.program import to_program
from speck.codegen.x86 import X86Compiler, X86Renderer
from speck.codegen.x86.elf_object import read_listing
from speck.codegen.x86.objdump import disassemble_object, parse_objdump
from speck.codegen.x86.renderer import ZmmRefusal
from speck.uop import AxisType, Context, UOp, dtypes
from test_x86_blocking import BLOCKED
from test_x86_kernels import without_narrow_floats

_NARROW_EVEX = re.compile(r"\b[xy]mm(1[6-9]|2\d|3[01])\b")


def avx512_program(ast: UOp, fp_contract: bool = True) -> tuple[bytes, str]:
    spec = to_program(ast, X86Renderer(fp_contract=fp_contract, avx512=True), X86Compiler())
    assert spec.lib is not None
    return spec.lib, X86Compiler().disassemble(spec.lib)


def assert_listing_is_objdumps(obj: bytes, listing: str) -> None:
    """Every instruction line of the encoder's listing equals objdump's decoding of the object's bytes."""

    def jumps(lines: list[tuple[int, str]]) -> list[tuple[int, str]]:  # objdump -d prints targets without 0x
        return [(o, re.sub(r"^(j\w+|call) 0x", r"\1 ", t)) for o, t in lines]

    assert jumps(parse_objdump(listing)) == jumps(parse_objdump(disassemble_object(obj)))


def test_renderer_declares_widths_by_instruction_set() -> None:
    wide, narrow = X86Renderer(avx512=True), X86Renderer(avx512=False)
    # vector_registers: what the allocator hands out for float vectors (zmm16..29; ymm0..12), not the scratch ones
    assert (wide.max_vector_bytes, wide.vector_registers, wide.max_vec_lanes(dtypes.float32)) == (64, 14, 16)
    assert (narrow.max_vector_bytes, narrow.vector_registers, narrow.max_vec_lanes(dtypes.float32)) == (32, 13, 8)
    assert wide.max_vec_lanes(dtypes.int32) == narrow.max_vec_lanes(dtypes.int32) == 1


def test_default_follows_the_host_and_the_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    r = X86Renderer()
    monkeypatch.setattr(cpu_features, "host_cpu_flags", lambda: frozenset({"avx2", "fma", "avx512f"}))
    assert r.max_vector_bytes == 64
    with Context(X86_AVX512=0):
        assert r.max_vector_bytes == 32  # forced AVX2 on an AVX-512 host
    monkeypatch.setattr(cpu_features, "host_cpu_flags", lambda: frozenset({"avx2", "fma"}))
    assert r.max_vector_bytes == 32  # never AVX-512 without avx512f, whatever the setting says
    with Context(X86_AVX512=1):
        assert r.max_vector_bytes == 32


def test_this_hosts_default_matches_cpuinfo() -> None:
    flags = open("/proc/cpuinfo").read()
    assert X86Renderer().uses_avx512 == (" avx512f" in flags)


@pytest.mark.parametrize("name", sorted(BLOCKED))
def test_blocked_kernels_build_zmm_code_objdump_agrees_with(name: str) -> None:
    obj, listing = avx512_program(BLOCKED[name]())
    assert_listing_is_objdumps(obj, listing)
    assert not _NARROW_EVEX.search(listing), "a 128/256-bit EVEX form needs AVX512VL"


def test_matmul_fma_reads_its_row_element_as_an_embedded_broadcast() -> None:
    """4 rows x 2 zmm: each reduce step loads two vectors of b and reads a[i, r] of each row as {1to16} straight
    in the FMA - no scalar load, no vbroadcastss."""
    _, listing = avx512_program(BLOCKED["matmul_64x32x256"]())
    assert len(re.findall(r"vfmadd231ps zmm\d+,zmm\d+,DWORD BCST \[", listing)) == 8
    assert "vbroadcastss" not in listing and "ymm" not in listing and "vmovss" not in listing


def _bool_roundtrip16() -> UOp:
    """b[i] = a[i] for 64 bools: 16-lane bool loads/stores the zmm rules refuse."""
    n = 64
    r = UOp.range(n, 0, AxisType.GLOBAL)
    a, o = UOp.param(1, dtypes.bool.ptr(n)), UOp.param(0, dtypes.bool.ptr(n))
    return UOp.sink(o.index(r).store(a.index(r).load()).end(r), arg=KernelInfo(name="bool_copy"))


def test_refused_kernel_is_rendered_for_avx2(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    ast = _bool_roundtrip16()
    with pytest.raises(ZmmRefusal, match="AVX-512 selector does not take"):
        to_program(ast, X86Renderer(avx512=True), None)
    be = get_backend("X86")
    monkeypatch.setattr(be, "_renderer", X86Renderer(avx512=True))
    with Context(DEBUG=2):
        spec = be.to_program(ast, compile=False)
    assert "rendering it with X86_AVX2" in capsys.readouterr().out
    assert spec.renderer == "x86" and max(u.dtype.count for u in spec.uops) == 8  # ymm lanes


@settings(max_examples=max(10, settings.default.max_examples // 2), deadline=None)
@given(kernel_asts())
def test_corpus_builds_avx512_objects_or_refuses(case: tuple[UOp, list, dict]) -> None:
    ast, inputs, _ = case
    ast, _ = without_narrow_floats(ast, inputs)
    try:
        obj, listing = avx512_program(ast)
    except X86UnsupportedError:
        return  # refused up front (ZmmRefusal: the registry renders it for AVX2)
    assert read_listing(obj) == listing
    assert_listing_is_objdumps(obj, listing)
    assert not _NARROW_EVEX.search(listing), "a 128/256-bit EVEX form needs AVX512VL"


def test_odd_wide_vectors_are_refused_and_run_on_avx2(monkeypatch: pytest.MonkeyPatch) -> None:
    """12 lanes fit no register: the AVX-512 renderer refuses the kernel up front, and the registry's X86 backend
    gives it to the AVX2 renderer, whose object runs here and matches the interpreter."""
    import numpy as np

    from speck.codegen.interpret import run_program
    from speck.codegen.opt import Opt, OptOps
    from test_x86_kernels import run_x86

    n = 48
    r = UOp.range(n, 0, AxisType.GLOBAL)
    x = UOp.param(1, dtypes.float32.ptr(n)).index(r).load()
    ast = UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(r).store(x * x + 1.0).end(r),
                   arg=KernelInfo(name="odd12", opts=(Opt(OptOps.UPCAST, 0, 12),)))  # fmt: skip
    with pytest.raises(ZmmRefusal, match="12 lanes"):
        to_program(ast, X86Renderer(avx512=True), None)
    be = get_backend("X86")
    monkeypatch.setattr(be, "_renderer", X86Renderer(avx512=True))
    spec = be.to_program(ast)
    ins = [np.zeros(n, np.float32), np.random.default_rng(0).standard_normal(n).astype(np.float32)]
    want = [b.copy() for b in ins]
    run_program(spec.uops, want, {})
    assert "zmm" not in X86Compiler().disassemble(spec.lib or b"")
    np.testing.assert_allclose(run_x86(spec, ins, {})[0], want[0], rtol=1e-6)  # (the registry's FP_CONTRACT: FMA)
