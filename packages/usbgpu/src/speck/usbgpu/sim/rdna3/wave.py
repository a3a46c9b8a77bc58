"""The state of a group of waves executing the same instruction stream in lockstep.

A `Waves` holds n wave32 waves at one program counter: scalar registers as (128, n) uint32 (the scalar operand space
0-127 of the encodings: SGPRs 0-105, VCC_LO/HI 106-107, NULL 124, M0 125, EXEC_LO/HI 126-127), SCC as (n,), vector
registers as (nvgpr, n, 32) uint32. Every operation is one numpy call over all their lanes. When a scalar branch
goes different ways for different waves, the group splits (`take`); groups meet again at barriers.

Outstanding loads are modelled per counter (vmcnt: global/flat/scratch; lgkmcnt: scalar and LDS loads): a load reads
memory when issued, but its data reaches the destination registers only when an s_waitcnt retires it (loads of one
counter retire in issue order). Touching a register a load still owes raises ShaderHazardError: on hardware the
kernel would read stale data.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from speck.usbgpu.errors import ShaderHazardError

LANES = 32
VCC, NULL, M0, EXEC = 106, 124, 125, 126
LANE_BITS = np.uint32(1) << np.arange(LANES, dtype=np.uint32)
LANE_IDS = np.arange(LANES, dtype=np.uint32)


def unpack_lanes(bits: Any) -> np.ndarray:
    """(n,) uint32 lane masks -> (n, 32) bool, lane i = bit i (np.unpackbits: one C pass, no (n, 1) broadcast)."""
    words = np.ascontiguousarray(bits, dtype="<u4").reshape(-1)
    return np.unpackbits(words.view(np.uint8), bitorder="little").view(np.bool_).reshape(len(words), LANES)


def lane_ones(mask: np.ndarray) -> np.ndarray:
    """(n, 32) bool -> uint32 all ones where set, zero elsewhere."""
    ones = mask.astype(np.uint32)
    np.negative(ones, out=ones)  # 1 -> 0xFFFFFFFF (modulo 2**32)
    return ones


def masked_store(dst: np.ndarray, value: Any, ones: np.ndarray) -> None:
    """dst = value where `ones` (lane_ones) is set, else unchanged; in place, in three passes of plain integer
    arithmetic (np.copyto with where= is several times slower). `value` is cast as np.copyto(casting="unsafe")
    would."""
    value = np.asarray(value)
    if value.dtype != np.uint32:
        value = value.astype(np.uint32)
    diff = np.bitwise_xor(dst, value)
    np.bitwise_and(diff, ones, out=diff)
    np.bitwise_xor(dst, diff, out=dst)


def to_waves(x: Any, n: int) -> Any:
    """A per-wave value (n,) or a scalar as an (n,) array (np.broadcast_to only when the shape differs: it is slow)."""
    x = np.asarray(x)
    return x if x.shape == (n,) else np.broadcast_to(x, (n,))


def per_lane(x: np.ndarray) -> np.ndarray:
    """A per-wave (n,) array as a read-only (n, 32) view, every lane of a wave seeing its value."""
    x = np.ascontiguousarray(x)
    view = np.ndarray((len(x), LANES), x.dtype, buffer=x, strides=(x.itemsize, 0))
    view.flags.writeable = False
    return view


@dataclass
class Pending:
    """A load in flight: its counter ('vm' or 'lgkm'), destination registers and data (per register, lane mask)."""

    counter: str
    vector: bool
    regs: list[int]
    values: list[np.ndarray]  # per register: (n, 32) uint32 for VGPRs, (n,) uint32 for SGPRs
    mask: np.ndarray | None  # (n, 32) bool for VGPRs (lanes that were active), None for SGPRs
    half: int = -1  # -1: whole registers; 0/1: only the low/high 16 bits (d16 loads)
    full: bool = False  # every lane was active (mask is all true): retiring is a plain copy

    def take(self, idx: np.ndarray) -> Pending:
        return Pending(
            self.counter,
            self.vector,
            self.regs,
            [v[idx] for v in self.values],
            None if self.mask is None else self.mask[idx],
            self.half,
            self.full,
        )


@dataclass
class Mode:
    """The MODE register fields the VALU obeys: FP_DENORM (per precision), FP_ROUND (only round-to-nearest-even is
    implemented), IEEE and DX10_CLAMP."""

    denorm32: int = 3
    denorm16_64: int = 3
    round_mode: int = 0
    ieee: bool = True
    dx10_clamp: bool = True

    def copy(self) -> Mode:
        return Mode(self.denorm32, self.denorm16_64, self.round_mode, self.ieee, self.dx10_clamp)


class LaunchMemory(Protocol):
    """The memory a wave's instructions reach through its launch (`speck.usbgpu.sim.rdna3.dispatch.Launch`): global,
    flat, scalar, LDS and scratch accesses, checked and counted there."""

    def load(self, addresses: np.ndarray, size: int, space: str, lanes: int | None = None) -> np.ndarray: ...
    def flat_load(self, w: Waves, mask: np.ndarray, addresses: np.ndarray, size: int, space: str) -> np.ndarray: ...
    def flat_store(self, w: Waves, mask: np.ndarray, addresses: np.ndarray, data: np.ndarray, space: str) -> None: ...
    def lds_load(self, wgs: np.ndarray, addresses: np.ndarray, size: int) -> Any: ...
    def lds_store(self, wgs: np.ndarray, addresses: np.ndarray, data: np.ndarray) -> None: ...
    def scratch_load(self, rows: np.ndarray, addresses: np.ndarray, size: int) -> Any: ...
    def scratch_store(self, rows: np.ndarray, addresses: np.ndarray, data: np.ndarray) -> None: ...


@dataclass
class Waves:
    """n waves at one pc (see the module docstring)."""

    launch: LaunchMemory
    s: np.ndarray
    v: np.ndarray
    scc: np.ndarray
    wg: np.ndarray  # workgroup index (into launch.lds) of each wave
    wave_ids: np.ndarray  # index of each wave in the launch (scratch rows)
    pc: int
    mode: Mode
    pending: list[Pending] = field(default_factory=list)
    pending_v: set[int] = field(default_factory=set)
    pending_s: set[int] = field(default_factory=set)
    _exec_mask: np.ndarray | None = None
    _exec_full: bool = False
    _exec_m32: np.ndarray | None = None  # (n, 32) uint32: all ones in the active lanes (for masked writes)

    @property
    def n(self) -> int:
        return len(self.wg)

    # ---- EXEC ----
    def exec_mask(self) -> np.ndarray:
        """(n, 32) bool: the active lanes."""
        if self._exec_mask is None:
            self._exec_mask = unpack_lanes(self.s[EXEC])
            self._exec_full = bool((self.s[EXEC] == 0xFFFFFFFF).all())
            self._exec_m32 = None
        return self._exec_mask

    def exec_full(self) -> bool:
        self.exec_mask()
        return self._exec_full

    # ---- scalar registers ----
    def write_s(self, r: int, value: np.ndarray | np.integer | int) -> None:
        """Write one 32-bit scalar register for every wave (NULL discards; EXEC_HI is ignored in wave32)."""
        if r == NULL or r == EXEC + 1:
            return
        self.s[r] = value
        if r == EXEC:
            self._exec_mask = None

    def write_s64(self, r: int, value: np.ndarray) -> None:
        value = np.asarray(value, dtype=np.uint64)
        self.write_s(r, (value & np.uint64(0xFFFFFFFF)).astype(np.uint32))
        if r != NULL:
            self.write_s(r + 1, (value >> np.uint64(32)).astype(np.uint32))

    def read_s64(self, r: int) -> Any:
        return self.s[r].astype(np.uint64) | (self.s[r + 1].astype(np.uint64) << np.uint64(32))

    # ---- vector registers ----
    def write_v(self, r: int, value: np.ndarray | np.integer | int, mask: np.ndarray | None = None) -> None:
        """Write VGPR r in the active lanes (or in `mask`'s lanes)."""
        if mask is None:
            if self._exec_mask is None:
                self.exec_mask()
            if self._exec_full:
                self.v[r] = value
                return
            if self._exec_m32 is None:
                self._exec_m32 = lane_ones(self.exec_mask())
            masked_store(self.v[r], value, self._exec_m32)
            return
        masked_store(self.v[r], value, lane_ones(mask))

    def write_v16(self, r: int, hi: bool, value: np.ndarray, mask: np.ndarray | None = None) -> None:
        """Write the low or high 16 bits of VGPR r, keeping the other half."""
        value = np.asarray(value).astype(np.uint32) & np.uint32(0xFFFF)
        old = self.v[r]
        new = (old & np.uint32(0xFFFF)) | (value << np.uint32(16)) if hi else (old & np.uint32(0xFFFF0000)) | value
        self.write_v(r, new, mask)

    def lane_mask_from(self, bits: np.ndarray) -> Any:
        """(n,) uint32 lane masks -> (n, 32) bool."""
        return unpack_lanes(bits)

    # ---- outstanding loads ----
    def check_hazard(self, vregs: frozenset[int], sregs: frozenset[int]) -> None:
        bad_v = self.pending_v & vregs
        bad_s = self.pending_s & sregs
        if bad_v or bad_s:
            names = [f"v{r}" for r in sorted(bad_v)] + [f"s{r}" for r in sorted(bad_s)]
            counters = sorted({p.counter for p in self.pending if set(p.regs) & (bad_v if p.vector else bad_s)})
            raise ShaderHazardError(
                f"{', '.join(names)} used while a load into it is outstanding (no s_waitcnt {'/'.join(counters)}cnt)"
            )

    def issue(self, load: Pending) -> None:
        self.pending.append(load)
        (self.pending_v if load.vector else self.pending_s).update(load.regs)

    def wait(self, counter: str, allowed: int) -> None:
        """Retire the oldest loads of `counter` until at most `allowed` remain outstanding."""
        mine = [p for p in self.pending if p.counter == counter]
        if len(mine) <= allowed:
            return
        for p in mine[: len(mine) - allowed]:
            self.pending.remove(p)
            self._retire(p)
        self.pending_v = {r for p in self.pending if p.vector for r in p.regs}
        self.pending_s = {r for p in self.pending if not p.vector for r in p.regs}

    def _retire(self, p: Pending) -> None:
        ones = None
        for r, val in zip(p.regs, p.values):
            if not p.vector:
                self.write_s(r, val)
            elif p.half >= 0:
                self.write_v16(r, bool(p.half), val, p.mask)
            elif p.full:
                self.v[r] = val
            else:
                assert p.mask is not None
                if ones is None:  # once per load, not per register
                    ones = lane_ones(p.mask)
                masked_store(self.v[r], val, ones)

    # ---- splitting ----
    def take(self, idx: np.ndarray, pc: int) -> Waves:
        """The waves `idx` of this group as a group of their own, at `pc`."""
        return Waves(
            self.launch,
            self.s[:, idx],
            self.v[:, idx],
            self.scc[idx],
            self.wg[idx],
            self.wave_ids[idx],
            pc,
            self.mode.copy(),
            [p.take(idx) for p in self.pending],
            set(self.pending_v),
            set(self.pending_s),
        )
