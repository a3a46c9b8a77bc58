"""ELF loader/linker for relocatable x86-64 objects (ET_REL) from LLVM (llvmlite), gcc/clang `-c` and speck's own
x86 backend.

`load_elf(obj, libraries)` parses sections, symbols and RELA relocations, lays the allocatable sections out in one
private mapping (code first, then the constant pages with the GOT, then the writable pages), resolves undefined
symbols against the given `Library` objects, applies the relocations and seals the pages: code R-X, constants
R--, data RW- (never W+X). Calls and PC-relative references to external functions, which live further than
+-2 GiB away, go through 16-byte veneers (`jmp *[rip]; .quad target`) placed right after the code.

Supported relocations: R_X86_64_64, PC32, PLT32, 32, 32S, PC64, GOTPCREL, GOTPCRELX, REX_GOTPCRELX, GOTPC32.
Objects with absolute 32-bit relocations (32, 32S: non-PIC code) are mapped below 2 GiB so the addresses fit.
AArch64 objects are rejected with a clear message (not implemented: speck's CPU targets are x86-64).

Objects may come from a cache on disk, so nothing read is trusted: every header, table, entry, name, index, offset
and size is checked before use, and malformed input of any kind raises ElfLinkError naming the object (the kernel
or cache key given as `name`), the place (section, entry, file offset) and what was expected - never a raw
struct.error/IndexError. The loader can't tell a well-formed object that means another program (a changed addend,
a moved symbol) from the intended one: that is what the cache's checksum is for."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import NoReturn

from speck.hcq.errors import ElfLinkError, ElfSymbolError
from speck.hcq.libs import Library
from speck.hcq.memory import PAGE, PROT_EXEC, PROT_READ, PROT_WRITE, CodeMemory
from speck.uop.helpers import round_up

EM_X86_64, EM_AARCH64, EM_AMDGPU = 62, 183, 224
ET_REL, ET_DYN = 1, 3
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_NOBITS, SHT_REL = 1, 2, 3, 4, 8, 9
SHT_NOTE, SHT_DYNSYM = 7, 11
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
    addr: int = 0  # sh_addr: 0 in relocatable objects, the load address in shared objects


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


_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")
SHN_LORESERVE, SHN_XINDEX = 0xFF00, 0xFFFF
# the bytes a relocation of each kind patches (NONE patches nothing; the 64-bit kinds 8; every other kind 4)
_WIDTH = {"NONE": 0, "64": 8, "PC64": 8}
# A loaded image (code, constants, data, bss, common symbols) larger than this is refused: no kernel object comes near
# it, and a damaged size field must fail cleanly instead of mapping gigabytes.
MAX_IMAGE = 64 << 20


def _label(name: str) -> str:
    return f"ELF object {name!r}" if name else "ELF object"


@dataclass
class ElfObject:
    """A parsed relocatable object: its sections, symbol table and, per target section index, its relocations.
    `label` names it in errors ("ELF object 'E_4'"); `error` is the exception class `fail` raises (ElfLinkError or
    a subclass, e.g. speck.hcq.hsaco's CodeObjectError)."""

    data: bytes
    sections: list[Section]
    symbols: list[Symbol]
    relocations: dict[int, list[Relocation]] = field(default_factory=dict)
    label: str = "ELF object"
    error: type[ElfLinkError] = ElfLinkError

    def section_bytes(self, s: Section) -> bytes:
        return b"" if s.type == SHT_NOBITS else self.data[s.offset : s.offset + s.size]

    def fail(self, message: str) -> NoReturn:
        """Raise ElfLinkError (or this object's `error` class) naming this object."""
        raise self.error(f"{self.label}: {message}")

    def symbol_name(self, i: int) -> str:
        """A readable name for symbol `i`: its own name, else the section it stands for, else its index."""
        sym = self.symbols[i]
        if sym.name:
            return sym.name
        if 0 < sym.shndx < len(self.sections) and self.sections[sym.shndx].name:
            return self.sections[sym.shndx].name
        return f"symbol #{i}"


def _cstr(obj: ElfObject, table: bytes, off: int, table_name: str, what: str) -> str:
    end = table.find(b"\0", off) if off < len(table) else -1
    if end < 0:
        obj.fail(f"{what}: its name at offset {off:#x} of {table_name} ({len(table)} bytes) is outside the table or "
                 "not NUL-terminated")  # fmt: skip
    return table[off:end].decode(errors="replace")


@dataclass(frozen=True)
class ElfKind:
    """What `parse_elf` accepts: the machine and file type (named in errors, with advice), which symbol table to read
    (SHT_SYMTAB, or SHT_DYNSYM in a shared object) and the machine's relocation kinds by number (named `prefix` +
    kind in messages)."""

    machine: int = EM_X86_64
    machine_name: str = "x86-64"
    file_type: int = ET_REL
    file_type_name: str = "a relocatable object (ET_REL=1)"
    file_type_advice: str = "; compile with -c"
    symtab_type: int = SHT_SYMTAB
    relocations: dict[int, str] = field(default_factory=lambda: R_X86_64)
    prefix: str = "R_X86_64_"


X86_64_OBJECT = ElfKind()


def parse_elf(data: bytes, name: str = "", kind: ElfKind = X86_64_OBJECT,
              error: type[ElfLinkError] = ElfLinkError) -> ElfObject:  # fmt: skip
    """Parse a little-endian ELF64 object of `kind` (default: a relocatable x86-64 object). Everything read is
    bounds-checked: anything else than such an object, and any header, table or entry that is truncated, points
    outside the file or holds a value the loader can't honour, raises ElfLinkError (or `error`, a subclass) naming
    the object (`name`: the kernel or cache key), the place (section, entry, offset) and what was expected."""
    data = bytes(data)
    obj = ElfObject(data, [], [], label=_label(name), error=error)
    n = len(data)
    if data[:4] != b"\x7fELF":
        obj.fail(f"not an ELF object: expected magic b'\\x7fELF', got {data[:4]!r} ({n} bytes)")
    if n < _EHDR.size:
        obj.fail(f"truncated ELF header: expected {_EHDR.size} bytes, the file has {n}")
    if data[4] != 2 or data[5] != 1:
        obj.fail(f"only little-endian ELF64 objects are supported: EI_CLASS (offset 0x4) is {data[4]}, expected 2; "
                 f"EI_DATA (offset 0x5) is {data[5]}, expected 1")  # fmt: skip
    (_, e_type, e_machine, e_version, _, _, e_shoff, _, _, _, _, e_shentsize, e_shnum, e_shstrndx) = _EHDR.unpack_from(
        data, 0
    )
    if data[6] != 1 or e_version != 1:
        obj.fail(f"expected ELF version 1, got EI_VERSION={data[6]} (offset 0x6), e_version={e_version} (offset 0x14)")
    if e_type != kind.file_type:
        obj.fail(f"expected {kind.file_type_name}, got e_type={e_type} (offset 0x10){kind.file_type_advice}")
    if e_machine == EM_AARCH64 and kind.machine != EM_AARCH64:
        obj.fail(f"AArch64 objects are not supported by speck's ELF loader ({kind.machine_name} only)")
    if e_machine != kind.machine:
        obj.fail(
            f"expected an {kind.machine_name} object (e_machine={kind.machine}), got e_machine={e_machine} "
            "(offset 0x12)"
        )
    if e_shentsize != _SHDR.size:
        obj.fail(f"e_shentsize (offset 0x3a) is {e_shentsize}, expected {_SHDR.size} (ELF64 section headers)")
    if e_shnum == 0:
        obj.fail("e_shnum (offset 0x3c) is 0: no section headers (extended section numbering is not supported)")
    sht_end = e_shoff + e_shnum * _SHDR.size
    if e_shoff < _EHDR.size or sht_end > n:
        obj.fail(f"the section header table ({e_shnum} entries at e_shoff={e_shoff:#x}, ending at {sht_end:#x}) "
                 f"must lie between the ELF header and the end of the file ({n:#x} bytes); is the file "
                 "truncated?")  # fmt: skip
    if e_shstrndx >= e_shnum:
        obj.fail(f"e_shstrndx (offset 0x3e) is {e_shstrndx}, but there are only {e_shnum} sections")
    raw = [_SHDR.unpack_from(data, e_shoff + i * _SHDR.size) for i in range(e_shnum)]
    for i, r in enumerate(raw):
        if r[1] != SHT_NOBITS and r[4] + r[5] > n:
            obj.fail(f"section #{i} (header at {e_shoff + i * _SHDR.size:#x}) spans file bytes [{r[4]:#x}, "
                     f"{r[4] + r[5]:#x}), past the end of the file ({n:#x}); is the file truncated?")  # fmt: skip
    if raw[e_shstrndx][1] != SHT_STRTAB:
        obj.fail(f"the section name table (section #{e_shstrndx}) has type {raw[e_shstrndx][1]}, expected "
                 f"SHT_STRTAB ({SHT_STRTAB})")  # fmt: skip
    names = data[raw[e_shstrndx][4] : raw[e_shstrndx][4] + raw[e_shstrndx][5]]
    sections = obj.sections
    for i, r in enumerate(raw):
        nm = _cstr(obj, names, r[0], ".shstrtab", f"section #{i}")
        sections.append(Section(i, nm, r[1], r[2], r[4], r[5], r[6], r[7], max(r[8], 1), r[9], r[3]))

    symtabs = [s for s in sections if s.type == kind.symtab_type]
    if len(symtabs) > 1:
        obj.fail(f"{len(symtabs)} symbol tables ({', '.join(s.name for s in symtabs)}); an object has one")
    for st in symtabs:
        if st.entsize != _SYM.size or st.size % _SYM.size:
            obj.fail(f"section {st.name}: entries of {st.entsize} bytes in {st.size} bytes; expected {_SYM.size}-byte "
                     "entries filling the section")  # fmt: skip
        if not 0 < st.link < len(sections) or sections[st.link].type != SHT_STRTAB:
            obj.fail(f"section {st.name}: sh_link is {st.link}, expected the index of its string table (a "
                     f"SHT_STRTAB section, 1..{len(sections) - 1})")  # fmt: skip
        strsec = sections[st.link]
        strtab = obj.section_bytes(strsec)
        for k, off in enumerate(range(st.offset, st.offset + st.size, _SYM.size)):
            st_name, st_info, _, st_shndx, st_value, st_size = _SYM.unpack_from(data, off)
            nm = _cstr(obj, strtab, st_name, strsec.name, f"symbol #{k} of {st.name}")
            where = f"symbol #{k} {nm!r} of {st.name} (offset {off:#x})"
            if st_shndx >= SHN_LORESERVE and st_shndx not in (SHN_ABS, SHN_COMMON):
                obj.fail(f"{where}: section index {st_shndx:#x} is reserved (extended indexes are not supported)")
            if st_shndx < SHN_LORESERVE and st_shndx >= len(sections):
                obj.fail(f"{where}: section index {st_shndx} is past the {len(sections)} sections")
            if 0 < st_shndx < len(sections) and not 0 <= st_value - sections[st_shndx].addr <= \
                    sections[st_shndx].size - st_size:  # fmt: skip
                sec = sections[st_shndx]
                obj.fail(f"{where}: it spans [{st_value:#x}, {st_value + st_size:#x}) of section {sec.name}, which "
                         f"covers [{sec.addr:#x}, {sec.addr + sec.size:#x})")  # fmt: skip
            obj.symbols.append(Symbol(nm, st_info >> 4, st_info & 0xF, st_shndx, st_value, st_size))

    symtab_index = symtabs[0].index if symtabs else -1
    for s in sections:
        if s.type == SHT_REL:
            obj.fail(f"section {s.name}: REL relocations (without addends) are not used on {kind.machine_name}")
        if s.type != SHT_RELA:
            continue
        if s.entsize != _RELA.size or s.size % _RELA.size:
            obj.fail(f"section {s.name}: entries of {s.entsize} bytes in {s.size} bytes; expected {_RELA.size}-byte "
                     "entries filling the section")  # fmt: skip
        if not 0 < s.info < len(sections):
            obj.fail(f"section {s.name}: relocates section #{s.info} (sh_info), which does not exist (sections are "
                     f"1..{len(sections) - 1})")  # fmt: skip
        if s.link != symtab_index:
            obj.fail(f"section {s.name}: sh_link is {s.link}, expected the symbol table's index ({symtab_index})"
                     if symtabs else f"section {s.name}: relocations but the object has no symbol table")  # fmt: skip
        target = sections[s.info]
        relocs = obj.relocations.setdefault(s.info, [])
        for k, off in enumerate(range(s.offset, s.offset + s.size, _RELA.size)):
            r_offset, r_info, r_addend = _RELA.unpack_from(data, off)
            where = f"relocation #{k} of {s.name} (offset {off:#x})"
            rkind = kind.relocations.get(r_info & 0xFFFFFFFF)
            if rkind is None:
                obj.fail(f"{where}: unsupported relocation type {r_info & 0xFFFFFFFF} at {target.name}+{r_offset:#x}; "
                         f"supported: {', '.join(kind.prefix + t for t in kind.relocations.values())}")  # fmt: skip
            if r_info >> 32 >= len(obj.symbols):
                obj.fail(f"{where}: symbol index {r_info >> 32}, but the symbol table has {len(obj.symbols)} symbols")
            width = _WIDTH.get(rkind, 4)
            if r_offset + width > target.size:
                obj.fail(f"{where}: {kind.prefix}{rkind} patches {width} bytes at {r_offset:#x}, outside section "
                         f"{target.name} ({target.size:#x} bytes)")  # fmt: skip
            relocs.append(Relocation(r_offset, r_info >> 32, rkind, r_addend))
    return obj


def _is_loaded(s: Section) -> bool:
    # unwind tables are allocatable but only matter to a C++ unwinder; kernels never throw
    return bool(s.flags & SHF_ALLOC) and s.type != SHT_X86_64_UNWIND and s.name != ".eh_frame" and s.size > 0


class LoadedObject:
    """An object linked into executable memory. `symbols` maps each defined global/weak symbol to its address;
    `ranges` lists the (address, size, protection) of the sealed page ranges. Keep it alive while its code runs."""

    def __init__(self, mem: CodeMemory, symbols: dict[str, int], ranges: list[tuple[int, int, int]],
                 label: str = "ELF object") -> None:  # fmt: skip
        self.mem, self.symbols, self.ranges, self.label = mem, symbols, ranges, label

    def address(self, name: str) -> int:
        """The absolute address of the defined symbol `name`; ElfSymbolError (an ElfLinkError and a KeyError)
        listing the defined symbols otherwise."""
        try:
            return self.symbols[name]
        except KeyError:
            raise ElfSymbolError(
                f"{self.label}: symbol {name!r} is not defined by the object; it defines {sorted(self.symbols)}"
            ) from None


def _resolve_external(name: str, libraries: list[Library]) -> int | None:
    for lib in libraries:
        if (addr := lib.lookup(name)) is not None:
            return addr
    return None


def _check_align(obj: ElfObject, align: int, what: str) -> None:
    # the mapping is only page-aligned, so a larger alignment could not be honoured
    if align & (align - 1) or align > PAGE:
        obj.fail(f"{what}: alignment {align} is not a power of two up to the page size ({PAGE})")


def load_elf(obj_bytes: bytes, libraries: list[Library] | None = None, name: str = "") -> LoadedObject:
    """Link a relocatable x86-64 object into fresh executable memory and return it. Undefined (non-weak) symbols
    are looked up in `libraries` in order; one that none defines raises ElfLinkError (a RuntimeError) naming it.
    `name` (the kernel or cache key) names the object in errors. Any malformed input raises ElfLinkError saying
    where and what was expected; nothing is mapped writable and executable at once."""
    libraries = libraries or []
    obj = parse_elf(obj_bytes, name)
    for s in obj.sections:
        if s.flags & SHF_TLS and s.size:
            obj.fail(f"section {s.name}: thread-local storage is not supported in kernels")
        if s.type in (SHT_INIT_ARRAY, SHT_FINI_ARRAY, SHT_PREINIT_ARRAY) and s.size:
            obj.fail(f"section {s.name}: static constructors/destructors are not supported in kernels")
    loaded = [s for s in obj.sections if _is_loaded(s)]
    for s in loaded:
        _check_align(obj, s.align, f"section {s.name}")
    code = [s for s in loaded if s.flags & SHF_EXECINSTR]

    # .data.rel.ro* is only written by relocations, which are applied before sealing: it can be read-only (RELRO)
    def relro(s: Section) -> bool:
        return s.name.startswith(".data.rel.ro")

    consts = [s for s in loaded if not s.flags & SHF_EXECINSTR and (not s.flags & SHF_WRITE or relro(s))]
    data = [s for s in loaded if s.flags & SHF_WRITE and not s.flags & SHF_EXECINSTR and not relro(s)]

    # external symbols: resolve every referenced undefined symbol now, so a missing one fails at load time, by name
    loaded_idx = {s.index for s in loaded}
    referenced = {r.sym for t, rs in obj.relocations.items() if t in loaded_idx for r in rs if r.kind != "NONE"}
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
                obj.fail(f"undefined symbol {sym.name!r}: not defined by the object nor by {searched}")
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
            _check_align(obj, max(sym.value, 1), f"common symbol {sym.name!r}")
            pos = round_up(pos, max(sym.value, 1))
            common[i], pos = pos, pos + sym.size
    total = round_up(max(pos, 1), PAGE)
    if total > MAX_IMAGE:
        obj.fail(f"the sections and common symbols to load take {total:#x} bytes, more than the {MAX_IMAGE >> 20} MiB "
                 "a kernel object may (a damaged size field?)")  # fmt: skip

    try:
        mem = CodeMemory(total, low=needs_low)
    except OSError as e:
        obj.fail(f"could not map {total} bytes for the image: {e}")
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
        if sym.shndx == SHN_UNDEF:
            obj.fail(f"a relocation refers to {obj.symbol_name(i)}, which is undefined and has no name to resolve")
        if sym.shndx not in offsets:
            obj.fail(f"symbol {obj.symbol_name(i)!r} lives in section {obj.sections[sym.shndx].name or sym.shndx}, "
                     "which is not loaded")  # fmt: skip
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
            if r.kind in ("PC32", "PLT32"):
                value, signed, bits = (stub_addr.get(r.sym) or sym_addr(r.sym)) + r.addend - P, True, 32
            elif r.kind in _GOT_KINDS:
                value, signed, bits = got_addr[r.sym] + r.addend - P, True, 32
            elif r.kind == "64":  # absolute 64-bit: wraps modulo 2**64 like a static linker's
                value, signed, bits = (sym_addr(r.sym) + r.addend) & (2**64 - 1), False, 64
            elif r.kind == "GOTPC32":
                value, signed, bits = base + got_off + r.addend - P, True, 32
            elif r.kind == "PC64":
                value, signed, bits = sym_addr(r.sym) + r.addend - P, True, 64
            elif r.kind == "32":
                value, signed, bits = sym_addr(r.sym) + r.addend, False, 32
            elif r.kind == "32S":
                value, signed, bits = sym_addr(r.sym) + r.addend, True, 32
            else:  # pragma: no cover - parse_elf only admits the kinds above
                obj.fail(f"relocation R_X86_64_{r.kind} not handled")
            lo, hi = (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) if signed else (0, 2**bits - 1)
            if not lo <= value <= hi:
                obj.fail(f"relocation R_X86_64_{r.kind} against {obj.symbol_name(r.sym)!r} in {sec.name}+"
                         f"{r.offset:#x} does not fit: value {value:#x} is outside [{lo:#x}, {hi:#x}]")  # fmt: skip
            struct.pack_into(_PUT[signed, bits], image, where, value)

    mem.write(0, bytes(image))
    ranges = [(0, code_end, PROT_READ | PROT_EXEC), (const_start, data_start - const_start, PROT_READ)]
    ranges.append((data_start, total - data_start, PROT_READ | PROT_WRITE))
    ranges = [r for r in ranges if r[1] > 0]
    mem.seal(ranges)
    symbols = {
        sym.name: sym_addr(i)
        for i, sym in enumerate(obj.symbols)
        if sym.name and sym.bind in (STB_GLOBAL, STB_WEAK) and i not in external
        and (sym.shndx in offsets or sym.shndx in (SHN_ABS, SHN_COMMON))
    }  # fmt: skip
    return LoadedObject(mem, symbols, [(base + o, round_up(n, PAGE), p) for o, n, p in ranges], obj.label)


_PUT = {(True, 32): "<i", (False, 32): "<I", (True, 64): "<q", (False, 64): "<Q"}
