"""The steps that bring an RDNA3 card up far enough for its queues to run, each to the public amdgpu formats:
identification from the IP discovery table, NBIO (doorbells, framebuffer access), the GMC (framebuffer and system
apertures, L1 TLB / L2, the VM context speck uses and its page tables, TLB invalidation), the IH ring, and SDMA0
queue 0, the MEC and speck's compute queue. The order and register values follow the Linux drivers (nbio_v4_3.c,
gfxhub_v3_0.c, mmhub_v3_0.c, ih_v6_0.c, sdma_v6_0.c, gfx_v11_0.c); speck's own choices are noted where they differ.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from speck.usbgpu.amd import discovery, layout, ucode
from speck.usbgpu.amd.compute import ComputeLayout, ComputeQueue
from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.psp import Psp, PspMemory, smu_alive
from speck.usbgpu.amd.sdma import DOORBELL_INDEX, RING_SIZE
from speck.usbgpu.amd.tables import CONST, GC, MMHUB, NBIO, OSSSYS
from speck.usbgpu.amd.vm import PageTables
from speck.usbgpu.errors import GpuBringUpError, GpuNotSupported

VMID = 1  # the VM context speck's queues run in (GCVM_CONTEXT1)
AMD_VENDOR = 0x1002
DISPLAY_CLASS = 0x03  # PCI base class "display controller"
IFWI_READY = 1 << 31  # MP0_SMN_C2PMSG_33: the boot firmware finished (amdgpu_discovery_read_binary_from_mem)
IFWI_POLLS = 2000
# IP blocks the driver programs and the versions it knows (major, minor): a card without them is refused.
REQUIRED_IPS: dict[str, tuple[int, int]] = {
    "GC": (11, 0),
    "SDMA0": (6, 0),
    "MMHUB": (3, 0),
    "NBIO": (4, 3),
    "OSSSYS": (6, 0),
    "MP0": (13, 0),
}
SDMA_WATCHDOG_PERIODS = 100  # QUEUE_HANG_COUNT in 100 ms units: a queue stuck 10 s raises SDMA_QUEUE_HANG
SDMA_DOORBELL_RANGE = 2  # dwords routed to SDMA0 (one 64-bit doorbell)


@dataclass(frozen=True)
class FbInfo:
    base: int  # MC address of VRAM offset 0 (GCMC_VM_FB_LOCATION_BASE)
    top: int
    offset: int  # what page-table entries add to a VRAM offset (GCMC_VM_FB_OFFSET)


def check_identity(vendor: int, device: int, class_code: int) -> None:
    """Refuse a function that is not an AMD display controller, before anything is written to it."""
    base_class = class_code >> 16
    if vendor != AMD_VENDOR or base_class != DISPLAY_CLASS:
        raise GpuNotSupported(
            "GPU identification",
            f"the PCIe function behind the bridge is {vendor:04x}:{device:04x} with class {class_code:06x}; "
            f"speck.usbgpu drives AMD ({AMD_VENDOR:04x}) display controllers (class {DISPLAY_CLASS:02x}xxxx) and "
            "wrote nothing to it",
        )


def read_discovery(mmio: Mmio, read_vram: Callable[[int, int], bytes], bar0_size: int) -> tuple[int, bytes]:
    """(VRAM size, discovery binary): wait for the boot firmware, read the memory size and the table in the top of
    VRAM through BAR0 - reads only, with the fixed addresses amdgpu_discovery.c uses before the bases are known."""
    for _ in range(IFWI_POLLS):
        if mmio.read_address(4 * CONST.mmMP0_SMN_C2PMSG_33) & IFWI_READY:
            break
    else:
        raise GpuBringUpError(
            "IP discovery", "the card's boot firmware never reported ready (MP0 C2PMSG_33 bit 31)", "power-cycle it"
        )
    vram_size = mmio.read_address(4 * CONST.mmRCC_CONFIG_MEMSIZE) << 20
    if vram_size < CONST.DISCOVERY_TMR_OFFSET:
        raise GpuBringUpError("IP discovery", f"the card reports {vram_size} bytes of VRAM", "")
    at = vram_size - CONST.DISCOVERY_TMR_OFFSET
    if at + CONST.DISCOVERY_TMR_SIZE > bar0_size:
        raise GpuBringUpError(
            "IP discovery",
            f"the discovery table at VRAM offset {at:#x} lies beyond BAR0 ({bar0_size:#x} bytes)",
            "the bridge did not grow BAR0 with resizable BAR to cover all of VRAM",
        )
    return vram_size, read_vram(at, CONST.DISCOVERY_TMR_SIZE)


def check_ips(found: discovery.Discovery) -> None:
    """Refuse a card whose IP blocks are not the RDNA3 ones speck programs."""
    for name, want in REQUIRED_IPS.items():
        ip = found.find(name)
        if ip is None or ip.version[:2] != want:
            have = "missing" if ip is None else ".".join(map(str, ip.version))
            raise GpuNotSupported(
                "GPU identification",
                f"{name} is {have}, speck.usbgpu drives {name} {want[0]}.{want[1]}.x",
                found.summary(),
            )


def setup_nbio(m: Mmio) -> None:
    """Doorbell aperture on, framebuffer reads/writes from the host enabled (nbio_v4_3.c)."""
    m.update(NBIO.RCC_DEV0_EPF0_RCC_DOORBELL_APER_EN, BIF_DOORBELL_APER_EN=1)
    m.write_fields(NBIO.BIF_BX0_BIF_FB_EN, FB_READ_EN=1, FB_WRITE_EN=1)


def read_fb(m: Mmio) -> FbInfo:
    base = m.field(GC.GCMC_VM_FB_LOCATION_BASE, "FB_BASE") << 24
    top = m.field(GC.GCMC_VM_FB_LOCATION_TOP, "FB_TOP") << 24 | 0xFFFFFF
    return FbInfo(base, top, m.field(GC.GCMC_VM_FB_OFFSET, "FB_OFFSET") << 24)


def setup_hub_apertures(m: Mmio, fb: FbInfo) -> None:
    """VMID 0 reaches VRAM physically through the framebuffer aperture (system aperture = the framebuffer, AGP
    off), and the L1 TLB runs in advanced driver model, on both hubs (gfxhub_v3_0.c / mmhub_v3_0.c)."""
    for low, high, tlb in (
        (GC.GCMC_VM_SYSTEM_APERTURE_LOW_ADDR, GC.GCMC_VM_SYSTEM_APERTURE_HIGH_ADDR, GC.GCMC_VM_MX_L1_TLB_CNTL),
        (MMHUB.MMMC_VM_SYSTEM_APERTURE_LOW_ADDR, MMHUB.MMMC_VM_SYSTEM_APERTURE_HIGH_ADDR, MMHUB.MMMC_VM_MX_L1_TLB_CNTL),
    ):
        m.write(low, fb.base >> 18)
        m.write(high, fb.top >> 18)
        m.update(
            tlb,
            ENABLE_L1_TLB=1,
            SYSTEM_ACCESS_MODE=3,
            ENABLE_ADVANCED_DRIVER_MODEL=1,
            SYSTEM_APERTURE_UNMAPPED_ACCESS=0,
        )
    m.write_fields(GC.GCMC_VM_AGP_BASE)
    m.write_fields(GC.GCMC_VM_AGP_BOT, AGP_BOT=0xFFFFFF)  # bottom above top: the AGP aperture is off
    m.write_fields(GC.GCMC_VM_AGP_TOP)
    m.update(GC.GCVM_L2_CNTL, ENABLE_L2_CACHE=1)
    m.update(GC.GCVM_CONTEXT0_CNTL, ENABLE_CONTEXT=0)  # VMID 0: no page table, the apertures above
    m.update(MMHUB.MMVM_CONTEXT0_CNTL, ENABLE_CONTEXT=0)


def setup_vm_context(m: Mmio, tables: PageTables, last_page: int) -> None:
    """VM context 1: four-level tables (depth 3, 9-bit blocks), the whole low half of the address space, every
    protection fault reported without retry (gfxhub_v3_0_setup_vmid_config with noretry)."""
    root = tables.root_pde()
    m.write(GC.GCVM_CONTEXT1_PAGE_TABLE_BASE_ADDR_LO32, root & 0xFFFFFFFF)
    m.write(GC.GCVM_CONTEXT1_PAGE_TABLE_BASE_ADDR_HI32, root >> 32)
    m.write(GC.GCVM_CONTEXT1_PAGE_TABLE_START_ADDR_LO32, 0)
    m.write(GC.GCVM_CONTEXT1_PAGE_TABLE_START_ADDR_HI32, 0)
    m.write(GC.GCVM_CONTEXT1_PAGE_TABLE_END_ADDR_LO32, last_page & 0xFFFFFFFF)
    m.write(GC.GCVM_CONTEXT1_PAGE_TABLE_END_ADDR_HI32, last_page >> 32 & 0xF)
    faults = {name: 1 for name in GC.GCVM_CONTEXT1_CNTL.fields if name.endswith(("_ENABLE_DEFAULT", "_INTERRUPT"))}
    m.write_fields(
        GC.GCVM_CONTEXT1_CNTL,
        ENABLE_CONTEXT=1,
        PAGE_TABLE_DEPTH=3,
        PAGE_TABLE_BLOCK_SIZE=0,
        RETRY_PERMISSION_OR_INVALID_PAGE_FAULT=0,
        RETRY_OTHER_FAULT=0,
        **faults,
    )


def invalidate_tlb(m: Mmio, vmid: int) -> None:
    """Flush the GFX hub's TLB entries of `vmid` (legacy flush on engine 17, as gfxhub_v3_0 requests it)."""
    req = GC.GCVM_INVALIDATE_ENG17_REQ
    m.write_fields(
        req,
        PER_VMID_INVALIDATE_REQ=1 << vmid,
        FLUSH_TYPE=0,
        INVALIDATE_L2_PTES=1,
        INVALIDATE_L2_PDE0=1,
        INVALIDATE_L2_PDE1=1,
        INVALIDATE_L2_PDE2=1,
        INVALIDATE_L1_PTES=1,
    )
    ack = GC.GCVM_INVALIDATE_ENG17_ACK
    m.wait(ack, lambda v: bool(ack.get(v, "PER_VMID_INVALIDATE_ACK") >> vmid & 1), "GPU TLB invalidation")


