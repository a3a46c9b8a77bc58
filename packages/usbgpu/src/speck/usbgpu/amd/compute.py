"""The compute queue, driver side: an MQD (v11_compute_mqd) and the HQD registers of one MEC queue programmed the way
gfx_v11_0.c programs its KIQ (GRBM_GFX_CNTL selects the queue, the registers are written from the MQD, CP_HQD_ACTIVE
starts it), a ring in VRAM fed through a 64-bit doorbell, and the packets that program a dispatch from a kernel
descriptor's fields.

The command processor does not read the 64-byte kernel descriptor: the driver copies what it holds into the
COMPUTE_PGM_* registers with SET_SH_REG (code address, RSRC1/2/3, LDS size), fills the user SGPRs the descriptor
enables (COMPUTE_USER_DATA_*), sizes scratch (COMPUTE_TMPRING_SIZE), then DISPATCH_DIRECT.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from speck.usbgpu.amd import pm4
from speck.usbgpu.amd.mmio import Mmio
from speck.usbgpu.amd.tables import GC, STRUCTS
from speck.usbgpu.errors import UsbGpuValueError

_MQD = STRUCTS.v11_compute_mqd
ME, PIPE, QUEUE = 1, 0, 0  # MEC 1 (me 1), pipe 0, queue 0: the queue speck runs its dispatches on
MQD_HEADER = 0xC0310800  # the value gfx_v11_0_compute_mqd_init puts in an MQD's header dword
EOP_BYTES = 2048  # GFX11_MEC_HPD_SIZE: the end-of-pipe buffer a queue needs
LDS_GRANULE = 512  # COMPUTE_PGM_RSRC2.LDS_SIZE counts 128-dword blocks on gfx11
SCRATCH_WAVE_GRANULE = 256  # COMPUTE_TMPRING_SIZE.WAVESIZE units [unverified: the gfx11 granule]
WAVE_LANES = 32
# The user SGPRs a kernel descriptor can enable, in the order they are loaded (LLVM AMDGPUUsage, "Initial Kernel
# Execution State"), with how many SGPRs each takes.
USER_SGPRS: dict[str, int] = {
    "private_segment_buffer": 4,
    "dispatch_ptr": 2,
    "queue_ptr": 2,
    "kernarg_segment_ptr": 2,
    "dispatch_id": 2,
    "flat_scratch_init": 2,
    "private_segment_size": 1,
}
# hsa_kernel_dispatch_packet_t (HSA Platform System Architecture spec): what a dispatch pointer points at.
DYNAMIC_STACK_BYTES = 1024  # per lane for a kernel with dynamic stack use (HIP's default per-thread stack limit)
AQL_PACKET = struct.Struct("<HHHHHHIIIIIQQQQ")
AQL_KERNEL_DISPATCH = 2  # HSA_PACKET_TYPE_KERNEL_DISPATCH


@dataclass(frozen=True)
class KernelCode:
    """What the command processor needs from a kernel descriptor (LLVM AMDGPUUsage, "Kernel Descriptor"), as a
    code-object loader reads it: `entry` is the GPU virtual address of the first instruction (the descriptor's
    address + kernel_code_entry_byte_offset; 256-byte aligned), `rsrc1/2/3` its COMPUTE_PGM_RSRC* values,
    `user_sgprs` the enabled user SGPRs (names of USER_SGPRS, any order), `group_segment_size` the static LDS
    bytes, `private_segment_size` the scratch bytes per lane, `kernarg_size` the kernarg segment's size,
    `dynamic_stack` the descriptor's uses_dynamic_stack bit (the launch then reserves DYNAMIC_STACK_BYTES more
    scratch per lane, as HIP's default stack limit does)."""

    entry: int
    rsrc1: int
    rsrc2: int
    rsrc3: int = 0
    user_sgprs: Sequence[str] = ("kernarg_segment_ptr",)
    group_segment_size: int = 0
    private_segment_size: int = 0
    kernarg_size: int = 0
    wave32: bool = True
    name: str = "kernel"
    dynamic_stack: bool = False

    @property
    def scratch_per_lane(self) -> int:
        """Scratch bytes each lane gets: the static private segment plus the dynamic stack reservation."""
        return self.private_segment_size + (DYNAMIC_STACK_BYTES if self.dynamic_stack else 0)

    def __post_init__(self) -> None:
        unknown = [s for s in self.user_sgprs if s not in USER_SGPRS]
        if unknown:
            raise UsbGpuValueError(f"{self.name}: unknown user SGPRs {unknown}; known: {', '.join(USER_SGPRS)}")
        if self.entry & 0xFF:
            raise UsbGpuValueError(
                f"{self.name}: code at {self.entry:#x} is not 256-byte aligned (COMPUTE_PGM_LO drops 8 bits)"
            )
        if not self.wave32:
            raise UsbGpuValueError(f"{self.name} is compiled for wave64; speck dispatches wave32 kernels")
        count = sum(USER_SGPRS[s] for s in self.user_sgprs)
        declared = GC.COMPUTE_PGM_RSRC2.get(self.rsrc2, "USER_SGPR")
        if count > declared:  # LLVM may reserve more than the enabled ones (they load as 0)
            raise UsbGpuValueError(
                f"{self.name}: the enabled user SGPRs ({', '.join(self.user_sgprs) or 'none'}) take {count} SGPRs "
                f"but COMPUTE_PGM_RSRC2.USER_SGPR is {declared}"
            )


