"""GPU page tables as the driver writes them: GMC v11's four-level tables (PDB2 -> PDB1 -> PDB0 -> PTB, 512 entries of
8 bytes each, 48-bit virtual addresses), VRAM mapped in 2 MiB pages by PDE0 entries with the PTE bit, the bridge's
memory (system pages) in 4 KiB PTEs. Entry formats come from amdgpu_vm.h (speck.usbgpu.amd.tables.CONST).

Tables live in a pool of VRAM the caller reserves and are written through BAR0; entries change in a host copy and
reach VRAM with `flush()`, after which the caller invalidates the GPU's TLB.
"""

from __future__ import annotations

from collections.abc import Callable

from speck.usbgpu.amd.tables import CONST
from speck.usbgpu.errors import UsbGpuValueError, VramAllocError

ENTRIES = 512
TABLE_BYTES = ENTRIES * 8
PAGE = 1 << 12
HUGE = 1 << 21
ADDRESS_MASK = 0x0000_FFFF_FFFF_F000
VA_LIMIT = 1 << 47  # the low half of the 48-bit space (the upper half is the sign-extended hole)
LEVEL_SHIFTS = (39, 30, 21)  # PDB2, PDB1, PDB0; the PTB indexes bits 20:12
PDE_FLAGS = CONST.AMDGPU_PTE_VALID
VRAM_FLAGS = (
    CONST.AMDGPU_PTE_VALID | CONST.AMDGPU_PTE_READABLE | CONST.AMDGPU_PTE_WRITEABLE | CONST.AMDGPU_PTE_EXECUTABLE
)
SYSTEM_FLAGS = (
    CONST.AMDGPU_PTE_VALID
    | CONST.AMDGPU_PTE_SYSTEM
    | CONST.AMDGPU_PTE_SNOOPED
    | CONST.AMDGPU_PTE_READABLE
    | CONST.AMDGPU_PTE_WRITEABLE
)


class PageTables:
    """One VM's tables. `write(vram_offset, data)` stores bytes in VRAM; `vram_base` is what the GPU adds to a VRAM
    offset in a PDE/PTE (the hub's FB_OFFSET: 0 on a discrete card)."""

    def __init__(self, write: Callable[[int, bytes], None], pool: tuple[int, int], vram_base: int = 0) -> None:
        self.write = write
        self.vram_base = vram_base
        self._next, self._end = pool
        self._free: list[int] = []
        self.tables: dict[tuple[int, int], int] = {}  # (level 0..3, va >> (shift + 9)) -> VRAM offset of the table
        self.entries: dict[int, int] = {}  # VRAM offset of an entry -> its value (host copy)
        self._dirty: set[int] = set()
        self.root = self._table(0, 0)

    def _alloc(self) -> int:
        if self._free:
            return self._free.pop()
        if self._next + TABLE_BYTES > self._end:
            raise VramAllocError(
                "page table allocation", f"the {self._end - self._next:#x}-byte page-table pool is used up", ""
            )
        offset = self._next
        self._next += TABLE_BYTES
        return offset

    def _table(self, level: int, key: int) -> int:
        table = self.tables.get((level, key))
        if table is None:
            table = self.tables[(level, key)] = self._alloc()
            self.write(table, bytes(TABLE_BYTES))  # VRAM holds garbage on a real card: clear before linking it
        return table

    def root_pde(self) -> int:
        """The value for GCVM_CONTEXT*_PAGE_TABLE_BASE_ADDR_LO32/HI32."""
        return (self.vram_base + self.root) | PDE_FLAGS

    def _set(self, entry: int, value: int) -> None:
        if self.entries.get(entry, 0) != value:
            self.entries[entry] = value
            self._dirty.add(entry)

    def _pdb0(self, va: int) -> int:
        """The PDB0 table covering `va`, creating PDB1/PDB0 tables (and linking them) as needed."""
        table = self.root
        for level, shift in enumerate(LEVEL_SHIFTS[:2]):
            child_key = va >> shift
            child = self._table(level + 1, child_key)
            self._set(table + 8 * (va >> shift & ENTRIES - 1), (self.vram_base + child) | PDE_FLAGS)
            table = child
        return table

    def map_vram(self, va: int, vram: int, size: int) -> None:
        """Map [va, va + size) to VRAM offsets [vram, vram + size) in 2 MiB pages (all three 2 MiB aligned)."""
        self._check(va, size, HUGE)
        if vram % HUGE:
            raise UsbGpuValueError(f"VRAM offset {vram:#x} is not 2 MiB aligned")
        for off in range(0, size, HUGE):
            pdb0 = self._pdb0(va + off)
            pte = (self.vram_base + vram + off) & ADDRESS_MASK | VRAM_FLAGS | CONST.AMDGPU_PDE_PTE
            self._set(pdb0 + 8 * ((va + off) >> 21 & ENTRIES - 1), pte)

    def map_system(self, va: int, bus: int, size: int) -> None:
        """Map [va, va + size) to PCIe bus addresses [bus, bus + size) in 4 KiB system pages."""
        self._check(va, size, PAGE)
        for off in range(0, size, PAGE):
            pdb0 = self._pdb0(va + off)
            ptb = self._table(3, (va + off) >> 21)
            self._set(pdb0 + 8 * ((va + off) >> 21 & ENTRIES - 1), (self.vram_base + ptb) | PDE_FLAGS)
            self._set(ptb + 8 * ((va + off) >> 12 & ENTRIES - 1), (bus + off) & ADDRESS_MASK | SYSTEM_FLAGS)

    def unmap(self, va: int, size: int) -> None:
        """Invalidate the 2 MiB VRAM pages covering [va, va + size)."""
        self._check(va, size, HUGE)
        for off in range(0, size, HUGE):
            pdb0 = self.tables.get((2, (va + off) >> 30))
            if pdb0 is not None:
                self._set(pdb0 + 8 * ((va + off) >> 21 & ENTRIES - 1), 0)

    @staticmethod
    def _check(va: int, size: int, align: int) -> None:
        if va % align or size % align or size <= 0 or va + size > VA_LIMIT:
            raise UsbGpuValueError(f"mapping [{va:#x}, +{size:#x}) must be {align:#x} aligned and below {VA_LIMIT:#x}")

    def flush(self) -> int:
        """Write the changed entries to VRAM (runs of adjacent entries as one write); returns how many."""
        dirty = sorted(self._dirty)
        self._dirty.clear()
        i = 0
        while i < len(dirty):
            j = i
            while j + 1 < len(dirty) and dirty[j + 1] == dirty[j] + 8:
                j += 1
            data = b"".join(self.entries[e].to_bytes(8, "little") for e in dirty[i : j + 1])
            self.write(dirty[i], data)
            i = j + 1
        return len(dirty)
