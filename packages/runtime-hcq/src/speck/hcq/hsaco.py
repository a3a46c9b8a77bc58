"""HSA code objects read back: what a loader and an AMD GPU's command processor need from the ELF shared objects
speck.codegen's AMD backend writes (speck.codegen.compiler.code_object), or any AMDGPU code object v4-v6.

    co = parse_code_object(lib, name="E_4")
    k = co.kernels["E_4"]              # or co.kernel("E_4"): a named error when it is missing
    k.code                              # the kernel's machine code (from its entry point to its symbol's end)
    k.code_address                      # where that code sits in co.image (the PT_LOAD segments at their addresses)
    k.descriptor.vgpr_count, k.descriptor.user_sgprs(), k.descriptor.group_segment_fixed_size  # what dispatch reads
    k.args, k.kernarg_segment_size, k.wavefront_size   # from the NT_AMDGPU_METADATA note (msgpack)

The ELF structure is read by speck.hcq.elf's parser (every header, table and entry bounds-checked); this module adds
the program headers, the metadata note (a small msgpack decoder: the runtime needs no msgpack package) and the
64-byte kernel descriptors, whose fields are laid out in LLVM's AMDGPU documentation ("Kernel Descriptor",
COMPUTE_PGM_RSRC1/2/3 for GFX10-GFX11). Nothing read is trusted: a truncated, corrupt or foreign object raises
CodeObjectError naming the object, the place and what was expected, never a struct.error or IndexError."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from speck.hcq.elf import EM_AMDGPU, ET_DYN, SHT_DYNSYM, SHT_NOTE, ElfKind, ElfObject, parse_elf
from speck.hcq.errors import CodeObjectError

ELFOSABI_AMDGPU_HSA = 64
# EI_ABIVERSION -> code object version (AMDGPU usage: ELFABIVERSION_AMDGPU_HSA_V4..V6)
CODE_OBJECT_VERSIONS = {2: 4, 3: 5, 4: 6}
NT_AMDGPU_METADATA = 32
KERNEL_DESCRIPTOR_SIZE = 64
PT_LOAD, PF_X = 1, 1
MAX_IMAGE = 64 << 20  # a code object's loaded image larger than this is refused (a damaged segment size)
# EF_AMDGPU_MACH (e_flags & 0xff) of the RDNA targets this reader decodes descriptors for
MACHS = {0x41: "gfx1100", 0x46: "gfx1101", 0x47: "gfx1102", 0x44: "gfx1103", 0x43: "gfx1150", 0x4A: "gfx1151"}
EF_AMDGPU_MACH = 0xFF
EF_AMDGPU_FEATURE_XNACK_V4, EF_AMDGPU_FEATURE_SRAMECC_V4 = 0x300, 0xC00
_FEATURE_STATES = {0: "unsupported", 1: "any", 2: "off", 3: "on"}

R_AMDGPU = {0: "NONE", 1: "ABS32_LO", 2: "ABS32_HI", 3: "ABS64", 4: "REL32", 5: "REL64", 6: "ABS32", 7: "GOTPCREL",
            10: "REL32_LO", 11: "REL32_HI", 13: "RELATIVE64", 14: "REL16"}  # fmt: skip
AMDGPU_CODE_OBJECT = ElfKind(
    machine=EM_AMDGPU,
    machine_name="AMDGPU",
    file_type=ET_DYN,
    file_type_name="an HSA code object (a shared object, ET_DYN=3)",
    file_type_advice="; link AMDGPU relocatable objects first (speck.codegen.compiler.code_object)",
    symtab_type=SHT_DYNSYM,
    relocations=R_AMDGPU,
    prefix="R_AMDGPU_",
)
_PHDR = struct.Struct("<IIQQQQQQ")
_KD = struct.Struct("<IIIIq20sIIIHH4s")


def _bits(v: int, lo: int, n: int) -> int:
    return (v >> lo) & ((1 << n) - 1)


@dataclass(frozen=True)
class KernelDescriptor:
    """The 64-byte kernel descriptor (`<kernel>.kd`), raw fields and their decoded meaning (GFX10-GFX11 layout).

    Raw: group_segment_fixed_size (LDS bytes), private_segment_fixed_size (scratch bytes per work-item),
    kernarg_size (bytes of kernel arguments), kernel_code_entry_byte_offset (from the descriptor to the code),
    compute_pgm_rsrc1/2/3 (the SPI registers dispatch programs), kernel_code_properties (which user SGPRs the
    dispatch initialises, wave32), kernarg_preload."""

    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    kernel_code_entry_byte_offset: int
    compute_pgm_rsrc3: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc2: int
    kernel_code_properties: int
    kernarg_preload: int

    @staticmethod
    def from_bytes(b: bytes, where: str = "kernel descriptor") -> KernelDescriptor:
        if len(b) != KERNEL_DESCRIPTOR_SIZE:
            raise CodeObjectError(f"{where}: expected {KERNEL_DESCRIPTOR_SIZE} bytes, got {len(b)}")
        (lds, priv, kernarg, _, entry, _, r3, r1, r2, props, preload, _) = _KD.unpack(b)
        return KernelDescriptor(lds, priv, kernarg, entry, r3, r1, r2, props, preload)

    # ---- COMPUTE_PGM_RSRC1 ----
    @property
    def wavefront_size32(self) -> bool:
        return bool(_bits(self.kernel_code_properties, 10, 1))

    @property
    def granulated_workitem_vgpr_count(self) -> int:
        return _bits(self.compute_pgm_rsrc1, 0, 6)

    @property
    def vgpr_count(self) -> int:
        """VGPRs allocated per work-item: (granulated + 1) * granule, granule 8 in wave32 and 4 in wave64."""
        return (self.granulated_workitem_vgpr_count + 1) * (8 if self.wavefront_size32 else 4)

    @property
    def granulated_wavefront_sgpr_count(self) -> int:
        """Reserved (0) on GFX10+, where every wave gets the full SGPR file; the metadata has `.sgpr_count`."""
        return _bits(self.compute_pgm_rsrc1, 6, 4)

    @property
    def float_round_mode_32(self) -> int:
        return _bits(self.compute_pgm_rsrc1, 12, 2)

    @property
    def float_round_mode_16_64(self) -> int:
        return _bits(self.compute_pgm_rsrc1, 14, 2)

    @property
    def float_denorm_mode_32(self) -> int:
        """3: denormals flushed neither on input nor on output (IEEE)."""
        return _bits(self.compute_pgm_rsrc1, 16, 2)

    @property
    def float_denorm_mode_16_64(self) -> int:
        return _bits(self.compute_pgm_rsrc1, 18, 2)

    @property
    def dx10_clamp(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 21, 1))

    @property
    def ieee_mode(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 23, 1))

    @property
    def fp16_overflow(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 26, 1))

    @property
    def workgroup_processor_mode(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 29, 1))

    @property
    def memory_ordered(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 30, 1))

    @property
    def forward_progress(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc1, 31, 1))

    # ---- COMPUTE_PGM_RSRC2 ----
    @property
    def enable_private_segment(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc2, 0, 1))

    @property
    def user_sgpr_count(self) -> int:
        """SGPRs s0.. the dispatch fills before the system SGPRs (workgroup ids) follow."""
        return _bits(self.compute_pgm_rsrc2, 1, 5)

    @property
    def enable_trap_handler(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc2, 6, 1))

    @property
    def workgroup_id_enabled(self) -> tuple[bool, bool, bool]:
        """Whether the workgroup id x, y, z are written to system SGPRs (in that order, after the user SGPRs)."""
        return tuple(bool(_bits(self.compute_pgm_rsrc2, 7 + d, 1)) for d in range(3))  # type: ignore[return-value]

    @property
    def enable_workgroup_info(self) -> bool:
        return bool(_bits(self.compute_pgm_rsrc2, 10, 1))

    @property
    def workitem_id_dims(self) -> int:
        """How many work-item ids v0 carries: 1 (x), 2 (x, y) or 3 (x, y, z), packed 10 bits each in v0 on GFX11."""
        return _bits(self.compute_pgm_rsrc2, 11, 2) + 1

    @property
    def granulated_lds_size(self) -> int:
        return _bits(self.compute_pgm_rsrc2, 15, 9)

    @property
    def exception_enables(self) -> int:
        return _bits(self.compute_pgm_rsrc2, 24, 7)

    # ---- COMPUTE_PGM_RSRC3 (GFX11) ----
    @property
    def shared_vgpr_count(self) -> int:
        return _bits(self.compute_pgm_rsrc3, 0, 4)

    @property
    def inst_pref_size(self) -> int:
        return _bits(self.compute_pgm_rsrc3, 4, 6)

    # ---- kernel_code_properties ----
    @property
    def uses_dynamic_stack(self) -> bool:
        return bool(_bits(self.kernel_code_properties, 11, 1))

    def user_sgprs(self) -> list[tuple[str, int]]:
        """The user SGPRs the dispatch initialises, in register order from s0, with their sizes in SGPRs (the
        kernel_code_properties ENABLE_SGPR_* bits, in the order the hardware fills them)."""
        return [(nm, n) for bit, nm, n in _USER_SGPRS if _bits(self.kernel_code_properties, bit, 1)]


# ENABLE_SGPR_* bits of kernel_code_properties: (bit, what the SGPRs hold, how many), in register order
_USER_SGPRS = (
    (0, "private_segment_buffer", 4),
    (1, "dispatch_ptr", 2),
    (2, "queue_ptr", 2),
    (3, "kernarg_segment_ptr", 2),
    (4, "dispatch_id", 2),
    (5, "flat_scratch_init", 2),
    (6, "private_segment_size", 1),
)


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument from the metadata's `.args`: where it sits in the kernarg segment and what it is."""

    offset: int
    size: int
    value_kind: str  # "global_buffer", "by_value", "hidden_*"...
    name: str = ""
    address_space: str = ""
    access: str = ""


