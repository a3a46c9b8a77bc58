"""SDMA 6.0 engine 0, queue 0, as the simulator runs it: programmed through its real registers (SDMA0_QUEUE0_RB_*,
DOORBELL*, F32_CNTL, WATCHDOG_CNTL), fetching real sdma_6_0_0 packets from its ring through the GPU's page tables
(RB_CNTL.RB_VMID) and executing NOP, COPY_LINEAR, WRITE_UNTILED, FENCE, POLL_REGMEM, TRAP, TIMESTAMP(GET_GLOBAL)
and CONSTANT_FILL.

A POLL that is not satisfied stalls the engine until the polled dword changes (retry 0xFFF = forever); the queue's
watchdog (QUEUE_HANG_COUNT x 100 ms) turns a stall into a hang with an SDMA_QUEUE_HANG interrupt. A translation fault
stops the queue with an SDMA_PAGE_FAULT interrupt and the GFX hub's fault registers latched; an unknown opcode stops
it too. Copies move data in quanta at the modelled bandwidth, so a host writing the bounce SRAM at the same time
genuinely races them; every SRAM read is checked against the provenance tag of the sentinel the copy was gated on.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import TYPE_CHECKING

from speck.usbgpu.amd.tables import CONST, GC, PM4, SDMA, SDMA_PACKETS
from speck.usbgpu.sim.config import SECTOR, SRAM_PCIE, SRAM_SIZE
from speck.usbgpu.sim.cp import COMPARE
from speck.usbgpu.sim.vm import SYSTEM, VmFault

if TYPE_CHECKING:
    from speck.usbgpu.sim.gpu_services import GpuServices

RETRY_FOREVER = 0xFFF
WATCHDOG_UNIT_NS = 100e6  # SDMA0_WATCHDOG_CNTL.QUEUE_HANG_COUNT counts 100 ms (sdma_v6_0.c)
_P = SDMA_PACKETS


def addr64(lo: int, hi: int) -> int:
    return lo | hi << 32


@dataclass
class _Poll:
    va: int
    space: str
    phys: int
    ref: int
    mask: int
    func: int
    retries_left: int  # -1 = forever
    interval_ns: float
    token: int
    recheck_scheduled: bool = False


@dataclass
class _Copy:
    src: int
    dst: int
    size: int
    expect_gen: int | None  # provenance tag of the sentinel this copy was gated on
    snapshot: list[int] | None  # ungated SRAM copy: sector tags at copy start
    pos: int = 0


class SdmaEngine:
    """SDMA0 queue 0: register state, read/write pointers, doorbell and the packet interpreter."""

    def __init__(self, gpu: GpuServices) -> None:
        self.gpu = gpu
        regs = gpu.regs
        self.rptr = 0
        self.wptr = 0
        self.hung = False
        self.hang_reason = ""
        self.epoch = 0  # bumped by a queue reset: events scheduled before it are stale
        self._busy = False
        self._poll: _Poll | None = None
        self._poll_token = 0
        self._copy: _Copy | None = None
        self._expect_gen: int | None = None
        self.doorbells = 0
        self.packets = 0
        self.traps = 0
        self.bytes_copied = 0
        self.poll_stalls = 0
        # SRAM offset -> dword of sentinel polls that passed; if the host later writes the same value there, the
        # GPU had matched stale data (see SimDevice._check_late_sentinels).
        self.passed_sentinels: dict[int, int] = {}
        regs.on_write(GC.SDMA0_QUEUE0_RB_CNTL, self._rb_cntl_written)
        regs.on_write(GC.SDMA0_F32_CNTL, self._f32_written)
        regs.on_write(GC.SDMA0_QUEUE0_RB_WPTR, self._wptr_written)
        regs.on_write(GC.SDMA0_QUEUE0_RB_RPTR, lambda new, old: self._set_rptr(new))
        regs.on_read(GC.SDMA0_QUEUE0_RB_RPTR, lambda: self.rptr & 0xFFFFFFFF)
        regs.on_read(GC.SDMA0_QUEUE0_RB_RPTR_HI, lambda: self.rptr >> 32)
        regs.on_read(GC.SDMA0_STATUS_REG, self._status)
        regs.on_read(GC.SDMA0_QUEUE0_CONTEXT_STATUS, self._context_status)

    # --- registers ---
    def _reg(self, reg: object) -> int:
        return self.gpu.regs.get(reg)  # type: ignore[arg-type]

    @property
    def enabled(self) -> bool:
        return bool(GC.SDMA0_QUEUE0_RB_CNTL.get(self._reg(GC.SDMA0_QUEUE0_RB_CNTL), "RB_ENABLE"))

    @property
    def halted(self) -> bool:
        return bool(GC.SDMA0_F32_CNTL.get(self._reg(GC.SDMA0_F32_CNTL), "HALT"))

    @property
    def vmid(self) -> int:
        return GC.SDMA0_QUEUE0_RB_CNTL.get(self._reg(GC.SDMA0_QUEUE0_RB_CNTL), "RB_VMID")

    @property
    def ring_base(self) -> int:
        return addr64(self._reg(GC.SDMA0_QUEUE0_RB_BASE), self._reg(GC.SDMA0_QUEUE0_RB_BASE_HI)) << 8

    @property
    def ring_size(self) -> int:
        return 4 << GC.SDMA0_QUEUE0_RB_CNTL.get(self._reg(GC.SDMA0_QUEUE0_RB_CNTL), "RB_SIZE")

    def _rptr_addr(self) -> int | None:
        if not GC.SDMA0_QUEUE0_RB_CNTL.get(self._reg(GC.SDMA0_QUEUE0_RB_CNTL), "RPTR_WRITEBACK_ENABLE"):
            return None
        return addr64(self._reg(GC.SDMA0_QUEUE0_RB_RPTR_ADDR_LO), self._reg(GC.SDMA0_QUEUE0_RB_RPTR_ADDR_HI))

    def _wptr_poll_addr(self) -> int | None:
        cntl = self._reg(GC.SDMA0_QUEUE0_RB_CNTL)
        if not GC.SDMA0_QUEUE0_RB_CNTL.get(cntl, "F32_WPTR_POLL_ENABLE"):
            return None
        return addr64(self._reg(GC.SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_LO), self._reg(GC.SDMA0_QUEUE0_RB_WPTR_POLL_ADDR_HI))

    def _rb_cntl_written(self, new: int, old: int) -> None:
        enabled = GC.SDMA0_QUEUE0_RB_CNTL.get(new, "RB_ENABLE")
        if not enabled or not GC.SDMA0_QUEUE0_RB_CNTL.get(old, "RB_ENABLE"):
            # disabling (or enabling) the ring drops whatever the previous queue was doing
            self.epoch += 1
            self.hung, self.hang_reason = False, ""
            self._busy, self._poll, self._copy, self._expect_gen = False, None, None, None
            self.passed_sentinels.clear()
        if enabled:
            self._writeback()
            self._kick()

    def _f32_written(self, new: int, old: int) -> None:
        if not GC.SDMA0_F32_CNTL.get(new, "HALT"):
            missing = self.gpu.psp.missing_for("sdma")
            if missing:
                self.gpu.refuse(f"SDMA0 released from halt without its firmware ({missing}; bring-up step 'firmware')")
                self.gpu.regs.set(GC.SDMA0_F32_CNTL, GC.SDMA0_F32_CNTL.encode(new, HALT=1))
                return
        self._kick()

    def _set_rptr(self, value: int) -> None:
        self.rptr = value

    def _wptr_written(self, new: int, old: int) -> None:
        self.wptr = new | self._reg(GC.SDMA0_QUEUE0_RB_WPTR_HI) << 32
        if GC.SDMA0_QUEUE0_MINOR_PTR_UPDATE.get(self._reg(GC.SDMA0_QUEUE0_MINOR_PTR_UPDATE), "ENABLE"):
            return  # the driver is setting the pointers up, not submitting
        self._kick()

    def _status(self) -> int:
        idle = self.idle
        return GC.SDMA0_STATUS_REG.encode(IDLE=int(idle), RB_EMPTY=int(self.rptr == self.wptr), RB_CMD_IDLE=int(idle))

    def _context_status(self) -> int:
        return GC.SDMA0_QUEUE0_CONTEXT_STATUS.encode(IDLE=int(self.idle), EXCEPTION=4 if self.hung else 0)

    @property
    def idle(self) -> bool:
        return self.rptr == self.wptr and not self._busy and self._poll is None and self._copy is None

    @property
    def polling(self) -> bool:
        return self._poll is not None

    def doorbell(self, value: int) -> None:
        """The host rang the queue's doorbell with the new write pointer (a monotonic byte count)."""
        self.doorbells += 1
        poll = self._wptr_poll_addr()
        if poll is not None:
            try:
                word = struct.unpack("<Q", self.gpu.read(self.vmid, poll, 8))[0]
            except VmFault as fault:
                self._fault(fault, "reading the write-pointer shadow")
                return
            if word != value:
                self.gpu.violation(f"SDMA doorbell value {value:#x} differs from the wptr shadow {word:#x} in memory")
        if value < self.wptr:
            self.gpu.violation(f"SDMA doorbell moved the write pointer backwards ({self.wptr:#x} -> {value:#x})")
        if self.enabled and value - self.rptr > self.ring_size:
            self.gpu.violation(f"SDMA doorbell {value:#x} is more than a ring ({self.ring_size:#x}) ahead of rptr")
        self.wptr = value
        self._kick()

    # --- execution ---
    def _kick(self, delay: float = 0.0) -> None:
        if not self.enabled or self.halted or self.hung or self._busy or self._poll is not None:
            return
        if self.rptr < self.wptr:
            self._busy = True
            epoch = self.epoch
            clock = self.gpu.clock
            clock.at(clock.now + delay + self.gpu.timing.sdma_packet_ns, lambda: self._step(epoch))

    def _ring_dwords(self, offset: int, count: int) -> tuple[int, ...]:
        size = self.ring_size
        off = (self.rptr + 4 * offset) % size
        first = min(count * 4, size - off)
        raw = self.gpu.read(self.vmid, self.ring_base + off, first)
        if first < count * 4:  # a packet crossing the ring end wraps (the driver avoids this with NOP fill)
            raw += self.gpu.read(self.vmid, self.ring_base, count * 4 - first)
        return struct.unpack(f"<{count}I", raw)

    def _advance(self, ndwords: int) -> None:
        self.rptr += ndwords * 4
        self._writeback()
        self._busy = False
        self._kick()

    def _writeback(self) -> None:
        addr = self._rptr_addr()
        if addr is not None:
            try:
                self.gpu.write(self.vmid, addr, struct.pack("<Q", self.rptr))
            except VmFault as fault:
                self._fault(fault, "writing back the read pointer")

    def _hang(self, reason: str, src_id: int = CONST.GFX_11_0_0__SRCID__SDMA_QUEUE_HANG) -> None:
        self.hung, self.hang_reason = True, reason
        self._busy, self._poll, self._copy = False, None, None
        self.gpu.ih.post(CONST.SOC21_IH_CLIENTID_GFX, src_id, vmid=self.vmid, src_data=(self.rptr & 0xFFFFFFFF,))

    def _fault(self, fault: VmFault, doing: str) -> None:
        """A translation fault stops the queue: latch it in the hub, post SDMA_PAGE_FAULT (and the UTCL2 fault)."""
        self.gpu.report_vm_fault(fault, client="SDMA0")
        self._hang(f"{fault} while {doing}", CONST.GFX_11_0_0__SRCID__SDMA_PAGE_FAULT)

    def _step(self, epoch: int) -> None:
        if epoch != self.epoch or self.hung:
            return
        faults = self.gpu.faults
        if faults.gpu_hang_after_packets is not None:
            if faults.gpu_hang_after_packets <= 0:
                self._stop_dead()
                return
            faults.gpu_hang_after_packets -= 1
        self.packets += 1
        try:
            self._execute()
        except VmFault as fault:
            self._fault(fault, f"executing the packet at rptr {self.rptr:#x}")

    def _stop_dead(self) -> None:
        """Injected hang: the engine stops; its watchdog reports it after the hang period."""
        self._busy = False
        self._poll = _Poll(0, "", 0, 0, 0, 0, -1, 0.0, -1)  # occupies the engine so nothing else runs
        self._arm_watchdog(-1, "injected GPU hang: the engine stopped")

    def _execute(self) -> None:
        header = self._ring_dwords(0, 1)[0]
        op = _P.NOP.get([header], "op")
        if op == SDMA.OP_NOP:
            self._advance(1 + _P.NOP.get([header], "count"))
        elif op == SDMA.OP_COPY:
            self._start_copy(self._ring_dwords(0, _P.COPY_LINEAR.dwords))
        elif op == SDMA.OP_WRITE:
            hdr = self._ring_dwords(0, _P.WRITE_UNTILED.dwords - 1)
            n = _P.WRITE_UNTILED.get(hdr, "count") + 1
            words = self._ring_dwords(_P.WRITE_UNTILED.dwords - 1, n)
            dst = addr64(_P.WRITE_UNTILED.get(hdr, "dst_addr_31_0"), _P.WRITE_UNTILED.get(hdr, "dst_addr_63_32"))
            self._later_write(dst, struct.pack(f"<{n}I", *words), _P.WRITE_UNTILED.dwords - 1 + n)
        elif op == SDMA.OP_FENCE:
            pkt = self._ring_dwords(0, _P.FENCE.dwords)
            dst = addr64(_P.FENCE.get(pkt, "addr_31_0"), _P.FENCE.get(pkt, "addr_63_32"))
            self._later_write(dst, struct.pack("<I", _P.FENCE.get(pkt, "data")), _P.FENCE.dwords)
        elif op == SDMA.OP_POLL_REGMEM:
            self._start_poll(self._ring_dwords(0, _P.POLL_REGMEM.dwords))
        elif op == SDMA.OP_TRAP:
            self.traps += 1
            ctx = _P.TRAP.get(self._ring_dwords(0, _P.TRAP.dwords), "int_context")
            self.gpu.ih.post(CONST.SOC21_IH_CLIENTID_GFX, CONST.GFX_11_0_0__SRCID__SDMA_TRAP, src_data=(ctx,))
            self._advance(_P.TRAP.dwords)
        elif op == SDMA.OP_TIMESTAMP:
            pkt = self._ring_dwords(0, _P.TIMESTAMP_GET_GLOBAL.dwords)
            lo, hi = _P.TIMESTAMP_GET_GLOBAL.mask("write_addr_31_3")
            dst = (pkt[lo] & hi) | _P.TIMESTAMP_GET_GLOBAL.get(pkt, "write_addr_63_32") << 32
            self._later_write(dst, struct.pack("<Q", self.gpu.ticks()), _P.TIMESTAMP_GET_GLOBAL.dwords)
        elif op == SDMA.OP_CONST_FILL:
            pkt = self._ring_dwords(0, _P.CONSTANT_FILL.dwords)
            dst = addr64(_P.CONSTANT_FILL.get(pkt, "dst_addr_31_0"), _P.CONSTANT_FILL.get(pkt, "dst_addr_63_32"))
            n = _P.CONSTANT_FILL.get(pkt, "count") + 1
            data = struct.pack("<I", _P.CONSTANT_FILL.get(pkt, "src_data_31_0")) * (n // 4 + 1)
            self._later_write(dst, data[:n], _P.CONSTANT_FILL.dwords)
        else:
            self.gpu.violation(f"unknown SDMA opcode {op} (header {header:#010x}) at rptr {self.rptr:#x}")
            self._hang(f"unknown SDMA opcode {op} at rptr {self.rptr:#x}")

    def _later_write(self, addr: int, data: bytes, ndwords: int) -> None:
        epoch = self.epoch

        def land() -> None:
            if epoch != self.epoch or self.hung:
                return
            try:
                self.gpu.write(self.vmid, addr, data)
            except VmFault as fault:
                self._fault(fault, f"writing {len(data)} bytes at {addr:#x}")
                return
            self._advance(ndwords)

        clock = self.gpu.clock
        clock.at(clock.now + self.gpu.timing.gpu_write_ns, land)

    # --- POLL_REGMEM ---
    def _start_poll(self, pkt: tuple[int, ...]) -> None:
        p = _P.POLL_REGMEM
        if not p.get(pkt, "mem_poll"):
            self.gpu.violation("POLL_REGMEM of a register (mem_poll=0) is not modelled")
            self._hang("register poll")
            return
        va = addr64(p.get(pkt, "addr_31_0"), p.get(pkt, "addr_63_32"))
        space, phys, _ = self.gpu.vm.translate(self.vmid, va, write=False)
        retry = p.get(pkt, "retry_count")
        self._poll_token += 1
        self._poll = _Poll(
            va=va,
            space=space,
            phys=phys,
            ref=p.get(pkt, "value"),
            mask=p.get(pkt, "mask"),
            func=p.get(pkt, "func"),
            retries_left=-1 if retry == RETRY_FOREVER else retry,
            interval_ns=float(p.get(pkt, "interval")) * 1000.0,  # interval unit taken as 1 us [unit uncertain]
            token=self._poll_token,
        )
        self._busy = False
        self._check_poll(first=True)

    def _check_poll(self, first: bool = False) -> None:
        poll = self._poll
        if poll is None or self.hung or poll.token < 0:
            return
        poll.recheck_scheduled = False
        value = struct.unpack("<I", self.gpu.read_space(poll.space, poll.phys, 4))[0]
        if COMPARE.get(poll.func, COMPARE[PM4.WAIT_FUNCTION_ALWAYS])(value & poll.mask, poll.ref & poll.mask):
            self._poll = None
            # A satisfied EQ poll on the bounce SRAM is a sentinel: the next copy out of SRAM must read data from
            # the same arm (provenance) that wrote the sentinel.
            sram = _sram_offset(poll.space, poll.phys)
            if sram is not None and poll.func == PM4.WAIT_FUNCTION_EQ:
                self._expect_gen = self.gpu.host.mem.sector_gen[sram // SECTOR]
                self.passed_sentinels[sram] = value
            self._busy = True
            self._advance(_P.POLL_REGMEM.dwords)
            return
        if first:
            self.poll_stalls += 1
            self._arm_watchdog(poll.token, f"POLL_REGMEM at {poll.va:#x} unsatisfied for the watchdog period")
        if poll.retries_left >= 0:
            if poll.retries_left == 0:  # finite retries exhausted: the packet completes unsatisfied
                self._poll = None
                self._busy = True
                self._advance(_P.POLL_REGMEM.dwords)
                return
            poll.retries_left -= 1
            poll.recheck_scheduled = True
            clock = self.gpu.clock
            clock.at(clock.now + max(poll.interval_ns, 1.0), self._check_poll)

    def _arm_watchdog(self, token: int, reason: str) -> None:
        count = GC.SDMA0_WATCHDOG_CNTL.get(self._reg(GC.SDMA0_WATCHDOG_CNTL), "QUEUE_HANG_COUNT")
        if not count:
            return
        epoch = self.epoch
        clock = self.gpu.clock

        def fire() -> None:
            if epoch == self.epoch and not self.hung and self._poll is not None and self._poll.token == token:
                self._hang(reason)

        clock.at(clock.now + count * WATCHDOG_UNIT_NS, fire)

    def memory_changed(self, space: str, addr: int, n: int) -> None:
        """Something wrote [addr, addr+n) of `space`: a stalled POLL on that dword re-checks after the recheck delay."""
        poll = self._poll
        if poll is None or poll.recheck_scheduled or poll.space != space:
            return
        if not (addr < poll.phys + 4 and poll.phys < addr + n):
            return
        poll.recheck_scheduled = True
        clock = self.gpu.clock
        clock.at(clock.now + self.gpu.timing.poll_recheck_ns, self._check_poll)

    # --- COPY_LINEAR ---
    def _start_copy(self, pkt: tuple[int, ...]) -> None:
        p = _P.COPY_LINEAR
        size = p.get(pkt, "count") + 1
        src = addr64(p.get(pkt, "src_addr_31_0"), p.get(pkt, "src_addr_63_32"))
        dst = addr64(p.get(pkt, "dst_addr_31_0"), p.get(pkt, "dst_addr_63_32"))
        expect, snapshot = None, None
        space, phys, _ = self.gpu.vm.translate(self.vmid, src, write=False)
        sram = _sram_offset(space, phys)
        if sram is not None:
            if self._expect_gen is not None:
                expect = self._expect_gen
            else:
                mem = self.gpu.host.mem
                snapshot = list(mem.sector_gen[sram // SECTOR : (sram + size + SECTOR - 1) // SECTOR])
                pending = self.gpu.host.pending_out_range()
                if pending is not None and pending[0] < sram + size and sram < pending[1]:
                    self.gpu.violation(
                        f"GPU copy from SRAM {sram:#x}+{size:#x} started while the armed OUT transfer still has "
                        f"to fill SRAM [{pending[0]:#x}, {pending[1]:#x})"
                    )
        self._expect_gen = None
        self._copy = _Copy(src, dst, size, expect, snapshot)
        self._copy_quantum(self.epoch)

    def _copy_quantum(self, epoch: int) -> None:
        copy = self._copy
        if epoch != self.epoch or copy is None:
            return
        n = min(self.gpu.timing.quantum, copy.size - copy.pos)
        clock = self.gpu.clock
        when = clock.now + n * 1e9 / self.gpu.timing.sdma_bytes_per_s

        def move() -> None:
            if epoch != self.epoch or self._copy is not copy or self.hung:
                return
            try:
                pieces = self.gpu.vm.ranges(self.vmid, copy.src + copy.pos, n, write=False)
                for space, addr, length in pieces:
                    self._check_sram_read(copy, space, addr, length)
                data = b"".join(self.gpu.read_space(space, addr, length) for space, addr, length in pieces)
                self.gpu.write(self.vmid, copy.dst + copy.pos, data)
            except VmFault as fault:
                self._fault(fault, f"copying {copy.size} bytes from {copy.src:#x} to {copy.dst:#x}")
                return
            copy.pos += n
            self.bytes_copied += n
            if copy.pos >= copy.size:
                self._copy = None
                self._advance(_P.COPY_LINEAR.dwords)
            else:
                self._copy_quantum(epoch)

        clock.at(when, move)

    def _check_sram_read(self, copy: _Copy, space: str, addr: int, n: int) -> None:
        off = _sram_offset(space, addr)
        if off is None:
            return
        gens = self.gpu.host.mem.sector_gen[off // SECTOR : (off + n + SECTOR - 1) // SECTOR]
        if copy.expect_gen is not None:
            if gens.count(copy.expect_gen) == len(gens):
                return
            bad = next(g for g in gens if g != copy.expect_gen)
            if bad > copy.expect_gen or bad < 0 < copy.expect_gen:
                what = "host overwrote SRAM data the GPU had not copied yet"
            else:
                what = "GPU read a part before its data/sentinel landed"
            self.gpu.violation(
                f"{what}: SRAM {off:#x}+{n:#x} holds data of arm {bad}, the sentinel polled was from arm "
                f"{copy.expect_gen}"
            )
        elif copy.snapshot is not None:
            first = self.gpu.vm.translate(self.vmid, copy.src, write=False)[1] - SRAM_PCIE
            before = copy.snapshot[off // SECTOR - first // SECTOR : (off + n + SECTOR - 1) // SECTOR - first // SECTOR]
            if list(gens) != before:
                self.gpu.violation(f"host overwrote SRAM {off:#x}+{n:#x} while an ungated GPU copy was reading it")


def _sram_offset(space: str, addr: int) -> int | None:
    """Offset into the bridge's bounce SRAM of a system (PCIe bus) address, or None."""
    if space == SYSTEM and SRAM_PCIE <= addr < SRAM_PCIE + SRAM_SIZE:
        return addr - SRAM_PCIE
    return None
