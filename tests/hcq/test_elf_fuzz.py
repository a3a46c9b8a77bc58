"""The ELF loader never fails raw: real objects from the LLVM, C and x86 paths (a kernel compiled by
speck.codegen.to_program with each renderer) and gcc's object with every relocation kind, truncated at every byte,
bit-flipped and with header/table fields overwritten. Every outcome is an ElfLinkError naming the object, or a load
with no page writable and executable; a load that the parser reads as the same program as the original (same
loaded bytes, relocations, symbols) runs on the CPU device and computes bit for bit what the original computes.
Mutants read as another program (a changed addend, a moved symbol) are well-formed objects the loader can't tell
from intended ones; they are loaded and checked, not run (a cached object is guarded by the cache's checksum)."""

from __future__ import annotations

import functools
import shutil
import struct
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import event, given
from hypothesis import strategies as st

from speck.codegen import to_program
from speck.codegen.kernel_info import KernelInfo
from speck.hcq import Buffer, Device
from speck.hcq.elf import (
    MAX_IMAGE,
    SHF_ALLOC,
    SHF_EXECINSTR,
    SHF_TLS,
    SHF_WRITE,
    SHN_UNDEF,
    SHT_NOBITS,
    SHT_RELA,
    SHT_STRTAB,
    SHT_SYMTAB,
    ElfLinkError,
    ElfObject,
    _is_loaded,
    load_elf,
    parse_elf,
)
from speck.hcq.errors import ElfSymbolError
from speck.hcq.libs import default_libraries
from speck.hcq.memory import PROT_EXEC, PROT_WRITE
from speck.uop import AxisType, Ops, UOp, dtypes

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="the C path and gcc's object need gcc")
ROWS, COLS = 24, 10
RNG = np.random.default_rng(7)
A = RNG.uniform(-2, 2, ROWS * COLS).astype(np.float32)
B = RNG.uniform(0, 4, ROWS).astype(np.float32)


def fuzz_ast() -> UOp:
    # out[r] = sum_k exp2(1.5 * a[r, k]) + sqrt(b[r]) * 0.25: vector code, .rodata constants, PC32 relocations
    r = UOp.range(ROWS, 0, AxisType.GLOBAL)
    k = UOp.range(COLS, 1, AxisType.REDUCE)
    o = UOp.param(0, dtypes.float32.ptr(ROWS))
    a, b = UOp.param(1, dtypes.float32.ptr(ROWS * COLS)), UOp.param(2, dtypes.float32.ptr(ROWS))
    red = (a.index(r * COLS + k).load() * UOp.const(dtypes.float32, 1.5)).exp2().reduce(k, op=Ops.ADD)
    val = red + b.index(r).load().sqrt() * UOp.const(dtypes.float32, 0.25)
    return UOp.sink(o.index(r).store(val).end(r), arg=KernelInfo(name="fuzzk"))


def fuzz_reference() -> np.ndarray:
    a64 = A.astype(np.float64).reshape(ROWS, COLS)
    return np.exp2(1.5 * a64).sum(axis=1) + np.sqrt(B.astype(np.float64)) * 0.25


@dataclass
class Base:
    """A real object, the name of its kernel, and how to run a loaded copy of it on the CPU device."""

    obj: bytes
    name: str
    run: Callable[[bytes, bool], np.ndarray]  # load `lib` on Device["CPU"] (or raise ElfLinkError), check, run
    parsed: ElfObject

    @functools.cached_property
    def expected(self) -> np.ndarray:
        return self.run(self.obj, True)


def codegen_base(path: str) -> Base:
    if path == "llvm":
        from speck.codegen.compiler import LLVMCompiler
        from speck.codegen.renderer.llvmir import LLVMRenderer

        spec = to_program(fuzz_ast(), LLVMRenderer(), LLVMCompiler())
    elif path == "clang":
        from speck.codegen.compiler import ClangCompiler
        from speck.codegen.renderer.cstyle import ClangRenderer

        spec = to_program(fuzz_ast(), ClangRenderer(), ClangCompiler())
    else:
        from speck.codegen.x86 import X86Compiler, X86Renderer

        spec = to_program(fuzz_ast(), X86Renderer(), X86Compiler())
    assert spec.lib is not None

    def run(lib: bytes, maps: bool) -> np.ndarray:
        dev = Device["CPU"]
        prog = dev.runtime(spec.name, lib, buffers=spec.buffers, vars=spec.vars, global_size=spec.global_size)
        check_no_wx(prog.image, maps)  # type: ignore[attr-defined]
        O = Buffer("CPU", ROWS, np.float32)
        prog(O, Buffer("CPU", ROWS * COLS, np.float32).copyin(A), Buffer("CPU", ROWS, np.float32).copyin(B), wait=True)
        return O.numpy().copy()

    return Base(spec.lib, spec.name, run, parse_elf(spec.lib))


