"""One DISPATCH_DIRECT in the simulator: the COMPUTE_* state a queue holds handed to the RDNA3 shader-core emulator
(speck.usbgpu.sim.rdna3, which needs numpy: speck-usbgpu[sim]) against the queue's GPU virtual memory, and what the
command processor makes of the result - modelled time from the instruction counts, or a fault, or a hang.

Time: the emulator counts wave-instructions by kind; each kind costs SimTiming.cycle_costs cycles, the waves share
SimTiming.simds SIMDs at SimTiming.gpu_clock_hz; a dispatch takes the longer of that and its global memory traffic at
SimTiming.vram_bytes_per_s (a roofline), plus a fixed launch/drain overhead. A dispatch that executes more
than SimTiming.dispatch_max_instructions wave-instructions is taken to be hung: it never completes.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from speck.usbgpu import errors
from speck.usbgpu.amd.ih import SQ_ILLEGAL_INSTRUCTION, SQ_MEMORY_VIOLATION, SQ_OTHER, SQ_TRAP
from speck.usbgpu.amd.tables import CONST, GC
from speck.usbgpu.sim.vm import VmFault

if TYPE_CHECKING:
    from speck.usbgpu.sim.gpu_services import GpuServices

# COMPUTE_TMPRING_SIZE.WAVESIZE counts scratch per wave in 256-byte units [unverified: the gfx11 granule]
SCRATCH_WAVE_GRANULE = 256
WAVE_LANES = 32


@dataclass
class Outcome:
    duration_ns: float = 0.0
    instructions: int = 0
    fault: str = ""  # non-empty: the queue stops with this record and the SQ interrupt below
    src_id: int | None = None
    src_data: tuple[int, ...] = ()
    hang: str = ""  # non-empty: the dispatch never completes


class QueueState(Protocol):
    """The hardware queue a dispatch runs on, as the dispatch reads it (`speck.usbgpu.sim.cp.Hqd` is one)."""

    sh: dict[str, int]  # the COMPUTE_* shader registers set on the queue
    vmid: int
    dispatches: int

    @property
    def name(self) -> str: ...


def _sq(kind: int, message: str, pc: int | None) -> Outcome:
    pc = pc or 0
    return Outcome(
        fault=message, src_id=CONST.GFX_11_0_0__SRCID__SQ_INTERRUPT_ID, src_data=(kind, pc & 0xFFFFFFFF, pc >> 32)
    )


def run_dispatch(gpu: GpuServices, hqd: QueueState, dim: tuple[int, int, int], initiator: int) -> Outcome:
    try:  # the emulator (and numpy) are imported on the first dispatch only
        rdna3: Any = importlib.import_module("speck.usbgpu.sim.rdna3")
        from speck.usbgpu.sim.shader_memory import ShaderMemory
    except ImportError as exc:
        return _sq(
            SQ_OTHER, f"no shader core: the RDNA3 emulator is unavailable ({exc}); pip install speck-usbgpu[sim]", None
        )
    sh = hqd.sh
    reg = GC.COMPUTE_NUM_THREAD_X
    num_thread = tuple(reg.get(sh.get(f"COMPUTE_NUM_THREAD_{axis}", 1), "NUM_THREAD_FULL") for axis in "XYZ")
    wavesize = GC.COMPUTE_TMPRING_SIZE.get(sh.get("COMPUTE_TMPRING_SIZE", 0), "WAVESIZE")
    code = (sh.get("COMPUTE_PGM_HI", 0) & 0xFF) << 40 | sh.get("COMPUTE_PGM_LO", 0) << 8
    packet = rdna3.DispatchPacket(
        pgm_lo=sh.get("COMPUTE_PGM_LO", 0),
        pgm_hi=sh.get("COMPUTE_PGM_HI", 0),
        rsrc1=sh.get("COMPUTE_PGM_RSRC1", 0),
        rsrc2=sh.get("COMPUTE_PGM_RSRC2", 0),
        rsrc3=sh.get("COMPUTE_PGM_RSRC3", 0),
        user_data=[sh.get(f"COMPUTE_USER_DATA_{i}", 0) for i in range(16)],
        num_thread=num_thread,
        dim=dim,
        initiator=initiator,
        start=tuple(sh.get(f"COMPUTE_START_{axis}", 0) for axis in "XYZ"),
        scratch_per_lane=wavesize * SCRATCH_WAVE_GRANULE // WAVE_LANES,
        kernel=f"{hqd.name} dispatch {hqd.dispatches} (code at {code:#x})",
    )
    memory = ShaderMemory(gpu, hqd.vmid)
    timing = gpu.timing
    try:
        stats: Any = rdna3.dispatch(packet, memory, max_instructions=timing.dispatch_max_instructions)
    except VmFault as fault:
        return _sq(SQ_MEMORY_VIOLATION, f"shader page fault: {fault}", None)
    except errors.BridgeError as exc:  # the emulator's ShaderError family
        if isinstance(exc, getattr(errors, "EmulationError", ())):
            return _sq(SQ_ILLEGAL_INSTRUCTION, f"illegal instruction: {exc}", getattr(exc, "pc", None))
        if isinstance(exc, getattr(errors, "ShaderMemoryFault", ())):
            detail = f"shader page fault: {memory.fault}" if memory.fault else f"shader memory violation: {exc}"
            return _sq(SQ_MEMORY_VIOLATION, detail, getattr(exc, "pc", None))
        if isinstance(exc, getattr(errors, "ShaderHang", ())):
            return Outcome(hang=f"dispatch hung: {exc}")
        kind = SQ_TRAP if isinstance(exc, getattr(errors, "ShaderTrap", ())) else SQ_OTHER
        return _sq(kind, f"shader stopped: {exc}", getattr(exc, "pc", None))
    except Exception as exc:  # a bug in the emulator: stop the queue, never let it out of the model
        gpu.violation(f"the shader-core emulator failed on {packet.kernel}: {type(exc).__name__}: {exc}")
        return _sq(SQ_OTHER, f"emulator failure: {type(exc).__name__}: {exc}", None)
    cycles = stats.cycles(timing.cycle_costs)
    parallel = min(max(stats.waves, 1), timing.simds)
    memory_ns = (stats.bytes_read + stats.bytes_written) / timing.vram_bytes_per_s * 1e9
    duration = timing.dispatch_overhead_ns + max(cycles / parallel / timing.gpu_clock_hz * 1e9, memory_ns)
    gpu.cp.ran(stats)
    return Outcome(duration_ns=duration, instructions=stats.instructions)
