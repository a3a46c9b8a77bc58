"""PM4 type-3 packet builders for gfx11 compute queues (opcodes and field positions from nvd.h via
speck.usbgpu.amd.tables; the packet bodies as gfx_v11_0.c emits them).

Each builder returns the packet's dwords. A packet is a header - type 3, the opcode, the count of body dwords minus
one, the compute shader type - followed by its body.
"""

from __future__ import annotations

from collections.abc import Sequence

from speck.usbgpu.amd.regdefs import Reg
from speck.usbgpu.amd.tables import EVENT, PM4, PM4_PACKETS
from speck.usbgpu.errors import UsbGpuValueError

_H = PM4_PACKETS.HEADER
MAX_BODY = 1 << _H.fields["count"][2]  # the count field holds body dwords - 1
IB_MAX_DWORDS = (1 << PM4_PACKETS.INDIRECT_BUFFER.fields["ib_size"][2]) - 1
# the GPU clock of RELEASE_MEM and SDMA timestamps and CP_MES_MTIME: the 100 MHz reference clock
TIMESTAMP_NS = 10


def header(opcode: int, body_dwords: int) -> int:
    """A type-3 header for a compute queue (PACKET3_COMPUTE: the shader-type bit set)."""
    if not 1 <= body_dwords <= MAX_BODY:
        raise UsbGpuValueError(f"a PM4 packet body holds 1..{MAX_BODY} dwords, got {body_dwords}")
    return _H.encode(type=PM4.PACKET_TYPE3, opcode=opcode, count=body_dwords - 1, shader_type=1)[0]


def _packet(opcode: int, layout_dwords: int, body: list[int]) -> list[int]:
    body[0] = header(opcode, layout_dwords - 1 + len(body) - layout_dwords)
    return body


def nop(body_dwords: int = 1) -> list[int]:
    """NOP with `body_dwords` of padding (a 1-dword type-3 NOP is not encodable: its count is body - 1)."""
    return [header(PM4.NOP, body_dwords)] + [0] * body_dwords


def _lo_hi(addr: int) -> tuple[int, int]:
    return addr & 0xFFFFFFFF, addr >> 32 & 0xFFFFFFFF


def set_sh_reg(reg: Reg, values: Sequence[int], gc_base: int) -> list[int]:
    """SET_SH_REG: write `values` to `reg` and the registers after it. `gc_base` is GC's base segment 0 (from
    the discovery table): SH registers are addressed from PACKET3_SET_SH_REG_START."""
    offset = gc_base + reg.offset - PM4.SET_SH_REG_START
    if reg.ip != "GC" or reg.base_idx != 0 or offset < 0:
        raise UsbGpuValueError(f"{reg.name} is not a shader (SH) register of GC")
    p = PM4_PACKETS.SET_SH_REG
    out = p.encode(reg_offset=offset)
    out[0] = header(PM4.SET_SH_REG, 1 + len(values))
    return out + [v & 0xFFFFFFFF for v in values]


def dispatch_direct(dim: tuple[int, int, int], initiator: int) -> list[int]:
    """DISPATCH_DIRECT: `dim` workgroups (or threads, with USE_THREAD_DIMENSIONS) and COMPUTE_DISPATCH_INITIATOR."""
    p = PM4_PACKETS.DISPATCH_DIRECT
    out = p.encode(dim_x=dim[0], dim_y=dim[1], dim_z=dim[2], dispatch_initiator=initiator)
    out[0] = header(PM4.DISPATCH_DIRECT, p.dwords - 1)
    return out


def acquire_mem() -> list[int]:
    """ACQUIRE_MEM over all of memory: invalidate/write back every cache level before later work reads it
    (gfx_v11_0_emit_mem_sync)."""
    p = PM4_PACKETS.ACQUIRE_MEM
    out = p.encode(
        coher_size=0xFFFFFFFF,
        coher_size_hi=0xFFFFFF,
        poll_interval=10,
        gcr_gl2_inv=1,
        gcr_gl2_wb=1,
        gcr_glm_inv=1,
        gcr_glm_wb=1,
        gcr_gl1_inv=1,
        gcr_glv_inv=1,
        gcr_glk_inv=1,
        gcr_gli_inv=1,
    )
    out[0] = header(PM4.ACQUIRE_MEM, p.dwords - 1)
    return out