@dataclass(frozen=True)
class Launch:
    """One dispatch: `grid` workgroups of `block` threads, the kernarg segment at `kernargs` (GPU address)."""

    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    kernargs: int
    dispatch_packet: int = 0  # where the AQL packet lives when the kernel reads its dispatch pointer
    dispatch_id: int = 0
    scratch_base: int = 0


def aql_packet(code: KernelCode, launch: Launch, kernel_object: int = 0) -> bytes:
    """The 64-byte hsa_kernel_dispatch_packet_t a kernel's dispatch pointer points at (sizes, segment sizes)."""
    g, b = launch.grid, launch.block
    dims = 3 if g[2] > 1 or b[2] > 1 else 2 if g[1] > 1 or b[1] > 1 else 1
    threads = [x * y for x, y in zip(g, b)]
    return AQL_PACKET.pack(
        AQL_KERNEL_DISPATCH,
        dims,
        *b,
        0,
        *threads,
        code.scratch_per_lane,
        code.group_segment_size,
        kernel_object,
        launch.kernargs,
        0,
        0,
    )


def user_sgpr_values(code: KernelCode, launch: Launch) -> list[int]:
    """COMPUTE_USER_DATA_* for `code`'s enabled user SGPRs, in load order."""
    out: list[int] = []
    for name in USER_SGPRS:
        if name not in code.user_sgprs:
            continue
        if name == "private_segment_buffer":
            out += [0, 0, 0, 0]  # gfx11 uses architected flat scratch: the buffer descriptor is unused
        elif name == "dispatch_ptr":
            if not launch.dispatch_packet:
                raise UsbGpuValueError(f"{code.name} reads its dispatch pointer: the launch needs a dispatch packet")
            out += [launch.dispatch_packet & 0xFFFFFFFF, launch.dispatch_packet >> 32]
        elif name == "queue_ptr":
            raise UsbGpuValueError(f"{code.name} reads an HSA queue pointer; speck's PM4 queue has no amd_queue_t")
        elif name == "kernarg_segment_ptr":
            out += [launch.kernargs & 0xFFFFFFFF, launch.kernargs >> 32]
        elif name == "dispatch_id":
            out += [launch.dispatch_id & 0xFFFFFFFF, launch.dispatch_id >> 32]
        elif name == "flat_scratch_init":
            out += [launch.scratch_base & 0xFFFFFFFF, launch.scratch_base >> 32]
        else:
            out += [code.scratch_per_lane]
    return out


