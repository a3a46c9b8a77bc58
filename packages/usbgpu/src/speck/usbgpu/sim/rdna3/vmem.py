"""Vector memory: the FLAT/GLOBAL/SCRATCH and DS (LDS) encodings, plus the MUBUF cache invalidations.

Field layouts (RDNA3 ISA chapter 15.13-15.14): FLAT offset[12:0] dlc[13] glc[14] slc[15] seg[17:16] (0 flat,
1 scratch, 2 global) op[24:18] [31:26]=110111 / addr[39:32] data[47:40] saddr[54:48] sve[55] vdst[63:56];
DS offset0[7:0] offset1[15:8] gds[17] op[25:18] [31:26]=110110 / addr[39:32] data0[47:40] data1[55:48] vdst[63:56].

Addresses: global = SGPR-pair saddr + 32-bit vaddr + offset (or a 64-bit vaddr when saddr is off); flat = 64-bit vaddr +
offset, where the shared and private apertures reach LDS and scratch; scratch = each lane's private offset
(vaddr if SVE) + saddr + offset; DS = vaddr + offset inside the workgroup's LDS allocation. Loads read memory when they
issue and deliver their data when an s_waitcnt retires them (vmcnt for FLAT/GLOBAL/SCRATCH, lgkmcnt for DS); stores
complete at issue.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from speck.usbgpu.sim.rdna3.inst import Inst, unimplemented, vgpr_range
from speck.usbgpu.sim.rdna3.operands import (
    APERTURE_SIZE,
    NULL_CODE,
    PRIVATE_APERTURE,
    SHARED_APERTURE,
    pair64,
    scalar_text,
)
from speck.usbgpu.sim.rdna3.wave import EXEC, Pending, Waves, per_lane

Fetch = Callable[[int], int]
SEGMENTS = {0: "flat", 1: "scratch", 2: "global"}


@dataclass(frozen=True)
class MemOp:
    """size: bytes moved per lane; load: loads (else stores); ext: how sub-dword loads widen ('u', 'i'); d16: the
    register half a 16-bit load or store uses (0 low, 1 high, -1 whole registers)."""

    name: str
    size: int
    load: bool
    ext: str = "u"
    d16: int = -1


FLAT_OPS: dict[int, MemOp] = {
    0x10: MemOp("load_u8", 1, True),
    0x11: MemOp("load_i8", 1, True, "i"),
    0x12: MemOp("load_u16", 2, True),
    0x13: MemOp("load_i16", 2, True, "i"),
    0x14: MemOp("load_b32", 4, True),
    0x15: MemOp("load_b64", 8, True),
    0x16: MemOp("load_b96", 12, True),
    0x17: MemOp("load_b128", 16, True),
    0x18: MemOp("store_b8", 1, False),
    0x19: MemOp("store_b16", 2, False),
    0x1A: MemOp("store_b32", 4, False),
    0x1B: MemOp("store_b64", 8, False),
    0x1C: MemOp("store_b96", 12, False),
    0x1D: MemOp("store_b128", 16, False),
    0x1E: MemOp("load_d16_u8", 1, True, "u", 0),
    0x1F: MemOp("load_d16_i8", 1, True, "i", 0),
    0x20: MemOp("load_d16_b16", 2, True, "u", 0),
    0x21: MemOp("load_d16_hi_u8", 1, True, "u", 1),
    0x22: MemOp("load_d16_hi_i8", 1, True, "i", 1),
    0x23: MemOp("load_d16_hi_b16", 2, True, "u", 1),
    0x24: MemOp("store_d16_hi_b8", 1, False, "u", 1),
    0x25: MemOp("store_d16_hi_b16", 2, False, "u", 1),
}
FLAT_ATOMICS = {0x33: "atomic_swap_b32", 0x34: "atomic_cmpswap_b32", 0x35: "atomic_add_u32", 0x36: "atomic_sub_u32"}
FLAT_ATOMICS |= {0x38: "atomic_min_i32", 0x39: "atomic_min_u32", 0x3A: "atomic_max_i32", 0x3B: "atomic_max_u32"}
FLAT_ATOMICS |= {0x3C: "atomic_and_b32", 0x3D: "atomic_or_b32", 0x3E: "atomic_xor_b32", 0x3F: "atomic_inc_u32"}
FLAT_ATOMICS |= {0x40: "atomic_dec_u32", 0x41: "atomic_swap_b64", 0x42: "atomic_cmpswap_b64", 0x43: "atomic_add_u64"}
FLAT_ATOMICS |= {0x50: "atomic_cmpswap_f32", 0x51: "atomic_min_f32", 0x52: "atomic_max_f32", 0x56: "atomic_add_f32"}


def _widen(raw: np.ndarray, op: MemOp) -> np.ndarray:
    """(k, size) bytes -> (k, dwords) uint32 register values (sub-dword loads zero/sign-extended)."""
    if op.size >= 4:
        return np.ascontiguousarray(raw).view(np.uint32)
    dt = {(1, "u"): np.uint8, (1, "i"): np.int8, (2, "u"): np.uint16, (2, "i"): np.int16}[(op.size, op.ext)]
    v = np.ascontiguousarray(raw).view(dt).astype(np.int32 if op.ext == "i" else np.uint32)
    return v.view(np.uint32).reshape(-1, 1)


def _narrow(values: np.ndarray, op: MemOp) -> np.ndarray:
    """(k, dwords) uint32 register values -> (k, size) bytes to store."""
    if op.size >= 4:
        return np.ascontiguousarray(values).view(np.uint8)
    v = values[:, 0] >> np.uint32(16) if op.d16 == 1 else values[:, 0]
    return np.ascontiguousarray(v).view(np.uint8).reshape(-1, 4)[:, : op.size]


def active(w: Waves, values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """The active lanes' elements of a (n, 32) array, in (wave, lane) order."""
    return values.reshape(-1) if w.exec_full() else values[mask]


