"""A minimal reader of HSA code objects (ELF64 for EM_AMDGPU) and the 64-byte kernel descriptor.

usbgpu cannot import speck.hcq's ELF tools, and the emulator needs little: the loadable image, the symbol table
(to find `<kernel>` and `<kernel>.kd`) and the descriptor fields the command processor reads. Layouts follow LLVM's
AMDGPUUsage ("Code Object V5 Kernel Descriptor", "compute_pgm_rsrc1/2/3") and the ELF-64 specification.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from speck.usbgpu.errors import CodeObjectError

EM_AMDGPU = 224
# e_flags & EF_AMDGPU_MACH: the gfx11 targets whose wave32 ISA this emulator implements
MACH_NAMES = {0x41: "gfx1100", 0x46: "gfx1101", 0x47: "gfx1102", 0x44: "gfx1103", 0x43: "gfx1150", 0x4A: "gfx1151"}
EF_AMDGPU_MACH = 0xFF
PT_LOAD = 1
SHT_SYMTAB, SHT_DYNSYM = 2, 11
KD_SIZE = 64


def _bits(value: int, lo: int, width: int) -> int:
    return (value >> lo) & ((1 << width) - 1)


@dataclass(frozen=True)
class KernelDescriptor:
    """The fields of an amdhsa kernel descriptor (code object v4/v5 layout)."""

    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    kernel_code_entry_byte_offset: int
    rsrc3: int
    rsrc1: int
    rsrc2: int
    kernel_code_properties: int

    @classmethod
    def from_bytes(cls, raw: bytes) -> KernelDescriptor:
        if len(raw) < KD_SIZE:
            raise CodeObjectError("reading the kernel descriptor", f"{len(raw)} bytes, a descriptor has {KD_SIZE}")
        group, private, kernarg = struct.unpack_from("<III", raw, 0)
        (entry,) = struct.unpack_from("<q", raw, 16)
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, 44)
        (props,) = struct.unpack_from("<H", raw, 56)
        return cls(group, private, kernarg, entry, rsrc3, rsrc1, rsrc2, props)

    # kernel_code_properties: which user SGPRs the kernel asks for (in this order), and wave32
    @property
    def user_sgpr_flags(self) -> dict[str, bool]:
        p = self.kernel_code_properties
        names = ("private_segment_buffer", "dispatch_ptr", "queue_ptr", "kernarg_segment_ptr", "dispatch_id")
        flags = {n: bool(p >> i & 1) for i, n in enumerate(names)}
        flags["flat_scratch_init"] = bool(p >> 5 & 1)
        flags["private_segment_size"] = bool(p >> 6 & 1)
        return flags

    @property
    def uses_dynamic_stack(self) -> bool:
        return bool(self.kernel_code_properties >> 11 & 1)

    @property
    def wave32(self) -> bool:
        return bool(self.kernel_code_properties >> 10 & 1)


@dataclass(frozen=True)
class CodeObject:
    """A parsed code object: its loadable image (one bytes blob from vaddr 0), symbols and target."""

    image: bytes
    symbols: dict[str, int]
    mach: str

    def kernel(self, name: str) -> tuple[int, KernelDescriptor]:
        """(code entry offset in the image, descriptor) of kernel `name`."""
        kd_name = f"{name}.kd"
        if kd_name not in self.symbols:
            kernels = sorted(s[:-3] for s in self.symbols if s.endswith(".kd"))
            raise CodeObjectError(f"finding kernel {name!r}", f"no symbol {kd_name!r}; the code object has {kernels}")
        kd_addr = self.symbols[kd_name]
        kd = KernelDescriptor.from_bytes(self.image[kd_addr : kd_addr + KD_SIZE])
        entry = kd_addr + kd.kernel_code_entry_byte_offset
        if not 0 <= entry < len(self.image):
            raise CodeObjectError(f"locating the code of {name!r}", f"entry {entry:#x} is outside the image")
        return entry, kd


def parse_code_object(blob: bytes) -> CodeObject:
    """Parse an HSA code object; CodeObjectError says what is wrong with a corrupt or foreign one."""
    op = "parsing the code object"
    if len(blob) < 64 or blob[:4] != b"\x7fELF":
        raise CodeObjectError(op, "not an ELF file (bad magic or shorter than an ELF header)")
    if blob[4] != 2 or blob[5] != 1:
        raise CodeObjectError(op, "not a little-endian ELF64 file")
    (e_machine,) = struct.unpack_from("<H", blob, 18)
    (e_phoff, e_shoff, e_flags) = struct.unpack_from("<QQI", blob, 32)
    (e_phentsize, e_phnum, e_shentsize, e_shnum) = struct.unpack_from("<HHHH", blob, 54)
    if e_machine != EM_AMDGPU:
        raise CodeObjectError(op, f"e_machine {e_machine}, an AMDGPU code object has {EM_AMDGPU}")
    mach = MACH_NAMES.get(e_flags & EF_AMDGPU_MACH)
    if mach is None:
        raise CodeObjectError(op, f"target e_flags {e_flags:#x} is not a gfx11 (RDNA3) target this emulator runs")
    segments = [_unpack(blob, "<IIQQQQQQ", e_phoff + i * e_phentsize, op) for i in range(e_phnum)]
    loads = [s for s in segments if s[0] == PT_LOAD]
    if not loads:
        raise CodeObjectError(op, "no loadable segment: link the object into a shared object first")
    size = max(s[3] + s[6] for s in loads)  # p_vaddr + p_memsz
    if size > 1 << 30:
        raise CodeObjectError(op, f"a loadable segment ends at {size:#x}, beyond any plausible code object")
    image = bytearray(size)
    for _, _, off, vaddr, _, filesz, _, _ in loads:
        if off + filesz > len(blob):
            raise CodeObjectError(op, f"a segment's file range [{off:#x}, {off + filesz:#x}) is past the end")
        image[vaddr : vaddr + filesz] = blob[off : off + filesz]
    sections = [_unpack(blob, "<IIQQQQIIQQ", e_shoff + i * e_shentsize, op) for i in range(e_shnum)]
    symbols: dict[str, int] = {}
    for sh in sections:
        if sh[1] not in (SHT_SYMTAB, SHT_DYNSYM):
            continue
        if sh[6] >= len(sections):
            raise CodeObjectError(op, f"a symbol table links to section {sh[6]}, which does not exist")
        strtab = sections[sh[6]]
        names = blob[strtab[4] : strtab[4] + strtab[5]]
        for k in range(sh[5] // 24):
            st_name, _, _, _, st_value, _ = _unpack(blob, "<IBBHQQ", sh[4] + k * 24, op)
            end = names.find(b"\0", st_name)
            if st_name and end > st_name:
                symbols[names[st_name:end].decode("utf-8", "replace")] = st_value
    return CodeObject(bytes(image), symbols, mach)


def _unpack(blob: bytes, fmt: str, offset: int, op: str) -> tuple[int, ...]:
    if offset < 0 or offset + struct.calcsize(fmt) > len(blob):
        raise CodeObjectError(op, f"a header at {offset:#x} runs past the end of the {len(blob)}-byte file")
    return struct.unpack_from(fmt, blob, offset)
