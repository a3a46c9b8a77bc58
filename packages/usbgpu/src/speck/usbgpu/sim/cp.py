"""The command processor's compute side (MEC, RS64): hardware queue descriptors programmed through the banked
CP_HQD_* registers (GRBM_GFX_CNTL selects me/pipe/queue) and activated with CP_HQD_ACTIVE, each fetching PM4
type-3 packets from its ring in VRAM through the queue's VM when its doorbell rings.

Packets: NOP, SET_SH_REG (COMPUTE_* state per queue), DISPATCH_DIRECT (the grid runs in the RDNA3 emulator against
GPU virtual memory and takes modelled time), ACQUIRE_MEM (a coherence point: the model keeps no caches, so it only
orders), RELEASE_MEM (a 32/64-bit value, the GPU clock, and optionally an end-of-pipe interrupt, written once all
earlier work finished), WAIT_REG_MEM (the queue stalls until memory satisfies the compare), INDIRECT_BUFFER (one
level: a batch of packets elsewhere in memory) and WRITE_DATA. Anything else - an unknown opcode, a packet that runs
past the write pointer, a non-shader register - stops the queue with the CP's error interrupt (CP_BAD_OPCODE_ERROR,
CP_PM4_PKT_RSVD_BIT_ERROR, CP_PRIV_REG_FAULT) and a record; a translation fault stops it with the UTCL2 fault; a
shader fault raises the SQ interrupt and leaves the dispatch unfinished. No Python exception leaves the model.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from speck.usbgpu.amd.regdefs import Reg
from speck.usbgpu.amd.tables import CONST, CP_RING_ID, EVENT, GC, PM4, PM4_PACKETS, STRUCTS
from speck.usbgpu.sim.dispatch import run_dispatch
from speck.usbgpu.sim.vm import VmFault

if TYPE_CHECKING:
    from speck.usbgpu.sim.gpu_services import GpuServices

Queue = tuple[int, int, int]  # (me, pipe, queue)
EOP_EVENTS = (EVENT.CACHE_FLUSH_AND_INV_TS_EVENT, EVENT.BOTTOM_OF_PIPE_TS)
_H = PM4_PACKETS.HEADER
_MQD = STRUCTS.v11_compute_mqd
# WAIT_REG_MEM function codes (SDMA POLL_REGMEM uses the same) -> the comparison
COMPARE: dict[int, Callable[[int, int], bool]] = {
    PM4.WAIT_FUNCTION_ALWAYS: lambda v, r: True,
    PM4.WAIT_FUNCTION_LT: lambda v, r: v < r,
    PM4.WAIT_FUNCTION_LE: lambda v, r: v <= r,
    PM4.WAIT_FUNCTION_EQ: lambda v, r: v == r,
    PM4.WAIT_FUNCTION_NE: lambda v, r: v != r,
    PM4.WAIT_FUNCTION_GE: lambda v, r: v >= r,
    PM4.WAIT_FUNCTION_GT: lambda v, r: v > r,
}
_FUNCTION = {PM4.WAIT_FUNCTION_ALWAYS: "(always)", PM4.WAIT_FUNCTION_LT: "<", PM4.WAIT_FUNCTION_LE: "<=",
             PM4.WAIT_FUNCTION_EQ: "==", PM4.WAIT_FUNCTION_NE: "!=", PM4.WAIT_FUNCTION_GE: ">=",
             PM4.WAIT_FUNCTION_GT: ">"}  # fmt: skip
# the MQD fields the CP reads back on activation, with the HQD register each must equal
_MQD_CHECKS: tuple[tuple[str, Reg], ...] = (
    ("cp_hqd_pq_base_lo", GC.CP_HQD_PQ_BASE),
    ("cp_hqd_pq_base_hi", GC.CP_HQD_PQ_BASE_HI),
    ("cp_hqd_pq_control", GC.CP_HQD_PQ_CONTROL),
    ("cp_hqd_pq_doorbell_control", GC.CP_HQD_PQ_DOORBELL_CONTROL),
    ("cp_hqd_vmid", GC.CP_HQD_VMID),
)


@dataclass
class _Ib:
    va: int
    end: int  # byte address just past its last dword
    vmid: int


@dataclass
class _Wait:
    space: str
    phys: int
    ref: int
    mask: int
    function: int
    packet_dwords: int
    recheck: bool = False


@dataclass
class Hqd:
    """One active hardware queue."""

    key: Queue
    vmid: int
    ring: int
    size: int  # bytes
    rptr: int  # dwords, monotonic
    wptr: int
    rptr_report: int
    doorbell: int | None  # dword index in the doorbell BAR
    sh: dict[str, int] = field(default_factory=dict)
    ib: _Ib | None = None
    busy: bool = False
    wait: _Wait | None = None
    stopped: str = ""  # why the queue stopped (fault / hang), "" while it runs
    header: int = 0  # of the packet being executed
    epoch: int = 0
    packets: int = 0
    dispatches: int = 0
    instructions: int = 0
    acquires: int = 0

    @property
    def name(self) -> str:
        return f"compute me{self.key[0]} pipe{self.key[1]} queue{self.key[2]}"

    @property
    def ring_id(self) -> int:
        return CP_RING_ID.encode(me=self.key[0], pipe=self.key[1], queue=self.key[2])[0]


class CommandProcessor:
    def __init__(self, gpu: GpuServices) -> None:
        self.gpu = gpu
        self.queues: dict[Queue, Hqd] = {}
        self.records: list[str] = []  # what stopped queues, for tests (the driver reads the IH ring)
        self.last_dispatch: Any = None  # the emulator's Stats of the last dispatch that ran to its end
        self.dispatches_run = 0  # such dispatches, and their wave-instructions, since power-on
        self.instructions = 0
        regs = gpu.regs
        regs.on_write(GC.CP_HQD_ACTIVE, self._active_written)
        regs.on_write(GC.CP_HQD_DEQUEUE_REQUEST, self._dequeue_written)
        regs.on_read(GC.CP_HQD_PQ_RPTR, self._rptr_read)
        regs.on_read(GC.CP_HQD_ACTIVE, self._active_read)
        regs.on_write(GC.CP_MEC_RS64_CNTL, self._mec_written)
        self._shader_core: Any = None

    def account(self, queue: str) -> str:
        """What stopped or holds up `queue` (e.g. "compute me1 pipe0 queue0"), as the model sees it; "" if nothing
        does."""
        hqd = next((h for h in self.queues.values() if h.name == queue), None)
        if hqd is None:
            return ""
        if hqd.stopped or hqd.wait is None:
            return hqd.stopped
        w = hqd.wait
        value = int.from_bytes(self.gpu.read_space(w.space, w.phys, 4), "little")
        return (
            f"waiting (WAIT_REG_MEM) for the dword at {w.space} {w.phys:#x} & {w.mask:#x} {_FUNCTION[w.function]} "
            f"{w.ref:#x}; it holds {value:#x}"
        )

    def ran(self, stats: Any) -> None:
        self.last_dispatch = stats
        self.dispatches_run += 1
        self.instructions += stats.instructions

    # --- registers ---
    def _selected(self) -> Queue:
        return self.gpu.regs.selected()

    def _bank(self, reg: Reg) -> int:
        return self.gpu.regs.get(reg)

    def _rptr_read(self) -> int:
        hqd = self.queues.get(self._selected())
        return (hqd.rptr if hqd is not None else self._bank(GC.CP_HQD_PQ_RPTR)) & 0xFFFFFFFF

    def _active_read(self) -> int:
        return int(self._selected() in self.queues)

    def _mec_written(self, new: int, old: int) -> None:
        if not GC.CP_MEC_RS64_CNTL.get(new, "MEC_HALT"):
            missing = self.gpu.psp.missing_for("mec")
            if missing:
                self.gpu.refuse(
                    f"the MEC released from halt without its firmware ({missing}; bring-up step 'firmware')"
                )
                self.gpu.regs.set(GC.CP_MEC_RS64_CNTL, GC.CP_MEC_RS64_CNTL.encode(new, MEC_HALT=1))

    @property
    def mec_halted(self) -> bool:
        return bool(GC.CP_MEC_RS64_CNTL.get(self.gpu.regs.get(GC.CP_MEC_RS64_CNTL), "MEC_HALT"))

    def _active_written(self, new: int, old: int) -> None:
        key = self._selected()
        if not GC.CP_HQD_ACTIVE.get(new, "ACTIVE"):
            self._deactivate(key)
            return
        if self.mec_halted:
            self.gpu.refuse(
                f"compute me{key[0]} pipe{key[1]} queue{key[2]} activated while the MEC is halted "
                "(CP_MEC_RS64_CNTL.MEC_HALT=1: its firmware is not loaded and started; bring-up step 'cp')"
            )
            self.gpu.regs.set_banked(key, GC.CP_HQD_ACTIVE, 0)
            return
        b = self._bank
        doorbell = b(GC.CP_HQD_PQ_DOORBELL_CONTROL)
        size_field = GC.CP_HQD_PQ_CONTROL.get(b(GC.CP_HQD_PQ_CONTROL), "QUEUE_SIZE")
        hqd = Hqd(
            key=key,
            vmid=GC.CP_HQD_VMID.get(b(GC.CP_HQD_VMID), "VMID"),
            ring=(b(GC.CP_HQD_PQ_BASE) | (b(GC.CP_HQD_PQ_BASE_HI) & 0xFF) << 32) << 8,
            size=4 << (size_field + 1),  # 2^(QUEUE_SIZE+1) dwords
            rptr=b(GC.CP_HQD_PQ_RPTR),
            wptr=b(GC.CP_HQD_PQ_WPTR_LO) | b(GC.CP_HQD_PQ_WPTR_HI) << 32,
            rptr_report=b(GC.CP_HQD_PQ_RPTR_REPORT_ADDR) | (b(GC.CP_HQD_PQ_RPTR_REPORT_ADDR_HI) & 0xFFFF) << 32,
            doorbell=(
                GC.CP_HQD_PQ_DOORBELL_CONTROL.get(doorbell, "DOORBELL_OFFSET")
                if GC.CP_HQD_PQ_DOORBELL_CONTROL.get(doorbell, "DOORBELL_EN")
                else None
            ),
        )
        self._check_mqd(hqd)
        self.queues[key] = hqd
        self._kick(hqd)

    def _check_mqd(self, hqd: Hqd) -> None:
        """The CP saves and restores a queue from its MQD: it must describe the queue the registers program."""
        b = self._bank
        mqd_va = b(GC.CP_MQD_BASE_ADDR) | b(GC.CP_MQD_BASE_ADDR_HI) << 32
        vmid = GC.CP_MQD_CONTROL.get(b(GC.CP_MQD_CONTROL), "VMID")
        try:
            mqd = _MQD.unpack(self.gpu.read(vmid, mqd_va, _MQD.size))
        except VmFault as fault:
            self.gpu.violation(f"{hqd.name}: its MQD at {mqd_va:#x} is unreadable ({fault})")
            return
        bad = [f"{name}={mqd[name]:#x} but {reg.name}={b(reg):#x}" for name, reg in _MQD_CHECKS if mqd[name] != b(reg)]
        if bad:
            self.gpu.violation(f"{hqd.name}: its MQD at {mqd_va:#x} disagrees with the HQD registers: {'; '.join(bad)}")

    def _dequeue_written(self, new: int, old: int) -> None:
        if GC.CP_HQD_DEQUEUE_REQUEST.get(new, "DEQUEUE_REQ"):
            self._deactivate(self._selected())

    def _deactivate(self, key: Queue) -> None:
        hqd = self.queues.pop(key, None)
        if hqd is not None:
            hqd.epoch += 1  # whatever it was doing is dropped
            self.gpu.regs.set_banked(key, GC.CP_HQD_PQ_RPTR, hqd.rptr & 0xFFFFFFFF)
        self.gpu.regs.set_banked(key, GC.CP_HQD_ACTIVE, 0)

    # --- doorbells ---
    def doorbell(self, index: int, value: int) -> bool:
        """A 64-bit doorbell write: the new write pointer (in dwords) of the queue listening at `index`."""
        lower = GC.CP_MEC_DOORBELL_RANGE_LOWER.get(
            self.gpu.regs.get(GC.CP_MEC_DOORBELL_RANGE_LOWER), "DOORBELL_RANGE_LOWER"
        )
        upper = GC.CP_MEC_DOORBELL_RANGE_UPPER.get(
            self.gpu.regs.get(GC.CP_MEC_DOORBELL_RANGE_UPPER), "DOORBELL_RANGE_UPPER"
        )
        hqd = next((q for q in self.queues.values() if q.doorbell == index), None)
        if hqd is None:
            known = [
                key
                for key, bank in self.gpu.regs.banked.items()
                if GC.CP_HQD_PQ_DOORBELL_CONTROL.get(
                    bank[self.gpu.regs.address["CP_HQD_PQ_DOORBELL_CONTROL"]], "DOORBELL_OFFSET"
                )
                == index
            ]
            if known:
                me, pipe, queue = known[0]
                self.gpu.refuse(
                    f"doorbell {index} for compute me{me} pipe{pipe} queue{queue}, which is not active "
                    "(CP_HQD_ACTIVE=0: the compute queue is not initialized; bring-up step 'compute queue')"
                )
                return True
            return False
        if not lower <= index <= upper:
            self.gpu.refuse(
                f"doorbell {index} of {hqd.name} outside the MEC doorbell range [{lower}, {upper}] "
                "(CP_MEC_DOORBELL_RANGE_LOWER/UPPER; bring-up step 'compute queue')"
            )
            return True
        if not GC.CP_PQ_STATUS.get(self.gpu.regs.get(GC.CP_PQ_STATUS), "DOORBELL_ENABLE"):
            self.gpu.refuse(
                f"doorbell of {hqd.name} with CP_PQ_STATUS.DOORBELL_ENABLE=0 (bring-up step 'compute queue')"
            )
            return True
        if self.mec_halted:
            self.gpu.refuse(f"doorbell of {hqd.name} while the MEC is halted (bring-up step 'cp')")
            return True
        if value < hqd.wptr:
            self.gpu.violation(f"{hqd.name}: doorbell moved the write pointer backwards ({hqd.wptr} -> {value})")
        hqd.wptr = value
        self._kick(hqd)
        return True

    # --- execution ---
    def _kick(self, hqd: Hqd) -> None:
        if hqd.busy or hqd.wait is not None or hqd.stopped or (hqd.ib is None and hqd.rptr >= hqd.wptr):
            return
        hqd.busy = True
        epoch, clock = hqd.epoch, self.gpu.clock
        clock.at(clock.now + self.gpu.timing.cp_packet_ns, lambda: self._step(hqd, epoch))

    def _fetch(self, hqd: Hqd, index: int, count: int) -> tuple[int, ...]:
        """`count` dwords from the current stream (the IB, else the ring) at dword `index` past the read point."""
        if hqd.ib is not None:
            return struct.unpack(f"<{count}I", self.gpu.read(hqd.ib.vmid, hqd.ib.va + 4 * index, 4 * count))
        out = []
        for i in range(count):
            off = 4 * (hqd.rptr + index + i) % hqd.size
            out.append(int.from_bytes(self.gpu.read(hqd.vmid, hqd.ring + off, 4), "little"))
        return tuple(out)

    def _available(self, hqd: Hqd) -> int:
        """Dwords between the read point and the end of the current stream."""
        if hqd.ib is not None:
            return (hqd.ib.end - hqd.ib.va) // 4
        return hqd.wptr - hqd.rptr

    def _step(self, hqd: Hqd, epoch: int) -> None:
        if epoch != hqd.epoch or hqd.stopped:
            return
        hqd.busy = False
        try:
            header = hqd.header = self._fetch(hqd, 0, 1)[0]
            h = _H.decode([header])
            if h["type"] != PM4.PACKET_TYPE3:
                self._stop(hqd, CONST.GFX_11_0_0__SRCID__CP_BAD_OPCODE_ERROR, f"type-{h['type']} packet {header:#010x}")
                return
            size = h["count"] + 2
            if size > self._available(hqd):
                self._stop(
                    hqd,
                    CONST.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR,
                    f"packet {header:#010x} of {size} dwords runs past the "
                    f"{'indirect buffer' if hqd.ib else 'write pointer'} ({self._available(hqd)} dwords left)",
                )
                return
            handler = self._handlers.get(h["opcode"])
            if handler is None:
                self._stop(hqd, CONST.GFX_11_0_0__SRCID__CP_BAD_OPCODE_ERROR, f"unknown PM4 opcode {h['opcode']:#x}")
                return
            hqd.packets += 1
            handler(self, hqd, self._fetch(hqd, 0, size))
        except VmFault as fault:
            self.gpu.report_vm_fault(fault, client="CPF" if not fault.write else "CPC")
            self._stop(hqd, None, str(fault))

    def _advance(self, hqd: Hqd, dwords: int) -> None:
        """Move past the packet just executed; an IB that is done returns to the ring after its packet."""
        if hqd.ib is not None:
            hqd.ib.va += 4 * dwords
            if hqd.ib.va >= hqd.ib.end:
                hqd.ib = None
                dwords = PM4_PACKETS.INDIRECT_BUFFER.dwords
            else:
                self._kick(hqd)
                return
        hqd.rptr += dwords
        if hqd.rptr_report:
            self.gpu.write(hqd.vmid, hqd.rptr_report, struct.pack("<Q", hqd.rptr))
        self._kick(hqd)

    def _stop(self, hqd: Hqd, src_id: int | None, reason: str, src_data: tuple[int, ...] | None = None) -> None:
        hqd.stopped = reason
        hqd.busy, hqd.wait = False, None
        self.records.append(f"{hqd.name}: {reason}")
        if src_data is None:  # a CP error: the offending packet's header and where it was read
            src_data = (hqd.header, hqd.rptr & 0xFFFFFFFF)
        if src_id is not None:
            self.gpu.ih.post(
                CONST.SOC21_IH_CLIENTID_GRBM_CP, src_id, ring_id=hqd.ring_id, vmid=hqd.vmid, src_data=src_data
            )

    # --- packets ---
    def _nop(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        self._advance(hqd, len(pkt))

    def _set_sh_reg(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        start = PM4.SET_SH_REG_START + PM4_PACKETS.SET_SH_REG.get(pkt, "reg_offset")
        for i, value in enumerate(pkt[2:]):
            reg = self.gpu.regs.by_address.get(start + i)
            if reg is None or reg.ip != "GC" or not reg.name.startswith("COMPUTE_"):
                self._stop(
                    hqd,
                    CONST.GFX_11_0_0__SRCID__CP_PRIV_REG_FAULT,
                    f"SET_SH_REG to dword {start + i:#x}, which is not a compute shader register",
                )
                return
            hqd.sh[reg.name] = value
        self._advance(hqd, len(pkt))

    def _acquire_mem(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        hqd.acquires += 1
        self._advance(hqd, len(pkt))

    def _release_mem(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        p = PM4_PACKETS.RELEASE_MEM
        event = p.get(pkt, "event_type")
        if event not in EOP_EVENTS:
            self._stop(
                hqd,
                CONST.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR,
                f"RELEASE_MEM with event type {event:#x} (not an end-of-pipe event)",
            )
            return
        addr = p.get(pkt, "addr_lo") | p.get(pkt, "addr_hi") << 32
        sel = p.get(pkt, "data_sel")
        data = {
            PM4.RELEASE_DATA_SEL_NONE: b"",
            PM4.RELEASE_DATA_SEL_DATA32: struct.pack("<I", p.get(pkt, "data_lo")),
            PM4.RELEASE_DATA_SEL_DATA64: struct.pack("<II", p.get(pkt, "data_lo"), p.get(pkt, "data_hi")),
            PM4.RELEASE_DATA_SEL_GPU_CLOCK: struct.pack("<Q", self.gpu.ticks()),
            PM4.RELEASE_DATA_SEL_SYSTEM_CLOCK: struct.pack("<Q", self.gpu.ticks()),
        }.get(sel)
        if data is None:
            self._stop(hqd, CONST.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR, f"RELEASE_MEM data_sel {sel}")
            return
        interrupt = p.get(pkt, "int_sel") != PM4.RELEASE_INT_SEL_NONE
        epoch, clock = hqd.epoch, self.gpu.clock
        hqd.busy = True

        def land() -> None:
            if epoch != hqd.epoch or hqd.stopped:
                return
            hqd.busy = False
            try:
                if data:
                    self.gpu.write(hqd.vmid, addr, data)
            except VmFault as fault:
                self.gpu.report_vm_fault(fault, client="CPC")
                self._stop(hqd, None, f"RELEASE_MEM: {fault}")
                return
            if interrupt:
                self.gpu.ih.post(
                    CONST.SOC21_IH_CLIENTID_GRBM_CP,
                    CONST.GFX_11_0_0__SRCID__CP_EOP_INTERRUPT,
                    ring_id=hqd.ring_id,
                    vmid=hqd.vmid,
                    src_data=(p.get(pkt, "int_ctxid"),),
                )
            self._advance(hqd, len(pkt))

        clock.at(clock.now + self.gpu.timing.gpu_write_ns, land)

    def _wait_reg_mem(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        p = PM4_PACKETS.WAIT_REG_MEM
        if p.get(pkt, "mem_space") != PM4.WAIT_MEM_SPACE_MEMORY or p.get(pkt, "operation") != 0:
            self._stop(
                hqd,
                CONST.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR,
                "WAIT_REG_MEM on a register or with a write operation (modelled: wait on memory)",
            )
            return
        function = p.get(pkt, "function")
        if function not in COMPARE:
            self._stop(hqd, CONST.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR, f"WAIT_REG_MEM function {function}")
            return
        va = p.get(pkt, "addr_lo") | p.get(pkt, "addr_hi") << 32
        space, phys, _ = self.gpu.vm.translate(hqd.vmid, va, write=False)
        hqd.wait = _Wait(space, phys, p.get(pkt, "reference"), p.get(pkt, "mask"), function, len(pkt))
        self._check_wait(hqd, hqd.epoch)

    def _check_wait(self, hqd: Hqd, epoch: int) -> None:
        wait = hqd.wait
        if wait is None or epoch != hqd.epoch or hqd.stopped:
            return
        wait.recheck = False
        value = int.from_bytes(self.gpu.read_space(wait.space, wait.phys, 4), "little")
        if COMPARE[wait.function](value & wait.mask, wait.ref & wait.mask):
            hqd.wait = None
            self._advance(hqd, wait.packet_dwords)

    def memory_changed(self, space: str, addr: int, n: int) -> None:
        """A write to [addr, addr + n): queues waiting on a dword in it look again after the poll delay."""
        for hqd in self.queues.values():
            wait = hqd.wait
            if (
                wait is None
                or wait.recheck
                or wait.space != space
                or not (addr < wait.phys + 4 and wait.phys < addr + n)
            ):
                continue
            wait.recheck = True
            self._recheck_later(hqd)

    def _recheck_later(self, hqd: Hqd) -> None:
        epoch, clock = hqd.epoch, self.gpu.clock
        clock.at(clock.now + self.gpu.timing.poll_recheck_ns, lambda: self._check_wait(hqd, epoch))

    def _indirect_buffer(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        p = PM4_PACKETS.INDIRECT_BUFFER
        if hqd.ib is not None:
            self._stop(
                hqd,
                CONST.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR,
                "INDIRECT_BUFFER inside an indirect buffer (one level is supported)",
            )
            return
        size = p.get(pkt, "ib_size")
        va = p.get(pkt, "ib_base_lo") | p.get(pkt, "ib_base_hi") << 32
        if not p.get(pkt, "valid") or not size or va & 3:
            self._stop(
                hqd,
                CONST.GFX_11_0_0__SRCID__CP_PM4_PKT_RSVD_BIT_ERROR,
                f"INDIRECT_BUFFER at {va:#x} of {size} dwords (valid={p.get(pkt, 'valid')})",
            )
            return
        hqd.ib = _Ib(va, va + 4 * size, p.get(pkt, "vmid"))
        self._kick(hqd)

    def _write_data(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        p = PM4_PACKETS.WRITE_DATA
        sel = p.get(pkt, "dst_sel")
        if sel not in (PM4.WRITE_DST_SEL_MEMORY, PM4.WRITE_DST_SEL_MEMORY_SYNC, PM4.WRITE_DST_SEL_TC_L2):
            self._stop(
                hqd,
                CONST.GFX_11_0_0__SRCID__CP_PRIV_REG_FAULT,
                f"WRITE_DATA with dst_sel {sel} (a register write from a compute queue)",
            )
            return
        va = p.get(pkt, "dst_addr_lo") | p.get(pkt, "dst_addr_hi") << 32
        self.gpu.write(hqd.vmid, va, struct.pack(f"<{len(pkt) - p.dwords}I", *pkt[p.dwords :]))
        self._advance(hqd, len(pkt))

    def _dispatch_direct(self, hqd: Hqd, pkt: tuple[int, ...]) -> None:
        p = PM4_PACKETS.DISPATCH_DIRECT
        dim = (p.get(pkt, "dim_x"), p.get(pkt, "dim_y"), p.get(pkt, "dim_z"))
        initiator = p.get(pkt, "dispatch_initiator")
        outcome = run_dispatch(self.gpu, hqd, dim, initiator)
        hqd.dispatches += 1
        if outcome.fault:
            self._stop(hqd, outcome.src_id, outcome.fault, outcome.src_data)
            return
        if outcome.hang:
            hqd.stopped = outcome.hang  # the dispatch never finishes: no interrupt, the queue just stops moving
            hqd.busy = True
            self.records.append(f"{hqd.name}: {outcome.hang}")
            return
        hqd.instructions += outcome.instructions
        hqd.busy = True
        epoch, clock = hqd.epoch, self.gpu.clock

        def done() -> None:
            if epoch == hqd.epoch and not hqd.stopped:
                hqd.busy = False
                self._advance(hqd, len(pkt))

        clock.at(clock.now + outcome.duration_ns, done)

    _handlers: dict[int, Callable[[CommandProcessor, Hqd, tuple[int, ...]], None]] = {
        PM4.NOP: _nop,
        PM4.SET_SH_REG: _set_sh_reg,
        PM4.DISPATCH_DIRECT: _dispatch_direct,
        PM4.ACQUIRE_MEM: _acquire_mem,
        PM4.RELEASE_MEM: _release_mem,
        PM4.WAIT_REG_MEM: _wait_reg_mem,
        PM4.INDIRECT_BUFFER: _indirect_buffer,
        PM4.WRITE_DATA: _write_data,
    }