@dataclass(frozen=True)
class SdmaQueue:
    ring: int  # GPU virtual address of the ring
    size: int  # bytes
    rptr_addr: int  # where the engine writes its read pointer back
    wptr_addr: int  # the write-pointer shadow it polls
    doorbell: int  # dword index in the doorbell BAR


def setup_sdma_queue(m: Mmio, q: SdmaQueue) -> None:
    """SDMA0 queue 0 in VM context VMID (sdma_v6_0_gfx_resume's order), its doorbell routed by NBIO."""
    cntl = GC.SDMA0_QUEUE0_RB_CNTL
    m.update(cntl, RB_ENABLE=0)  # stop the queue: this drops whatever an earlier session left on it
    m.update(GC.SDMA0_F32_CNTL, HALT=1)
    m.write(GC.SDMA0_SEM_WAIT_FAIL_TIMER_CNTL, 0)
    value = cntl.encode(m.read(cntl), RB_SIZE=(q.size // 4).bit_length() - 1, RB_PRIV=1, RB_VMID=VMID, RB_ENABLE=0)
    m.write(cntl, value)
    for reg in (
        GC.SDMA0_QUEUE0_RB_RPTR,
        GC.SDMA0_QUEUE0_RB_RPTR_HI,
        GC.SDMA0_QUEUE0_RB_WPTR,
        GC.SDMA0_QUEUE0_RB_WPTR_HI,
    ):
        m.write(reg, 0)
    m.write(GC.SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_LO, q.wptr_addr & 0xFFFFFFFF)
    m.write(GC.SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_HI, q.wptr_addr >> 32)
    m.write(GC.SDMA0_QUEUE0_RB_RPTR_ADDR_HI, q.rptr_addr >> 32)
    m.write(GC.SDMA0_QUEUE0_RB_RPTR_ADDR_LO, q.rptr_addr & 0xFFFFFFFC)
    value = cntl.encode(value, RPTR_WRITEBACK_ENABLE=1, WPTR_POLL_ENABLE=0, F32_WPTR_POLL_ENABLE=1)
    m.write(GC.SDMA0_QUEUE0_RB_BASE, q.ring >> 8 & 0xFFFFFFFF)
    m.write(GC.SDMA0_QUEUE0_RB_BASE_HI, q.ring >> 40)
    m.write(GC.SDMA0_QUEUE0_MINOR_PTR_UPDATE, 1)  # the pointers go back to 0: say so first
    m.write(GC.SDMA0_QUEUE0_RB_WPTR, 0)
    m.write(GC.SDMA0_QUEUE0_RB_WPTR_HI, 0)
    m.update(GC.SDMA0_QUEUE0_DOORBELL, ENABLE=1)
    m.update(GC.SDMA0_QUEUE0_DOORBELL_OFFSET, OFFSET=q.doorbell)
    m.write_fields(
        NBIO.S2A_DOORBELL_ENTRY_2_CTRL,
        S2A_DOORBELL_PORT2_ENABLE=1,
        S2A_DOORBELL_PORT2_AWID=0xE,
        S2A_DOORBELL_PORT2_RANGE_OFFSET=q.doorbell,
        S2A_DOORBELL_PORT2_RANGE_SIZE=SDMA_DOORBELL_RANGE,
        S2A_DOORBELL_PORT2_AWADDR_31_28_VALUE=0x3,
    )
    m.write(GC.SDMA0_QUEUE0_MINOR_PTR_UPDATE, 0)
    m.update(GC.SDMA0_WATCHDOG_CNTL, QUEUE_HANG_COUNT=SDMA_WATCHDOG_PERIODS)
    m.update(GC.SDMA0_UTCL1_CNTL, RESP_MODE=3, REDO_DELAY=9)
    m.update(GC.SDMA0_F32_CNTL, HALT=0, TH1_RESET=0)
    m.write(cntl, cntl.encode(value, RB_ENABLE=1))
    m.update(GC.SDMA0_QUEUE0_IB_CNTL, IB_ENABLE=1)


def setup_ih(m: Mmio, ring: int, size: int, wptr: int) -> None:
    """IH ring 0 at MC address `ring` (ih_v6_0_enable_ring's order): base, writeback address, pointers, control."""
    m.write_fields(OSSSYS.IH_RB_CNTL)  # ring off while it is reprogrammed
    m.write(OSSSYS.IH_RB_BASE, ring >> 8 & 0xFFFFFFFF)
    m.write(OSSSYS.IH_RB_BASE_HI, ring >> 40 & 0xFF)
    m.write(OSSSYS.IH_RB_WPTR_ADDR_LO, wptr & 0xFFFFFFFC)
    m.write(OSSSYS.IH_RB_WPTR_ADDR_HI, wptr >> 32 & 0xFFFF)
    m.write(OSSSYS.IH_RB_WPTR, 0)
    m.write(OSSSYS.IH_RB_RPTR, 0)
    m.write_fields(
        OSSSYS.IH_RB_CNTL,
        RB_SIZE=(size // 4).bit_length() - 1,
        WPTR_WRITEBACK_ENABLE=1,
        WPTR_OVERFLOW_ENABLE=1,
        RB_ENABLE=1,
    )


def start_mec(m: Mmio) -> None:
    """Release MEC pipe 0 from reset and halt (gfx_v11_0_cp_compute_enable, RS64)."""
    m.update(GC.CP_MEC_RS64_CNTL, MEC_HALT=0, MEC_PIPE0_RESET=0, MEC_PIPE0_ACTIVE=1, MEC_INVALIDATE_ICACHE=0)


@dataclass
class Card:
    """What the bring-up leaves: the page tables, the framebuffer location, the compute queue."""

    tables: PageTables
    fb: FbInfo
    compute: ComputeQueue


def halt_engines(m: Mmio) -> None:
    """Stop SDMA0 (ring off, halted) and the MEC before their firmware is (re)loaded."""
    m.update(GC.SDMA0_QUEUE0_RB_CNTL, RB_ENABLE=0)
    m.update(GC.SDMA0_F32_CNTL, HALT=1)
    m.update(GC.CP_MEC_RS64_CNTL, MEC_HALT=1)


def load_firmware(m: Mmio, fb: FbInfo, vram_size: int, firmware: ucode.FirmwareSet, io: VramIo) -> list[str]:
    """The PSP loads the secure OS (if it is not running) and every image; then the SMU must answer. Returns what
    was loaded."""
    base = vram_size - layout.PSP_BELOW_TOP
    mem = PspMemory(
        ring=base + layout.PSP_RING,
        ring_bytes=layout.PSP_RING_BYTES,
        cmd=base + layout.PSP_CMD,
        fence=base + layout.PSP_FENCE,
        fw_pri=base + layout.PSP_FW_PRI,
        fw_pri_bytes=layout.PSP_FW_PRI_BYTES,
        tmr=base + layout.PSP_TMR,
    )
    psp = Psp(m, mem, lambda offset: fb.base + offset, io.write, io.read)
    halt_engines(m)
    psp.load_all(firmware)
    smu_alive(m)
    return psp.loaded


@dataclass(frozen=True)
class VramIo:
    """How bring-up reaches VRAM (through BAR0): write(offset, data), read(offset, n)."""

    write: Callable[[int, bytes], None]
    read: Callable[[int, int], bytes]


def bring_up(
    m: Mmio,
    io: VramIo,
    ring_doorbell: Callable[[int, int], None],
    firmware: ucode.FirmwareSet,
    vram_size: int,
    steps: list[str],
) -> Card:
    """Everything past identification that writes the card, in order (each finished step is appended to
    `steps`): NBIO, GMC with the driver's page tables, the IH ring, firmware through the PSP, SDMA0 queue 0, the
    MEC, the compute queue. `ring_doorbell(dword index, value)` writes a 64-bit doorbell."""
    write_vram = io.write
    L = layout
    setup_nbio(m)
    steps.append("nbio")
    fb = read_fb(m)
    setup_hub_apertures(m, fb)
    tables = PageTables(write_vram, L.PT_POOL, fb.offset)
    tables.map_vram(L.DRIVER_MAPPED[0], L.DRIVER_MAPPED[0], L.DRIVER_MAPPED[1])
    tables.map_system(L.SYS_VA + L.SRAM_PCIE, L.SRAM_PCIE, L.SRAM_BYTES)
    tables.map_system(L.SYS_VA + L.SQ_PCIE, L.SQ_PCIE, 3 * L.PAGE)  # the SQ page, the page between, the CQ page
    tables.flush()
    setup_vm_context(m, tables, L.LAST_PAGE)
    invalidate_tlb(m, VMID)
    steps.append("gmc")
    write_vram(L.IH_WPTR_VA, bytes(4))
    setup_ih(m, fb.base + L.IH_RING_VA, L.IH_RING_SIZE, fb.base + L.IH_WPTR_VA)
    steps.append("ih")
    load_firmware(m, fb, vram_size, firmware, io)
    steps.append("firmware")
    write_vram(L.QUEUE_PAGE_VA, bytes(16))
    setup_sdma_queue(m, SdmaQueue(L.RING_VA, RING_SIZE, L.QUEUE_PAGE_VA, L.QUEUE_PAGE_VA + 8, 2 * DOORBELL_INDEX))
    steps.append("sdma")
    start_mec(m)
    steps.append("cp")
    compute = ComputeQueue(
        m,
        ComputeLayout(
            ring=L.COMPUTE_RING_VA,
            ring_bytes=L.COMPUTE_RING_SIZE,
            rptr_report=L.COMPUTE_PAGE_VA,
            wptr_poll=L.COMPUTE_PAGE_VA + 8,
            eop=L.EOP_VA,
            mqd_vram=L.MQD_VA,
            doorbell=L.COMPUTE_DOORBELL,
            vmid=VMID,
        ),
        write_vram,
        ring_doorbell,
        lambda offset: fb.base + offset,
    )
    write_vram(L.COMPUTE_SIGNAL_VA, bytes(16))
    compute.setup()
    steps.append("compute queue")
    return Card(tables, fb, compute)
