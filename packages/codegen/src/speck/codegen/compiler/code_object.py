"""HSA code objects, linked in Python: `link_code_object(relocatable)` turns the AMDGPU relocatable object LLVM emits
(ET_REL: `.text` with the kernels' code, `.rodata` with their 64-byte kernel descriptors `<name>.kd`, the
NT_AMDGPU_METADATA note, and the relocations between them) into the ELF64 shared object (ET_DYN, EM_AMDGPU) a GPU
loader reads: no ld.lld at run time.

The output is laid out as ld.lld lays out such an input (`ld.lld -shared`), so the two agree on every address:
the ELF header and eight program headers, then the read-only segment (`.note`, `.dynsym`, `.gnu.hash`, `.hash`,
`.dynstr`, then the object's read-only sections), the code segment (`.text`), the writable segment (`.dynamic`,
also the RELRO range), then `.shstrtab` and the section headers. The first section of each later segment starts at
`align(dot, page) + dot % page` (lld's default, -z noseparate-code, with AMDGPU's 4 KiB max page size), and its file
offset is congruent to its address modulo the page. Dynamic symbols are the object's global and weak definitions,
ordered by GNU hash bucket as lld orders them. Relocations are resolved statically: the PC-relative kinds LLVM uses
between code and constants (the descriptor's `kernel_code_entry_byte_offset` is an R_AMDGPU_REL64 from the
descriptor to the code); an absolute one would need a dynamic relocation and is refused.

e_flags (EF_AMDGPU_MACH_* for the arch, xnack/sramecc feature bits) and e_ident (ELFOSABI_AMDGPU_HSA, the code
object version's ABI version) are the relocatable object's, as LLVM set them for the target."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from speck.codegen.errors import CodeObjectLinkError

EM_AMDGPU = 224
ET_REL, ET_DYN = 1, 3
SHT_NULL, SHT_PROGBITS, SHT_SYMTAB, SHT_STRTAB, SHT_RELA, SHT_HASH, SHT_DYNAMIC, SHT_NOTE = 0, 1, 2, 3, 4, 5, 6, 7
SHT_NOBITS, SHT_REL, SHT_DYNSYM, SHT_GNU_HASH = 8, 9, 11, 0x6FFFFFF6
SHF_WRITE, SHF_ALLOC, SHF_EXECINSTR = 0x1, 0x2, 0x4
PT_LOAD, PT_DYNAMIC, PT_NOTE, PT_PHDR = 1, 2, 4, 6
PT_GNU_STACK, PT_GNU_RELRO = 0x6474E551, 0x6474E552
PF_X, PF_W, PF_R = 1, 2, 4
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_SYMENT, DT_GNU_HASH = 0, 4, 5, 6, 10, 11, 0x6FFFFEF5
STB_GLOBAL, STB_WEAK, STT_SECTION = 1, 2, 3
SHN_UNDEF, SHN_LORESERVE, SHN_ABS = 0, 0xFF00, 0xFFF1
PAGE = 0x1000  # ld.lld's max page size for AMDGPU
GNU_HASH_SHIFT2 = 26  # lld's second Bloom filter bit

# R_AMDGPU_* relocations resolvable without a dynamic linker: PC-relative, as (width in bytes, what to write)
_REL_KINDS = {4: ("REL32", 4), 5: ("REL64", 8), 10: ("REL32_LO", 4), 11: ("REL32_HI", 4), 14: ("REL16", 2)}
_ABS_KINDS = {1: "ABS32_LO", 2: "ABS32_HI", 3: "ABS64", 6: "ABS32", 13: "RELATIVE64"}

EHDR = struct.Struct("<16sHHIQQQIHHHHHH")
SHDR = struct.Struct("<IIQQQQIIQQ")
PHDR = struct.Struct("<IIQQQQQQ")
SYM = struct.Struct("<IBBHQQ")
RELA = struct.Struct("<QQq")
DYN = struct.Struct("<qQ")


@dataclass
class _Section:
    name: str
    type: int
    flags: int
    data: bytes
    align: int
    entsize: int = 0
    link: int = 0
    info: int = 0
    addr: int = 0
    offset: int = 0


@dataclass
class _Sym:
    name: str
    info: int
    other: int
    shndx: int
    value: int
    size: int


def gnu_hash(name: bytes) -> int:
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xFFFFFFFF
    return h


def sysv_hash(name: bytes) -> int:
    h = 0
    for c in name:
        h = ((h << 4) + c) & 0xFFFFFFFF
        g = h & 0xF0000000
        if g:
            h ^= g >> 24
        h &= ~g & 0xFFFFFFFF
    return h


def _align(x: int, a: int) -> int:
    return (x + a - 1) // a * a if a > 1 else x


def _align_skew(x: int, a: int, skew: int) -> int:
    """The smallest value >= x that is congruent to skew modulo a (lld's alignTo with a skew)."""
    skew %= a
    return x + ((skew - x) % a)


MAX_ALIGN = 1 << 16  # the largest section alignment accepted (LLVM's AMDGPU sections ask for at most a page)


class _Input:
    """The relocatable object, read as far as linking needs (it comes from LLVM in this process; still, anything
    unexpected is a CodeObjectLinkError naming the object and the place, not an IndexError)."""

    def __init__(self, data: bytes, label: str) -> None:
        self.data, self.label = data, label
        if len(data) < EHDR.size or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            self.fail("not a little-endian ELF64 object")
        hdr = EHDR.unpack_from(data, 0)
        self.ident, e_type, e_machine, self.flags = hdr[0], hdr[1], hdr[2], hdr[7]
        e_shoff, e_shnum, e_shstrndx = hdr[6], hdr[12], hdr[13]
        if e_type != ET_REL or e_machine != EM_AMDGPU:
            self.fail(f"expected an AMDGPU relocatable object (e_type {ET_REL}, e_machine {EM_AMDGPU}), got e_type "
                      f"{e_type}, e_machine {e_machine}")  # fmt: skip
        if e_shoff + e_shnum * SHDR.size > len(data) or e_shstrndx >= e_shnum:
            self.fail(f"section header table ({e_shnum} entries at {e_shoff:#x}) outside the {len(data)}-byte file")
        raw = [SHDR.unpack_from(data, e_shoff + i * SHDR.size) for i in range(e_shnum)]
        for i, r in enumerate(raw):
            if r[1] != SHT_NOBITS and r[4] + r[5] > len(data):
                self.fail(f"section #{i} spans [{r[4]:#x}, {r[4] + r[5]:#x}) past the end of the file")
        for i, r in enumerate(raw):
            if r[8] > MAX_ALIGN or r[8] & (r[8] - 1):  # (laid out, an alignment of 2**60 asks for exabytes)
                self.fail(f"section #{i} asks for alignment {r[8]}; expected a power of two up to {MAX_ALIGN}")
        names = self._bytes(raw[e_shstrndx])
        self.sections = [
            _Section(self.cstr(names, r[0]), r[1], r[2], self._bytes(r), max(r[8], 1), r[9], r[6], r[7]) for r in raw
        ]
        symtabs = [s for s in self.sections if s.type == SHT_SYMTAB]
        if len(symtabs) != 1:
            self.fail(f"expected one symbol table, found {len(symtabs)}")
        st = symtabs[0]
        strtab = self.sections[st.link].data if 0 < st.link < len(self.sections) else self.fail("bad symtab link")
        self.symbols = [
            _Sym(self.cstr(strtab, n), info, other, shndx, value, size)
            for n, info, other, shndx, value, size in (
                SYM.unpack_from(st.data, o) for o in range(0, len(st.data) - SYM.size + 1, SYM.size)
            )
        ]
        self.relocations: dict[int, list[tuple[int, int, int, int]]] = {}  # target section -> (off, type, sym, add)
        for s in self.sections:
            if s.type == SHT_REL:
                self.fail(f"section {s.name}: REL relocations (without addends); AMDGPU objects use RELA")
            if s.type == SHT_RELA:
                rows = [RELA.unpack_from(s.data, o) for o in range(0, len(s.data) - RELA.size + 1, RELA.size)]
                self.relocations[s.info] = [(o, i & 0xFFFFFFFF, i >> 32, a) for o, i, a in rows]

    def _bytes(self, r: tuple[int, ...]) -> bytes:
        return b"" if r[1] == SHT_NOBITS else self.data[r[4] : r[4] + r[5]]

    def cstr(self, table: bytes, off: int) -> str:
        end = table.find(b"\0", off)
        if off >= len(table) or end < 0:
            self.fail(f"a name at offset {off:#x} is outside its {len(table)}-byte string table")
        try:
            return table[off:end].decode()
        except UnicodeDecodeError as e:
            msg = f"the name at offset {off:#x} of its string table is not UTF-8 ({e.reason})"
            raise CodeObjectLinkError(f"AMDGPU object {self.label!r}: {msg}") from None

    def fail(self, message: str) -> bytes:
        raise CodeObjectLinkError(f"AMDGPU object {self.label!r}: {message}")


def _phdr(kind: int, flags: int, off: int, addr: int, filesz: int, memsz: int, align: int) -> bytes:
    return PHDR.pack(kind, flags, off, addr, addr, filesz, memsz, align)


def link_code_object(relocatable: bytes, label: str = "") -> bytes:
    """Link an AMDGPU relocatable object into an HSA code object (see the module docstring). `label` (the kernel's
    name) names the object in errors."""
    obj = _Input(bytes(relocatable), label)
    loaded = [(i, s) for i, s in enumerate(obj.sections) if s.flags & SHF_ALLOC and s.type != SHT_RELA and s.data]
    for _, s in loaded:
        if s.flags & SHF_WRITE or s.type not in (SHT_PROGBITS, SHT_NOTE):
            obj.fail(f"section {s.name} (type {s.type}, flags {s.flags:#x}) is writable or not plain data; a kernel "
                     "code object has only code, constants and notes")  # fmt: skip
    notes = [(i, s) for i, s in loaded if s.type == SHT_NOTE]
    rodata = [(i, s) for i, s in loaded if s.type == SHT_PROGBITS and not s.flags & SHF_EXECINSTR]
    text = [(i, s) for i, s in loaded if s.flags & SHF_EXECINSTR]
    if not text:
        obj.fail("no executable section: the object holds no kernel code")
    out_names = [s.name for _, s in loaded]
    if len(set(out_names)) != len(out_names):
        obj.fail(f"several input sections share a name ({out_names}); the writer maps each to its own section")

    # dynamic symbols: global/weak definitions, stably sorted by GNU hash bucket (lld's order)
    defined = [sym for sym in obj.symbols[1:] if sym.info >> 4 in (STB_GLOBAL, STB_WEAK)]
    for sym in defined:
        if sym.shndx == SHN_UNDEF:
            obj.fail(f"symbol {sym.name!r} is undefined; a code object links against nothing")
    nbuckets = max(len(defined) // 4, 1)
    dynsyms = sorted(defined, key=lambda sym: gnu_hash(sym.name.encode()) % nbuckets)
    dynstr = b"\0"
    name_off: list[int] = []
    for sym in dynsyms:
        name_off.append(len(dynstr))
        dynstr += sym.name.encode() + b"\0"
    nsyms = len(dynsyms) + 1

    # sections, in output order (index 0 is the NULL section)
    note = _Section(".note", SHT_NOTE, SHF_ALLOC, b"".join(_pad(s.data, 4) for _, s in notes),
                    max([s.align for _, s in notes], default=4))  # fmt: skip
    out: list[_Section] = [_Section("", SHT_NULL, 0, b"", 0)]
    if notes:
        out.append(note)
    i_dynsym = len(out)
    out.append(_Section(".dynsym", SHT_DYNSYM, SHF_ALLOC, bytes(SYM.size * nsyms), 8, SYM.size, i_dynsym + 3, 1))
    masks = _mask_words(len(dynsyms))
    gnu_size = 16 + 8 * masks + 4 * nbuckets + 4 * len(dynsyms)
    out.append(_Section(".gnu.hash", SHT_GNU_HASH, SHF_ALLOC, bytes(gnu_size), 8, 0, i_dynsym))
    out.append(_Section(".hash", SHT_HASH, SHF_ALLOC, bytes(4 * (2 + 2 * nsyms)), 4, 4, i_dynsym))
    out.append(_Section(".dynstr", SHT_STRTAB, SHF_ALLOC, dynstr, 1))
    index_of: dict[int, int] = {}
    for i, s in rodata + text:
        index_of[i] = len(out)
        out.append(_Section(s.name, s.type, s.flags, s.data, s.align))
    i_dynamic = len(out)
    out.append(_Section(".dynamic", SHT_DYNAMIC, SHF_ALLOC | SHF_WRITE, bytes(DYN.size * 7), 8, DYN.size, i_dynsym + 3))
    alloc_end = len(out)

    # addresses and file offsets (lld's rules, module docstring); segments: read-only, code, writable
    nphdr = 8
    dot = off = EHDR.size + nphdr * PHDR.size
    segment_of = [0] + [0 if not s.flags & (SHF_EXECINSTR | SHF_WRITE) else 1 if s.flags & SHF_EXECINSTR else 2
                        for s in out[1:alloc_end]]  # fmt: skip
    for k in range(1, alloc_end):
        s = out[k]
        first = k > 1 and segment_of[k] != segment_of[k - 1]
        if first:
            dot = _align(dot, PAGE) + dot % PAGE
        s.addr = dot = _align(dot, s.align)
        s.offset = off = _align_skew(off, PAGE, s.addr) if first else _align(off, s.align)
        dot, off = dot + len(s.data), off + len(s.data)

    # symbol addresses, then the relocations between the object's sections
    def address(sym: _Sym) -> int:
        if sym.shndx == SHN_ABS:
            return sym.value
        if sym.shndx not in index_of:
            obj.fail(f"symbol {sym.name or '#' + str(sym.shndx)!r} lives in section #{sym.shndx}, which is not loaded")
        return out[index_of[sym.shndx]].addr + sym.value

    for target, relocs in obj.relocations.items():
        if target not in index_of:
            continue  # relocations of non-loaded sections (debug info) don't reach the code object
        sec = out[index_of[target]]
        data = bytearray(sec.data)
        for r_off, kind, symi, addend in relocs:
            where = f"relocation type {kind} at {sec.name}+{r_off:#x}"
            if kind in _ABS_KINDS:
                obj.fail(f"{where}: R_AMDGPU_{_ABS_KINDS[kind]} is absolute and would need a dynamic relocation, "
                         "which speck's code objects do not have")  # fmt: skip
            if kind not in _REL_KINDS or symi >= len(obj.symbols):
                obj.fail(
                    f"{where}: unsupported relocation (supported: "
                    f"{', '.join('R_AMDGPU_' + n for n, _ in _REL_KINDS.values())}) or bad symbol #{symi}"
                )
            name, width = _REL_KINDS[kind]
            sym = obj.symbols[symi]
            value = address(sym) + addend - (sec.addr + r_off)
            if name == "REL32_HI":
                value >>= 32
            if r_off + width > len(data):
                obj.fail(f"{where}: patches {width} bytes past the end of {sec.name} ({len(data)} bytes)")
            data[r_off : r_off + width] = (value & ((1 << (8 * width)) - 1)).to_bytes(width, "little")
        sec.data = bytes(data)

    # dynamic symbol table and the two hash tables
    dynsym = bytearray(SYM.size)
    for sym, noff in zip(dynsyms, name_off):
        shndx = index_of.get(sym.shndx, sym.shndx if sym.shndx >= SHN_LORESERVE else SHN_UNDEF)
        if shndx == SHN_UNDEF:
            obj.fail(f"symbol {sym.name!r} is defined in section #{sym.shndx}, which is not loaded")
        dynsym += SYM.pack(noff, sym.info, sym.other, shndx, address(sym), sym.size)
    out[i_dynsym].data = bytes(dynsym)
    out[i_dynsym + 1].data = _gnu_hash_table(dynsyms, nbuckets, masks)
    out[i_dynsym + 2].data = _sysv_hash_table(dynsyms, nsyms)
    dyn = [(DT_SYMTAB, out[i_dynsym].addr), (DT_SYMENT, SYM.size), (DT_STRTAB, out[i_dynsym + 3].addr),
           (DT_STRSZ, len(dynstr)), (DT_GNU_HASH, out[i_dynsym + 1].addr), (DT_HASH, out[i_dynsym + 2].addr),
           (DT_NULL, 0)]  # fmt: skip
    out[i_dynamic].data = b"".join(DYN.pack(t, v) for t, v in dyn)

    # non-allocated tail: the section name table, then the section headers
    shstr = b"\0"
    name_at: list[int] = [0]
    for s in out[1:]:
        name_at.append(len(shstr))
        shstr += s.name.encode() + b"\0"
    name_at.append(len(shstr))
    shstr += b".shstrtab\0"
    out.append(_Section(".shstrtab", SHT_STRTAB, 0, shstr, 1))
    out[-1].offset = off
    off += len(shstr)
    shoff = _align(off, 8)

    ro_end = out[index_of[text[0][0]] - 1]
    tx = out[index_of[text[0][0]] : index_of[text[-1][0]] + 1]
    dynamic = out[i_dynamic]
    phdrs = [
        _phdr(PT_PHDR, PF_R, EHDR.size, EHDR.size, nphdr * PHDR.size, nphdr * PHDR.size, 8),
        _phdr(PT_LOAD, PF_R, 0, 0, ro_end.offset + len(ro_end.data), ro_end.addr + len(ro_end.data), PAGE),
        _phdr(PT_LOAD, PF_R | PF_X, tx[0].offset, tx[0].addr, tx[-1].offset + len(tx[-1].data) - tx[0].offset,
              tx[-1].addr + len(tx[-1].data) - tx[0].addr, PAGE),
        _phdr(PT_LOAD, PF_R | PF_W, dynamic.offset, dynamic.addr, len(dynamic.data), len(dynamic.data), PAGE),
        _phdr(PT_DYNAMIC, PF_R | PF_W, dynamic.offset, dynamic.addr, len(dynamic.data), len(dynamic.data), 8),
        _phdr(PT_GNU_RELRO, PF_R, dynamic.offset, dynamic.addr, len(dynamic.data),
              _align(dynamic.addr + len(dynamic.data), PAGE) - dynamic.addr, 1),
        _phdr(PT_GNU_STACK, PF_R | PF_W, 0, 0, 0, 0, 0),
        _phdr(PT_NOTE, PF_R, note.offset, note.addr, len(note.data), len(note.data), note.align) if notes else
        _phdr(PT_NOTE, PF_R, 0, 0, 0, 0, 4),
    ]  # fmt: skip
    image = bytearray(shoff + SHDR.size * len(out))
    image[0 : EHDR.size] = EHDR.pack(obj.ident, ET_DYN, EM_AMDGPU, 1, 0, EHDR.size, shoff, obj.flags, EHDR.size,
                                     PHDR.size, nphdr, SHDR.size, len(out), len(out) - 1)  # fmt: skip
    image[EHDR.size : EHDR.size + nphdr * PHDR.size] = b"".join(phdrs)
    for k, s in enumerate(out):
        if k:
            image[s.offset : s.offset + len(s.data)] = s.data
        shdr = SHDR.pack(name_at[k] if k < len(out) - 1 else name_at[-1], s.type, s.flags, s.addr, s.offset,
                         len(s.data), s.link, s.info, s.align if k else 0, s.entsize)  # fmt: skip
        image[shoff + k * SHDR.size : shoff + (k + 1) * SHDR.size] = shdr
    return bytes(image)


def _pad(b: bytes, a: int) -> bytes:
    return b + bytes(-len(b) % a)


def _mask_words(n: int) -> int:
    """lld's Bloom filter size in 64-bit words: 12 bits per symbol, rounded up to the next power of two above."""
    bits = n * 12 // 64
    p = 1
    while p <= bits:
        p *= 2
    return p


def _gnu_hash_table(syms: list[_Sym], nbuckets: int, masks: int) -> bytes:
    hashes = [gnu_hash(s.name.encode()) for s in syms]
    bloom = [0] * masks
    for h in hashes:
        bloom[(h // 64) & (masks - 1)] |= (1 << (h % 64)) | (1 << ((h >> GNU_HASH_SHIFT2) % 64))
    buckets = [0] * nbuckets
    values = []
    for k, h in enumerate(hashes):
        b = h % nbuckets
        last = k + 1 == len(hashes) or hashes[k + 1] % nbuckets != b
        values.append(h | 1 if last else h & ~1)
        if k == 0 or hashes[k - 1] % nbuckets != b:
            buckets[b] = k + 1  # dynsym index (after the null symbol)
    head = struct.pack("<IIII", nbuckets, 1, masks, GNU_HASH_SHIFT2)
    return head + struct.pack(f"<{masks}Q", *bloom) + struct.pack(f"<{nbuckets}I", *buckets) + \
        struct.pack(f"<{len(values)}I", *values)  # fmt: skip


def _sysv_hash_table(syms: list[_Sym], nsyms: int) -> bytes:
    buckets, chains = [0] * nsyms, [0] * nsyms
    for k, s in enumerate(syms, start=1):
        h = sysv_hash(s.name.encode()) % nsyms
        chains[k], buckets[h] = buckets[h], k
    return struct.pack(f"<II{nsyms}I{nsyms}I", nsyms, nsyms, *buckets, *chains)


__all__ = ["EM_AMDGPU", "gnu_hash", "link_code_object", "sysv_hash"]