def _deliver(w: Waves, counter: str, vdst: int, data: np.ndarray, mask: np.ndarray, op: MemOp) -> None:
    """Queue a load's data (k active lanes, in (wave, lane) order) for the registers from vdst on."""
    values = []
    full_exec = w.exec_full()
    for k in range(data.shape[1]):
        if full_exec:
            values.append(np.ascontiguousarray(data[:, k]).reshape(w.n, 32))
            continue
        full = np.zeros((w.n, 32), dtype=np.uint32)
        full[mask] = data[:, k]
        values.append(full)
    if op.d16 >= 0:
        values = [v & np.uint32(0xFFFF) for v in values]
    w.issue(Pending(counter, True, list(range(vdst, vdst + len(values))), values, mask, op.d16, full_exec))


def _data(w: Waves, reg: int, dwords: int, mask: np.ndarray) -> np.ndarray:
    """The active lanes' store data: (k, dwords) uint32."""
    return np.stack([active(w, w.v[reg + k], mask) for k in range(dwords)], axis=1)


def decode_flat(pc: int, fetch: Fetch) -> Inst:
    w0, w1 = fetch(0), fetch(1)
    offset, glc, slc, dlc = w0 & 0x1FFF, (w0 >> 14) & 1, (w0 >> 15) & 1, (w0 >> 13) & 1
    seg, op = (w0 >> 16) & 3, (w0 >> 18) & 0x7F
    addr, data, saddr, sve, vdst = w1 & 0xFF, (w1 >> 8) & 0xFF, (w1 >> 16) & 0x7F, (w1 >> 23) & 1, (w1 >> 24) & 0xFF
    if offset & 0x1000:
        offset -= 0x2000
    prefix = SEGMENTS.get(seg, "<seg3>")
    mop = FLAT_OPS.get(op)
    if mop is None:
        name = f"{prefix}_{FLAT_ATOMICS[op]}" if op in FLAT_ATOMICS else f"<{prefix} opcode {op:#x}>"
        return Inst(pc, (w0, w1), "FLAT", op, name, "", "vmem", unimplemented(name, f" (encoding {w0:#010x})"))
    name = f"{prefix}_{mop.name}"
    dwords = max(1, mop.size // 4)
    has_saddr = saddr != NULL_CODE
    if seg == 1:
        vaddr_used, vaddr_bits = bool(sve), 32
    else:
        vaddr_used, vaddr_bits = True, (32 if has_saddr else 64)
    vtext = (f"v{addr}" if vaddr_bits == 32 else f"v[{addr}:{addr + 1}]") if vaddr_used else "off"
    stext = scalar_text(saddr, 64 if seg == 2 else 32) if has_saddr else "off"
    rtext = f"v{data}" if dwords == 1 else f"v[{data}:{data + dwords - 1}]"
    dtext = f"v{vdst}" if dwords == 1 else f"v[{vdst}:{vdst + dwords - 1}]"
    ops = [dtext, vtext] if mop.load else [vtext, rtext]
    if seg != 0:
        ops.append(stext)
    text = ", ".join(ops) + (f" offset:{offset}" if offset else "")
    text += "".join(f" {n}" for n, b in (("glc", glc), ("slc", slc), ("dlc", dlc)) if b)
    vregs = (vgpr_range(addr, vaddr_bits // 32) if vaddr_used else frozenset()) | (
        frozenset() if mop.load else vgpr_range(data, dwords)
    )
    sregs = frozenset(range(saddr, saddr + (2 if seg == 2 else 1))) if has_saddr and saddr < 106 else frozenset()
    inst = Inst(pc, (w0, w1), "FLAT", op, name, text, "vmem", vregs=vregs, sregs=sregs)

    def addresses(w: Waves, mask: np.ndarray, every: bool = False) -> Any:
        """The active lanes' addresses in (wave, lane) order, or with `every` (global only) all lanes'."""
        if every:
            pick: Callable[[np.ndarray], np.ndarray] = lambda x: x.reshape(-1)
        else:
            pick = lambda x: active(w, x, mask)
        if seg == 1:
            a = np.zeros(int(mask.sum()), dtype=np.int64)
            if vaddr_used:
                a = a + active(w, w.v[addr], mask).astype(np.int64)
            if has_saddr:
                a = a + active(w, per_lane(w.s[saddr]), mask).astype(np.int64)
            return ((a + offset) & 0xFFFFFFFF).astype(np.uint64)  # a 32-bit per-lane offset
        if has_saddr:
            base = pick(per_lane(w.read_s64(saddr)))
            return base + pick(w.v[addr]).astype(np.uint64) + np.uint64(offset & 0xFFFFFFFFFFFFFFFF)
        a64 = pair64(pick(w.v[addr]), pick(w.v[addr + 1]))
        return a64 + np.uint64(offset & 0xFFFFFFFFFFFFFFFF) if offset else a64

    def run(w: Waves) -> None:
        mask = w.exec_mask()
        if not w.s[EXEC].any():  # (the per-wave EXEC words: 32 times fewer than the lanes)
            if mop.load:
                _deliver(w, "vm", vdst, np.zeros((0, dwords), np.uint32), mask, mop)
            return
        if seg == 2 and mop.load and not w.exec_full():
            _global_load_lanes(w, mask, addresses(w, mask, every=True), vdst, mop)
            return
        a = addresses(w, mask)
        if seg == 1:
            lanes = _lane_rows(w, mask)
            if mop.load:
                _deliver(w, "vm", vdst, _widen(w.launch.scratch_load(lanes, a, mop.size), mop), mask, mop)
            else:
                w.launch.scratch_store(lanes, a, _narrow(_data(w, data, dwords, mask), mop))
            return
        space = "flat" if seg == 0 else "global"
        if mop.load:
            _deliver(w, "vm", vdst, _widen(w.launch.flat_load(w, mask, a, mop.size, space), mop), mask, mop)
        else:
            w.launch.flat_store(w, mask, a, _narrow(_data(w, data, dwords, mask), mop), space)

    inst.run = run
    return inst


def _global_load_lanes(w: Waves, mask: np.ndarray, every: np.ndarray, vdst: int, op: MemOp) -> None:
    """A global load under a partial EXEC without compacting the active lanes: inactive lanes read the first active
    lane's address (already read, so no new fault and no other effect), the data stays lane-shaped, and retiring
    writes only the active lanes. Stats count the active lanes' bytes."""
    flat = mask.reshape(-1)
    safe = every[int(np.argmax(flat))]
    data = w.launch.load(np.where(flat, every, safe), op.size, "global", lanes=int(np.count_nonzero(flat)))
    raw = _widen(data, op)
    values = [np.ascontiguousarray(raw[:, k]).reshape(w.n, 32) for k in range(raw.shape[1])]
    if op.d16 >= 0:
        values = [v & np.uint32(0xFFFF) for v in values]
    w.issue(Pending("vm", True, list(range(vdst, vdst + len(values))), values, mask, op.d16))


def _lane_rows(w: Waves, mask: np.ndarray) -> Any:
    """Row of each active lane in the launch's scratch array (wave id * 32 + lane)."""
    rows = w.wave_ids[:, None] * 32 + np.arange(32)
    return np.broadcast_to(rows, mask.shape)[mask]


# ---------------------------------------------------------------- DS (LDS)
@dataclass(frozen=True)
class DsOp:
    """size: bytes per address; load/store; pairs: the 2addr forms (two addresses); stride: offset unit multiplier."""

    name: str
    size: int
    load: bool
    ext: str = "u"
    d16: int = -1
    pairs: bool = False
    stride: int = 1


DS_OPS: dict[int, DsOp] = {
    0x0D: DsOp("ds_store_b32", 4, False),
    0x0E: DsOp("ds_store_2addr_b32", 4, False, pairs=True),
    0x0F: DsOp("ds_store_2addr_stride64_b32", 4, False, pairs=True, stride=64),
    0x1E: DsOp("ds_store_b8", 1, False),
    0x1F: DsOp("ds_store_b16", 2, False),
    0x36: DsOp("ds_load_b32", 4, True),
    0x37: DsOp("ds_load_2addr_b32", 4, True, pairs=True),
    0x38: DsOp("ds_load_2addr_stride64_b32", 4, True, pairs=True, stride=64),
    0x39: DsOp("ds_load_i8", 1, True, "i"),
    0x3A: DsOp("ds_load_u8", 1, True),
    0x3B: DsOp("ds_load_i16", 2, True, "i"),
    0x3C: DsOp("ds_load_u16", 2, True),
    0x4D: DsOp("ds_store_b64", 8, False),
    0x4E: DsOp("ds_store_2addr_b64", 8, False, pairs=True),
    0x4F: DsOp("ds_store_2addr_stride64_b64", 8, False, pairs=True, stride=64),
    0x76: DsOp("ds_load_b64", 8, True),
    0x77: DsOp("ds_load_2addr_b64", 8, True, pairs=True),
    0x78: DsOp("ds_load_2addr_stride64_b64", 8, True, pairs=True, stride=64),
    0xA0: DsOp("ds_store_b8_d16_hi", 1, False, d16=1),
    0xA1: DsOp("ds_store_b16_d16_hi", 2, False, d16=1),
    0xA2: DsOp("ds_load_u8_d16", 1, True, "u", 0),
    0xA3: DsOp("ds_load_u8_d16_hi", 1, True, "u", 1),
    0xA4: DsOp("ds_load_i8_d16", 1, True, "i", 0),
    0xA5: DsOp("ds_load_i8_d16_hi", 1, True, "i", 1),
    0xA6: DsOp("ds_load_u16_d16", 2, True, "u", 0),
    0xA7: DsOp("ds_load_u16_d16_hi", 2, True, "u", 1),
    0xDE: DsOp("ds_store_b96", 12, False),
    0xDF: DsOp("ds_store_b128", 16, False),
    0xFE: DsOp("ds_load_b96", 12, True),
    0xFF: DsOp("ds_load_b128", 16, True),
}
DS_OTHER = {0x00: "ds_add_u32", 0x01: "ds_sub_u32", 0x05: "ds_min_i32", 0x06: "ds_max_i32", 0x07: "ds_min_u32"}
DS_OTHER |= {0x08: "ds_max_u32", 0x09: "ds_and_b32", 0x0A: "ds_or_b32", 0x0B: "ds_xor_b32", 0x12: "ds_min_f32"}
DS_OTHER |= {0x13: "ds_max_f32", 0x15: "ds_add_f32", 0x20: "ds_add_rtn_u32", 0x2D: "ds_storexchg_rtn_b32"}
DS_OTHER |= {0x30: "ds_cmpstore_rtn_b32", 0x35: "ds_swizzle_b32", 0x79: "ds_add_rtn_f32", 0xB2: "ds_permute_b32"}
DS_OTHER |= {0xB3: "ds_bpermute_b32"}


def _vrange(r: int, n: int) -> str:
    return f"v{r}" if n == 1 else f"v[{r}:{r + n - 1}]"


def decode_ds(pc: int, fetch: Fetch) -> Inst:
    w0, w1 = fetch(0), fetch(1)
    off0, off1, gds, op = w0 & 0xFF, (w0 >> 8) & 0xFF, (w0 >> 17) & 1, (w0 >> 18) & 0xFF
    addr, data0, data1, vdst = w1 & 0xFF, (w1 >> 8) & 0xFF, (w1 >> 16) & 0xFF, (w1 >> 24) & 0xFF
    dop = DS_OPS.get(op)
    if dop is None or gds:
        name = DS_OTHER.get(op, f"<DS opcode {op:#x}>") if dop is None else dop.name
        return Inst(pc, (w0, w1), "DS", op, name, "", "lds", unimplemented(name, " (GDS)" if gds else ""))
    dwords = max(1, dop.size // 4)
    n_out = dwords * (2 if dop.pairs else 1)
    if dop.load:
        ops = [_vrange(vdst, n_out), f"v{addr}"]
    else:
        ops = [f"v{addr}", _vrange(data0, dwords)] + ([_vrange(data1, dwords)] if dop.pairs else [])
    text = ", ".join(ops)
    if dop.pairs:
        text += (f" offset0:{off0}" if off0 else "") + (f" offset1:{off1}" if off1 else "")
    elif off0 | (off1 << 8):
        text += f" offset:{off0 | (off1 << 8)}"
    vregs = vgpr_range(addr, 1) | (
        frozenset()
        if dop.load
        else vgpr_range(data0, dwords) | (vgpr_range(data1, dwords) if dop.pairs else frozenset())
    )
    inst = Inst(pc, (w0, w1), "DS", op, dop.name, text, "lds", vregs=vregs)
    if dop.pairs:
        offsets = [off0 * dop.size * dop.stride, off1 * dop.size * dop.stride]
        sources = [data0, data1]
    else:
        offsets, sources = [off0 | (off1 << 8)], [data0]
    mop = MemOp(dop.name, dop.size, dop.load, dop.ext, dop.d16)

    def run(w: Waves) -> None:
        mask = w.exec_mask()
        base = active(w, w.v[addr], mask).astype(np.int64)
        wgs = active(w, per_lane(w.wg), mask)
        if dop.load:  # the address adder is 32 bits wide: vaddr + offset wraps
            parts = [_widen(w.launch.lds_load(wgs, (base + o) & 0xFFFFFFFF, dop.size), mop) for o in offsets]
            _deliver(w, "lgkm", vdst, np.concatenate(parts, axis=1), mask, mop)
        else:
            for o, src in zip(offsets, sources):
                w.launch.lds_store(wgs, (base + o) & 0xFFFFFFFF, _narrow(_data(w, src, dwords, mask), mop))

    inst.run = run
    return inst


# ---------------------------------------------------------------- MUBUF: only the cache invalidations LLVM emits
MUBUF_NOPS = {0x2B: "buffer_gl0_inv", 0x2C: "buffer_gl1_inv"}


def decode_mubuf(pc: int, fetch: Fetch) -> Inst:
    w0, w1 = fetch(0), fetch(1)
    op = (w0 >> 18) & 0x7F
    if op in MUBUF_NOPS:  # caches are coherent in the emulator: invalidating them changes nothing
        return Inst(pc, (w0, w1), "MUBUF", op, MUBUF_NOPS[op], "", "nop", lambda w: None)
    name = f"<MUBUF opcode {op:#x}>"
    return Inst(pc, (w0, w1), "MUBUF", op, name, "", "vmem", unimplemented(name, " (buffer instructions)"))


_ = (APERTURE_SIZE, PRIVATE_APERTURE, SHARED_APERTURE)