def release_mem(addr: int, value: int, interrupt: bool = False, data64: bool = True) -> list[int]:
    """RELEASE_MEM at the end of the pipe: write back the caches, then write `value` (64 or low 32 bits) at `addr`
    once all earlier work finished, optionally raising an end-of-pipe interrupt (gfx_v11_0_ring_emit_fence)."""
    if addr & (7 if data64 else 3):
        raise UsbGpuValueError(f"RELEASE_MEM address {addr:#x} must be {'8' if data64 else '4'}-byte aligned")
    sel = PM4.RELEASE_DATA_SEL_DATA64 if data64 else PM4.RELEASE_DATA_SEL_DATA32
    return _release(addr, sel, value, interrupt)


def timestamp(addr: int) -> list[int]:
    """RELEASE_MEM of the GPU clock (64 bits, TIMESTAMP_NS per tick) at `addr` once all earlier work finished."""
    if addr & 7:
        raise UsbGpuValueError(f"a timestamp address {addr:#x} must be 8-byte aligned")
    return _release(addr, PM4.RELEASE_DATA_SEL_GPU_CLOCK, 0, False)


def _release(addr: int, data_sel: int, value: int, interrupt: bool) -> list[int]:
    lo, hi = _lo_hi(addr)
    p = PM4_PACKETS.RELEASE_MEM
    out = p.encode(
        event_type=EVENT.CACHE_FLUSH_AND_INV_TS_EVENT,
        event_index=5,  # an end-of-pipe timestamp event (the index gfx_v11_0.c uses with this event)
        gcr_seq=1,
        gcr_gl2_wb=1,
        gcr_glm_inv=1,
        gcr_glm_wb=1,
        cache_policy=3,
        data_sel=data_sel,
        int_sel=PM4.RELEASE_INT_SEL_AFTER_WRITE_CONFIRM if interrupt else PM4.RELEASE_INT_SEL_NONE,
        addr_lo=lo,
        addr_hi=hi,
        data_lo=value & 0xFFFFFFFF,
        data_hi=value >> 32 & 0xFFFFFFFF,
    )
    out[0] = header(PM4.RELEASE_MEM, p.dwords - 1)
    return out


def wait_reg_mem(
    addr: int, ref: int, function: int = PM4.WAIT_FUNCTION_GE, mask: int = 0xFFFFFFFF, poll_interval: int = 4
) -> list[int]:
    """WAIT_REG_MEM on memory: the queue stalls until (dword at `addr` & mask) <function> ref."""
    if addr & 3:
        raise UsbGpuValueError(f"WAIT_REG_MEM address {addr:#x} must be dword aligned")
    lo, hi = _lo_hi(addr)
    p = PM4_PACKETS.WAIT_REG_MEM
    out = p.encode(
        function=function,
        mem_space=PM4.WAIT_MEM_SPACE_MEMORY,
        addr_lo=lo,
        addr_hi=hi,
        reference=ref & 0xFFFFFFFF,
        mask=mask & 0xFFFFFFFF,
        poll_interval=poll_interval,
    )
    out[0] = header(PM4.WAIT_REG_MEM, p.dwords - 1)
    return out


def indirect_buffer(addr: int, ndwords: int, vmid: int) -> list[int]:
    """INDIRECT_BUFFER: run `ndwords` of PM4 at `addr` (in VM `vmid`), then continue after this packet."""
    if addr & 3 or not 0 < ndwords <= IB_MAX_DWORDS:
        raise UsbGpuValueError(f"an indirect buffer needs a dword-aligned address and 1..{IB_MAX_DWORDS} dwords")
    lo, hi = _lo_hi(addr)
    p = PM4_PACKETS.INDIRECT_BUFFER
    out = p.encode(ib_base_lo=lo, ib_base_hi=hi, ib_size=ndwords, valid=1, vmid=vmid)
    out[0] = header(PM4.INDIRECT_BUFFER, p.dwords - 1)
    return out


def write_data(addr: int, dwords: Sequence[int], confirm: bool = True) -> list[int]:
    """WRITE_DATA to memory (asynchronously, confirmed when `confirm`): `dwords` at `addr`."""
    if addr & 3 or not dwords:
        raise UsbGpuValueError("WRITE_DATA needs a dword-aligned address and at least one dword")
    lo, hi = _lo_hi(addr)
    p = PM4_PACKETS.WRITE_DATA
    out = p.encode(dst_sel=PM4.WRITE_DST_SEL_MEMORY, wr_confirm=int(confirm), dst_addr_lo=lo, dst_addr_hi=hi)
    out[0] = header(PM4.WRITE_DATA, p.dwords - 1 + len(dwords))
    return out + [d & 0xFFFFFFFF for d in dwords]
