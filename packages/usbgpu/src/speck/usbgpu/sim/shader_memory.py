"""The memory the RDNA3 shader core sees during a dispatch: GPU virtual addresses of the dispatching queue's VM,
translated through the GFX hub's page tables (sim/vm.py) to VRAM or, through the system aperture, to the bridge.

Implements the emulator's lane-vectorized protocol (gather/scatter of N lanes at 64-bit addresses, byte read/write):
lanes are translated per distinct 4 KiB page, VRAM is read and written in place through numpy views of the model's
VRAM pages, and a translation fault is latched like any other (fault registers, UTCL2 interrupt) and raised to the
emulator as its ShaderMemoryFault, which stops the dispatch the way the hardware's page fault stops the queue.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from speck.usbgpu import errors
from speck.usbgpu.errors import SimNotImplementedError
from speck.usbgpu.sim.memory import VRAM_PAGE_BITS
from speck.usbgpu.sim.vm import VRAM, VmFault

if TYPE_CHECKING:
    from speck.usbgpu.sim.gpu_services import GpuServices

_PAGE_BITS = 12
_VPAGE = 1 << VRAM_PAGE_BITS


class ShaderMemory:
    """A dispatch's view of memory in VM `vmid`; `fault` holds the translation fault that stopped it, if any."""

    def __init__(self, gpu: GpuServices, vmid: int) -> None:
        self.gpu, self.vmid = gpu, vmid
        self.fault: VmFault | None = None

    # --- faults ---
    def _raise(self, fault: VmFault, size: int) -> None:
        self.fault = fault
        self.gpu.report_vm_fault(fault, client="TCP")
        shader_fault: Any = getattr(errors, "ShaderMemoryFault", None)
        if shader_fault is None:  # an emulator without its own fault type: the VM fault itself stops it
            raise fault
        raise shader_fault("(page fault)", address=fault.va, size=size, space="global", region=fault.reason)

    # --- translation ---
    def _physical(self, addresses: np.ndarray, size: int, write: bool) -> tuple[np.ndarray, np.ndarray]:
        """(VRAM offsets, mask of lanes in system memory) of `addresses`. Fast path: when the whole span the lanes
        touch lies in the page (4 KiB or 2 MiB) that holds its first byte, one translation serves every lane - what
        the per-page path would give, without its sort; otherwise (or on a fault, to name the faulting lane) that
        path runs."""
        if len(addresses):
            lo, hi = int(addresses.min()), int(addresses.max()) + size
            try:
                space, base, left = self.gpu.vm.translate(self.vmid, lo, write)
            except VmFault:
                pass  # (the per-page path below finds the faulting lane and reports it)
            else:
                if hi - lo <= left:
                    return addresses - np.uint64(lo) + np.uint64(base), np.full(len(addresses), space != VRAM)
        return self._physical_pages(addresses, size, write)

    def _physical_pages(self, addresses: np.ndarray, size: int, write: bool) -> tuple[np.ndarray, np.ndarray]:
        """_physical lane by distinct 4 KiB page; lanes whose access crosses a page are translated at both ends and
        must stay contiguous."""
        pages = addresses >> np.uint64(_PAGE_BITS)
        unique, inverse = np.unique(pages, return_inverse=True)
        bases = np.empty(len(unique), dtype=np.uint64)
        system = np.zeros(len(unique), dtype=bool)
        for i, page in enumerate(unique.tolist()):
            va = page << _PAGE_BITS
            try:
                space, base, _ = self.gpu.vm.translate(self.vmid, va, write)
            except VmFault as fault:
                lane = int(np.argmax(pages == np.uint64(page)))
                self._raise(VmFault(fault.vmid, int(addresses[lane]), fault.write, fault.reason), size)
            bases[i] = base
            system[i] = space != VRAM
        phys = bases[inverse] + (addresses & np.uint64((1 << _PAGE_BITS) - 1))
        ends = (addresses & np.uint64((1 << _PAGE_BITS) - 1)) + np.uint64(size)
        for lane in np.nonzero(ends > np.uint64(1 << _PAGE_BITS))[0].tolist():  # crosses into the next page
            va = int(addresses[lane])
            last = va + size - 1
            try:
                space, end_phys, _ = self.gpu.vm.translate(self.vmid, last, write)
            except VmFault as fault:
                self._raise(VmFault(fault.vmid, last, fault.write, fault.reason), size)
            if (space != VRAM) != bool(system[inverse[lane]]) or end_phys != int(phys[lane]) + size - 1:
                raise SimNotImplementedError(f"a {size}-byte access at {va:#x} spans physically discontiguous pages")
        return phys, system[inverse]

    def _page(self, index: int, create: bool) -> np.ndarray | None:
        buf = self.gpu.vram.page(index, create)
        return None if buf is None else np.frombuffer(buf, dtype=np.uint8)

    # --- the emulator's protocol ---
    def gather(self, addresses: np.ndarray, size: int) -> np.ndarray:
        addresses = np.asarray(addresses, dtype=np.uint64)
        out = np.zeros((len(addresses), size), dtype=np.uint8)
        phys, system = self._physical(addresses, size, write=False)
        for lane in np.nonzero(system)[0].tolist():
            out[lane] = np.frombuffer(self.gpu.host.bus_read(int(phys[lane]), size), dtype=np.uint8)
        self._vram(phys, ~system, size, out, write=False)
        return out

    def scatter(self, addresses: np.ndarray, data: np.ndarray) -> None:
        addresses = np.asarray(addresses, dtype=np.uint64)
        size = data.shape[1]
        phys, system = self._physical(addresses, size, write=True)
        for lane in np.nonzero(system)[0].tolist():
            self.gpu.write_space("system", int(phys[lane]), bytes(data[lane]))
        self._vram(phys, ~system, size, data, write=True)

    def _vram(self, phys: np.ndarray, lanes: np.ndarray, size: int, buf: np.ndarray, write: bool) -> None:
        if not lanes.any():
            return
        offsets = phys[lanes]
        if int(offsets.max()) + size > self.gpu.vram.size:
            raise SimNotImplementedError("a page table entry points past the end of VRAM")
        vpage = offsets >> np.uint64(VRAM_PAGE_BITS)
        lane_index = np.nonzero(lanes)[0]
        first, last = int(vpage.min()), int(vpage.max())
        for index in [first] if first == last else np.unique(vpage).tolist():  # (most accesses: one VRAM page)
            sel = vpage == np.uint64(index)
            within = (offsets[sel] & np.uint64(_VPAGE - 1)).astype(np.int64)
            rows = lane_index[sel]
            crossing = within + size > _VPAGE
            page = self._page(index, create=write)
            if crossing.any():  # the access straddles two VRAM pages: go byte by byte through SparseMemory
                for row, off in zip(rows[crossing].tolist(), offsets[sel][crossing].tolist()):
                    if write:
                        self.gpu.vram.write(int(off), bytes(buf[row]))
                    else:
                        buf[row] = np.frombuffer(self.gpu.vram.read(int(off), size), dtype=np.uint8)
                rows, within = rows[~crossing], within[~crossing]
            if not len(rows):
                continue
            idx = within[:, None] + np.arange(size)
            if write:
                assert page is not None
                page[idx] = buf[rows]
            elif page is not None:
                buf[rows] = page[idx]
        if write:
            lo, hi = int(offsets.min()), int(offsets.max()) + size
            self.gpu.memory_changed(VRAM, lo, hi - lo)

    def read(self, address: int, size: int) -> bytes:
        try:
            return self.gpu.read(self.vmid, address, size)
        except VmFault as fault:
            self._raise(fault, size)
            raise  # unreachable: _raise raises

    def write(self, address: int, data: bytes) -> None:
        try:
            self.gpu.write(self.vmid, address, bytes(data))
        except VmFault as fault:
            self._raise(fault, len(data))