def gcc_base() -> Base:
    from test_elf import INPUT, PIC_C, gcc_object

    obj = gcc_object(PIC_C, "-fPIC")

    def run(lib: bytes, maps: bool) -> np.ndarray:
        prog = Device["CPU"].runtime("kern", lib, buffers=[(0, "float32", 12, "out"), (1, "float32", 12, "in")])
        check_no_wx(prog.image, maps)  # type: ignore[attr-defined]
        O = Buffer("CPU", len(INPUT), np.float32)
        prog(O, Buffer("CPU", len(INPUT), np.float32).copyin(INPUT), global_size=(len(INPUT),), threads=1, wait=True)
        return O.numpy().copy()

    return Base(obj, "kern", run, parse_elf(obj))


@functools.cache
def base(path: str) -> Base:
    return gcc_base() if path == "gcc" else codegen_base(path)


PATHS = ["llvm", pytest.param("clang", marks=[needs_gcc, pytest.mark.c_backend]), "x86",
         pytest.param("gcc", marks=needs_gcc)]  # fmt: skip


def check_no_wx(image: object, maps: bool = True) -> None:
    """No range the loader sealed is writable and executable, and (`maps`) neither is any page of the mapping as the
    kernel reports it in /proc/self/maps."""
    ranges = image.ranges  # type: ignore[attr-defined]
    mem = image.mem  # type: ignore[attr-defined]
    assert all(not (p & PROT_WRITE and p & PROT_EXEC) for _, _, p in ranges), ranges
    if not maps:
        return
    with open("/proc/self/maps") as f:
        for line in f:
            rng, perms = line.split()[:2]
            start, end = (int(x, 16) for x in rng.split("-"))
            if start < mem.addr + mem.size and end > mem.addr:
                assert not ("w" in perms and "x" in perms), f"{line.strip()} is writable and executable"


def meaning(o: ElfObject) -> tuple[object, ...]:
    """What the loader's result depends on: the loaded sections (kind, flags, size, alignment, bytes), relocations
    of loaded sections with the identity of their symbols, exported and common symbols. Indexes and file offsets
    are not part of it: two objects with equal meaning load to the same program."""
    loaded = [s for s in o.sections if _is_loaded(s)]
    idx = {s.index for s in loaded}

    def ident(i: int) -> tuple[object, ...]:
        s = o.symbols[i]
        return (s.name, s.bind) if s.shndx == SHN_UNDEF else (s.shndx, s.value, s.size if s.shndx >= 0xFF00 else 0)

    flags = SHF_ALLOC | SHF_WRITE | SHF_EXECINSTR | SHF_TLS
    secs = tuple((s.index, s.name, s.type == SHT_NOBITS, s.flags & flags, s.size, s.align, o.section_bytes(s))
                 for s in loaded)  # fmt: skip
    relocs = tuple(sorted((t, r.offset, r.kind, r.addend, ident(r.sym)) for t, rs in o.relocations.items() if t in idx
                          for r in rs))  # fmt: skip
    exported = tuple(sorted((s.name, s.bind, s.shndx, s.value, s.size) for s in o.symbols if s.name and s.bind
                            and s.shndx != SHN_UNDEF))  # fmt: skip
    return secs, relocs, exported


def outcome(b: Base, mutant: bytes, maps: bool = True) -> str:
    """Load `mutant` of base `b` and check the contract; returns what happened (for hypothesis' statistics).
    `maps`: also check the pages in /proc/self/maps (a few milliseconds)."""
    try:
        parsed = parse_elf(mutant, b.name)
        out = b.run(mutant, maps) if meaning(parsed) == meaning(b.parsed) else None
        if out is None:  # another program: load and check its pages, never run it
            check_no_wx(load_elf(mutant, default_libraries(), b.name), maps)
            return "loaded another program"
    except ElfLinkError as e:
        assert f"ELF object {b.name!r}" in str(e), f"the error does not name the object: {e}"
        return "ElfLinkError"
    np.testing.assert_array_equal(out, b.expected)
    return "same program: computed the same"


# ---------------------------------------------------------------- where the fields are
def _fields(fmt: str, offset: int) -> list[tuple[int, int]]:
    out, pos = [], offset
    for code in struct.Struct(fmt).format.lstrip("<"):
        if code.isdigit():  # only "16s" (e_ident): one field per byte of its meaningful part
            continue
        w = struct.calcsize("<" + code) if code != "s" else 16
        out += [(pos + i, 1) for i in range(8)] if code == "s" else [(pos, w)]
        pos += w
    return out


