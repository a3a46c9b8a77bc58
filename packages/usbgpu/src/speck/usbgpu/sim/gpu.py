"""The simulated Radeon (GC 11.0.0, SDMA 6.0, MMHUB 3.0, NBIO 4.3, OSSSYS 6.0, MP 13.0.0) behind the bridge.

What the host reaches through the BARs: VRAM (BAR0), the doorbells (BAR2) and the MMIO registers (BAR5, placed by
the discovery table the card keeps in the top of its VRAM). What the engines reach: GPU virtual memory through the
GFX hub (sim/vm.py), i.e. VRAM and - through the system aperture of the page tables - the bridge's memory over PCIe.

Bring-up is checked state: the L1 TLB and the VM context must be set up before any engine translates an address, the
NBIO doorbell aperture and routing must be on before a doorbell reaches an engine, an engine runs only once it is
unhalted; anything out of order is refused and recorded as a violation naming the missing step.
"""

from __future__ import annotations

from collections.abc import Callable

from speck.usbgpu.amd import discovery, ucode
from speck.usbgpu.amd.ih import SDMA_QUEUE
from speck.usbgpu.amd.pm4 import TIMESTAMP_NS
from speck.usbgpu.amd.tables import CONST, GC, GFXHUB_CLIENT_IDS, IP_HWID, MMHUB, MP, NBIO, SIM_IP_BASES
from speck.usbgpu.sim.cp import CommandProcessor
from speck.usbgpu.sim.gpu_services import GpuHost
from speck.usbgpu.sim.ih import InterruptHandler
from speck.usbgpu.sim.memory import SparseMemory
from speck.usbgpu.sim.psp import Psp
from speck.usbgpu.sim.regfile import RegisterFile
from speck.usbgpu.sim.sdma_engine import SdmaEngine
from speck.usbgpu.sim.vm import VRAM, GpuVm, VmFault

FB_BASE = 0x80_0000_0000  # where the card's firmware puts the framebuffer in its MC address space
# The IP blocks (and versions) the simulated card lists in its discovery table.
SIM_IPS: dict[str, tuple[int, int, int]] = {
    "GC": (11, 0, 0),
    "SDMA0": (6, 0, 0),
    "MMHUB": (3, 0, 0),
    "NBIO": (4, 3, 0),
    "OSSSYS": (6, 0, 0),
    "MP0": (13, 0, 0),
    "MP1": (13, 0, 0),
    "HDP": (6, 0, 0),
}


