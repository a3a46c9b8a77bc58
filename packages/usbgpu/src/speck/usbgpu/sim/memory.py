"""Backing stores of the simulator: sparse VRAM and the bridge's SRAM / queue pages / xdata with aliased windows."""

from __future__ import annotations

from array import array

from speck.usbgpu.errors import SimAccessError
from speck.usbgpu.sim.config import (
    CQ_PCIE,
    PAGE,
    SECTOR,
    SQ_PCIE,
    SRAM_PCIE,
    SRAM_SIZE,
    XDATA_CQ,
    XDATA_CQ_SIZE,
    XDATA_SQ,
    XDATA_SRAM,
    XDATA_SRAM_SIZE,
)

VRAM_PAGE_BITS = 20  # 1 MiB pages, allocated on first write (gigabytes of VRAM cost nothing until touched)
_VRAM_PAGE = 1 << VRAM_PAGE_BITS


class SparseMemory:
    """Byte-addressable memory of `size` bytes that reads as zero until written; bulk reads/writes span pages."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._pages: dict[int, bytearray] = {}

    def _check(self, addr: int, n: int) -> None:
        if addr < 0 or n < 0 or addr + n > self.size:
            raise SimAccessError(f"access [{addr:#x}, {addr + n:#x}) outside memory of {self.size:#x} bytes")

    def read(self, addr: int, n: int) -> bytes:
        """Return `n` bytes at `addr`."""
        self._check(addr, n)
        out = bytearray(n)
        pos = 0
        while pos < n:
            page, off = divmod(addr + pos, _VRAM_PAGE)
            take = min(n - pos, _VRAM_PAGE - off)
            data = self._pages.get(page)
            if data is not None:
                out[pos : pos + take] = data[off : off + take]
            pos += take
        return bytes(out)

    def page(self, index: int, create: bool) -> bytearray | None:
        """The backing store of page `index` (None if never written, unless `create`)."""
        buf = self._pages.get(index)
        if buf is None and create:
            buf = self._pages[index] = bytearray(_VRAM_PAGE)
        return buf

    def write(self, addr: int, data: bytes | bytearray | memoryview) -> None:
        """Store `data` at `addr`."""
        mv = memoryview(data).cast("B")
        n = len(mv)
        self._check(addr, n)
        pos = 0
        while pos < n:
            page, off = divmod(addr + pos, _VRAM_PAGE)
            take = min(n - pos, _VRAM_PAGE - off)
            buf = self._pages.get(page)
            if buf is None:
                buf = self._pages[page] = bytearray(_VRAM_PAGE)
            buf[off : off + take] = mv[pos : pos + take]
            pos += take


class BridgeMemory:
    """The ASM2464's memories: 512 KiB SRAM, the SQ and CQ pages, and the 64 KiB xdata space that aliases them.

    Every SRAM sector carries a provenance tag (`sector_gen`): the generation of the OUT arm (or other writer) that
    last wrote it. The GPU copy checks compare those tags with the tag of the sentinel it polled, which is how the
    simulator notices a host overwriting data the GPU has not copied yet.
    """

    def __init__(self) -> None:
        self.sram = bytearray(SRAM_SIZE)
        self.sq = bytearray(PAGE)
        self.cq = bytearray(PAGE)
        self.xdata = bytearray(0x10000)
        self.sector_gen = array("q", [0]) * (SRAM_SIZE // SECTOR)
        self.write_gen = -1  # tag for SRAM writes that are not OUT arms (E5 pokes, GPU writes); counts down

    # --- PCIe view (what the GPU reaches through the system aperture) ---
    def region(self, pcie: int, n: int) -> tuple[bytearray, int] | None:
        """Return (backing buffer, offset) for a PCIe range inside one bridge region, or None if unmapped."""
        if SRAM_PCIE <= pcie and pcie + n <= SRAM_PCIE + SRAM_SIZE:
            return self.sram, pcie - SRAM_PCIE
        if SQ_PCIE <= pcie and pcie + n <= SQ_PCIE + PAGE:
            return self.sq, pcie - SQ_PCIE
        if CQ_PCIE <= pcie and pcie + n <= CQ_PCIE + PAGE:
            return self.cq, pcie - CQ_PCIE
        return None

    def tag_sram(self, offset: int, n: int, gen: int) -> None:
        """Record that SRAM bytes [offset, offset+n) were written by writer `gen`."""
        if n <= 0:
            return
        s0, s1 = offset // SECTOR, (offset + n + SECTOR - 1) // SECTOR
        self.sector_gen[s0:s1] = array("q", [gen]) * (s1 - s0)

    # --- xdata view (what 0xE4/0xE5 reach) ---
    def _xdata_alias(self, addr: int) -> tuple[bytearray, int] | None:
        if XDATA_SQ <= addr < XDATA_SQ + PAGE:
            return self.sq, addr - XDATA_SQ
        if XDATA_CQ <= addr < XDATA_CQ + XDATA_CQ_SIZE:
            return self.cq, addr - XDATA_CQ
        if XDATA_SRAM <= addr < XDATA_SRAM + XDATA_SRAM_SIZE:
            return self.sram, addr - XDATA_SRAM
        return None

    def xdata_read(self, addr: int, n: int) -> bytes:
        """Read `n` xdata bytes (the windows return live SRAM / queue-page contents); wraps at 64 KiB."""
        out = bytearray(n)
        for i in range(n):
            a = (addr + i) & 0xFFFF
            alias = self._xdata_alias(a)
            out[i] = alias[0][alias[1]] if alias else self.xdata[a]
        return bytes(out)

    def xdata_write(self, addr: int, value: int) -> str:
        """Write one xdata byte; returns which region it hit ("sq", "cq", "sram" or "xdata")."""
        a = addr & 0xFFFF
        alias = self._xdata_alias(a)
        if alias is None:
            self.xdata[a] = value & 0xFF
            return "xdata"
        buf, off = alias
        buf[off] = value & 0xFF
        if buf is self.sram:
            self.tag_sram(off, 1, self.write_gen)
            return "sram"
        return "sq" if buf is self.sq else "cq"