@dataclass(frozen=True)
class Kernel:
    """One kernel of a code object: its entry (code_address, in the image), its code, its descriptor and its
    metadata (the raw map in `metadata`, the fields a dispatch needs as attributes)."""

    name: str
    descriptor_address: int
    code_address: int
    code: bytes
    descriptor: KernelDescriptor
    args: tuple[KernelArg, ...]
    kernarg_segment_size: int
    kernarg_segment_align: int
    wavefront_size: int
    sgpr_count: int
    vgpr_count: int
    group_segment_fixed_size: int
    private_segment_fixed_size: int
    max_flat_workgroup_size: int
    reqd_workgroup_size: tuple[int, ...] | None
    metadata: dict[str, Any] = field(repr=False)


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD segment: where it goes in the image, its size there and in the file, and whether it is code."""

    address: int
    memory_size: int
    offset: int
    file_size: int
    executable: bool


@dataclass(frozen=True)
class CodeObject:
    """A parsed code object: the loadable image (every PT_LOAD segment at its address, zero-filled between and
    beyond file contents), its segments, the target (`arch` from e_flags, xnack/sramecc states), the code object
    version, the whole metadata map and the kernels by name."""

    image: bytes
    segments: tuple[Segment, ...]
    e_flags: int
    arch: str
    xnack: str
    sramecc: str
    version: int
    metadata: dict[str, Any] = field(repr=False)
    kernels: dict[str, Kernel] = field(default_factory=dict)
    label: str = "code object"

    def kernel(self, name: str) -> Kernel:
        """The kernel called `name`; CodeObjectError listing the object's kernels otherwise."""
        if name not in self.kernels:
            raise CodeObjectError(f"{self.label}: no kernel {name!r}; it has {sorted(self.kernels)}")
        return self.kernels[name]