class GpuModel:
    def __init__(
        self,
        host: GpuHost,
        vram_size: int,
        ips: dict[str, tuple[int, int, int]] | None = None,
        firmware: dict[str, bytes] | None = None,
    ) -> None:
        self.host = host
        self.clock, self.timing, self.faults = host.clock, host.timing, host.faults
        self.vram = SparseMemory(vram_size)
        self.ips = SIM_IPS if ips is None else ips
        bases: dict[str, tuple[int, ...]] = {ip: SIM_IP_BASES["GC" if ip == "SDMA0" else ip] for ip in SIM_IPS}
        self.regs = RegisterFile(bases)
        self.vm = GpuVm(self.regs, self.vram.read)
        self.ih = InterruptHandler(self.regs, self.write_mc, self.ticks)
        self.sdma = SdmaEngine(self)
        self.cp = CommandProcessor(self)
        self.firmware_files = ucode.synthetic_files() if firmware is None else firmware
        self.psp = Psp(self, self.firmware_files)
        self.memory_listeners: list[Callable[[str, int, int], None]] = [
            self.sdma.memory_changed,
            self.cp.memory_changed,
        ]
        self.refused: list[str] = []  # bring-up steps something needed before they were done
        self._doorbell_low: dict[int, int] = {}
        self._rsmu_index = 0
        self._power_on(vram_size)
        regs = self.regs
        regs.on_write(GC.GCVM_INVALIDATE_ENG17_REQ, self._invalidate)
        regs.on_read(GC.CP_MES_MTIME_LO, lambda: self.ticks() & 0xFFFFFFFF)
        regs.on_read(GC.CP_MES_MTIME_HI, lambda: self.ticks() >> 32)
        regs.on_write(GC.GCVM_L2_PROTECTION_FAULT_CNTL, self._fault_cntl)
        regs.on_write(NBIO.BIF_BX_PF0_RSMU_INDEX, lambda new, old: setattr(self, "_rsmu_index", new))
        regs.on_write(NBIO.BIF_BX_PF0_RSMU_DATA, lambda new, old: self.regs.write(self._rsmu_index >> 2, new))
        regs.on_read(NBIO.BIF_BX_PF0_RSMU_DATA, lambda: self.regs.read(self._rsmu_index >> 2))

    def _power_on(self, vram_size: int) -> None:
        """What the card's firmware leaves behind at power-on: memory size, framebuffer location, the discovery
        table in the top of VRAM, and the boot firmware's "IFWI init done" flag."""
        regs = self.regs
        regs.set(NBIO.RCC_DEV0_EPF0_RCC_CONFIG_MEMSIZE, vram_size >> 20)
        regs.set(MP.MP0_SMN_C2PMSG_33, 1 << 31)
        top = (FB_BASE + vram_size - 1) >> 24
        regs.set(GC.GCMC_VM_FB_LOCATION_BASE, FB_BASE >> 24)
        regs.set(GC.GCMC_VM_FB_LOCATION_TOP, top)
        regs.set(MMHUB.MMMC_VM_FB_LOCATION_BASE, FB_BASE >> 24)
        regs.set(MMHUB.MMMC_VM_FB_LOCATION_TOP, top)
        blocks = [
            discovery.IpBlock(ip, IP_HWID[ip], 0, version, self.regs.bases[ip]) for ip, version in self.ips.items()
        ]
        self.vram.write(vram_size - CONST.DISCOVERY_TMR_OFFSET, discovery.build(blocks))

    def explain(self, queue: str) -> str:
        """The model's own account of why `queue` (named as the driver names it) stopped; "" if it did not."""
        if queue == SDMA_QUEUE:
            return self.sdma.hang_reason
        return self.cp.account(queue)

    # --- time ---
    def ticks(self) -> int:
        return int(self.clock.now / TIMESTAMP_NS)

    def violation(self, message: str) -> None:
        self.host.violation(message)

    def refuse(self, message: str) -> None:
        """Something needed a bring-up step that was not done: the hardware would ignore or fault it."""
        self.refused.append(message)
        self.host.violation(f"refused: {message}")

    # --- host side: BARs ---
    def bar0_write(self, offset: int, data: bytes) -> None:
        self.vram.write(offset, data)
        self.memory_changed(VRAM, offset, len(data))

    def mmio_read(self, offset: int) -> int:
        return self.regs.read(offset >> 2)

    def mmio_write(self, offset: int, value: int) -> None:
        self.regs.write(offset >> 2, value)

    def doorbell_write(self, offset: int, value: int) -> int:
        """A dword write into the doorbell BAR. 64-bit doorbells take effect with their high dword (speck writes
        them low dword first). Returns 1 when a doorbell rang an engine."""
        index = offset >> 2
        self._doorbell_low[index] = value
        low_index = index - 1
        if low_index not in self._doorbell_low:
            return 0
        value64 = self._doorbell_low[low_index] | value << 32
        if not self.regs.field(NBIO.RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN, "BIF_DOORBELL_APER_EN"):
            self.refuse(
                f"doorbell at BAR2+{low_index * 4:#x} dropped: the doorbell aperture is off "
                "(NBIO RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN.BIF_DOORBELL_APER_EN, bring-up step 'nbio')"
            )
            return 0
        for target in self._doorbell_targets():
            if target(low_index, value64):
                return 1
        return 0

    def _doorbell_targets(self) -> list[Callable[[int, int], bool]]:
        return [self._sdma_doorbell, self.cp.doorbell]

    def _sdma_doorbell(self, index: int, value: int) -> bool:
        regs = self.regs
        if GC.SDMA0_QUEUE0_DOORBELL_OFFSET.get(regs.get(GC.SDMA0_QUEUE0_DOORBELL_OFFSET), "OFFSET") != index:
            return False
        if not regs.field(GC.SDMA0_QUEUE0_DOORBELL, "ENABLE"):
            self.refuse("SDMA0 queue 0 doorbell rang with SDMA0_QUEUE0_DOORBELL.ENABLE=0 (bring-up step 'sdma')")
            return True
        s2a = NBIO.S2A_DOORBELL_ENTRY_2_CTRL
        route = regs.get(s2a)
        first, size = s2a.get(route, "S2A_DOORBELL_PORT2_RANGE_OFFSET"), s2a.get(route, "S2A_DOORBELL_PORT2_RANGE_SIZE")
        if not s2a.get(route, "S2A_DOORBELL_PORT2_ENABLE") or not first <= index < first + size:
            self.refuse(
                f"SDMA doorbell {index} is not routed to the SDMA (NBIO S2A_DOORBELL_ENTRY_2_CTRL covers "
                f"[{first}, {first + size}), enabled {s2a.get(route, 'S2A_DOORBELL_PORT2_ENABLE')}; bring-up step "
                "'sdma')"
            )
            return True
        if self.sdma.halted:
            self.refuse("SDMA0 doorbell rang while the engine is halted (SDMA0_F32_CNTL.HALT=1; bring-up step 'sdma')")
            return True
        self.sdma.doorbell(value)
        return True

    # --- GPU side: memory through the hubs ---
    def memory_changed(self, space: str, addr: int, n: int) -> None:
        for listener in self.memory_listeners:
            listener(space, addr, n)

    def read_space(self, space: str, addr: int, n: int) -> bytes:
        if space == VRAM:
            return self.vram.read(addr, n)
        return self.host.bus_read(addr, n)

    def write_space(self, space: str, addr: int, data: bytes) -> None:
        if space == VRAM:
            self.vram.write(addr, data)
        else:
            self.host.bus_write(addr, data)
        self.memory_changed(space, addr, len(data))

    def read(self, vmid: int, va: int, n: int, hub: str = "gc") -> bytes:
        """An engine's read of `n` bytes at GPU virtual address `va` (raises VmFault)."""
        return b"".join(self.read_space(s, a, m) for s, a, m in self.vm.ranges(vmid, va, n, False, hub))

    def write(self, vmid: int, va: int, data: bytes, hub: str = "gc") -> None:
        pos = 0
        for space, addr, m in self.vm.ranges(vmid, va, len(data), True, hub):
            self.write_space(space, addr, data[pos : pos + m])
            pos += m

    def write_mc(self, mc: int, data: bytes) -> None:
        """A VMID 0 write through the MM hub (the IH): a fault here is dropped, as the hub would."""
        try:
            self.write(0, mc, data, hub="mm")
        except VmFault as fault:
            self.violation(f"MM hub write dropped: {fault}")

    # --- faults ---
    def report_vm_fault(self, fault: VmFault, client: str) -> None:
        """Latch a translation fault in the GFX hub (the first one until cleared; later ones set MORE_FAULTS) and
        post the UTCL2 fault interrupt."""
        status_reg = GC.GCVM_L2_PROTECTION_FAULT_STATUS
        status = self.regs.get(status_reg)
        if status:
            self.regs.set(status_reg, status_reg.encode(status, MORE_FAULTS=1))
        else:
            mapping = int("mapping" in fault.reason or "no valid" in fault.reason)
            permission = 0 if mapping else (2 if fault.write else 1)
            cid = GFXHUB_CLIENT_IDS.index(client) if client in GFXHUB_CLIENT_IDS else 0
            self.regs.set(
                status_reg,
                status_reg.encode(
                    0,
                    MAPPING_ERROR=mapping,
                    PERMISSION_FAULTS=permission,
                    CID=cid,
                    RW=int(fault.write),
                    VMID=fault.vmid,
                ),
            )
            self.regs.set(GC.GCVM_L2_PROTECTION_FAULT_ADDR_LO32, fault.va >> 12 & 0xFFFFFFFF)
            self.regs.set(GC.GCVM_L2_PROTECTION_FAULT_ADDR_HI32, fault.va >> 44 & 0xF)
        self.ih.post(
            CONST.SOC21_IH_CLIENTID_GFX,
            CONST.GFX_11_0_0__SRCID__UTCL2_FAULT,
            vmid=fault.vmid,
            src_data=(fault.va >> 12 & 0xFFFFFFFF, fault.va >> 44 & 0xF),
        )

    def _fault_cntl(self, new: int, old: int) -> None:
        if GC.GCVM_L2_PROTECTION_FAULT_CNTL.get(new, "CLEAR_PROTECTION_FAULT_STATUS_ADDR"):
            for reg in (
                GC.GCVM_L2_PROTECTION_FAULT_STATUS,
                GC.GCVM_L2_PROTECTION_FAULT_ADDR_LO32,
                GC.GCVM_L2_PROTECTION_FAULT_ADDR_HI32,
            ):
                self.regs.set(reg, 0)

    def _invalidate(self, new: int, old: int) -> None:
        req = GC.GCVM_INVALIDATE_ENG17_REQ
        mask = req.get(new, "PER_VMID_INVALIDATE_REQ")
        self.vm.invalidate(mask)
        if req.get(new, "CLEAR_PROTECTION_FAULT_STATUS_ADDR"):
            self._fault_cntl(GC.GCVM_L2_PROTECTION_FAULT_CNTL.encode(CLEAR_PROTECTION_FAULT_STATUS_ADDR=1), 0)
        self.regs.set(GC.GCVM_INVALIDATE_ENG17_ACK, GC.GCVM_INVALIDATE_ENG17_ACK.encode(PER_VMID_INVALIDATE_ACK=mask))