@functools.cache
def structure(path: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(byte regions, fields) of base `path`: the ELF header, section header table, symbol table, relocations and
    string tables, and every header/table field as (offset, width)."""
    b = base(path)
    shoff, shnum = struct.unpack_from("<Q", b.obj, 0x28)[0], struct.unpack_from("<H", b.obj, 0x3C)[0]
    regions = [(0, 64), (shoff, shoff + 64 * shnum)]
    fields = _fields("<16sHHIQQQIHHHHHH", 0)
    for i in range(shnum):
        fields += _fields("<IIQQQQIIQQ", shoff + 64 * i)
    for s in b.parsed.sections:
        if s.type in (SHT_SYMTAB, SHT_RELA, SHT_STRTAB) and s.size:
            regions.append((s.offset, s.offset + s.size))
        if s.type == SHT_SYMTAB:
            fields += [f for off in range(s.offset, s.offset + s.size, 24) for f in _fields("<IBBHQQ", off)]
        if s.type == SHT_RELA:
            fields += [f for off in range(s.offset, s.offset + s.size, 24) for f in _fields("<QQq", off)]
    return regions, fields


def interesting(n: int) -> list[int]:
    return [0, 1, 2, 3, 4, 7, 8, 16, 24, 64, 0xFF, 0x100, 0x1000, 0xFFFF, 0xFF00, 0xFFF1, 0xFFF2, 2**31, 2**32 - 1,
            2**63 - 1, 2**63, 2**64 - 1, n - 8, n - 1, n, n + 1, MAX_IMAGE]  # fmt: skip


# ---------------------------------------------------------------- the tests
@pytest.mark.parametrize("path", PATHS)
def test_bases_compute_the_reference(path: str) -> None:
    b = base(path)
    if path == "gcc":
        from test_elf import INPUT, kern_ref

        np.testing.assert_allclose(b.expected, kern_ref(INPUT, 5), rtol=2e-6)
    else:
        np.testing.assert_allclose(b.expected, fuzz_reference(), rtol=1e-5)


@pytest.mark.parametrize("path", PATHS)
def test_truncation_at_every_byte_is_an_elf_link_error(path: str) -> None:
    b = base(path)
    for n in range(len(b.obj)):
        with pytest.raises(ElfLinkError) as ei:
            load_elf(b.obj[:n], default_libraries(), b.name)
        msg = str(ei.value)
        assert f"ELF object {b.name!r}" in msg
        assert "truncated" in msg or "not an ELF object" in msg or "past the end of the file" in msg, msg


@pytest.mark.parametrize("path", PATHS)
@given(data=st.data())
def test_bit_flips_in_headers_and_tables(path: str, data: st.DataObject) -> None:
    b = base(path)
    regions, _ = structure(path)
    mutant = bytearray(b.obj)
    for _ in range(data.draw(st.integers(1, 3), label="flips")):
        lo, hi = data.draw(st.sampled_from(regions), label="region")
        pos = data.draw(st.integers(lo, hi - 1), label="byte")
        mutant[pos] ^= 1 << data.draw(st.integers(0, 7), label="bit")
    event(outcome(b, bytes(mutant)))


@pytest.mark.parametrize("path", PATHS)
@given(data=st.data())
def test_field_overwrites(path: str, data: st.DataObject) -> None:
    b = base(path)
    _, fields = structure(path)
    mutant = bytearray(b.obj)
    for _ in range(data.draw(st.integers(1, 2), label="fields")):
        off, width = data.draw(st.sampled_from(fields), label="field")
        value = data.draw(st.sampled_from(interesting(len(b.obj))) | st.integers(0, 2 ** (8 * width) - 1))
        mutant[off : off + width] = (value % 2 ** (8 * width)).to_bytes(width, "little")
    event(outcome(b, bytes(mutant)))


@pytest.mark.parametrize("path", PATHS)
@given(pos=st.integers(0, 2**20), bit=st.integers(0, 7), cut=st.integers(0, 2**20))
def test_bit_flips_anywhere_then_truncation(path: str, pos: int, bit: int, cut: int) -> None:
    b = base(path)
    mutant = bytearray(b.obj)
    mutant[pos % len(mutant)] ^= 1 << bit
    event(outcome(b, bytes(mutant)))
    with pytest.raises(ElfLinkError, match=f"ELF object {b.name!r}"):
        load_elf(bytes(mutant[: cut % len(mutant)]), default_libraries(), b.name)


@pytest.mark.slow  # every single-bit flip of the ELF header and section header table: ~5000 loads per object
@pytest.mark.parametrize("path", PATHS)
def test_every_single_bit_flip_of_the_headers(path: str) -> None:
    b = base(path)
    regions, _ = structure(path)
    seen: dict[str, int] = {}
    for lo, hi in regions[:2]:
        for pos in range(lo, hi):
            for bit in range(8):
                mutant = bytearray(b.obj)
                mutant[pos] ^= 1 << bit
                what = outcome(b, bytes(mutant), maps=pos % 16 == 0)  # the kernel's view of some, cheaply
                seen[what] = seen.get(what, 0) + 1
    # both sides of the contract are exercised: flips the loader refuses and flips of fields it does not read
    assert seen.get("ElfLinkError", 0) > 100 and seen.get("same program: computed the same", 0) > 100, seen


# ---------------------------------------------------------------- each malformation, by its message
def section_header(b: Base, name: str) -> int:
    shoff = struct.unpack_from("<Q", b.obj, 0x28)[0]
    s = next(s for s in b.parsed.sections if s.name == name)
    return shoff + 64 * s.index


def patched(obj: bytes, offset: int, fmt: str, value: int) -> bytes:
    out = bytearray(obj)
    struct.pack_into(fmt, out, offset, value)
    return bytes(out)


def rejects(obj: bytes, *needles: str, name: str = "fuzzk") -> str:
    with pytest.raises(ElfLinkError) as ei:
        load_elf(obj, default_libraries(), name)
    msg = str(ei.value)
    assert f"ELF object {name!r}" in msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_each_malformation_names_the_place_and_what_was_expected() -> None:
    b = base("llvm")
    o, n = b.obj, len(b.obj)
    rejects(b"\x7fELF" + o[4:40], "truncated ELF header", "expected 64 bytes")
    rejects(b"MZ" + o[2:], "not an ELF object", "magic")
    rejects(patched(o, 4, "<B", 1), "EI_CLASS (offset 0x4) is 1, expected 2")
    rejects(patched(o, 5, "<B", 2), "little-endian", "EI_DATA (offset 0x5) is 2, expected 1")
    rejects(patched(o, 0x28, "<Q", n), "section header table", "end of the file")
    rejects(patched(o, 0x3A, "<H", 40), "e_shentsize (offset 0x3a) is 40, expected 64")
    rejects(patched(o, 0x3E, "<H", 900), "e_shstrndx (offset 0x3e) is 900")
    symtab = section_header(b, ".symtab")
    rejects(patched(o, symtab + 0x18, "<Q", n - 8), "spans file bytes", "past the end of the file")
    rejects(patched(o, symtab + 0x20, "<Q", 2**64 - 1), "past the end of the file")  # size overflow
    rejects(patched(o, symtab + 0x28, "<I", 0), ".symtab: sh_link is 0", "string table")
    rela = section_header(b, ".rela.text")
    rejects(patched(o, rela + 0x2C, "<I", 99), ".rela.text: relocates section #99", "does not exist")
    first = next(s for s in b.parsed.sections if s.name == ".rela.text").offset
    rejects(patched(o, first + 8, "<I", 37), "relocation #0 of .rela.text", "unsupported relocation type 37")
    rejects(patched(o, first + 12, "<I", 5000), "symbol index 5000", "symbol table has")
    rejects(patched(o, first, "<Q", 2**40), "patches 4 bytes at 0x10000000000", "outside section .text")
    text = section_header(b, ".text")
    rejects(patched(o, text + 0x30, "<Q", 3), "section .text: alignment 3 is not a power of two")
    rejects(patched(o, text + 0x30, "<Q", 1 << 20), "alignment 1048576")
    sym = next(s for s in b.parsed.sections if s.name == ".symtab")
    kernel = next(i for i, s in enumerate(b.parsed.symbols) if s.name == "fuzzk")
    rejects(patched(o, sym.offset + 24 * kernel + 8, "<Q", 2**62), "symbol #", "'fuzzk'", "of section .text")


@needs_gcc
def test_a_huge_bss_is_refused_before_mapping() -> None:
    b = base("gcc")
    bss = section_header(b, ".bss")
    rejects(patched(b.obj, bss + 0x20, "<Q", 1 << 40), "more than the 64 MiB", name="kern")


def test_a_missing_kernel_symbol_is_an_elf_link_error_and_a_key_error() -> None:
    b = base("llvm")
    image = load_elf(b.obj, default_libraries(), "fuzzk")
    with pytest.raises(ElfSymbolError) as ei:
        image.address("other")
    assert isinstance(ei.value, KeyError) and isinstance(ei.value, ElfLinkError)
    assert str(ei.value).startswith("ELF object 'fuzzk': symbol 'other' is not defined") and "fuzzk" in str(ei.value)