def scratch_waves(code: KernelCode, launch: Launch) -> int:
    """Waves the scratch ring is sized for: every wave of the grid, at most COMPUTE_TMPRING_SIZE.WAVES allows."""
    g, b = launch.grid, launch.block
    waves = g[0] * g[1] * g[2] * -(-(b[0] * b[1] * b[2]) // WAVE_LANES)
    return min(waves, (1 << GC.COMPUTE_TMPRING_SIZE.fields["WAVES"][1]) - 1)


def scratch_bytes(code: KernelCode, launch: Launch) -> int:
    """Bytes of scratch buffer a launch of `code` needs (0 without private segment)."""
    if not code.scratch_per_lane:
        return 0
    return scratch_waves(code, launch) * _wave_granules(code) * SCRATCH_WAVE_GRANULE


def _wave_granules(code: KernelCode) -> int:
    return -(-code.scratch_per_lane * WAVE_LANES // SCRATCH_WAVE_GRANULE)


def scratch_ring_size(code: KernelCode, launch: Launch) -> int:
    """COMPUTE_TMPRING_SIZE for a launch: the waves the scratch ring holds and each wave's scratch."""
    if not code.scratch_per_lane:
        return 0
    return GC.COMPUTE_TMPRING_SIZE.encode(0, WAVES=scratch_waves(code, launch), WAVESIZE=_wave_granules(code))


def dispatch_packets(code: KernelCode, launch: Launch, gc_base: int) -> list[int]:
    """SET_SH_REG of the COMPUTE_* state `code` needs for `launch`, then DISPATCH_DIRECT."""
    for n, axis in zip(launch.block, "xyz"):
        if not 1 <= n <= 1024:
            raise UsbGpuValueError(f"{code.name}: block {axis} of {n} threads (1..1024)")
    if launch.block[0] * launch.block[1] * launch.block[2] > 1024:
        raise UsbGpuValueError(f"{code.name}: a workgroup of {launch.block} threads exceeds 1024")
    lds_blocks = -(-code.group_segment_size // LDS_GRANULE)
    rsrc2 = GC.COMPUTE_PGM_RSRC2.encode(code.rsrc2, LDS_SIZE=lds_blocks)
    user = user_sgpr_values(code, launch)
    out = pm4.set_sh_reg(GC.COMPUTE_PGM_LO, [code.entry >> 8 & 0xFFFFFFFF, code.entry >> 40 & 0xFF], gc_base)
    out += pm4.set_sh_reg(GC.COMPUTE_PGM_RSRC1, [code.rsrc1, rsrc2], gc_base)
    out += pm4.set_sh_reg(GC.COMPUTE_PGM_RSRC3, [code.rsrc3], gc_base)
    out += pm4.set_sh_reg(GC.COMPUTE_TMPRING_SIZE, [scratch_ring_size(code, launch)], gc_base)
    if code.scratch_per_lane:
        if not launch.scratch_base:
            raise UsbGpuValueError(
                f"{code.name} uses {code.scratch_per_lane} bytes of scratch per lane: the launch needs a scratch buffer"
            )
        base = launch.scratch_base >> 8
        out += pm4.set_sh_reg(GC.COMPUTE_DISPATCH_SCRATCH_BASE_LO, [base & 0xFFFFFFFF, base >> 32], gc_base)
    out += pm4.set_sh_reg(GC.COMPUTE_START_X, [0, 0, 0], gc_base)
    out += pm4.set_sh_reg(GC.COMPUTE_NUM_THREAD_X, list(launch.block), gc_base)
    if user:
        out += pm4.set_sh_reg(GC.COMPUTE_USER_DATA_0, user, gc_base)
    initiator = GC.COMPUTE_DISPATCH_INITIATOR.encode(
        0, COMPUTE_SHADER_EN=1, FORCE_START_AT_000=1, CS_W32_EN=int(code.wave32)
    )
    return out + pm4.dispatch_direct(launch.grid, initiator)


@dataclass(frozen=True)
class ComputeLayout:
    """Where one compute queue lives: GPU virtual addresses (VM context `vmid`) and its MQD's MC address."""

    ring: int
    ring_bytes: int
    rptr_report: int
    wptr_poll: int
    eop: int
    mqd_vram: int  # VRAM offset of the MQD (the CP reaches it through VMID 0)
    doorbell: int  # dword index in the doorbell BAR
    vmid: int


@dataclass
class ComputeQueue:
    """One MEC queue: set up, fed, reset. `write_vram(offset, data)` reaches VRAM through BAR0; `ring_doorbell(
    index, value)` writes a 64-bit doorbell; `mc(offset)` is VRAM offset -> MC address (VMID 0)."""

    mmio: Mmio
    layout: ComputeLayout
    write_vram: Callable[[int, bytes], None]
    ring_doorbell: Callable[[int, int], None]
    mc: Callable[[int], int]
    wptr: int = 0  # dwords written (monotonic)
    doorbells: int = 0
    mqd: dict[str, int] = field(default_factory=dict)

    def _select(self, me: int = ME, pipe: int = PIPE, queue: int = QUEUE) -> None:
        self.mmio.write_fields(GC.GRBM_GFX_CNTL, MEID=me, PIPEID=pipe, QUEUEID=queue)

    def build_mqd(self) -> dict[str, int]:
        """The MQD fields (gfx_v11_0_compute_mqd_init with speck's queue: doorbell on, VM context `vmid`)."""
        L = self.layout
        eop = L.eop >> 8
        mqd_mc = self.mc(L.mqd_vram)
        doorbell = GC.CP_HQD_PQ_DOORBELL_CONTROL.encode(0, DOORBELL_OFFSET=L.doorbell, DOORBELL_EN=1)
        control = GC.CP_HQD_PQ_CONTROL.encode(
            None,
            QUEUE_SIZE=(L.ring_bytes // 4).bit_length() - 2,  # 2^(QUEUE_SIZE+1) dwords
            RPTR_BLOCK_SIZE=(4096 // 4).bit_length() - 2,
            UNORD_DISPATCH=1,
            TUNNEL_DISPATCH=0,
            PRIV_STATE=1,
            KMD_QUEUE=1,
        )
        return {
            "header": MQD_HEADER,
            "compute_pipelinestat_enable": 1,
            "compute_static_thread_mgmt_se0": 0xFFFFFFFF,
            "compute_static_thread_mgmt_se1": 0xFFFFFFFF,
            "compute_static_thread_mgmt_se2": 0xFFFFFFFF,
            "compute_static_thread_mgmt_se3": 0xFFFFFFFF,
            "compute_misc_reserved": 7,
            "cp_hqd_eop_base_addr_lo": eop & 0xFFFFFFFF,
            "cp_hqd_eop_base_addr_hi": eop >> 32,
            "cp_hqd_eop_control": GC.CP_HQD_EOP_CONTROL.encode(None, EOP_SIZE=(EOP_BYTES // 4).bit_length() - 2),
            "cp_hqd_pq_doorbell_control": doorbell,
            "cp_mqd_base_addr_lo": mqd_mc & 0xFFFFFFFC,
            "cp_mqd_base_addr_hi": mqd_mc >> 32,
            "cp_mqd_control": GC.CP_MQD_CONTROL.encode(None, VMID=0),
            "cp_hqd_pq_base_lo": L.ring >> 8 & 0xFFFFFFFF,
            "cp_hqd_pq_base_hi": L.ring >> 40 & 0xFF,
            "cp_hqd_pq_control": control,
            "cp_hqd_pq_rptr_report_addr_lo": L.rptr_report & 0xFFFFFFFC,
            "cp_hqd_pq_rptr_report_addr_hi": L.rptr_report >> 32 & 0xFFFF,
            "cp_hqd_pq_wptr_poll_addr_lo": L.wptr_poll & 0xFFFFFFFC,
            "cp_hqd_pq_wptr_poll_addr_hi": L.wptr_poll >> 32 & 0xFFFF,
            "cp_hqd_vmid": GC.CP_HQD_VMID.encode(0, VMID=L.vmid),
            "cp_hqd_persistent_state": GC.CP_HQD_PERSISTENT_STATE.encode(None, PRELOAD_SIZE=0x55),
            "cp_hqd_ib_control": GC.CP_HQD_IB_CONTROL.encode(None, MIN_IB_AVAIL_SIZE=3),
            "cp_hqd_active": 1,
        }

    def setup(self) -> None:
        """Write the MQD, then program and activate the HQD (gfx_v11_0_kiq_init_register's order)."""
        L, m = self.layout, self.mmio
        self.mqd = self.build_mqd()
        self.write_vram(L.mqd_vram, bytes(_MQD.pack(**self.mqd)))
        self.write_vram(self._offset(L.rptr_report), bytes(16))  # rptr report and wptr poll slots
        self.write_vram(self._offset(L.eop), bytes(EOP_BYTES))
        self._select()
        self.deactivate()
        q = self.mqd
        m.update(GC.CP_PQ_WPTR_POLL_CNTL, EN=0)
        m.write(GC.CP_HQD_EOP_BASE_ADDR, q["cp_hqd_eop_base_addr_lo"])
        m.write(GC.CP_HQD_EOP_BASE_ADDR_HI, q["cp_hqd_eop_base_addr_hi"])
        m.write(GC.CP_HQD_EOP_CONTROL, q["cp_hqd_eop_control"])
        m.write(GC.CP_HQD_PQ_DOORBELL_CONTROL, q["cp_hqd_pq_doorbell_control"])
        m.write(GC.CP_MQD_BASE_ADDR, q["cp_mqd_base_addr_lo"])
        m.write(GC.CP_MQD_BASE_ADDR_HI, q["cp_mqd_base_addr_hi"])
        m.write(GC.CP_MQD_CONTROL, q["cp_mqd_control"])
        m.write(GC.CP_HQD_PQ_BASE, q["cp_hqd_pq_base_lo"])
        m.write(GC.CP_HQD_PQ_BASE_HI, q["cp_hqd_pq_base_hi"])
        m.write(GC.CP_HQD_PQ_CONTROL, q["cp_hqd_pq_control"])
        m.write(GC.CP_HQD_PQ_RPTR_REPORT_ADDR, q["cp_hqd_pq_rptr_report_addr_lo"])
        m.write(GC.CP_HQD_PQ_RPTR_REPORT_ADDR_HI, q["cp_hqd_pq_rptr_report_addr_hi"])
        m.write(GC.CP_HQD_PQ_WPTR_POLL_ADDR, q["cp_hqd_pq_wptr_poll_addr_lo"])
        m.write(GC.CP_HQD_PQ_WPTR_POLL_ADDR_HI, q["cp_hqd_pq_wptr_poll_addr_hi"])
        m.write(GC.CP_MEC_DOORBELL_RANGE_LOWER, GC.CP_MEC_DOORBELL_RANGE_LOWER.encode(0, DOORBELL_RANGE_LOWER=0))
        m.write(
            GC.CP_MEC_DOORBELL_RANGE_UPPER,
            GC.CP_MEC_DOORBELL_RANGE_UPPER.encode(0, DOORBELL_RANGE_UPPER=max(L.doorbell + 1, 1)),
        )
        m.write(GC.CP_HQD_PQ_DOORBELL_CONTROL, q["cp_hqd_pq_doorbell_control"])
        m.write(GC.CP_HQD_PQ_RPTR, 0)
        m.write(GC.CP_HQD_PQ_WPTR_LO, 0)
        m.write(GC.CP_HQD_PQ_WPTR_HI, 0)
        m.write(GC.CP_HQD_VMID, q["cp_hqd_vmid"])
        m.write(GC.CP_HQD_PERSISTENT_STATE, q["cp_hqd_persistent_state"])
        m.write(GC.CP_HQD_ACTIVE, 1)
        m.update(GC.CP_PQ_STATUS, DOORBELL_ENABLE=1)
        self._select(0, 0, 0)
        self.wptr = 0

    def _offset(self, va: int) -> int:
        return va  # the driver's VM maps VRAM offset x at virtual address x

    def deactivate(self) -> None:
        """Dequeue the (selected) queue if it is active and wait until the CP lets it go."""
        m = self.mmio
        if m.field(GC.CP_HQD_ACTIVE, "ACTIVE"):
            m.write_fields(GC.CP_HQD_DEQUEUE_REQUEST, DEQUEUE_REQ=1)
            m.wait(GC.CP_HQD_ACTIVE, lambda v: not GC.CP_HQD_ACTIVE.get(v, "ACTIVE"), "compute queue dequeue")
            m.write(GC.CP_HQD_DEQUEUE_REQUEST, 0)

    def reset(self) -> None:
        """Dequeue and re-create the queue: whatever it was running or stuck on is dropped."""
        self.setup()

    def submit(self, packets: Sequence[int]) -> int:
        """Write `packets` into the ring (wrapping around its end), publish the write pointer and ring the
        doorbell once; returns the new write pointer (dwords)."""
        L = self.layout
        size_dw = L.ring_bytes // 4
        if len(packets) >= size_dw:
            raise UsbGpuValueError(f"{len(packets)} dwords do not fit the {size_dw}-dword compute ring; use an IB")
        data = struct.pack(f"<{len(packets)}I", *(p & 0xFFFFFFFF for p in packets))
        start = self.wptr % size_dw
        first = min(len(packets), size_dw - start)
        self.write_vram(self._offset(L.ring) + 4 * start, data[: 4 * first])
        if first < len(packets):
            self.write_vram(self._offset(L.ring), data[4 * first :])
        self.wptr += len(packets)
        self.write_vram(self._offset(L.wptr_poll), struct.pack("<Q", self.wptr))
        self.ring_doorbell(L.doorbell, self.wptr)
        self.doorbells += 1
        return self.wptr
