"""Kernels whose sources differ only in the kernel's name compile once: `rename_symbol` turns the object of one into
the object of the other.

A cold CNN training step has about 20 such kernels among its 104: an elementwise kernel's body does not depend on
its element count (the CPU ABI hands each call its slice, CPU_ABI.md), so `E_32` and `E_64` of one optimizer
update render to the same LLVM IR but for the name. The object's code, constants and relocations do not depend on
the name either (it is only the function symbol's string), so the pool compiles the first and derives the others by
renaming. The result is a valid relocatable object defining the same code under the new name; its bytes differ
from what the compiler would emit for the renamed source only in the string table's layout (the new name is
appended, the old string stays, unreferenced)."""

from __future__ import annotations

import struct

_EHDR = struct.Struct("<16sHHIQQQIHHHHHH")  # ELF64 header
_SHDR = struct.Struct("<IIQQQQIIQQ")  # ELF64 section header
_SYM = struct.Struct("<IBBHQQ")  # ELF64 symbol
_SHT_SYMTAB, _SHT_NOBITS = 2, 8


def rename_symbol(obj: bytes, old: str, new: str) -> bytes | None:
    """`obj` (a little-endian ELF64 relocatable object) with its one symbol named `old` named `new`; None when the
    object is not laid out as this expects (its symbols' string table is the last data before the section headers,
    nothing follows them, exactly one symbol is named `old`): the caller then compiles the renamed source itself."""
    if old == new:
        return obj
    if len(obj) < _EHDR.size or obj[:6] != b"\x7fELF\x02\x01":
        return None
    eh = list(_EHDR.unpack_from(obj))
    shoff, shentsize, shnum = eh[6], eh[11], eh[12]
    if shentsize != _SHDR.size or shoff + shnum * shentsize != len(obj):
        return None
    shdrs = [list(_SHDR.unpack_from(obj, shoff + i * shentsize)) for i in range(shnum)]
    symtabs = [i for i, s in enumerate(shdrs) if s[1] == _SHT_SYMTAB]
    if len(symtabs) != 1:
        return None
    symtab = shdrs[symtabs[0]]
    strndx = symtab[6]
    if not 0 < strndx < shnum or symtab[9] != _SYM.size:
        return None
    str_off, str_size = shdrs[strndx][4], shdrs[strndx][5]
    str_end = str_off + str_size
    others = [s for i, s in enumerate(shdrs) if i != strndx and s[1] != _SHT_NOBITS]
    if str_end > shoff or any(s[4] + s[5] > str_end for s in others):
        return None  # (appending to the string table would move another section's data)
    strtab = obj[str_off:str_end]
    target = old.encode() + b"\0"
    hits = []
    for k in range(symtab[5] // _SYM.size):
        pos = symtab[4] + k * _SYM.size
        st_name = _SYM.unpack_from(obj, pos)[0]
        if strtab[st_name : st_name + len(target)] == target:
            hits.append(pos)
    if len(hits) != 1:
        return None
    out = bytearray(obj[:str_end])
    struct.pack_into("<I", out, hits[0], str_size)  # the symbol's st_name: the appended string
    out += new.encode() + b"\0"
    out += b"\0" * (-len(out) % 8)  # section headers stay 8-byte aligned
    shdrs[strndx][5] = str_size + len(new.encode()) + 1
    eh[6] = len(out)
    struct.pack_into(_EHDR.format, out, 0, *eh)
    for s in shdrs:
        out += _SHDR.pack(*s)
    return bytes(out)


def symbol_names(obj: bytes) -> list[str]:
    """The names of an ELF64 object's symbols, in table order (tests compare a renamed object with a compiled one)."""
    eh = _EHDR.unpack_from(obj)
    shdrs = [_SHDR.unpack_from(obj, eh[6] + i * eh[11]) for i in range(eh[12])]
    symtab = next(s for s in shdrs if s[1] == _SHT_SYMTAB)
    strtab = shdrs[symtab[6]]
    names = []
    for k in range(symtab[5] // _SYM.size):
        st_name = _SYM.unpack_from(obj, symtab[4] + k * _SYM.size)[0]
        start = strtab[4] + st_name
        names.append(obj[start : obj.index(b"\0", start)].decode())
    return names


__all__ = ["rename_symbol", "symbol_names"]
