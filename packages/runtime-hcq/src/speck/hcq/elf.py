"""ELF loader/linker for relocatable x86-64 objects (ET_REL) from LLVM (llvmlite), gcc/clang `-c` and speck's own
x86 backend.

`load_elf(obj, libraries)` parses sections, symbols and RELA relocations, lays the allocatable sections out in one
private mapping (code first, then the constant pages with the GOT, then the writable pages), resolves undefined
symbols against the given `Library` objects, applies the relocations and seals the pages: code R-X, constants
R--, data RW- (never W+X). Calls and PC-relative references to external functions, which live further than
+-2 GiB away, go through 16-byte veneers (`jmp *[rip]; .quad target`) placed right after the code.

Supported relocations: R_X86_64_64, PC32, PLT32, 32, 32S, PC64, GOTPCREL, GOTPCRELX, REX_GOTPCRELX, GOTPC32.
Objects with absolute 32-bit relocations (32, 32S: non-PIC code) are mapped below 2 GiB so the addresses fit.
AArch64 objects are rejected with a clear message (not implemented: speck's CPU targets are x86-64)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from speck.hcq.errors import ElfLinkError
from speck.hcq.libs import Library
from speck.hcq.memory import PAGE, PROT_EXEC, PROT_READ, PROT_WRITE, CodeMemory, round_up

EM_X86_64, EM_AARCH64 = 62, 183
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 1, 2, 3, 4, 8, 9
SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY, SHT_X86_64_UNWIND = 14, 15, 16, 0x70000001
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR, SHF_TLS = 0x1, 0x2, 0x4, 0x400
SHN_UNDEF, SHN_ABS, SHN_COMMON = 0, 0xFFF1, 0xFFF2
STB_LOCAL, STB_GLOBAL, STB_WEAK = 0, 1, 2
STT_SECTION = 3

R_X86_64 = {
    0: "NONE", 1: "64", 2: "PC32", 4: "PLT32", 9: "GOTPCREL", 10: "32", 11: "32S", 24: "PC64",
    26: "GOTPC32", 41: "GOTPCRELX", 42: "REX_GOTPCRELX",
}  # fmt: skip
_GOT_KINDS = {"GOTPCREL", "GOTPCRELX", "REX_GOTPCRELX"}
# veneer: jmp qword ptr [rip+0] followed by the 8-byte absolute target, padded to 16 bytes
_STUB = bytes([0xFF, 0x25, 0, 0, 0, 0])
STUB_SIZE = 16


@dataclass
class Section:
    index: int
    name: str
    type: int
    flags: int
    offset: int
    size: int
    link: int
    info: int
    align: int
    entsize: int


@dataclass
class Symbol:
    name: str
    bind: int
    type: int
    shndx: int
    value: int
    size: int


@dataclass
class Relocation:
    offset: int
    sym: int
    kind: str
    addend: int


@dataclass
class ElfObject:
    """A parsed relocatable object: its sections, symbol table and, per target section index, its relocations."""

    data: bytes
    sections: list[Section]
    symbols: list[Symbol]
    relocations: dict[int, list[Relocation]] = field(default_factory=dict)

    def section_bytes(self, s: Section) -> bytes:
        return b"" if s.type == SHT_NOBITS else self.data[s.offset : s.offset + s.size]


def _cstr(blob: bytes, off: int) -> str:
    end = blob.index(b"\0", off)
    return blob[off:end].decode(errors="replace")


def parse_elf(data: bytes) -> ElfObject:
    """Parse a little-endian ELF64 relocatable x86-64 object; raises ElfLinkError for anything else, saying what
    was found."""
    data = bytes(data)
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise ElfLinkError(f"not an ELF object: expected magic b'\\x7fELF', got {data[:4]!r} ({len(data)} bytes)")
    if data[4] != 2 or data[5] != 1:
        raise ElfLinkError(f"only little-endian ELF64 objects are supported (EI_CLASS={data[4]}, EI_DATA={data[5]})")
    (_, e_type, e_machine, _, _, _, e_shoff, _, _, _, _, e_shentsize, e_shnum, e_shstrndx) = struct.unpack_from(
        "<16sHHIQQQIHHHHHH", data, 0
    )
    if e_type != 1:
        raise ElfLinkError(f"expected a relocatable object (ET_REL=1), got e_type={e_type}; compile with -c")
    if e_machine == EM_AARCH64:
        raise ElfLinkError("AArch64 objects are not supported by speck's ELF loader (x86-64 only)")
    if e_machine != EM_X86_64:
        raise ElfLinkError(f"expected an x86-64 object (e_machine={EM_X86_64}), got e_machine={e_machine}")
    raw = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    shstr = raw[e_shstrndx]
    names = data[shstr[4] : shstr[4] + shstr[5]]
    sections = [
        Section(i, _cstr(names, r[0]), r[1], r[2], r[4], r[5], r[6], r[7], max(r[8], 1), r[9])
        for i, r in enumerate(raw)
    ]
    symbols: list[Symbol] = []
    obj = ElfObject(data, sections, symbols)
    for s in sections:
        if s.type == SHT_SYMTAB:
            strtab = obj.section_bytes(sections[s.link])
            for off in range(s.offset, s.offset + s.size, 24):
                st_name, st_info, _, st_shndx, st_value, st_size = struct.unpack_from("<IBBHQQ", data, off)
                symbols.append(Symbol(_cstr(strtab, st_name), st_info >> 4, st_info & 0xF, st_shndx, st_value, st_size))
    for s in sections:
        if s.type == SHT_REL:
            raise ElfLinkError(f"section {s.name}: REL relocations (without addends) are not used on x86-64")
        if s.type != SHT_RELA:
            continue
        relocs = obj.relocations.setdefault(s.info, [])
        for off in range(s.offset, s.offset + s.size, 24):
            r_offset, r_info, r_addend = struct.unpack_from("<QQq", data, off)
            kind = R_X86_64.get(r_info & 0xFFFFFFFF)
            if kind is None:
                raise ElfLinkError(
                    f"unsupported relocation type {r_info & 0xFFFFFFFF} in {s.name} at offset {r_offset:#x}; "
                    f"supported: {', '.join('R_X86_64_' + k for k in R_X86_64.values())}"
                )
            relocs.append(Relocation(r_offset, r_info >> 32, kind, r_addend))
    return obj


def _is_loaded(s: Section) -> bool:
    # unwind tables are allocatable but only matter to a C++ unwinder; kernels never throw
    return bool(s.flags & SHF_ALLOC) and s.type != SHT_X86_64_UNWIND and s.name != ".eh_frame" and s.size > 0


class LoadedObject:
    """An object linked into executable memory. `symbols` maps each defined global/weak symbol to its address;
    `ranges` lists the (address, size, protection) of the sealed page ranges. Keep it alive while its code runs."""

    def __init__(self, mem: CodeMemory, symbols: dict[str, int], ranges: list[tuple[int, int, int]]) -> None:
        self.mem, self.symbols, self.ranges = mem, symbols, ranges

    def address(self, name: str) -> int:
        """The absolute address of the defined symbol `name`; KeyError listing the defined symbols otherwise."""
        try:
            return self.symbols[name]
        except KeyError:
            raise KeyError(f"symbol {name!r} is not defined by the object; it defines {sorted(self.symbols)}") from None


def _resolve_external(name: str, libraries: list[Library]) -> int | None:
    for lib in libraries:
        if (addr := lib.lookup(name)) is not None:
            return addr
    return None


def load_elf(obj_bytes: bytes, libraries: list[Library] | None = None) -> LoadedObject:
    """Link a relocatable x86-64 object into fresh executable memory and return it. Undefined (non-weak) symbols
    are looked up in `libraries` in order; one that none defines raises ElfLinkError (a RuntimeError) naming it."""
    libraries = libraries or []
    obj = parse_elf(obj_bytes)
    for s in obj.sections:
        if s.flags & SHF_TLS and s.size:
            raise ElfLinkError(f"section {s.name}: thread-local storage is not supported in kernels")
        if s.type in (SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY) and s.size:
            raise ElfLinkError(f"section {s.name}: static constructors/destructors are not supported in kernels")
    loaded = [s for s in obj.sections if _is_loaded(s)]
    code = [s for s in loaded if s.flags & SHF_EXECINSTR]

    # .data.rel.ro* is only written by relocations, which are applied before sealing: it can be read-only (RELRO)
    def relro(s: Section) -> bool:
        return s.name.startswith(".data.rel.ro")

    consts = [s for s in loaded if not s.flags & SHF_EXECINSTR and (not s.flags & SHF_WRITE or relro(s))]
    data = [s for s in loaded if s.flags & SHF_WRITE and not s.flags & SHF_EXECINSTR and not relro(s)]

    # external symbols: resolve every referenced undefined symbol now, so a missing one fails at load time, by name
    loaded_idx = {s.index for s in loaded}
    referenced = {r.sym for t, rs in obj.relocations.items() if t in loaded_idx for r in rs}
    external: dict[int, int] = {}
    got_symbol = -1
    for i, sym in enumerate(obj.symbols):
        if i == 0 or sym.shndx != SHN_UNDEF or not sym.name:
            continue
        if sym.name == "_GLOBAL_OFFSET_TABLE_":  # the assembler's name for our GOT (ours is placed below)
            got_symbol = i
            continue
        if i not in referenced:
            continue
        addr = _resolve_external(sym.name, libraries)
        if addr is None:
            if sym.bind == STB_WEAK:
                addr = 0
            else:
                searched = ", ".join(lib.path for lib in libraries) or "no libraries"
                raise ElfLinkError(f"undefined symbol {sym.name!r}: not defined by the object nor by {searched}")
        external[i] = addr

    # which symbols need a veneer (external, reached by a 32-bit PC-relative call) or a GOT slot
    stub_syms: list[int] = []
    got_syms: list[int] = []
    needs_low = False
    for target, relocs in obj.relocations.items():
        if target not in loaded_idx:
            continue
        for r in relocs:
            if r.kind in ("PC32", "PLT32") and r.sym in external and r.sym not in stub_syms:
                stub_syms.append(r.sym)
            elif r.kind in _GOT_KINDS and r.sym not in got_syms:
                got_syms.append(r.sym)
            elif r.kind in ("32", "32S"):
                needs_low = True

    # layout: [code | veneers] [constants | GOT] [data | bss | common], each group starting on a fresh page
    offsets: dict[int, int] = {}
    pos = 0
    for s in code:
        pos = round_up(pos, s.align)
        offsets[s.index], pos = pos, pos + s.size
    stub_off = round_up(pos, 16)
    code_end = stub_off + STUB_SIZE * len(stub_syms)
    pos = round_up(code_end, PAGE)
    const_start = pos
    for s in consts:
        pos = round_up(pos, s.align)
        offsets[s.index], pos = pos, pos + s.size
    got_off = round_up(pos, 8)
    pos = got_off + 8 * len(got_syms)
    data_start = round_up(pos, PAGE)
    pos = data_start
    for s in data:
        pos = round_up(pos, s.align)
        offsets[s.index], pos = pos, pos + s.size
    common: dict[int, int] = {}
    for i, sym in enumerate(obj.symbols):
        if sym.shndx == SHN_COMMON:
            pos = round_up(pos, max(sym.value, 1))
            common[i], pos = pos, pos + sym.size
    total = round_up(max(pos, 1), PAGE)

    mem = CodeMemory(total, low=needs_low)
    base = mem.addr
    image = bytearray(total)
    for s in loaded:
        image[offsets[s.index] : offsets[s.index] + s.size] = obj.section_bytes(s) or bytes(s.size)

    def sym_addr(i: int) -> int:
        sym = obj.symbols[i]
        if i == got_symbol:
            return base + got_off
        if i in external:
            return external[i]
        if i in common:
            return base + common[i]
        if sym.shndx == SHN_ABS:
            return sym.value
        if sym.shndx not in offsets:
            where = obj.sections[sym.shndx].name if sym.shndx < len(obj.sections) else f"#{sym.shndx}"
            raise ElfLinkError(f"symbol {sym.name or '(section)'!r} lives in section {where}, which is not loaded")
        return base + offsets[sym.shndx] + sym.value

    stub_addr: dict[int, int] = {}
    for k, i in enumerate(stub_syms):
        off = stub_off + STUB_SIZE * k
        image[off : off + 14] = _STUB + struct.pack("<Q", sym_addr(i))
        stub_addr[i] = base + off
    got_addr: dict[int, int] = {}
    for k, i in enumerate(got_syms):
        struct.pack_into("<Q", image, got_off + 8 * k, sym_addr(i))
        got_addr[i] = base + got_off + 8 * k

    for target, relocs in obj.relocations.items():
        if target not in loaded_idx:
            continue
        sec = obj.sections[target]
        for r in relocs:
            if r.kind == "NONE":
                continue
            where = offsets[target] + r.offset
            P = base + where
            name = obj.symbols[r.sym].name or obj.sections[obj.symbols[r.sym].shndx].name
            if r.kind in ("PC32", "PLT32"):
                S = stub_addr.get(r.sym) or sym_addr(r.sym)
                _put(image, where, S + r.addend - P, signed=True, bits=32, what=(r.kind, name, sec.name, r.offset))
            elif r.kind in _GOT_KINDS:
                _put(image, where, got_addr[r.sym] + r.addend - P, True, 32, (r.kind, name, sec.name, r.offset))
            elif r.kind == "64":
                struct.pack_into("<Q", image, where, (sym_addr(r.sym) + r.addend) & (2**64 - 1))
            elif r.kind == "GOTPC32":
                _put(image, where, base + got_off + r.addend - P, True, 32, (r.kind, name, sec.name, r.offset))
            elif r.kind == "PC64":
                struct.pack_into("<q", image, where, sym_addr(r.sym) + r.addend - P)
            elif r.kind == "32":
                _put(image, where, sym_addr(r.sym) + r.addend, False, 32, (r.kind, name, sec.name, r.offset))
            elif r.kind == "32S":
                _put(image, where, sym_addr(r.sym) + r.addend, True, 32, (r.kind, name, sec.name, r.offset))
            else:  # pragma: no cover - parse_elf only admits the kinds above
                raise ElfLinkError(f"relocation R_X86_64_{r.kind} not handled")

    mem.write(0, bytes(image))
    ranges = [(0, code_end, PROT_READ | PROT_EXEC), (const_start, data_start - const_start, PROT_READ)]
    ranges.append((data_start, total - data_start, PROT_READ | PROT_WRITE))
    ranges = [r for r in ranges if r[1] > 0]
    mem.seal(ranges)
    symbols = {
        sym.name: sym_addr(i)
        for i, sym in enumerate(obj.symbols)
        if sym.name and sym.bind in (STB_GLOBAL, STB_WEAK) and sym.shndx != SHN_UNDEF and i not in external
    }
    return LoadedObject(mem, symbols, [(base + o, round_up(n, PAGE), p) for o, n, p in ranges])


def _put(image: bytearray, where: int, value: int, signed: bool, bits: int, what: tuple[str, str, str, int]) -> None:
    lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
    if not lo <= value <= hi:
        kind, name, sec, off = what
        raise ElfLinkError(
            f"relocation R_X86_64_{kind} against {name!r} in {sec}+{off:#x} does not fit: value {value:#x} is "
            f"outside [{lo:#x}, {hi:#x}]"
        )
    struct.pack_into("<i" if signed else "<I", image, where, value)
