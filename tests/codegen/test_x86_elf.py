"""ELF64 relocatable object writer: checked by readelf/objdump (binutils) and by linking with gcc and calling it."""

from __future__ import annotations

import ctypes
import shutil
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from speck.codegen.x86.assembler import Assembled, assemble
from speck.codegen.x86.elf_object import ConstPool, write_elf_object
from speck.codegen.x86.encoder import Relocation
from speck.codegen.x86.objdump import disassemble_object
from speck.codegen.x86.operands import RSP, Imm, Inst, Sym, rodata, xmm
from speck.codegen.x86.ops import X86Op as O

needs_gcc = pytest.mark.skipif(shutil.which("gcc") is None, reason="gcc is needed to link the object")


def exp_kernel(pool: ConstPool) -> Assembled:
    """float k(float x) { return expf(x) * 3.0f + floor(2.75f) + 0.25f; } with constants in .rodata."""
    three = pool.add(struct.pack("<f", 3.0), 4)
    quarter = pool.add(struct.pack("<f", 0.25), 16)
    frac = pool.add(struct.pack("<f", 2.75), 4)
    assert pool.add(struct.pack("<f", 3.0), 4) == three  # identical constants are shared
    return assemble([
        Inst(O.SUB, (RSP, Imm(8))),  # keep rsp 16-byte aligned at the call
        Inst(O.CALL, (Sym("expf"),)),
        Inst(O.ADD, (RSP, Imm(8))),
        Inst(O.VMULSS, (xmm(0), xmm(0), rodata(three))),
        Inst(O.VROUNDSS, (xmm(1), xmm(1), rodata(frac), Imm(1))),  # imm8 after the displacement: addend -5
        Inst(O.VADDSS, (xmm(0), xmm(0), xmm(1))),
        Inst(O.VADDSS, (xmm(0), xmm(0), rodata(quarter))),
        Inst(O.RET),
    ])  # fmt: skip


def test_object_structure_reported_by_readelf(tmp_path: Path) -> None:
    pool = ConstPool()
    asm = exp_kernel(pool)
    obj = write_elf_object("exp_kernel", asm.code, asm.relocations, bytes(pool.data))
    path = tmp_path / "k.o"
    path.write_bytes(obj)
    out = subprocess.run(
        ["readelf", "-h", "-S", "-s", "-r", "-W", str(path)], capture_output=True, text=True, check=True
    )
    text = out.stdout
    assert "REL (Relocatable file)" in text and "Advanced Micro Devices X86-64" in text
    for section in (".text", ".rodata", ".rela.text", ".symtab", ".strtab", ".shstrtab", ".note.GNU-stack"):
        assert f" {section} " in text
    sym = next(line.split() for line in text.splitlines() if line.rstrip().endswith(" exp_kernel"))
    assert sym[3:5] == ["FUNC", "GLOBAL"] and int(sym[2]) == len(asm.code)
    assert any(line.split()[-1] == "expf" and "UND" in line for line in text.splitlines() if "NOTYPE" in line)
    relocs = [line.split() for line in text.splitlines() if "R_X86_64_" in line]
    kinds = [(r[2], r[4]) for r in relocs]
    assert kinds == [("R_X86_64_PLT32", "expf"), ("R_X86_64_PC32", ".rodata"), ("R_X86_64_PC32", ".rodata"),
                     ("R_X86_64_PC32", ".rodata")]  # fmt: skip
    assert [int(r[0], 16) for r in relocs] == [r.offset for r in asm.relocations]
    # objdump -dr agrees on every instruction and shows the same relocations
    dis = disassemble_object(obj, relocs=True)
    # addend = constant offset - bytes from the field to the end of the instruction (4, or 5 with the imm8)
    assert "R_X86_64_PLT32\texpf-0x4" in dis
    three, quarter, frac = 0, 16, 20
    for addend in (three - 4, frac - 5, quarter - 4):
        assert f"R_X86_64_PC32\t.rodata{addend:+#x}".replace("+-", "-") in dis


@needs_gcc
def test_links_with_gcc_and_runs(tmp_path: Path) -> None:
    pool = ConstPool()
    asm = exp_kernel(pool)
    (tmp_path / "k.o").write_bytes(write_elf_object("exp_kernel", asm.code, asm.relocations, bytes(pool.data)))
    subprocess.run(["gcc", "-shared", "-o", str(tmp_path / "k.so"), str(tmp_path / "k.o"), "-lm"], check=True)
    fn = ctypes.CDLL(str(tmp_path / "k.so")).exp_kernel
    fn.restype, fn.argtypes = ctypes.c_float, [ctypes.c_float]
    libm = ctypes.CDLL("libm.so.6")
    libm.expf.restype, libm.expf.argtypes = ctypes.c_float, [ctypes.c_float]
    for x in np.linspace(-4, 4, 17, dtype=np.float32).tolist():
        want = np.float32(libm.expf(x)) * np.float32(3.0) + np.float32(2.0) + np.float32(0.25)
        assert np.float32(fn(x)) == want


def test_const_pool_alignment_and_sharing() -> None:
    pool = ConstPool()
    a = pool.add(b"\1", 1)
    b = pool.add(b"\2" * 32, 32)
    c = pool.add(b"\1", 1)
    d = pool.add(b"\1", 8)
    assert (a, b, c) == (0, 32, 0) and d % 8 == 0 and d not in (a, b)
    assert pool.data[b : b + 32] == b"\2" * 32


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"name": "not a name"}, "C identifier"),
        ({"relocations": [Relocation(0, "GOT", "x", 0)]}, "unknown relocation kind"),
        ({"relocations": [Relocation(2, "PC32", "x", 0)]}, "outside"),
    ],
)
def test_bad_input(kwargs: dict, fragment: str) -> None:
    args = {"name": "k", "code": b"\xc3\x90\x90", "relocations": ()} | kwargs
    with pytest.raises(ValueError, match=fragment):
        write_elf_object(**args)