# ---------------------------------------------------------------------------------------------------------------------
# msgpack (the subset AMDGPU metadata uses: maps, arrays, strings, ints, bools, nil, floats, binary)
class _Unpacker:
    MAX_DEPTH = 32

    def __init__(self, data: bytes, fail: Callable[[str], NoReturn]) -> None:
        self.data, self.pos, self.fail = data, 0, fail

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            self.fail(f"truncated: {n} bytes needed at offset {self.pos}, {len(self.data) - self.pos} left")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return b

    def uint(self, n: int) -> int:
        return int.from_bytes(self.take(n), "big")

    def value(self, depth: int = 0) -> Any:
        if depth > self.MAX_DEPTH:
            self.fail(f"nested more than {self.MAX_DEPTH} deep at offset {self.pos}")
        t = self.uint(1)
        if t <= 0x7F:
            return t
        if t >= 0xE0:
            return t - 0x100
        if 0x80 <= t <= 0x8F:
            return self.map(t & 0x0F, depth)
        if 0x90 <= t <= 0x9F:
            return [self.value(depth + 1) for _ in range(t & 0x0F)]
        if 0xA0 <= t <= 0xBF:
            return self.str(t & 0x1F)
        simple: dict[int, Any] = {0xC0: None, 0xC2: False, 0xC3: True}
        if t in simple:
            return simple[t]
        if t in (0xC4, 0xC5, 0xC6):
            return self.take(self.uint(1 << (t - 0xC4)))
        if t in (0xCA, 0xCB):
            return struct.unpack(">f" if t == 0xCA else ">d", self.take(4 if t == 0xCA else 8))[0]
        if 0xCC <= t <= 0xCF:
            return self.uint(1 << (t - 0xCC))
        if 0xD0 <= t <= 0xD3:
            return int.from_bytes(self.take(1 << (t - 0xD0)), "big", signed=True)
        if t in (0xD9, 0xDA, 0xDB):
            return self.str(self.uint(1 << (t - 0xD9)))
        if t in (0xDC, 0xDD):
            return [self.value(depth + 1) for _ in range(self.uint(2 if t == 0xDC else 4))]
        if t in (0xDE, 0xDF):
            return self.map(self.uint(2 if t == 0xDE else 4), depth)
        self.fail(f"unsupported type byte {t:#04x} at offset {self.pos - 1}")

    def str(self, n: int) -> str:
        raw = self.take(n)
        try:
            return raw.decode()
        except UnicodeDecodeError:
            self.fail(f"a string at offset {self.pos - n} is not UTF-8")

    def map(self, n: int, depth: int) -> dict[Any, Any]:
        out: dict[Any, Any] = {}
        for _ in range(n):
            k = self.value(depth + 1)
            if isinstance(k, (dict, list)):
                self.fail(f"a map key at offset {self.pos} is a {type(k).__name__}")
            out[k] = self.value(depth + 1)
        return out


