"""The ELF loader/linker: every relocation kind the compilers emit, external symbols from libm/libgcc_s, the
undefined-symbol error, and page protections (never writable and executable at once)."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import tempfile

import numpy as np
import pytest

from hcq_kernels import POW_IR
from speck.codegen.compiler import LLVMCompiler
from speck.hcq.elf import R_X86_64, ElfLinkError, LoadedObject, load_elf, parse_elf
from speck.hcq.libs import Library, default_libraries, find_library, load_library

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="the gcc-object tests need gcc")

# exercises PC32 (static data, jump tables in .rodata), PLT32 (local and libm calls), 64 (a pointer table),
# GOTPCREL*/REX_GOTPCRELX (a preemptible global), and writable .data/.bss
PIC_C = r"""
float powf(float, float);
int counter = 5;
static const float table[8] = {1, 2, 3, 4, 5, 6, 7, 8};
static float scratch[16];
static float *const ptrs[2] = {scratch, scratch + 8};
__attribute__((noinline)) int jt(int x, int y) {
  switch (x) {
    case 0: return y * 3 + 1; case 1: return y ^ 0x55; case 2: return y << 3; case 3: return y / 7;
    case 4: return y - 100; case 5: return y * y; case 6: return ~y; case 7: return y % 11; default: return 0;
  }
}
unsigned long scratch_addr(void) { return (unsigned long)&scratch[0]; }
void kern(float *restrict o, const float *restrict a, int s, int e) {
  for (int i = s; i < e; i++) {
    ptrs[i & 1][i & 7] = a[i];
    o[i] = powf(a[i], table[i & 7] / 4.0f) + jt(i & 7, (int)a[i]) + counter + ptrs[i & 1][i & 7];
    counter += 1;
  }
}
"""


def gcc_object(src: str, *flags: str, lang: str = "c") -> bytes:
    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "k.o")
        base = [
            "gcc",
            "-O2",
            "-c",
            "-x",
            lang,
            "-",
            "-o",
            out,
            "-fno-asynchronous-unwind-tables",
            "-fno-stack-protector",
        ]
        proc = subprocess.run([*base, *flags], input=src.encode(), capture_output=True)
        assert proc.returncode == 0, proc.stderr.decode()
        with open(out, "rb") as f:
            return f.read()


def reloc_kinds(obj: bytes) -> set[str]:
    return {r.kind for rs in parse_elf(obj).relocations.values() for r in rs}


def c_div(y: int, d: int) -> int:
    q = abs(y) // abs(d)
    return q if (y >= 0) == (d > 0) else -q


def jt_ref(x: int, y: int) -> int:
    ops = [
        lambda y: y * 3 + 1, lambda y: y ^ 0x55, lambda y: y << 3, lambda y: c_div(y, 7), lambda y: y - 100,
        lambda y: y * y, lambda y: ~y, lambda y: y - c_div(y, 11) * 11,
    ]  # fmt: skip
    return ops[x](y)


def kern_ref(a: np.ndarray, counter0: int) -> np.ndarray:
    table = np.arange(1, 9, dtype=np.float32)
    out = np.empty_like(a)
    for i, v in enumerate(a):
        p = np.float32(np.power(v, table[i & 7] / np.float32(4)))
        out[i] = np.float32(np.float32(p + np.float32(jt_ref(i & 7, int(v)))) + np.float32(counter0 + i)) + v
    return out


def run_kern(lo: LoadedObject, a: np.ndarray) -> np.ndarray:
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(lo.address("kern"))
    out = np.zeros_like(a)
    fn(out.ctypes.data, a.ctypes.data, 0, len(a))
    return out


def maps_overlapping(lo: LoadedObject) -> list[tuple[int, int, str]]:
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            rng, perms = line.split()[:2]
            start, end = (int(x, 16) for x in rng.split("-"))
            if start < lo.mem.addr + lo.mem.size and end > lo.mem.addr:
                found.append((start, end, perms))
    return found


INPUT = np.array([1.5, 2.0, 3.25, 4.0, 7.0, 9.5, 12.0, 30.0, 0.5, 100.0, 17.0, 3.0], dtype=np.float32)


@needs_gcc
@pytest.mark.parametrize(
    "flags, expected_kinds",
    [
        (("-fPIC",), {"PC32", "PLT32", "64", "REX_GOTPCRELX"}),
        (("-fPIC", "-fno-plt"), {"PC32", "64", "GOTPCRELX", "REX_GOTPCRELX"}),
        (("-fPIC", "-Wa,-mrelax-relocations=no"), {"PC32", "PLT32", "64", "GOTPCREL"}),
        (("-fno-pic", "-mcmodel=small"), {"PC32", "PLT32", "64", "32", "32S"}),
    ],
)
def test_gcc_relocations_link_and_compute(flags: tuple[str, ...], expected_kinds: set[str]) -> None:
    obj = gcc_object(PIC_C, *flags)
    assert expected_kinds <= reloc_kinds(obj)
    lo = load_elf(obj, default_libraries())
    np.testing.assert_allclose(run_kern(lo, INPUT), kern_ref(INPUT, 5), rtol=2e-6)
    # .data is writable and keeps its state: the second call continues the counter
    np.testing.assert_allclose(run_kern(lo, INPUT), kern_ref(INPUT, 5 + len(INPUT)), rtol=2e-6)
    # scratch_addr returns an absolute address: it must point into the loaded object's writable pages
    addr = ctypes.CFUNCTYPE(ctypes.c_ulong)(lo.address("scratch_addr"))()
    assert any(start <= addr < start + size and prot == 3 for start, size, prot in lo.ranges)
    if "32S" in expected_kinds:
        assert lo.mem.addr + lo.mem.size < 2**31  # absolute 32-bit relocations forced a low mapping


ASM_PC64_GOTPC32 = """
.intel_syntax noprefix
.text
.globl get_pc64
get_pc64:
  lea rax, [rip + disp]
  add rax, [rip + disp]
  ret
