"""Register access to the GPU through the bridge: one PCIe TLP per register, at the byte address the card's discovery
table gives (IP base segment + offset, in dwords). Registers beyond the MMIO BAR go through NBIO's RSMU index/data
pair, as amdgpu's indirect register access does."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from speck.usbgpu.amd.regdefs import Reg
from speck.usbgpu.amd.tables import NBIO
from speck.usbgpu.errors import GpuBringUpError, GpuFenceTimeout


class TlpBus(Protocol):
    def mem_read32(self, address: int) -> int: ...

    def mem_write32(self, address: int, value: int) -> None: ...


class Mmio:
    """Registers of one card. `bases`: IP block name -> base segments (dwords), from its discovery table."""

    def __init__(self, bus: TlpBus, bar: int, bar_size: int, bases: dict[str, tuple[int, ...]]) -> None:
        self.bus, self.bar, self.bar_size, self.bases = bus, bar, bar_size, bases
        self.reads = self.writes = 0

    def address(self, reg: Reg) -> int:
        """Byte address of `reg` in the card's register space."""
        try:
            segments = self.bases[reg.ip]
        except KeyError:
            raise GpuBringUpError(
                f"register {reg.name}", f"the card's discovery table has no {reg.ip} block", ""
            ) from None
        return 4 * (segments[reg.base_idx] + reg.offset)

    def read_address(self, address: int) -> int:
        self.reads += 1
        if address + 4 <= self.bar_size:
            return self.bus.mem_read32(self.bar + address)
        self._direct_write(NBIO.BIF_BX_PF0_RSMU_INDEX, address)
        return self.bus.mem_read32(self.bar + self.address(NBIO.BIF_BX_PF0_RSMU_DATA))

    def write_address(self, address: int, value: int) -> None:
        self.writes += 1
        if address + 4 <= self.bar_size:
            self.bus.mem_write32(self.bar + address, value & 0xFFFFFFFF)
            return
        self._direct_write(NBIO.BIF_BX_PF0_RSMU_INDEX, address)
        self._direct_write(NBIO.BIF_BX_PF0_RSMU_DATA, value)

    def _direct_write(self, reg: Reg, value: int) -> None:
        self.bus.mem_write32(self.bar + self.address(reg), value & 0xFFFFFFFF)

    def read(self, reg: Reg) -> int:
        return self.read_address(self.address(reg))

    def write(self, reg: Reg, value: int) -> None:
        self.write_address(self.address(reg), value)

    def write_fields(self, reg: Reg, **fields: int) -> int:
        """Write the register's reset value with `fields` set (no read); returns the value written."""
        value = reg.encode(None, **fields)
        self.write(reg, value)
        return value

    def update(self, reg: Reg, **fields: int) -> int:
        """Read-modify-write `fields` of `reg`; returns the value written."""
        value = reg.encode(self.read(reg), **fields)
        self.write(reg, value)
        return value

    def field(self, reg: Reg, name: str) -> int:
        return reg.get(self.read(reg), name)

    def wait(self, reg: Reg, done: Callable[[int], bool], what: str, limit: int = 1000) -> int:
        """Read `reg` until `done(value)`; GpuFenceTimeout naming `what` after `limit` reads."""
        value = 0
        for _ in range(limit):
            value = self.read(reg)
            if done(value):
                return value
        raise GpuFenceTimeout(what, f"{reg.name} stayed at {value:#010x} for {limit} reads")
