"""Relocatable ELF64 x86-64 object writer (ET_REL) for one kernel function.

Layout: .text (the function), .rodata (constants referenced RIP-relative), .rela.text, .symtab, .strtab, .shstrtab, an
empty .note.GNU-stack (so linkers do not assume an executable stack) and, when given, .speck.listing: the encoder's
Intel-syntax listing of the function (not loaded: no SHF_ALLOC; `read_listing` gets it back, so the object carries its
own listing wherever it was compiled or cached). The symbol table holds the two section symbols
(relocations against .rodata point at the section symbol plus an offset), the kernel as a global FUNC, and every other
referenced name as an undefined global (expf, memcpy, ...) for the loader to resolve. Field layouts follow the System V
gABI ("Object Files") and the x86-64 psABI (relocation types R_X86_64_PC32 = 2, R_X86_64_PLT32 = 4).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

from speck.codegen.errors import CodegenValueError
from speck.codegen.x86.encoder import Relocation

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
_SHDR = struct.Struct("<IIQQQQIIQQ")
_SYM = struct.Struct("<IBBHQQ")
_RELA = struct.Struct("<QQq")

ET_REL, EM_X86_64 = 1, 62
SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA = 1, 2, 3, 4
SHF_ALLOC, SHF_EXECINSTR, SHF_INFO_LINK = 0x2, 0x4, 0x40
STB_LOCAL, STB_GLOBAL = 0, 1
STT_NOTYPE, STT_FUNC, STT_SECTION = 0, 2, 3
RELOC_TYPES = {"PC32": 2, "PLT32": 4}


class ConstPool:
    """Accumulates .rodata constants, aligning each and sharing identical ones; `add` returns the byte offset."""

    def __init__(self) -> None:
        self.data = bytearray()
        self._seen: dict[tuple[bytes, int], int] = {}

    def add(self, value: bytes, align: int = 16) -> int:
        """Place `value` at an `align`-aligned offset (reusing an identical earlier constant) and return the offset."""
        key = (bytes(value), align)
        if key not in self._seen:
            self.data += b"\0" * (-len(self.data) % align)
            self._seen[key] = len(self.data)
            self.data += value
        return self._seen[key]


class _StrTab:
    def __init__(self) -> None:
        self.data = bytearray(b"\0")

    def add(self, s: str) -> int:
        off = len(self.data)
        self.data += s.encode() + b"\0"
        return off


LISTING_SECTION = ".speck.listing"


def write_elf_object(
    name: str, code: bytes, relocations: Sequence[Relocation] = (), rodata: bytes = b"", listing: str = ""
) -> bytes:
    """Build an ET_REL x86-64 object defining the global function `name` (the whole of `code`).

    Relocation symbols ".rodata" and ".text" resolve to those sections, `name` to the function itself, anything else
    becomes an undefined global. Raises ValueError for an unknown relocation kind or an offset outside the code.
    """
    if not name.isidentifier():
        raise CodegenValueError(f"write_elf_object: function name must be a C identifier, got {name!r}")
    strtab, shstrtab = _StrTab(), _StrTab()
    # symbols: null, section .text, section .rodata, then globals (the function, then externals)
    symbols = [
        _SYM.pack(0, 0, 0, 0, 0, 0),
        _SYM.pack(0, STT_SECTION, 0, 1, 0, 0),
        _SYM.pack(0, STT_SECTION, 0, 2, 0, 0),
    ]
    first_global = len(symbols)
    sym_index = {".text": 1, ".rodata": 2, name: len(symbols)}
    symbols.append(_SYM.pack(strtab.add(name), (STB_GLOBAL << 4) | STT_FUNC, 0, 1, 0, len(code)))
    relas = []
    for r in relocations:
        if r.kind not in RELOC_TYPES:
            raise CodegenValueError(
                f"write_elf_object: unknown relocation kind {r.kind!r}; expected one of {list(RELOC_TYPES)}"
            )
        if not 0 <= r.offset <= len(code) - 4:
            raise CodegenValueError(
                f"write_elf_object: relocation offset {r.offset} is outside the {len(code)}-byte code"
            )
        if r.symbol not in sym_index:
            sym_index[r.symbol] = len(symbols)
            symbols.append(_SYM.pack(strtab.add(r.symbol), (STB_GLOBAL << 4) | STT_NOTYPE, 0, 0, 0, 0))
        relas.append(_RELA.pack(r.offset, (sym_index[r.symbol] << 32) | RELOC_TYPES[r.kind], r.addend))

    # (name, type, flags, data, link, info, align, entsize); indices fixed by the symbol table above
    sections = [
        (".text", SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, code, 0, 0, 16, 0),
        (".rodata", SHT_PROGBITS, SHF_ALLOC, rodata, 0, 0, 32, 0),
        (".rela.text", SHT_RELA, SHF_INFO_LINK, b"".join(relas), 4, 1, 8, _RELA.size),
        (".symtab", SHT_SYMTAB, 0, b"".join(symbols), 5, first_global, 8, _SYM.size),
        (".strtab", SHT_STRTAB, 0, bytes(strtab.data), 0, 0, 1, 0),
        (".shstrtab", SHT_STRTAB, 0, b"", 0, 0, 1, 0),
        (".note.GNU-stack", SHT_PROGBITS, 0, b"", 0, 0, 1, 0),
    ]
    if listing:
        sections.append((LISTING_SECTION, SHT_PROGBITS, 0, listing.encode(), 0, 0, 1, 0))
    names = [shstrtab.add(s[0]) for s in sections]
    body = bytearray()
    offsets = []
    for sec in sections:
        data = bytes(shstrtab.data) if sec[0] == ".shstrtab" else sec[3]
        pos = _EHDR.size + len(body)
        pos += -pos % sec[6]
        body += b"\0" * (pos - _EHDR.size - len(body))
        offsets.append((pos, len(data)))
        body += data
    shoff = _EHDR.size + len(body)
    shoff += -shoff % 8
    body += b"\0" * (shoff - _EHDR.size - len(body))
    headers = [_SHDR.pack(0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    for sec, nm, (off, size) in zip(sections, names, offsets):
        headers.append(_SHDR.pack(nm, sec[1], sec[2], 0, off, size, sec[4], sec[5], sec[6], sec[7]))
    ident = b"\x7fELF" + bytes([2, 1, 1, 0]) + b"\0" * 8
    shstrndx = 1 + [s[0] for s in sections].index(".shstrtab")
    ehdr = _EHDR.pack(ident, ET_REL, EM_X86_64, 1, 0, 0, shoff, 0, _EHDR.size, 0, 0, _SHDR.size, len(headers), shstrndx)
    return ehdr + bytes(body) + b"".join(headers)


def read_listing(obj: bytes) -> str | None:
    """The .speck.listing section of an object `write_elf_object` built (None when it has none); ValueError when
    `obj` is not a little-endian ELF64 object or its section table points outside it."""
    if len(obj) < _EHDR.size or obj[:6] != b"\x7fELF\x02\x01":
        raise CodegenValueError(f"read_listing: expected an ELF64 little-endian object, got {obj[:6]!r}...")
    ehdr = _EHDR.unpack_from(obj)
    shoff, shnum, shstrndx = ehdr[6], ehdr[12], ehdr[13]
    if shoff + shnum * _SHDR.size > len(obj) or shstrndx >= shnum:
        raise CodegenValueError(f"read_listing: section table ({shnum} entries at {shoff:#x}) is outside the "
                                f"{len(obj)}-byte object")  # fmt: skip
    headers = [_SHDR.unpack_from(obj, shoff + k * _SHDR.size) for k in range(shnum)]
    names_at, names_size = headers[shstrndx][4], headers[shstrndx][5]
    names = obj[names_at : names_at + names_size]
    for h in headers:
        if names[h[0] : names.find(b"\0", h[0])].decode() == LISTING_SECTION:
            return obj[h[4] : h[4] + h[5]].decode()
    return None
