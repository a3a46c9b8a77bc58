"""The simulated card's MMIO register file: every register of speck.usbgpu.amd.tables placed at the byte address its
IP block's base segment (what the card's discovery table reports) puts it, with reset values, per-queue banking of
the CP_HQD_* registers (selected through GRBM_GFX_CNTL, as on the hardware) and read/write hooks for the registers
that do something.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from speck.usbgpu.amd import tables
from speck.usbgpu.amd.regdefs import Reg

ReadHook = Callable[[], int]
WriteHook = Callable[[int, int], None]  # (new value, old value)

REGISTER_CLASSES = (tables.GC, tables.NBIO, tables.OSSSYS, tables.MP, tables.MMHUB)
BANKED_PREFIXES = ("CP_HQD_", "CP_MQD_")  # per me/pipe/queue, selected by GRBM_GFX_CNTL


def all_registers() -> Iterable[Reg]:
    for cls in REGISTER_CLASSES:
        for value in vars(cls).values():
            if isinstance(value, Reg):
                yield value


def dword_address(reg: Reg, bases: dict[str, tuple[int, ...]]) -> int:
    """The register's dword address on a card whose discovery table lists `bases` (IP name -> segments)."""
    return bases[reg.ip][reg.base_idx] + reg.offset


class RegisterFile:
    """Dword-addressed registers (byte address = dword address * 4)."""

    def __init__(self, bases: dict[str, tuple[int, ...]]) -> None:
        self.bases = bases
        self.by_address: dict[int, Reg] = {}
        self.address: dict[str, int] = {}
        for reg in all_registers():
            addr = dword_address(reg, bases)
            self.by_address[addr] = reg
            self.address[reg.name] = addr
        self.values: dict[int, int] = {a: r.default for a, r in self.by_address.items()}
        self.banked: dict[tuple[int, int, int], dict[int, int]] = {}
        self._banked_addrs = {a for a, r in self.by_address.items() if r.name.startswith(BANKED_PREFIXES)}
        self.read_hooks: dict[int, ReadHook] = {}
        self.write_hooks: dict[int, WriteHook] = {}
        self.writes = 0

    # --- wiring ---
    def on_read(self, reg: Reg, hook: ReadHook) -> None:
        self.read_hooks[self.address[reg.name]] = hook

    def on_write(self, reg: Reg, hook: WriteHook) -> None:
        self.write_hooks[self.address[reg.name]] = hook

    # --- queue banking ---
    def selected(self) -> tuple[int, int, int]:
        """(me, pipe, queue) GRBM_GFX_CNTL selects for the banked registers."""
        reg = tables.GC.GRBM_GFX_CNTL
        word = self.values[self.address[reg.name]]
        return reg.get(word, "MEID"), reg.get(word, "PIPEID"), reg.get(word, "QUEUEID")

    def bank(self, queue: tuple[int, int, int]) -> dict[int, int]:
        bank = self.banked.get(queue)
        if bank is None:
            bank = self.banked[queue] = {a: self.by_address[a].default for a in self._banked_addrs}
        return bank

    def get_banked(self, queue: tuple[int, int, int], reg: Reg) -> int:
        return self.bank(queue)[self.address[reg.name]]

    def set_banked(self, queue: tuple[int, int, int], reg: Reg, value: int) -> None:
        self.bank(queue)[self.address[reg.name]] = value & 0xFFFFFFFF

    # --- plain access (no hooks): what the model itself uses ---
    def get(self, reg: Reg) -> int:
        addr = self.address[reg.name]
        if addr in self._banked_addrs:
            return self.bank(self.selected())[addr]
        return self.values[addr]

    def set(self, reg: Reg, value: int) -> None:
        addr = self.address[reg.name]
        if addr in self._banked_addrs:
            self.bank(self.selected())[addr] = value & 0xFFFFFFFF
        else:
            self.values[addr] = value & 0xFFFFFFFF

    def field(self, reg: Reg, name: str) -> int:
        return reg.get(self.get(reg), name)

    # --- bus access (hooks run) ---
    def read(self, dword: int) -> int:
        hook = self.read_hooks.get(dword)
        if hook is not None:
            return hook() & 0xFFFFFFFF
        if dword in self._banked_addrs:
            return self.bank(self.selected())[dword]
        return self.values.get(dword, 0)

    def write(self, dword: int, value: int) -> None:
        self.writes += 1
        value &= 0xFFFFFFFF
        if dword in self._banked_addrs:
            bank = self.bank(self.selected())
            old = bank[dword]
            bank[dword] = value
        else:
            old = self.values.get(dword, 0)
            self.values[dword] = value
        hook = self.write_hooks.get(dword)
        if hook is not None:
            hook(value, old)