def unpack_msgpack(data: bytes, what: str = "msgpack") -> Any:
    """Decode one msgpack value that fills `data` exactly; CodeObjectError (naming `what`) when it is malformed."""

    def fail(msg: str) -> NoReturn:
        raise CodeObjectError(f"{what}: {msg}")

    u = _Unpacker(bytes(data), fail)
    v = u.value()
    if u.pos != len(u.data):
        fail(f"{len(u.data) - u.pos} bytes follow the value (it ends at offset {u.pos})")
    return v


# ---------------------------------------------------------------------------------------------------------------------
def _segments(obj: ElfObject) -> list[Segment]:
    data = obj.data
    e_phoff, e_phentsize, e_phnum = struct.unpack_from("<Q", data, 32)[0], *struct.unpack_from("<HH", data, 54)
    if e_phnum == 0:
        obj.fail("no program headers: a code object's segments say where its code and descriptors are loaded")
    if e_phentsize != _PHDR.size:
        obj.fail(f"e_phentsize (offset 0x36) is {e_phentsize}, expected {_PHDR.size}")
    if e_phoff + e_phnum * _PHDR.size > len(data):
        obj.fail(f"the program header table ({e_phnum} entries at {e_phoff:#x}) runs past the end of the file "
                 f"({len(data):#x} bytes); is it truncated?")  # fmt: skip
    out = []
    for i in range(e_phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = _PHDR.unpack_from(data, e_phoff + i * _PHDR.size)
        if p_type != PT_LOAD:
            continue
        where = f"program header #{i} (PT_LOAD at {e_phoff + i * _PHDR.size:#x})"
        if p_offset + p_filesz > len(data):
            obj.fail(f"{where}: file bytes [{p_offset:#x}, {p_offset + p_filesz:#x}) run past the end of the file "
                     f"({len(data):#x}); is it truncated?")  # fmt: skip
        if p_filesz > p_memsz or p_vaddr + p_memsz > MAX_IMAGE:
            obj.fail(f"{where}: {p_filesz:#x} file bytes, {p_memsz:#x} in memory at {p_vaddr:#x}; expected the file "
                     f"part to fit the memory part and the image to stay under {MAX_IMAGE >> 20} MiB")  # fmt: skip
        out.append(Segment(p_vaddr, p_memsz, p_offset, p_filesz, bool(p_flags & PF_X)))
    if not out:
        obj.fail("no PT_LOAD segment: nothing to load")
    spans = sorted((s.address, s.address + s.memory_size) for s in out)
    for (_, end), (start, _) in zip(spans, spans[1:]):
        if start < end:
            obj.fail(f"PT_LOAD segments overlap at {start:#x}")
    return out


def _notes(obj: ElfObject) -> list[tuple[str, int, bytes]]:
    """(owner, type, descriptor) of every note in the SHT_NOTE sections."""
    out = []
    for s in obj.sections:
        if s.type != SHT_NOTE:
            continue
        b, pos = obj.section_bytes(s), 0
        while pos < len(b):
            if pos + 12 > len(b):
                obj.fail(f"section {s.name}: a note header at offset {pos:#x} is cut off ({len(b) - pos} bytes left)")
            namesz, descsz, ntype = struct.unpack_from("<III", b, pos)
            name_end = pos + 12 + namesz
            desc_at = name_end + (-namesz % 4)
            end = desc_at + descsz
            if end > len(b):
                obj.fail(f"section {s.name}: the note at offset {pos:#x} (name {namesz} bytes, descriptor {descsz} "
                         f"bytes) runs past the section's end ({len(b):#x})")  # fmt: skip
            owner = b[pos + 12 : name_end].rstrip(b"\0").decode(errors="replace")
            out.append((owner, ntype, b[desc_at:end]))
            pos = end + (-descsz % 4)
    return out


def _field(obj: ElfObject, md: dict[str, Any], key: str, kind: type | tuple[type, ...], where: str,
           default: Any = ...) -> Any:  # fmt: skip
    if key not in md:
        if default is not ...:
            return default
        obj.fail(f"{where}: the metadata has no {key} field")
    v = md[key]
    if not isinstance(v, kind) or (kind is int and isinstance(v, bool)):
        obj.fail(f"{where}: metadata field {key} is {v!r}, expected {getattr(kind, '__name__', kind)}")
    return v


def _arg(obj: ElfObject, a: Any, where: str) -> KernelArg:
    if not isinstance(a, dict):
        obj.fail(f"{where}: expected a map, got {type(a).__name__}")
    off, size = _field(obj, a, ".offset", int, where), _field(obj, a, ".size", int, where)
    if off < 0 or size < 0:
        obj.fail(f"{where}: negative offset {off} or size {size}")
    access = _field(obj, a, ".actual_access", str, where, _field(obj, a, ".access", str, where, ""))
    name, space = _field(obj, a, ".name", str, where, ""), _field(obj, a, ".address_space", str, where, "")
    return KernelArg(off, size, _field(obj, a, ".value_kind", str, where), name, space, access)


def parse_code_object(data: bytes, name: str = "") -> CodeObject:
    """Parse an HSA code object (module docstring). `name` (the kernel or cache key) names it in errors; anything
    malformed raises CodeObjectError saying where and what was expected."""
    obj = parse_elf(data, name, AMDGPU_CODE_OBJECT, CodeObjectError)
    label = obj.label.replace("ELF object", "code object")
    obj.label = label
    if obj.data[7] != ELFOSABI_AMDGPU_HSA:
        obj.fail(f"EI_OSABI (offset 0x7) is {obj.data[7]}, expected {ELFOSABI_AMDGPU_HSA} (ELFOSABI_AMDGPU_HSA)")
    version = CODE_OBJECT_VERSIONS.get(obj.data[8])
    if version is None:
        obj.fail(f"EI_ABIVERSION (offset 0x8) is {obj.data[8]}; expected one of {sorted(CODE_OBJECT_VERSIONS)} "
                 "(code object v4-v6)")  # fmt: skip
    if relocs := [(s, r) for s, rs in obj.relocations.items() for r in rs]:
        obj.fail(f"{len(relocs)} dynamic relocation(s) (the first: R_AMDGPU_{relocs[0][1].kind} in "
                 f"{obj.sections[relocs[0][0]].name}); speck loads code objects without a dynamic linker")  # fmt: skip
    e_flags = struct.unpack_from("<I", obj.data, 48)[0]
    arch = MACHS.get(e_flags & EF_AMDGPU_MACH)
    if arch is None:
        obj.fail(f"e_flags (offset 0x30) is {e_flags:#x}: EF_AMDGPU_MACH {e_flags & EF_AMDGPU_MACH:#x} is not an RDNA3 "
                 f"target speck reads ({', '.join(f'{m:#x} {a}' for m, a in MACHS.items())})")  # fmt: skip
    segments = _segments(obj)
    image = bytearray(max(s.address + s.memory_size for s in segments))
    for s in segments:
        image[s.address : s.address + s.file_size] = obj.data[s.offset : s.offset + s.file_size]
    notes = [d for owner, t, d in _notes(obj) if owner == "AMDGPU" and t == NT_AMDGPU_METADATA]
    if len(notes) != 1:
        obj.fail(f"expected one AMDGPU metadata note (owner 'AMDGPU', type {NT_AMDGPU_METADATA}), found {len(notes)}")
    metadata = unpack_msgpack(notes[0], f"{label}: the metadata note")
    if not isinstance(metadata, dict):
        obj.fail(f"the metadata note holds a {type(metadata).__name__}, expected a map")
    kernels: dict[str, Kernel] = {}
    syms = {s.name: s for s in obj.symbols if s.name}
    for i, md in enumerate(_field(obj, metadata, "amdhsa.kernels", list, "the metadata")):
        where = f"kernel #{i} of the metadata"
        if not isinstance(md, dict):
            obj.fail(f"{where}: expected a map, got {type(md).__name__}")
        kname, ksym = _field(obj, md, ".name", str, where), _field(obj, md, ".symbol", str, where)
        where = f"kernel {kname!r}"
        kernels[kname] = _kernel(obj, md, kname, ksym, syms, segments, bytes(image), where)
    return CodeObject(bytes(image), tuple(segments), e_flags, arch,
                      _FEATURE_STATES[(e_flags & EF_AMDGPU_FEATURE_XNACK_V4) >> 8],
                      _FEATURE_STATES[(e_flags & EF_AMDGPU_FEATURE_SRAMECC_V4) >> 10], version, metadata, kernels,
                      label)  # fmt: skip


def _kernel(obj: ElfObject, md: dict[str, Any], kname: str, ksym: str, syms: dict[str, Any], segments: list[Segment],
            image: bytes, where: str) -> Kernel:  # fmt: skip
    kd_sym = syms.get(ksym)
    if kd_sym is None:
        obj.fail(f"{where}: its descriptor symbol {ksym!r} is not in the dynamic symbol table")
    kd_at = kd_sym.value
    if kd_sym.size != KERNEL_DESCRIPTOR_SIZE or not any(
        s.address <= kd_at and kd_at + KERNEL_DESCRIPTOR_SIZE <= s.address + s.file_size for s in segments
    ):
        obj.fail(f"{where}: descriptor {ksym!r} at {kd_at:#x} ({kd_sym.size} bytes) is not {KERNEL_DESCRIPTOR_SIZE} "
                 "bytes inside a loaded segment")  # fmt: skip
    kd = KernelDescriptor.from_bytes(image[kd_at : kd_at + KERNEL_DESCRIPTOR_SIZE], f"{obj.label}: {where}")
    entry = kd_at + kd.kernel_code_entry_byte_offset
    seg = next((s for s in segments if s.executable and s.address <= entry < s.address + s.file_size), None)
    if seg is None or entry % 256:
        obj.fail(f"{where}: kernel_code_entry_byte_offset {kd.kernel_code_entry_byte_offset:#x} puts the entry at "
                 f"{entry:#x}, which is not a 256-byte aligned address in an executable segment")  # fmt: skip
    fn = syms.get(kname)
    end = entry + fn.size if fn is not None and fn.value == entry and fn.size else seg.address + seg.file_size
    if end > seg.address + seg.file_size:
        obj.fail(f"{where}: its code [{entry:#x}, {end:#x}) runs past its segment's end")
    args = tuple(_arg(obj, a, f"{where}, argument #{j}") for j, a in enumerate(_field(obj, md, ".args", list, where,
                                                                                      [])))  # fmt: skip
    kernarg = _field(obj, md, ".kernarg_segment_size", int, where)
    lds = _field(obj, md, ".group_segment_fixed_size", int, where)
    for a in args:
        if a.offset + a.size > kernarg:
            obj.fail(f"{where}: argument {a.name or a.value_kind!r} at [{a.offset}, {a.offset + a.size}) lies outside "
                     f"the {kernarg}-byte kernarg segment")  # fmt: skip
    if kernarg != kd.kernarg_size or lds != kd.group_segment_fixed_size:
        obj.fail(f"{where}: the metadata says {kernarg} kernarg bytes and {lds} LDS bytes, the descriptor "
                 f"{kd.kernarg_size} and {kd.group_segment_fixed_size}")  # fmt: skip
    wave = _field(obj, md, ".wavefront_size", int, where)
    if wave != (32 if kd.wavefront_size32 else 64):
        obj.fail(f"{where}: the metadata's .wavefront_size {wave} disagrees with the descriptor's wave32 bit")
    reqd = _field(obj, md, ".reqd_workgroup_size", list, where, None)
    if reqd is not None and (len(reqd) != 3 or not all(isinstance(x, int) and x > 0 for x in reqd)):
        obj.fail(f"{where}: .reqd_workgroup_size is {reqd!r}, expected three positive ints")
    return Kernel(name=kname, descriptor_address=kd_at, code_address=entry, code=image[entry:end], descriptor=kd,
                  args=args, kernarg_segment_size=kernarg,
                  kernarg_segment_align=_field(obj, md, ".kernarg_segment_align", int, where), wavefront_size=wave,
                  sgpr_count=_field(obj, md, ".sgpr_count", int, where),
                  vgpr_count=_field(obj, md, ".vgpr_count", int, where), group_segment_fixed_size=lds,
                  private_segment_fixed_size=_field(obj, md, ".private_segment_fixed_size", int, where),
                  max_flat_workgroup_size=_field(obj, md, ".max_flat_workgroup_size", int, where, 1024),
                  reqd_workgroup_size=tuple(reqd) if reqd is not None else None, metadata=md)  # fmt: skip


__all__ = [
    "AMDGPU_CODE_OBJECT",
    "CodeObject",
    "CodeObjectError",
    "Kernel",
    "KernelArg",
    "KernelDescriptor",
    "Segment",
    "parse_code_object",
    "unpack_msgpack",
]
