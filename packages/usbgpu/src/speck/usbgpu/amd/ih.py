"""The interrupt handler ring, driver side: the GPU writes 32-byte entries (client, source, ring, VMID, timestamp,
four data dwords) into a ring in VRAM and its write pointer to a writeback slot; the driver reads what is new and
hands the read pointer back (IH_RB_RPTR). Faults and hangs of the queues arrive here, and `QueueEvent` turns an
entry into what it means for speck's queues."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Protocol

from speck.usbgpu.amd.compute import ME, PIPE, QUEUE
from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.tables import CONST, CP_RING_ID, GC, GFXHUB_CLIENT_IDS, IH_ENTRY, OSSSYS

ENTRY_BYTES = 4 * IH_ENTRY.dwords
# A CP error interrupt's data words as speck's simulated card writes them: the packet header and the read pointer
# (the hardware keeps the header in CP_MEC_ME1_HEADER_DUMP).
# An SQ interrupt's data words as the simulated card writes them: src_data0 names what stopped the wave, src_data1/2
# hold its program counter. (A real card's SQ interrupt words identify the wave instead; reading its PC takes
# SQ_IND_INDEX/DATA accesses this driver does not make, so on hardware the kind below reads "shader error".)
SQ_ILLEGAL_INSTRUCTION, SQ_MEMORY_VIOLATION, SQ_TRAP, SQ_OTHER = 1, 2, 3, 4
SQ_KINDS = {
    SQ_ILLEGAL_INSTRUCTION: "illegal instruction",
    SQ_MEMORY_VIOLATION: "memory violation",
    SQ_TRAP: "trap",
    SQ_OTHER: "shader error",
}
_SRC = CONST
SDMA_QUEUE = "SDMA0 queue 0"  # the one SDMA queue speck runs
# (client, source) -> (queue it concerns, what happened, is it a hang rather than a fault)
_EVENTS: dict[tuple[int, int], tuple[str, str, bool]] = {
    (CONST.SOC21_IH_CLIENTID_GFX, _SRC.GFX_11_0_0__SRCID__SDMA_QUEUE_HANG): (SDMA_QUEUE, "queue hang", True),
    (CONST.SOC21_IH_CLIENTID_GFX, _SRC.GFX_11_0_0__SRCID__SDMA_PAGE_FAULT): (SDMA_QUEUE, "page fault", False),
    (CONST.SOC21_IH_CLIENTID_GFX, _SRC.GFX_11_0_0__SRCID__UTCL2_FAULT): ("", "page fault", False),
    (CONST.SOC21_IH_CLIENTID_GRBM_CP, _SRC.GFX_11_0_0__SRCID__CP_BAD_OPCODE_ERROR): ("", "bad PM4 opcode", False),
    (CONST.SOC21_IH_CLIENTID_GRBM_CP, _SRC.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR): (
        "",
        "malformed PM4 packet (reserved bits)",
        False,
    ),
    (CONST.SOC21_IH_CLIENTID_GRBM_CP, _SRC.GFX_11_0_0__SRCID__CP_PRIV_REG_FAULT): ("", "privileged register", False),
    (CONST.SOC21_IH_CLIENTID_GRBM_CP, _SRC.GFX_11_0_0__SRCID__CP_PRIV_INSTR_FAULT): ("", "privileged packet", False),
    (CONST.SOC21_IH_CLIENTID_GRBM_CP, _SRC.GFX_11_0_0__SRCID__CP_GPF): ("", "general protection fault", False),
    (CONST.SOC21_IH_CLIENTID_GRBM_CP, _SRC.GFX_11_0_0__SRCID__SQ_INTERRUPT_ID): ("", "shader exception", False),
    (CONST.SOC21_IH_CLIENTID_GRBM_CP, _SRC.GFX_11_0_0__SRCID__CP_ME_WAIT_REG_MEM_POLL_TIMEOUT): (
        "",
        "WAIT_REG_MEM poll timeout",
        True,
    ),
}


# GFX hub clients -> the speck queue whose work they do (speck runs one compute queue)
COMPUTE_QUEUE = f"compute me{ME} pipe{PIPE} queue{QUEUE}"
_CLIENT_QUEUES = {
    "SDMA0": SDMA_QUEUE,
    "CPC": COMPUTE_QUEUE,
    "CPF": COMPUTE_QUEUE,
    "TCP": COMPUTE_QUEUE,
    "SQC (data)": COMPUTE_QUEUE,
    "SQC (inst)": COMPUTE_QUEUE,
}


@dataclass(frozen=True)
class IhEntry:
    client_id: int
    src_id: int
    ring_id: int
    vmid: int
    timestamp: int
    src_data: tuple[int, int, int, int]

    @classmethod
    def decode(cls, raw: bytes) -> IhEntry:
        d = struct.unpack(f"<{IH_ENTRY.dwords}I", raw)
        f = IH_ENTRY.decode(d)
        ts = f["timestamp_lo"] | f["timestamp_hi"] << 32
        data = (f["src_data0"], f["src_data1"], f["src_data2"], f["src_data3"])
        return cls(f["client_id"], f["src_id"], f["ring_id"], f["vmid"], ts, data)


@dataclass(frozen=True)
class GpuFaultRecord:
    """What stopped a queue: `queue` (e.g. "compute me1 pipe0 queue0", "SDMA0 queue 0"), `kind`, the faulting
    GPU virtual `address` and `access` ("read"/"write") for page faults, and `detail`."""

    queue: str
    kind: str
    hang: bool
    address: int | None = None
    access: str | None = None
    vmid: int | None = None
    detail: str = ""

    def __str__(self) -> str:
        text = f"{self.queue}: {self.kind}"
        if self.address is not None:
            text += f" at GPU address {self.address:#x}"
        if self.access:
            text += f" ({self.access})"
        if self.vmid is not None:
            text += f", VMID {self.vmid}"
        return text + (f"; {self.detail}" if self.detail else "")


def cp_queue_name(ring_id: int) -> str:
    f = CP_RING_ID.decode([ring_id])
    return f"compute me{f['me']} pipe{f['pipe']} queue{f['queue']}"


class VramWords(Protocol):
    def mem_read32(self, address: int) -> int: ...


class IhRing:
    """The driver's view of IH ring 0: `offset`/`size` in VRAM. It reads with single-dword TLPs only (IH_RB_WPTR,
    then the new entries through BAR0), never the 0xF0 streams on EP 0x81, so it works while a copy-out's IN stream
    is stuck - exactly when the queue's health is in question."""

    def __init__(self, mmio: Mmio, bus: VramWords, vram_bar: int, offset: int, size: int) -> None:
        self.mmio, self.bus, self.vram_bar = mmio, bus, vram_bar
        self.offset, self.size = offset, size
        self.rptr = 0

    def poll(self) -> list[IhEntry]:
        """Entries the GPU wrote since the last poll (read pointer handed back)."""
        wptr = (OSSSYS.IH_RB_WPTR.get(self.mmio.read(OSSSYS.IH_RB_WPTR), "OFFSET") << 2) % self.size
        entries: list[IhEntry] = []
        while self.rptr != wptr:
            base = self.vram_bar + self.offset + self.rptr
            raw = b"".join(self.bus.mem_read32(base + 4 * i).to_bytes(4, "little") for i in range(IH_ENTRY.dwords))
            entries.append(IhEntry.decode(raw))
            self.rptr = (self.rptr + ENTRY_BYTES) % self.size
        if entries:
            self.mmio.write_fields(OSSSYS.IH_RB_RPTR, OFFSET=wptr >> 2)
        return entries