.globl get_got
get_got:
  lea rax, [rip + _GLOBAL_OFFSET_TABLE_]
  ret
.globl get_via_got
get_via_got:
  mov rax, [rip + target@GOTPCREL]
  ret
.globl get_target
get_target:
  lea rax, [rip + target]
  ret
.section .rodata
disp: .quad target - .
.data
.globl target
target: .quad 42
"""


@needs_gcc
def test_section_variants_are_laid_out() -> None:
    obj = gcc_object(PIC_C, "-fPIC")
    names = {s.name for s in parse_elf(obj).sections}
    assert {".text.unlikely", ".rodata.cst4", ".data.rel.ro.local", ".bss"} <= names


@needs_gcc
def test_pc64_gotpc32_and_plain_gotpcrel_from_assembly() -> None:
    obj = gcc_object(ASM_PC64_GOTPC32, "-Wa,-mrelax-relocations=no", lang="assembler")
    assert {"PC64", "GOTPC32", "GOTPCREL", "PC32"} <= reloc_kinds(obj)
    lo = load_elf(obj, [])
    call = lambda name: ctypes.CFUNCTYPE(ctypes.c_uint64)(lo.address(name))()
    target = call("get_target")
    assert target == lo.address("target") and ctypes.c_uint64.from_address(target).value == 42
    assert call("get_pc64") == target  # &disp + (target - &disp)
    assert call("get_via_got") == target
    got = call("get_got")
    assert ctypes.c_uint64.from_address(got).value == target  # the one GOT slot holds &target


def test_llvm_object_links_powf_from_libm_and_rodata() -> None:
    obj = LLVMCompiler().compile(POW_IR)
    assert {"PLT32", "PC32"} <= reloc_kinds(obj)
    lo = load_elf(obj, [load_library("m")])
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(lo.address("powk"))
    a = np.linspace(0.5, 9.0, 37, dtype=np.float32)
    out = np.zeros_like(a)
    fn(out.ctypes.data, a.ctypes.data, 0, len(a))
    expo = np.array([1.0, 2.0, 0.5, 3.0], dtype=np.float32)[np.arange(len(a)) & 3]
    np.testing.assert_allclose(out, np.power(a, expo), rtol=2e-6)


def test_half_helpers_resolve_from_libgcc_s() -> None:
    ir = """
