"""PCIe config space and TLP routing of the simulated topology: bridges on buses 0-3, the GPU on bus 4.

A config TLP reaches bus B only if every bridge upstream has B inside [secondary, subordinate]; a memory TLP reaches
the GPU only if every bridge forwards the address (memory or prefetchable window, MEM enabled) and it hits one of
the GPU's enabled BARs. Anything else completes with Unsupported Request, as a real fabric would.
"""

from __future__ import annotations

import struct

from speck.usbgpu.sim.config import BRIDGE_DEVICE, BRIDGE_VENDOR, GPU_BUS, GPU_CLASS, GPU_DEVICE, GPU_VENDOR

CPL_SC, CPL_UR, CPL_CRS, CPL_CA = 0, 1, 2, 4
CMD_MEM, CMD_MASTER = 0x2, 0x4
REBAR_CAP_ID = 0x15
MIB = 1 << 20


class ConfigSpace:
    """4 KiB of config registers with per-dword write masks; BAR registers answer the all-ones sizing probe."""

    def __init__(self) -> None:
        self.regs = bytearray(4096)
        self.wmask: dict[int, int] = {}  # dword offset -> writable bits (absent = read-only)
        self.bars: dict[int, tuple[int, int]] = {}  # BAR register offset -> (size, flag bits); 64-bit BARs span two

    def dword(self, reg: int) -> int:
        return int(struct.unpack_from("<I", self.regs, reg & ~3)[0])

    def set_dword(self, reg: int, value: int) -> None:
        struct.pack_into("<I", self.regs, reg & ~3, value & 0xFFFFFFFF)

    def read(self, reg: int) -> int:
        """Read the dword containing `reg`."""
        return self.dword(reg)

    def write(self, reg: int, value: int, byte_enable: int) -> None:
        """Write `value` to the dword at `reg` under `byte_enable`, honouring write masks and BAR sizing."""
        reg &= ~3
        lane_mask = sum(0xFF << (8 * i) for i in range(4) if byte_enable >> i & 1)
        if reg in self.bars or (reg - 4) in self.bars and self.bars[reg - 4][1] & 0x4:
            self._write_bar(reg, value, lane_mask)
            return
        mask = self.wmask.get(reg, 0) & lane_mask
        self.set_dword(reg, (self.dword(reg) & ~mask) | (value & mask))

    def _write_bar(self, reg: int, value: int, lane_mask: int) -> None:
        old = self.dword(reg)
        new = (old & ~lane_mask) | (value & lane_mask)
        if reg in self.bars:
            size, flags = self.bars[reg]
            new = (new & ~(size - 1) & 0xFFFFFFFF) | flags if size < (1 << 32) else flags
        else:  # upper half of a 64-bit BAR
            size, _ = self.bars[reg - 4]
            new &= ~((size - 1) >> 32) & 0xFFFFFFFF
        self.set_dword(reg, new)

    def bar_address(self, reg: int) -> int:
        """Current base address programmed in the BAR at `reg` (64-bit BARs combine both halves)."""
        _, flags = self.bars[reg]
        lo = self.dword(reg) & ~0xF
        return lo | (self.dword(reg + 4) << 32) if flags & 0x4 else lo

    def resize_bar(self, reg: int, size: int) -> None:
        """Change a BAR's size (ReBAR); the address bits below the new size are cleared."""
        _, flags = self.bars[reg]
        self.bars[reg] = (size, flags)
        self._write_bar(reg, self.dword(reg), 0)
        if flags & 0x4:
            self._write_bar(reg + 4, self.dword(reg + 4), 0)


def _bridge_config() -> ConfigSpace:
    cs = ConfigSpace()
    cs.set_dword(0x00, BRIDGE_DEVICE << 16 | BRIDGE_VENDOR)
    cs.set_dword(0x08, 0x06040000)  # class: PCI-to-PCI bridge
    cs.set_dword(0x0C, 0x00010000)  # header type 1
    cs.set_dword(0x24, 0x00010001)  # prefetchable window is 64-bit capable
    cs.wmask.update({0x04: 0x0000_0007, 0x18: 0x00FF_FFFF, 0x20: 0xFFF0_FFF0, 0x24: 0xFFF0_FFF0})
    cs.wmask.update({0x28: 0xFFFF_FFFF, 0x2C: 0xFFFF_FFFF})
    return cs


