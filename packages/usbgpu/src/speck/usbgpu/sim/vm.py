"""GPU virtual memory as the GFX hub (GC 11) translates it: VM context 1's four-level page table that the driver
writes into VRAM (GMC v11 PDE/PTE formats of amdgpu_vm.h), VMID 0's physical framebuffer aperture, a TLB that only
an invalidation request empties, and translation faults latched in GCVM_L2_PROTECTION_FAULT_STATUS/ADDR.

A translation yields (space, address): "vram" (a VRAM offset) or "system" (a PCIe bus address, here the bridge's
memory). A fault raises VmFault for the engine that made the access, which stops its queue and reports it; no
Python exception from the walk ever leaves the model.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from speck.usbgpu.amd.tables import CONST, GC, MMHUB
from speck.usbgpu.sim.regfile import RegisterFile

VRAM, SYSTEM = "vram", "system"
PAGE = 1 << 12
HUGE = 1 << 21  # a PDE0 with the PTE bit maps 2 MiB
LEVEL_BITS = 9
ADDRESS_MASK = 0x0000_FFFF_FFFF_F000  # PDE/PTE address bits 47:12
VA_BITS = 48
DRIVER_VMID = 1  # the one VM context the simulated GFX hub models besides VMID 0 (GCVM_CONTEXT1_*)


@dataclass
class VmFault(Exception):
    """A translation fault: raised to the engine that made the access (never out of the model)."""

    vmid: int
    va: int
    write: bool
    reason: str

    def __str__(self) -> str:
        access = "write" if self.write else "read"
        return f"GPU page fault: {access} of {self.va:#x} in VMID {self.vmid}: {self.reason}"


Translation = tuple[str, int, int, int]  # (space, base address of the page, page size, PTE flags)


class GpuVm:
    """Translation for the GFX hub (`hub="gc"`) or the MM hub (`hub="mm"`, VMID 0 only: the IH and the PSP)."""

    def __init__(self, regs: RegisterFile, read_vram: Callable[[int, int], bytes]) -> None:
        self.regs = regs
        self.read_vram = read_vram
        self.tlb: dict[tuple[int, int, int], Translation] = {}  # (vmid, page size, va // page size)
        self.walks = 0
        self.invalidations = 0
        self.faults: list[VmFault] = []

    # --- the hub's configuration ---
    def fb_offset(self) -> int:
        return self.regs.field(GC.GCMC_VM_FB_OFFSET, "FB_OFFSET") << 24

    def _fb_aperture(self, hub: str) -> tuple[int, int]:
        if hub == "mm":
            base, top = MMHUB.MMMC_VM_FB_LOCATION_BASE, MMHUB.MMMC_VM_FB_LOCATION_TOP
            return self.regs.field(base, "FB_BASE") << 24, (self.regs.field(top, "FB_TOP") << 24) | 0xFFFFFF
        return (
            self.regs.field(GC.GCMC_VM_FB_LOCATION_BASE, "FB_BASE") << 24,
            (self.regs.field(GC.GCMC_VM_FB_LOCATION_TOP, "FB_TOP") << 24) | 0xFFFFFF,
        )

    def invalidate(self, vmid_mask: int) -> None:
        """An invalidation request (GCVM_INVALIDATE_ENG*_REQ): drop the TLB entries of the VMIDs in the mask."""
        self.invalidations += 1
        self.tlb = {k: v for k, v in self.tlb.items() if not vmid_mask >> k[0] & 1}

    # --- translation ---
    def translate(self, vmid: int, va: int, write: bool, hub: str = "gc") -> tuple[str, int, int]:
        """(space, address, bytes left in its page) of GPU virtual address `va`; raises VmFault."""
        for size in (HUGE, PAGE):
            hit = self.tlb.get((vmid, size, va // size))
            if hit is not None:
                space, base, _, flags = hit
                self._check_access(vmid, va, write, flags)
                return space, base + va % size, size - va % size
        space, base, size, flags = self._walk(vmid, va, write, hub)
        if hub == "gc":
            self.tlb[(vmid, size, va // size)] = (space, base, size, flags)
        return space, base + va % size, size - va % size

    def ranges(self, vmid: int, va: int, n: int, write: bool, hub: str = "gc") -> list[tuple[str, int, int]]:
        """The physically contiguous pieces (space, address, length) of [va, va + n)."""
        out: list[tuple[str, int, int]] = []
        pos = 0
        while pos < n:
            space, addr, left = self.translate(vmid, va + pos, write, hub)
            take = min(left, n - pos)
            if out and out[-1][0] == space and out[-1][1] + out[-1][2] == addr:
                out[-1] = (space, out[-1][1], out[-1][2] + take)
            else:
                out.append((space, addr, take))
            pos += take
        return out

    def _fault(self, vmid: int, va: int, write: bool, reason: str) -> VmFault:
        fault = VmFault(vmid, va, write, reason)
        self.faults.append(fault)
        return fault

    def _walk(self, vmid: int, va: int, write: bool, hub: str) -> Translation:
        self.walks += 1
        tlb_cntl = MMHUB.MMMC_VM_MX_L1_TLB_CNTL if hub == "mm" else GC.GCMC_VM_MX_L1_TLB_CNTL
        if not self.regs.field(tlb_cntl, "ENABLE_L1_TLB"):
            raise self._fault(vmid, va, write, f"the L1 TLB is off ({tlb_cntl.name}.ENABLE_L1_TLB=0: GMC not set up)")
        if vmid == 0:
            fb_base, fb_top = self._fb_aperture(hub)
            if fb_base <= va <= fb_top:
                phys = va - fb_base + (self.fb_offset() if hub == "gc" else 0)
                return VRAM, phys - phys % HUGE, HUGE, CONST.AMDGPU_PTE_READABLE | CONST.AMDGPU_PTE_WRITEABLE
            raise self._fault(vmid, va, write, f"outside the framebuffer aperture [{fb_base:#x}, {fb_top:#x}]")
        if vmid != DRIVER_VMID or hub != "gc":
            raise self._fault(vmid, va, write, f"VM context {vmid} is not set up (the model has contexts 0 and 1)")
        if not self.regs.field(GC.GCVM_L2_CNTL, "ENABLE_L2_CACHE"):
            raise self._fault(vmid, va, write, "the VM L2 is off (GCVM_L2_CNTL.ENABLE_L2_CACHE=0: GMC not set up)")
        cntl = self.regs.get(GC.GCVM_CONTEXT1_CNTL)
        if not GC.GCVM_CONTEXT1_CNTL.get(cntl, "ENABLE_CONTEXT"):
            raise self._fault(vmid, va, write, "VM context 1 is disabled (GCVM_CONTEXT1_CNTL.ENABLE_CONTEXT=0)")
        depth = GC.GCVM_CONTEXT1_CNTL.get(cntl, "PAGE_TABLE_DEPTH")
        block = GC.GCVM_CONTEXT1_CNTL.get(cntl, "PAGE_TABLE_BLOCK_SIZE")
        if depth != 3 or block != 0:
            raise self._fault(vmid, va, write, f"page table depth {depth} / block size {block} (modelled: 3 / 0)")
        start = (
            self.regs.get(GC.GCVM_CONTEXT1_PAGE_TABLE_START_ADDR_LO32)
            | (self.regs.get(GC.GCVM_CONTEXT1_PAGE_TABLE_START_ADDR_HI32) & 0xF) << 32
        )
        end = (
            self.regs.get(GC.GCVM_CONTEXT1_PAGE_TABLE_END_ADDR_LO32)
            | (self.regs.get(GC.GCVM_CONTEXT1_PAGE_TABLE_END_ADDR_HI32) & 0xF) << 32
        )
        if not start <= va >> 12 <= end:
            raise self._fault(vmid, va, write, f"outside the VM range of pages [{start:#x}, {end:#x}] (range fault)")
        root = self.regs.get(GC.GCVM_CONTEXT1_PAGE_TABLE_BASE_ADDR_LO32) | (
            self.regs.get(GC.GCVM_CONTEXT1_PAGE_TABLE_BASE_ADDR_HI32) << 32
        )
        if not root & CONST.AMDGPU_PTE_VALID:
            raise self._fault(vmid, va, write, "the page directory base is not valid (GCVM_CONTEXT1_PAGE_TABLE_BASE)")
        table = (root & ADDRESS_MASK) - self.fb_offset()
        for level, shift in (("PDB2", 39), ("PDB1", 30), ("PDB0", 21)):
            entry = self._entry(table, va >> shift & (1 << LEVEL_BITS) - 1)
            if not entry & CONST.AMDGPU_PTE_VALID:
                raise self._fault(vmid, va, write, f"no valid {level} entry (mapping error)")
            if level == "PDB0" and entry & CONST.AMDGPU_PDE_PTE:
                return self._leaf(vmid, va, write, entry, HUGE)
            if entry & CONST.AMDGPU_PTE_SYSTEM:
                raise self._fault(vmid, va, write, f"{level} entry points to system memory (not modelled)")
            table = (entry & ADDRESS_MASK) - self.fb_offset()
        return self._leaf(vmid, va, write, self._entry(table, va >> 12 & (1 << LEVEL_BITS) - 1), PAGE)

    def _entry(self, table: int, index: int) -> int:
        return int.from_bytes(self.read_vram(table + 8 * index, 8), "little")

    def _check_access(self, vmid: int, va: int, write: bool, flags: int) -> None:
        need = CONST.AMDGPU_PTE_WRITEABLE if write else CONST.AMDGPU_PTE_READABLE
        if not flags & need:
            raise self._fault(vmid, va, write, f"the page is not {'writeable' if write else 'readable'} (permission)")

    def _leaf(self, vmid: int, va: int, write: bool, pte: int, size: int) -> Translation:
        if not pte & CONST.AMDGPU_PTE_VALID:
            raise self._fault(vmid, va, write, "no valid PTE (mapping error)")
        self._check_access(vmid, va, write, pte)
        base = pte & ADDRESS_MASK & ~(size - 1)
        if pte & CONST.AMDGPU_PTE_SYSTEM:
            return SYSTEM, base, size, pte
        return VRAM, base - self.fb_offset(), size, pte
