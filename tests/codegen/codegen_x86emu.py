"""An emulator of x86-64 kernels as speck's x86 backend emits them: the test oracle for code this host cannot run
(AVX-512: no avx512f here), and a second opinion on the code it can.

Independence: instructions are decoded by GNU objdump (`objdump -d -r -M intel --no-show-raw-insn` on the ELF object),
not by speck's encoder tables, and each mnemonic's semantics are written from the Intel SDM (codegen_x86emu_ops.py:
integer and control flow; codegen_x86emu_vec.py: vector arithmetic, compares, conversions, moves;
codegen_x86emu_lanes.py: shuffles, permutes, broadcasts and opmasks). A wrong encoding,
selection or register allocation therefore shows up as a wrong result rather than being decoded back by the same
tables that produced it.

Structure: ELF reader (sections, symbols, relocations) -> loader (sections at fake addresses, relocations applied) ->
decoder (objdump text -> `Decoded` instructions with parsed operands, each bound once to its semantic closure) -> one
run loop. Decoded programs are cached per object.

ABI (speck's CPU kernels, System V x86-64): buffers as pointers, then int32 vars, then int32 core_start, core_end; the
first six integer arguments in rdi, rsi, rdx, rcx, r8, r9, the rest on the stack. The upper halves of int32
arguments are undefined by the ABI: the emulator fills them with junk so a kernel that relies on them fails.
Buffers are mapped at addresses above 4 GiB (so truncating a pointer to 32 bits faults) and written back in place.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
import subprocess
import tempfile
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import codegen_x86emu_lanes  # noqa: F401  (registers the lane-moving vector and opmask rules)
import codegen_x86emu_vec  # noqa: F401  (registers the arithmetic vector rules)
from codegen_x86emu_ops import (
    M64,
    RULES,
    Decoded,
    EmulationError,
    Gpr,
    Imm,
    KReg,
    Machine,
    Mem,
    Memory,
    Operand,
    Run,
    Target,
    VecReg,
)

__all__ = ["EmuStats", "EmulationError", "emulate", "decode_object"]

# ---------------------------------------------------------------------------------------------------------------------
# ELF64 relocatable objects (System V gABI "Object Files", x86-64 psABI relocations)

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
SHT_SYMTAB, SHT_RELA, SHT_NOBITS, SHF_ALLOC, SHF_WRITE = 2, 4, 8, 0x2, 0x1
R_64, R_PC32, R_PLT32, R_32, R_32S = 1, 2, 4, 10, 11


@dataclass
class Section:
    name: str
    type: int
    flags: int
    data: bytes
    link: int
    info: int
    align: int
    addr: int = 0  # load address (allocated sections)


@dataclass
class Symbol:
    name: str
    shndx: int
    value: int


def read_elf(obj: bytes) -> tuple[list[Section], list[Symbol], list[tuple[int, int, int, int, int]]]:
    """Sections, symbols and relocations (target section, offset, symbol index, type, addend) of an ET_REL object."""
    if len(obj) < _EHDR.size or obj[:6] != b"\x7fELF\x02\x01":
        raise EmulationError(f"expected a little-endian ELF64 object, got {obj[:6]!r}...")
    e = _EHDR.unpack_from(obj)
    if e[1] != 1 or e[2] != 62:
        raise EmulationError(
            f"expected an x86-64 relocatable object (ET_REL, EM_X86_64), got type {e[1]} machine {e[2]}"
        )
    shoff, shnum, shstrndx = e[6], e[12], e[13]
    raw = [_SHDR.unpack_from(obj, shoff + i * _SHDR.size) for i in range(shnum)]
    names = obj[raw[shstrndx][4] : raw[shstrndx][4] + raw[shstrndx][5]]

    def cstr(tab: bytes, at: int) -> str:
        return tab[at : tab.index(b"\0", at)].decode()

    sections = [Section(cstr(names, h[0]), h[1], h[2], b"\0" * h[5] if h[1] == SHT_NOBITS else obj[h[4] : h[4] + h[5]],
                        h[6], h[7], max(h[8], 1)) for h in raw]  # fmt: skip
    symbols: list[Symbol] = []
    for s in sections:
        if s.type == SHT_SYMTAB:
            strtab = sections[s.link].data
            for i in range(len(s.data) // _SYM.size):
                nm, _info, _other, shndx, value, _size = _SYM.unpack_from(s.data, i * _SYM.size)
                symbols.append(Symbol(cstr(strtab, nm), shndx, value))
    relocs = []
    for s in sections:
        if s.type == SHT_RELA:
            for i in range(len(s.data) // _RELA.size):
                off, info, addend = _RELA.unpack_from(s.data, i * _RELA.size)
                relocs.append((s.info, off, info >> 32, info & 0xFFFF_FFFF, addend))
    return sections, symbols, relocs


# ---------------------------------------------------------------------------------------------------------------------
# loading: allocated sections near CODE_BASE, undefined symbols at EXTERN_BASE (calls there are errors)

CODE_BASE = 0x40_0000
EXTERN_BASE = 0x30_0000  # within +-2 GiB of the code: PC32/PLT32 relocations reach it
BUFFER_BASE = 0x1_0000_0000
STACK_TOP, STACK_SIZE = 0x7FFF_0000_0000, 1 << 18
RETURN_SENTINEL = 0x7FFF_DEAD_0000
JUNK_UPPER = 0xDEAD_BEEF << 32


@dataclass
class Program:
    """A decoded object: loaded section images (relocated), instructions, address -> index, symbol addresses."""

    images: list[tuple[int, bytes, str, bool]]  # (address, bytes, section name, writable)
    insts: list[Decoded]
    index: dict[int, int]
    falls: list[int]  # index of the next instruction in the same section, -1 at a section's end
    symbols: dict[str, int]
    externals: dict[int, str]


def _load(obj: bytes) -> tuple[list[Section], dict[str, int], dict[int, str], dict[int, dict[int, int]]]:
    """Place sections, resolve symbols, apply relocations. Returns the sections (with addresses and relocated data),
    defined symbol addresses, external fake addresses, and per-section {offset: relocated field value}."""
    sections, symbols, relocs = read_elf(obj)
    at = CODE_BASE
    for s in sections:
        if s.flags & SHF_ALLOC:
            at += -at % max(s.align, 16)
            s.addr = at
            at += len(s.data) + 64  # a gap: running off a section's end faults instead of reading the next one
    externals: dict[int, str] = {}
    sym_addr: list[int] = []
    defined: dict[str, int] = {}
    for sym in symbols:
        if sym.shndx == 0 and sym.name:
            a = EXTERN_BASE + 16 * len(externals)
            externals[a] = sym.name
        elif 0 < sym.shndx < len(sections):
            a = sections[sym.shndx].addr + sym.value
            if sym.name:
                defined[sym.name] = a
        else:
            a = sym.value  # SHN_ABS and the null symbol
        sym_addr.append(a)
    images = {i: bytearray(s.data) for i, s in enumerate(sections) if s.flags & SHF_ALLOC}
    fields: dict[int, dict[int, int]] = {i: {} for i in images}
    for target, off, sym_index, rtype, addend in relocs:
        if target not in images:
            continue  # relocations of non-loaded sections (debug info) do not matter here
        s_val, p = sym_addr[sym_index], sections[target].addr + off
        if rtype in (R_PC32, R_PLT32):
            v, size = s_val + addend - p, 4
            if not -(2**31) <= v < 2**31:
                raise EmulationError(f"relocation at {sections[target].name}+{off:#x}: PC32 value {v:#x} overflows")
        elif rtype == R_64:
            v, size = s_val + addend, 8
        elif rtype in (R_32, R_32S):
            v, size = s_val + addend, 4
        else:
            raise EmulationError(f"relocation type {rtype} at {sections[target].name}+{off:#x} is not supported "
                                 "(expected R_X86_64_PC32, PLT32, 64, 32 or 32S)")  # fmt: skip
        images[target][off : off + size] = (v & ((1 << (8 * size)) - 1)).to_bytes(size, "little")
        fields[target][off] = v
    for i, img in images.items():
        sections[i].data = bytes(img)
    return sections, defined, externals, fields


# ---------------------------------------------------------------------------------------------------------------------
# decoding objdump's Intel syntax

_GPRS: dict[str, tuple[int, int]] = {}
for _i, _n in enumerate(("ax", "cx", "dx", "bx", "sp", "bp", "si", "di")):
    _GPRS["r" + _n], _GPRS["e" + _n], _GPRS[_n] = (_i, 8), (_i, 4), (_i, 2)
for _i, _n in enumerate(("al", "cl", "dl", "bl", "spl", "bpl", "sil", "dil")):
    _GPRS[_n] = (_i, 1)
for _i in range(8, 16):
    _GPRS[f"r{_i}"], _GPRS[f"r{_i}d"], _GPRS[f"r{_i}w"], _GPRS[f"r{_i}b"] = (_i, 8), (_i, 4), (_i, 2), (_i, 1)
_VEC = re.compile(r"^([xyz])mm(\d+)$")
_SIZES = {"BYTE": 1, "WORD": 2, "DWORD": 4, "QWORD": 8, "XMMWORD": 16, "YMMWORD": 32, "ZMMWORD": 64}
_MEM = re.compile(r"^(?:(\w+) (PTR|BCST) )?(?:\w+:)?\[([^\]]*)\]$")
_LINE = re.compile(r"^\s*([0-9a-f]+):\t(.*)$")
_RELOC_LINE = re.compile(r"^\s*([0-9a-f]+): (R_X86_64_\w+)\s+(.*)$")
_SECTION = re.compile(r"^Disassembly of section (.*):$")
_IGNORED_PREFIXES = {"data16", "cs", "ds", "notrack", "bnd"}


def _split_operands(s: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if cur:
        out.append(cur)
    return [o.strip() for o in out]


def _parse_operand(tok: str, d: Decoded, rip_value: int | None, sec_addr: int) -> Operand:
    decorations = re.findall(r"\{([^}]*)\}", tok)
    tok = re.sub(r"\{[^}]*\}", "", tok).strip()
    bcast = False
    for dec in decorations:
        if re.fullmatch(r"k[1-7]", dec):
            d.mask = int(dec[1])
        elif dec == "z":
            d.zero = True
        elif re.fullmatch(r"1to\d+", dec):
            bcast = True
        else:
            raise d.fail(f"operand decoration {{{dec}}} (embedded rounding/SAE) is not supported")
    if d.mn == "call" or d.mn.startswith("j"):
        if (t := re.fullmatch(r"([0-9a-f]+)(?: <.*>)?", tok)) is not None:
            return Target(sec_addr + int(t.group(1), 16))
    if tok in _GPRS:
        return Gpr(*_GPRS[tok], tok)
    if (v := _VEC.match(tok)) is not None:
        return VecReg(int(v.group(2)), {"x": 16, "y": 32, "z": 64}[v.group(1)])
    if re.fullmatch(r"k[0-7]", tok):
        return KReg(int(tok[1]))
    if re.fullmatch(r"-?0x[0-9a-f]+|-?\d+", tok):
        return Imm(int(tok, 0))
    if (mm := _MEM.match(tok)) is not None:
        kw, kind, inner = mm.groups()
        if kw is not None and kw not in _SIZES:
            raise d.fail(f"memory operand size {kw!r} is not supported")
        size = _SIZES[kw] if kw else None
        bcast = bcast or kind == "BCST"
        base = index = vindex = None
        scale, disp, rip = 1, 0, None
        for sign, term in re.findall(r"([+-]?)([^+-]+)", inner.replace(" ", "")):
            if term == "rip":
                rip = True
            elif "*" in term:
                reg, sc = term.split("*")
                scale = int(sc)
                if (vi := _VEC.match(reg)) is not None:
                    vindex = int(vi.group(2))
                else:
                    index = _gpr64(reg, d)
            elif term in _GPRS:
                base = _gpr64(term, d)
            elif re.fullmatch(r"0x[0-9a-f]+|\d+", term):
                disp += -int(term, 0) if sign == "-" else int(term, 0)
            else:
                raise d.fail(f"unexpected address term {term!r}")
        if rip:
            # RIP-relative: next_ip + disp32; a relocated field's value replaces objdump's (unrelocated) disp
            return Mem(None, None, 1, 0, size, (d.next_addr + (rip_value if rip_value is not None else disp)) & M64,
                       bcast)  # fmt: skip
        return Mem(base, index, scale, disp, size, None, bcast, vindex)
    raise d.fail(f"operand {tok!r} is not understood")


def _gpr64(name: str, d: Decoded) -> int:
    num, size = _GPRS.get(name, (-1, 0))
    if size != 8:
        raise d.fail(f"address register {name!r}: only 64-bit addressing is supported")
    return num


def _form(d: Decoded) -> str:
    """A compact operand signature, e.g. `vaddps zmm{k}{z},zmm,m32bcst` (for tests asserting which forms ran)."""
    parts = []
    for i, o in enumerate(d.ops):
        if isinstance(o, Gpr):
            s = f"r{o.size * 8}"
        elif isinstance(o, VecReg):
            s = {16: "xmm", 32: "ymm", 64: "zmm"}[o.size]
        elif isinstance(o, Mem):
            s = f"m{(o.size or 0) * 8}" + ("bcst" if o.bcast else "")
        elif isinstance(o, KReg):
            s = "k"
        else:
            s = "imm" if isinstance(o, Imm) else "rel"
        if i == 0:
            s += ("{k}" if d.mask else "") + ("{z}" if d.zero else "")
        parts.append(s)
    return f"{d.mn} {','.join(parts)}".strip()


def _objdump(obj: bytes) -> str:
    if shutil.which("objdump") is None:
        raise EmulationError("objdump not found on PATH: the emulator decodes with GNU binutils' objdump")
    with tempfile.TemporaryDirectory(prefix="speck-x86emu-") as tmp:
        path = Path(tmp) / "k.o"
        path.write_bytes(obj)
        proc = subprocess.run(["objdump", "-d", "-r", "-M", "intel", "--no-show-raw-insn", str(path)],
                              capture_output=True, text=True)  # fmt: skip
    if proc.returncode != 0:
        raise EmulationError(f"objdump -d -r -M intel failed: {proc.stderr.strip()}")
    return proc.stdout


def decode_object(obj: bytes) -> Program:
    """Load and decode every executable section of `obj` (cached per object)."""
    key = hashlib.sha256(obj).digest()
    if key in _CACHE:
        return _CACHE[key]
    sections, defined, externals, fields = _load(obj)
    by_name = {s.name: (i, s) for i, s in enumerate(sections)}
    extern_by_name = {n: a for a, n in externals.items()}
    rows: list[tuple[int, int, str]] = []  # (section index, offset, text)
    reloc_syms: dict[tuple[int, int], str] = {}
    sec = -1
    for line in _objdump(obj).splitlines():
        if (hdr := _SECTION.match(line)) is not None:
            if hdr.group(1) not in by_name:
                raise EmulationError(f"objdump disassembled section {hdr.group(1)!r} that the ELF reader did not find")
            sec = by_name[hdr.group(1)][0]
        elif (r := _RELOC_LINE.match(line)) is not None:
            reloc_syms[(sec, int(r.group(1), 16))] = re.split(r"[+-]0x", r.group(3).strip())[0]
        elif (ln := _LINE.match(line)) is not None:
            text = re.split(r"\s+#", ln.group(2))[0].strip()
            rows.append((sec, int(ln.group(1), 16), re.sub(r"\s+", " ", text)))
    reloc_at = {si: sorted(f) for si, f in fields.items()}  # relocated field offsets per section
    insts: list[Decoded] = []
    for j, (si, off, text) in enumerate(rows):
        section = sections[si]
        nxt = rows[j + 1][1] if j + 1 < len(rows) and rows[j + 1][0] == si else len(section.data)
        d = Decoded(section.addr + off, section.addr + nxt, text, "", [])
        words = text.split(None, 1)
        while words and words[0] in _IGNORED_PREFIXES and len(words) > 1:
            words = words[1].split(None, 1)
        d.mn = words[0] if words else ""
        at = bisect_left(reloc_at[si], off)
        in_inst = reloc_at[si][at : bisect_left(reloc_at[si], nxt, at)]
        rip_value = fields[si][in_inst[0]] if in_inst else None
        try:
            if d.mn in ("call", "jmp") and in_inst:  # a relocated direct call: its target is the symbol's
                sym = reloc_syms.get((si, in_inst[0]), "")
                addr = (d.next_addr + rip_value) & M64  # type: ignore[operator]
                d.ops = [Target(addr, externals.get(addr) or (sym if sym in extern_by_name else None))]
            elif d.mn.startswith("nop") or d.mn == "xchg" and words[1:] == ["ax,ax"]:
                d.mn, d.ops = "nop", []
            else:
                d.ops = (
                    [_parse_operand(t, d, rip_value, section.addr) for t in _split_operands(words[1])]
                    if words[1:]
                    else []
                )
                if in_inst and not any(isinstance(o, Mem) and o.rip is not None for o in d.ops):
                    raise d.fail("a relocation outside a RIP-relative operand (absolute address) is not supported")
            builder = RULES.get(d.mn)
            if builder is None:
                raise d.fail(f"mnemonic {d.mn!r} has no semantics in the emulator")
            d.form = _form(d)
            d.run = builder(d)
        except Exception as e:
            if not isinstance(e, EmulationError):  # an emulator bug: still name the instruction
                e = d.fail(f"decoding failed ({type(e).__name__}: {e})")
            d.run = _raiser(e)  # decoding problems surface when (and only if) the instruction runs
            d.form = d.form or d.mn
        insts.append(d)
    index = {d.addr: i for i, d in enumerate(insts)}
    falls = [i + 1 if i + 1 < len(insts) and insts[i + 1].addr == d.next_addr else -1 for i, d in enumerate(insts)]
    images = [(s.addr, s.data, s.name, bool(s.flags & SHF_WRITE)) for s in sections if s.flags & SHF_ALLOC]
    prog = Program(images, insts, index, falls, defined, externals)
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[key] = prog
    return prog


def _raiser(e: EmulationError) -> Run:
    def run(m: Machine) -> None:
        raise e

    return run


_CACHE: dict[bytes, Program] = {}


# ---------------------------------------------------------------------------------------------------------------------
# running


@dataclass
class EmuStats:
    """What one `emulate` call executed: instruction count, and per mnemonic / per operand form counts."""

    instructions: int = 0
    mnemonics: Counter[str] = field(default_factory=Counter)
    forms: Counter[str] = field(default_factory=Counter)


ARG_REGS = (7, 6, 2, 1, 8, 9)  # rdi, rsi, rdx, rcx, r8, r9


def emulate(lib: bytes, name: str, args: Sequence[np.ndarray | int], max_jumps: int = 10_000_000,
            poison_upper: bool = True) -> EmuStats:  # fmt: skip
    """Run function `name` of ELF object `lib` on `args` (numpy arrays become pointers to mapped copies, written
    back in place afterwards; ints are int32 arguments). Raises EmulationError for anything it cannot run."""
    prog = decode_object(lib)
    if name not in prog.symbols:
        raise EmulationError(f"function {name!r} is not defined in the object (defined: {sorted(prog.symbols)})")
    mem = Memory()
    for addr, data, sname, writable in prog.images:
        mem.map(addr, data, sname, writable)
    mem.map(STACK_TOP - STACK_SIZE, bytes(STACK_SIZE), "stack")
    values: list[int] = []
    buffers: list[tuple[np.ndarray, int]] = []
    mapped: dict[tuple[int, int], int] = {}  # (host address, bytes) -> fake address: one array passed twice aliases
    at = BUFFER_BASE
    for i, a in enumerate(args):
        if isinstance(a, np.ndarray):
            if not a.flags.c_contiguous:
                raise ValueError(f"emulate: argument {i} must be a C-contiguous array (got strides {a.strides})")
            host = (a.__array_interface__["data"][0], a.nbytes)
            if host in mapped:
                values.append(mapped[host])
                continue
            for (h, n), _ in mapped.items():
                if a.nbytes and n and h < host[0] + a.nbytes and host[0] < h + n:
                    raise ValueError(f"emulate: argument {i} partly overlaps an earlier array argument; pass the "
                                     "same array or disjoint ones")  # fmt: skip
            mem.map(at, a.view(np.uint8).reshape(-1).tobytes() if a.size else b"", f"arg{i}")
            buffers.append((a, at))
            values.append(at)
            mapped[host] = at
            at += a.nbytes + 0x10000  # unmapped gaps between buffers: overruns fault
            at += -at % 4096
        elif isinstance(a, (int, np.integer)):
            v = int(a)
            if not -(2**31) <= v < 2**32:
                raise ValueError(f"emulate: argument {i} = {v} does not fit the int32 ABI slot")
            values.append((v & 0xFFFF_FFFF) | (JUNK_UPPER if poison_upper else (M64 ^ 0xFFFF_FFFF) * (v < 0)))
        else:
            raise TypeError(f"emulate: argument {i} must be a numpy array or an int, got {type(a).__name__}")
    m = Machine(mem)
    for r in range(16):
        m.gpr[r] = 0xBAD0_0000_0000_0000 | r << 32  # callee sees no meaningful values in unused registers
    sp = STACK_TOP - 4096
    stack_args = values[len(ARG_REGS) :]
    sp -= 8 * len(stack_args) + (8 * len(stack_args)) % 16
    for k, v in enumerate(stack_args):
        mem.write_int(sp + 8 * k, 8, v)
    sp -= 8
    mem.write_int(sp, 8, RETURN_SENTINEL)  # at entry rsp % 16 == 8, as after a call
    m.gpr[4] = sp
    for r, v in zip(ARG_REGS, values):
        m.gpr[r] = v
    counts = _run(prog, m, prog.symbols[name], max_jumps)
    for a, addr in buffers:
        if a.size:
            after = mem.read(addr, a.nbytes)
            if a.flags.writeable:
                a.view(np.uint8).reshape(-1)[:] = after
            elif not np.array_equal(after, a.view(np.uint8).reshape(-1)):
                raise EmulationError(f"the kernel wrote to a read-only array argument (mapped at {addr:#x})")
    stats = EmuStats()
    for i, c in enumerate(counts):
        if c:
            stats.instructions += c
            stats.mnemonics[prog.insts[i].mn] += c
            stats.forms[prog.insts[i].form] += c
    return stats


def _run(prog: Program, m: Machine, entry: int, max_jumps: int) -> list[int]:
    insts, index, falls = prog.insts, prog.index, prog.falls
    counts = [0] * len(insts)
    pc = index.get(entry)
    if pc is None:
        raise EmulationError(f"entry {entry:#x} is not an instruction boundary")
    jumps = 0  # an endless loop must keep jumping: counting taken transfers bounds the run
    d = insts[pc]
    try:
        with np.errstate(all="ignore"):  # IEEE results without numpy's warnings (x86 masks FP exceptions too)
            while True:
                d = insts[pc]
                counts[pc] += 1
                nxt = d.run(m)  # type: ignore[misc]
                if nxt is None:
                    pc = falls[pc]
                    if pc < 0:
                        raise EmulationError("execution ran off the end of its section")
                    continue
                if nxt == RETURN_SENTINEL:
                    break
                target = index.get(nxt)
                if target is None:
                    if nxt in prog.externals:
                        raise EmulationError(f"control transfer to external symbol {prog.externals[nxt]!r}")
                    raise EmulationError(f"control transfer to {nxt:#x}, which is not an instruction of the object")
                pc = target
                jumps += 1
                if jumps > max_jumps:
                    raise EmulationError(f"more than {max_jumps} jumps taken (an endless loop?)")
    except EmulationError as e:
        raise EmulationError(f"{e}\n  at {d.addr - CODE_BASE:#x} (address {d.addr:#x}): `{d.text}`") from None
    except Exception as e:
        raise EmulationError(f"internal error {type(e).__name__}: {e}\n  at {d.addr:#x}: `{d.text}`") from e
    return counts