def describe(entry: IhEntry, mmio: Mmio | None) -> GpuFaultRecord | None:
    """What `entry` means for speck's queues (None: nothing wrong, e.g. an end-of-pipe interrupt). A page fault
    reads the GFX hub's latched fault status and address (and clears them) when `mmio` is given."""
    known = _EVENTS.get((entry.client_id, entry.src_id))
    if known is None:
        return None
    queue, kind, hang = known
    if not queue:
        queue = cp_queue_name(entry.ring_id) if entry.client_id == CONST.SOC21_IH_CLIENTID_GRBM_CP else "GPU"
    if entry.src_id == CONST.GFX_11_0_0__SRCID__SQ_INTERRUPT_ID:
        pc = entry.src_data[1] | entry.src_data[2] << 32
        what = SQ_KINDS.get(entry.src_data[0], "shader error")
        return GpuFaultRecord(queue, f"shader {what}", hang, vmid=entry.vmid, detail=f"wave at pc {pc:#x}")
    if entry.client_id == CONST.SOC21_IH_CLIENTID_GRBM_CP:
        detail = f"packet header {entry.src_data[0]:#010x} at read pointer {entry.src_data[1]}"
        return GpuFaultRecord(queue, kind, hang, vmid=entry.vmid, detail=detail)
    if queue.startswith("SDMA") and kind != "page fault":
        return GpuFaultRecord(queue, kind, hang, vmid=entry.vmid, detail=f"read pointer {entry.src_data[0]:#x}")
    if kind != "page fault":
        detail = f"interrupt source {entry.src_id}, data {', '.join(f'{d:#x}' for d in entry.src_data)}"
        return GpuFaultRecord(queue, kind, hang, vmid=entry.vmid, detail=detail)
    address = entry.src_data[0] << 12 | (entry.src_data[1] & 0xF) << 44
    access, client = None, ""
    if mmio is not None:
        status = mmio.read(GC.GCVM_L2_PROTECTION_FAULT_STATUS)
        if status:
            reg = GC.GCVM_L2_PROTECTION_FAULT_STATUS
            access = "write" if reg.get(status, "RW") else "read"
            cid = reg.get(status, "CID")
            client = GFXHUB_CLIENT_IDS[cid] if cid < len(GFXHUB_CLIENT_IDS) else f"client {cid}"
            lo, hi = mmio.read(GC.GCVM_L2_PROTECTION_FAULT_ADDR_LO32), mmio.read(GC.GCVM_L2_PROTECTION_FAULT_ADDR_HI32)
            address = lo << 12 | (hi & 0xF) << 44
            mmio.update(GC.GCVM_L2_PROTECTION_FAULT_CNTL, CLEAR_PROTECTION_FAULT_STATUS_ADDR=1)
    if queue == "GPU" and client:
        queue = _CLIENT_QUEUES.get(client, client)
    detail = f"GFX hub client {client}" if client else ""
    return GpuFaultRecord(queue, kind, hang, address, access, entry.vmid, detail)