declare float @__extendhfsf2(half)
declare half @__truncsfhf2(float)
define void @roundtrip(ptr %o, ptr %a, i32 %s, i32 %e) {
entry:
  %c0 = icmp slt i32 %s, %e
  br i1 %c0, label %loop, label %exit
loop:
  %i = phi i32 [%s, %entry], [%n, %loop]
  %ix = sext i32 %i to i64
  %p = getelementptr float, ptr %a, i64 %ix
  %v = load float, ptr %p
  %h = call half @__truncsfhf2(float %v)
  %r = call float @__extendhfsf2(half %h)
  %q = getelementptr float, ptr %o, i64 %ix
  store float %r, ptr %q
  %n = add i32 %i, 1
  %c = icmp slt i32 %n, %e
  br i1 %c, label %loop, label %exit
exit:
  ret void
}
"""
    lo = load_elf(LLVMCompiler().compile(ir), default_libraries())
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32)(
        lo.address("roundtrip")
    )
    a = np.array([0.1, 1.0, -2.5, 65504.0, 1e-5, 3.14159, 70000.0], dtype=np.float32)
    out = np.zeros_like(a)
    fn(out.ctypes.data, a.ctypes.data, 0, len(a))
    with np.errstate(over="ignore"):  # 70000 overflows to inf in half, in both paths
        expected = a.astype(np.float16).astype(np.float32)
    np.testing.assert_array_equal(out, expected)


def test_undefined_symbol_is_named_at_load_time() -> None:
    ir = """
declare float @speck_no_such_function(float)
define void @k(ptr %o, i32 %s, i32 %e) {
  %r = call float @speck_no_such_function(float 1.0)
  store float %r, ptr %o
  ret void
}
"""
    obj = LLVMCompiler().compile(ir)
    with pytest.raises(RuntimeError, match="speck_no_such_function"):
        load_elf(obj, default_libraries())
    with pytest.raises(ElfLinkError, match="undefined symbol 'speck_no_such_function'"):
        load_elf(obj, [])


@needs_gcc
def test_loaded_pages_are_never_writable_and_executable() -> None:
    objs = [gcc_object(PIC_C, "-fPIC"), gcc_object(PIC_C, "-fno-pic"), LLVMCompiler().compile(POW_IR)]
    for obj in objs:
        lo = load_elf(obj, default_libraries())
        maps = maps_overlapping(lo)
        assert maps, "the loaded object's pages are not in /proc/self/maps"
        for start, end, perms in maps:
            assert not ("w" in perms and "x" in perms), f"{start:#x}-{end:#x} is {perms}"
        assert any("x" in perms for *_, perms in maps)  # the code really is executable


def test_parse_rejects_non_objects_with_a_clear_message() -> None:
    with pytest.raises(ElfLinkError, match="not an ELF object"):
        parse_elf(b"hello world" * 10)
    obj = bytearray(LLVMCompiler().compile(POW_IR))
    obj[16] = 3  # e_type = ET_DYN
    with pytest.raises(ElfLinkError, match="ET_REL"):
        parse_elf(bytes(obj))
    obj = bytearray(LLVMCompiler().compile(POW_IR))
    obj[18] = 183  # e_machine = AArch64
    with pytest.raises(ElfLinkError, match="AArch64"):
        parse_elf(bytes(obj))


def test_symbol_lookup_names_defined_symbols() -> None:
    lo = load_elf(LLVMCompiler().compile(POW_IR), default_libraries())
    with pytest.raises(KeyError, match="powk"):
        lo.address("nope")


def test_library_finder_honours_the_path_override(monkeypatch: pytest.MonkeyPatch) -> None:
    real = find_library("m")
    assert real is not None
    monkeypatch.setenv("LIBM_PATH", "/nonexistent/libm-custom.so")
    assert find_library("m") == "/nonexistent/libm-custom.so"
    lib = Library(real)
    assert lib.lookup("powf") is not None and lib.lookup("speck_not_there") is None


def test_every_supported_relocation_kind_is_named() -> None:
    assert {"PC32", "PLT32", "64", "32", "32S", "GOTPCREL", "GOTPCRELX", "REX_GOTPCRELX"} <= set(R_X86_64.values())


def test_objects_from_speck_x86_backend_link() -> None:
    # k(float *out): out[0] = expf(<rodata constant 2.0>), hand-encoded, written by speck's own ELF object writer
    from speck.codegen.x86.elf_object import write_elf_object
    from speck.codegen.x86.encoder import Relocation

    code = bytes.fromhex("57" + "f30f1005" + "00000000" + "e8" + "00000000" + "5f" + "f30f1107" + "c3")
    relocs = [Relocation(5, "PC32", ".rodata", -4), Relocation(10, "PLT32", "expf", -4)]
    obj = write_elf_object("k", code, relocs, rodata=np.float32(2.0).tobytes())
    lo = load_elf(obj, default_libraries())
    out = np.zeros(1, np.float32)
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lo.address("k"))(out.ctypes.data)
    np.testing.assert_allclose(out[0], np.exp(2.0), rtol=1e-6)  # libm expf, within an ulp
