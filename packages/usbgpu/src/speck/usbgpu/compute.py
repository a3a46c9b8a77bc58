"""Compute on the GPU behind the bridge: PM4 submission to the compute queue (direct to the ring, or as one
INDIRECT_BUFFER batch behind one doorbell), dispatches programmed from kernel-descriptor fields, the compute timeline
signal (every submission ends with a RELEASE_MEM of the next value), waits bounded in GPU time, queue status and
reset. UsbGpu (speck.usbgpu.api) exposes this as the driver API; this module does the work inside its operations.

Kernarg segments, AQL dispatch packets and indirect buffers are staged in a pool of VRAM the GPU can read, written
through BAR0; the pool is reused once the work that read it has signalled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from speck.usbgpu.amd import pm4
from speck.usbgpu.amd.bringup import VMID
from speck.usbgpu.amd.compute import KernelCode, Launch, aql_packet, dispatch_packets, scratch_bytes
from speck.usbgpu.amd.ih import COMPUTE_QUEUE, GpuFaultRecord
from speck.usbgpu.amd.layout import COMPUTE_PAGE_VA, COMPUTE_SIGNAL_VA
from speck.usbgpu.amd.sdma import Timeline
from speck.usbgpu.amd.tables import GC
from speck.usbgpu.errors import GpuFault, GpuFenceTimeout, GpuHang, UsbGpuValueError
from speck.usbgpu.gpu import GpuContext, stopped_queue_error

POOL_ALIGN = 256  # kernarg segments want 16, AQL packets 64; 256 keeps every staged object cache-line aligned
DEFAULT_TIMEOUT_S = 10.0
SPACE_POLLS = 10_000  # reads of the rptr report while waiting for room in the ring


@dataclass(frozen=True)
class QueueStatus:
    """The compute queue as the driver sees it: `completed` is the last timeline value the GPU signalled and
    `submitted` the last one submitted; `faults` what the interrupt ring reported since the last reset."""

    queue: str
    active: bool
    rptr: int
    wptr: int
    completed: int
    submitted: int
    faults: tuple[GpuFaultRecord, ...]

    @property
    def idle(self) -> bool:
        return self.rptr == self.wptr and Timeline.reached(self.completed, self.submitted)

    @property
    def hung(self) -> bool:
        return any(f.hang for f in self.faults)

    @property
    def faulted(self) -> bool:
        return any(not f.hang for f in self.faults)


class ComputeEngine:
    """The session's compute queue. `pool` = (GPU address, bytes) of VRAM to stage kernargs and IBs in."""

    queue_name = COMPUTE_QUEUE

    def __init__(self, ctx: GpuContext, pool: tuple[int, int]) -> None:
        ctx.require_ready("compute")
        assert ctx.compute is not None
        self.ctx = ctx
        self.queue = ctx.compute
        self.signal = Timeline(
            ctx.bridge, COMPUTE_SIGNAL_VA, ctx.vram_bar, ctx.options.poll_limit, self.check, ctx.gpu_time_ns
        )
        self.gc_base = ctx.discovery.bases()["GC"][0]
        self.pool_va, self.pool_size = pool
        self._pool_pos = 0
        self._pool_epoch = 0  # timeline value the pool's current contents are guarded by
        self.submitted = 0
        self.dispatch_id = 0
        self.faults: list[GpuFaultRecord] = []
        self._rptr = 0
        self._scratch: tuple[int, int] | None = None  # (address, bytes) of the scratch buffer
        self.stats = {"submissions": 0, "dispatches": 0, "batches": 0, "pool_drains": 0, "resets": 0}

    # ------------------------------------------------------------------ health
    def check(self, what: str) -> None:
        """Raise GpuFault / GpuHang if the interrupt ring reports a stopped queue (compute or SDMA)."""
        for record in self.ctx.poll_faults():
            self.faults.append(record)
            raise stopped_queue_error(what, record)

    # ------------------------------------------------------------------ staging
    def stage(self, data: bytes) -> int:
        """Copy `data` into the pool (after the work that used the space before has finished); its GPU address."""
        n = -(-max(len(data), 1) // POOL_ALIGN) * POOL_ALIGN
        if n > self.pool_size:
            raise UsbGpuValueError(f"{len(data)} bytes do not fit the {self.pool_size}-byte staging pool")
        if self._pool_pos + n > self.pool_size:
            self.stats["pool_drains"] += 1
            self.wait(self.submitted, DEFAULT_TIMEOUT_S, "reusing the kernarg/IB pool")
            self._pool_pos = 0
        va = self.pool_va + self._pool_pos
        self._pool_pos += n
        self.ctx._vram_write(va, bytes(data).ljust(-(-len(data) // 4) * 4, b"\0"))
        return va

    def launch(self, code: KernelCode, grid: Sequence[int], block: Sequence[int], kernargs: bytes = b"") -> list[int]:
        """The packets of one dispatch of `code` (ACQUIRE_MEM, COMPUTE_* state, DISPATCH_DIRECT), its kernarg
        segment (zero-padded to the descriptor's kernarg size), AQL packet and scratch staged."""
        gx, gy, gz = (int(x) for x in (*grid, 1, 1, 1)[:3])
        bx, by, bz = (int(x) for x in (*block, 1, 1, 1)[:3])
        g, b = (gx, gy, gz), (bx, by, bz)
        if any(n < 1 for n in g):
            raise UsbGpuValueError(f"{code.name}: grid {g} needs at least one workgroup per axis")
        args = bytes(kernargs).ljust(max(code.kernarg_size, len(kernargs)), b"\0")
        kernarg_va = self.stage(args) if args else 0
        self.dispatch_id += 1
        launch = Launch(g, b, kernarg_va, dispatch_id=self.dispatch_id)
        if "dispatch_ptr" in code.user_sgprs:
            launch = replace(launch, dispatch_packet=self.stage(aql_packet(code, launch)))
        need = scratch_bytes(code, launch)
        if need:
            launch = replace(launch, scratch_base=self._scratch_buffer(need))
        self.stats["dispatches"] += 1
        return pm4.acquire_mem() + dispatch_packets(code, launch, self.gc_base)

    def _scratch_buffer(self, need: int) -> int:
        if self._scratch is None or self._scratch[1] < need:
            self.wait(self.submitted, DEFAULT_TIMEOUT_S, "growing the scratch buffer")
            heap = self.ctx.heap
            if self._scratch is not None:
                self.ctx.unmap_heap(*self._scratch)
                heap.free(self._scratch[0])
            va = heap.alloc(need)
            self.ctx.map_heap([(va, need)])
            self._scratch = (va, need)
        return self._scratch[0]

    # ------------------------------------------------------------------ submission
    def _room(self, dwords: int) -> None:
        """Wait until the ring has room for `dwords` more (the CP reports its read pointer)."""
        size = self.queue.layout.ring_bytes // 4
        for _ in range(SPACE_POLLS):
            if self.queue.wptr + dwords - self._rptr < size:
                return
            raw = self.ctx.bridge.stream_read(self.ctx.vram_bar + COMPUTE_PAGE_VA, 8)
            self._rptr = int.from_bytes(raw, "little")
            self.check("waiting for room in the compute ring")
        raise GpuHang("compute submission", self.queue_name, f"the ring stayed full (read pointer {self._rptr})")

    def submit(self, packets: Sequence[int], batch: bool = False, interrupt: bool = False) -> int:
        """Submit `packets` and a RELEASE_MEM of the next timeline value; returns that value. `batch` puts them in an
        indirect buffer, so the ring gets one INDIRECT_BUFFER + RELEASE_MEM and one doorbell however long they are."""
        value = self.signal.next()
        tail = pm4.release_mem(COMPUTE_SIGNAL_VA, value, interrupt=interrupt)
        body = list(packets)
        if batch and body:
            ib = self.stage(b"".join((p & 0xFFFFFFFF).to_bytes(4, "little") for p in body))
            ring = pm4.indirect_buffer(ib, len(body), VMID) + tail
            self.stats["batches"] += 1
        else:
            ring = body + tail
        self._room(len(ring))
        self.queue.submit(ring)
        self.submitted = value
        self.stats["submissions"] += 1
        return value

    # ------------------------------------------------------------------ signals and status
    def completed(self) -> int:
        return self.signal.read()

    def wait(self, value: int, timeout_s: float = DEFAULT_TIMEOUT_S, what: str = "") -> None:
        """Return once the compute timeline reached `value`; GpuFault / GpuHang when the queue stopped, and GpuHang
        (naming the queue and where it stands) when `timeout_s` seconds of GPU time pass without it."""
        if not value or Timeline.reached(self.signal.read(), value):
            return
        what = what or f"waiting for compute signal {value}"
        try:
            self.signal.wait(value, what, timeout_ns=timeout_s * 1e9)
        except (GpuFault, GpuHang):
            raise
        except GpuFenceTimeout as exc:
            st = self.status()
            kind = (
                f"no signal {value} after {timeout_s:g} s of GPU time (signal at {st.completed}, read pointer "
                f"{st.rptr} of {st.wptr} dwords)"
            )
            record = self.ctx.explained(GpuFaultRecord(self.queue_name, kind, True))
            self.faults.append(record)  # the driver now takes the queue as hung until it is reset
            raise stopped_queue_error(what, record) from exc

    def blocking(self, what: str) -> GpuFault | GpuHang | None:
        """This queue's error when it has not reached its last submission (which copies wait for on the GPU): the
        fault it reported, or GpuHang. None when it is done. Called when a copy failed waiting."""
        if not self.submitted or Timeline.reached(self.signal.read(), self.submitted):
            return None
        st = self.status()
        reported = [f for f in st.faults if f.queue == self.queue_name]
        if reported:
            return stopped_queue_error(what, reported[0])  # the first since the last reset: the cause
        kind = (
            f"signal {self.submitted}, which the copy waited for on the GPU, never came (signal at {st.completed}, "
            f"read pointer {st.rptr} of {st.wptr} dwords)"
        )
        record = self.ctx.explained(GpuFaultRecord(self.queue_name, kind, True))
        self.faults.append(record)
        return stopped_queue_error(what, record)

    def status(self) -> QueueStatus:
        """Read the queue's state (registers, read pointer, signal) and any new interrupts (kept in `faults`)."""
        self.faults += self.ctx.poll_faults()
        m = self.ctx.mmio
        self.queue._select()
        active = bool(m.field(GC.CP_HQD_ACTIVE, "ACTIVE"))
        rptr = m.read(GC.CP_HQD_PQ_RPTR)
        self.queue._select(0, 0, 0)
        return QueueStatus(
            self.queue_name,
            active,
            rptr,
            self.queue.wptr & 0xFFFFFFFF,
            self.signal.read(),
            self.submitted,
            tuple(self.faults),
        )

    def reset(self) -> None:
        """Dequeue and re-create the queue (dropping what it was running or stuck on), forget its fault records and
        mark every submitted value signalled, so waits on dropped work return."""
        self.queue.reset()
        self.ctx.poll_faults()
        self.faults.clear()
        self.ctx._vram_write(COMPUTE_SIGNAL_VA, self.submitted.to_bytes(8, "little"))
        self._rptr = 0
        self._pool_pos = 0
        self.stats["resets"] += 1