def _gpu_config(vram_size: int, bar0_initial: int, subsystem: int) -> ConfigSpace:
    cs = ConfigSpace()
    cs.set_dword(0x00, GPU_DEVICE << 16 | GPU_VENDOR)
    cs.set_dword(0x08, GPU_CLASS << 8)  # class code in bits 31:8 (revision 0)
    cs.set_dword(0x2C, subsystem)  # subsystem vendor (bits 15:0) and id (31:16), read-only
    cs.wmask[0x04] = 0x0000_0007
    cs.bars[0x10] = (bar0_initial, 0xC)  # BAR0: VRAM, 64-bit prefetchable
    cs.bars[0x18] = (2 * MIB, 0xC)  # BAR2: doorbells, 64-bit prefetchable
    cs.bars[0x24] = (1 * MIB, 0x0)  # BAR5: MMIO, 32-bit
    for reg, (_, flags) in cs.bars.items():
        cs.set_dword(reg, flags)
    # ReBAR extended capability at 0x100: one resizable BAR (BAR0), sizes 256 MiB .. VRAM size.
    cs.set_dword(0x100, REBAR_CAP_ID | 1 << 16)
    supported = 0
    for log2 in range(28, vram_size.bit_length()):
        supported |= 1 << (log2 - 20 + 4)
    cs.set_dword(0x104, supported)
    cs.set_dword(0x108, 0 | 1 << 5 | ((bar0_initial.bit_length() - 1 - 20) << 8))
    cs.wmask[0x108] = 0x3F00
    return cs


class PcieFabric:
    """The downstream PCIe topology: config routing, bridge windows and the GPU's BAR decode."""

    def __init__(self, vram_size: int, subsystem: int, bar0_initial: int = 256 * MIB) -> None:
        self.bridges = [_bridge_config() for _ in range(GPU_BUS)]
        self.gpu = _gpu_config(vram_size, bar0_initial, subsystem)
        self.vram_size = vram_size
        self._cache: tuple[list[tuple[tuple[int, int], ...]], list[tuple[int, int, int]]] | None = None

    def _reaches_bus(self, bus: int) -> bool:
        for upstream in range(bus):
            bus_regs = self.bridges[upstream].dword(0x18)
            secondary, subordinate = bus_regs >> 8 & 0xFF, bus_regs >> 16 & 0xFF
            if not secondary <= bus <= subordinate:
                return False
        return True

    def config(self, bus: int, dev: int, fn: int, type1: bool) -> ConfigSpace | None:
        """The config space a config TLP for bus/dev/fn lands in, or None (-> UR)."""
        if type1 != (bus > 0) or dev != 0 or fn != 0 or bus > GPU_BUS or not self._reaches_bus(bus):
            return None
        return self.gpu if bus == GPU_BUS else self.bridges[bus]

    def config_write(self, cs: ConfigSpace, reg: int, value: int, byte_enable: int) -> str | None:
        """Config write with the GPU's ReBAR control side effect. Returns what was unsafe about it, if anything
        (resizing or moving a BAR of the GPU while it decodes memory)."""
        self._cache = None
        unsafe = None
        dword = reg & ~3
        if cs is self.gpu and cs.dword(0x04) & CMD_MEM and (dword in cs.bars or dword - 4 in cs.bars or dword == 0x108):
            unsafe = f"GPU config write {value:#010x} to {dword:#x} (a BAR or ReBAR control) with memory decoding on"
        cs.write(reg, value, byte_enable)
        if cs is self.gpu and reg & ~3 == 0x108:
            encoded = cs.dword(0x108) >> 8 & 0x3F
            if cs.dword(0x104) >> (encoded + 4) & 1:
                cs.resize_bar(0x10, 1 << (encoded + 20))
        return unsafe

    def _bridge_windows(self, br: ConfigSpace) -> tuple[tuple[int, int], ...]:
        if not br.dword(0x04) & CMD_MEM:
            return ()
        mem = br.dword(0x20)
        base, limit = (mem & 0xFFF0) << 16, ((mem >> 16) & 0xFFF0) << 16 | 0xFFFFF
        pref = br.dword(0x24)
        pbase = (pref & 0xFFF0) << 16 | br.dword(0x28) << 32
        plimit = ((pref >> 16) & 0xFFF0) << 16 | 0xFFFFF | br.dword(0x2C) << 32
        return ((base, limit), (pbase, plimit))

    def _routes(self) -> tuple[list[tuple[tuple[int, int], ...]], list[tuple[int, int, int]]]:
        """Bridge windows and enabled GPU BAR ranges, recomputed only after a config write."""
        if self._cache is None:
            windows = [self._bridge_windows(br) for br in self.bridges]
            bars: list[tuple[int, int, int]] = []
            if self.gpu.dword(0x04) & CMD_MEM:
                for reg, index in ((0x10, 0), (0x18, 2), (0x24, 5)):
                    size, _ = self.gpu.bars[reg]
                    base = self.gpu.bar_address(reg)
                    if base:
                        bars.append((base, base + size, index))
            self._cache = (windows, bars)
        return self._cache

    def decode(self, addr: int, n: int = 4) -> tuple[int, int] | None:
        """Route a memory TLP: (BAR index 0/2/5, offset) if [addr, addr+n) reaches one enabled GPU BAR, else None."""
        windows, bars = self._routes()
        for wins in windows:
            if not any(lo <= addr and addr + n - 1 <= hi for lo, hi in wins):
                return None
        for base, end, index in bars:
            if base <= addr and addr + n <= end:
                return index, addr - base
        return None

    @property
    def gpu_bus_master(self) -> bool:
        """Whether the GPU may issue DMA (SDMA reads/writes of bridge memory)."""
        return bool(self.gpu.dword(0x04) & CMD_MASTER)
