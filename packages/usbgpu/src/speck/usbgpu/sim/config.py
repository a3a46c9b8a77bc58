"""Timing knobs, fault switches and the fixed address map of the simulated bridge + GPU (PROTOCOL.md 2 and 7).

The bridge constants here are the simulator's own restatement of the protocol: the driver (speck.usbgpu.bridge)
keeps its own copy on purpose, so a wrong number on either side shows up as a failing differential test instead of
agreeing with itself. The GPU's registers and packet formats are not restated: both sides read them from the
generated speck.usbgpu.amd.tables.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# --- bridge memory map (PROTOCOL.md 2.1 / 2.2) ---
SRAM_PCIE = 0x200000  # 32 slots x 16 KiB bounce SRAM as the GPU sees it
SRAM_SIZE = 0x80000
SLOT_SIZE = 0x4000
NUM_SLOTS = 32
SECTOR = 512
SQ_PCIE = 0x820000  # "NVMe SQ" page (fence flags at +0x800)
CQ_PCIE = 0x822000  # "NVMe CQ" page (a GPU write here releases a read-armed IN stream)
PAGE = 0x1000
XDATA_SQ = 0xA000
XDATA_CQ = 0xB800
XDATA_CQ_SIZE = 0x800  # 0xC000+ is register space, so only 2 KiB of the CQ page can really be a window
XDATA_SRAM = 0xF000
XDATA_SRAM_SIZE = 0x1000
XDATA_MISROUTE = 0x7000  # EP 0x02 landing buffer: unarmed bulk OUT data ends up here
XDATA_LTSSM = 0xB450
LTSSM_L0 = 0x78
LTSSM_DETECT = 0x01
FLAGS_XDATA = 0xA800  # four u64 fence flags (G3): full0, full1, first0, first1

# --- the GPU behind the bridge ---
GPU_VENDOR = 0x1002
GPU_DEVICE = 0x744C  # Navi 31 (Radeon RX 7900 XTX)
GPU_CLASS = 0x030000  # VGA-compatible display controller
BRIDGE_VENDOR = 0x1B21
BRIDGE_DEVICE = 0x2464
GPU_BUS = 4
# PCI subsystem id (config 0x2C: id << 16 | vendor) of speck's simulated board. The driver runs the same bring-up on
# every card; only on boards it was verified against (this one) does it run without the explicit opt-in for
# unverified hardware. A SimDevice given another subsystem looks like an unverified real card to it.
SIM_GPU_SUBSYSTEM = 0x0051 << 16 | 0x5EED
HARDWARE_LIKE_SUBSYSTEM = 0x0E3B << 16 | 0x1002  # e.g. a board of the GPU vendor's own


@dataclass
class SimTiming:
    """Virtual-time model of the link, the bridge firmware and the GPU copy engine (all times in nanoseconds).

    Defaults model a USB 3.2 Gen 2 (10 Gbit/s) link: ~1000 MB/s of bulk payload after 128b/132b coding and
    protocol overhead, the firmware's measured 0xF0 costs (~3.6 MB/s stream write, ~1.8 MB/s stream read), a
    100 us vendor-request round trip (requests are handled in 8051 firmware) and an SDMA copy across the GPU's
    PCIe x2 link to the bridge at ~1.8 GB/s.
    """

    link_bytes_per_s: float = 1.0e9
    bulk_latency_ns: float = 20_000.0  # submit -> first byte for a transfer that is not already queued behind another
    control_rtt_ns: float = 100_000.0
    f0_write_ns_per_dword: float = 1_100.0
    f0_read_ns_per_dword: float = 2_200.0
    sdma_bytes_per_s: float = 1.8e9
    sdma_packet_ns: float = 100.0  # decode cost per SDMA packet
    gpu_write_ns: float = 500.0  # a GPU write (WRITE/FENCE) landing in bridge memory or VRAM
    poll_recheck_ns: float = 1_000.0  # delay between a change of polled memory and the stalled POLL noticing it
    arm_switch_ns: float = 0.0  # end of one arm's sectors -> the latched arm accepting data
    f4_wait_limit_ns: float = 2.0e9  # 0xF4 gives up (bails) after this long
    link_power_on_ns: float = 300.0e6  # 0xF3(1): fw waits for 3 stable LTSSM samples before answering
    quantum: int = 16384  # granularity of modelled data movement (link and SDMA copies)
    # the command processor and the shader core (a Navi 31: 96 CUs = 192 SIMD32 at ~2.5 GHz)
    cp_packet_ns: float = 200.0  # decode cost per PM4 packet
    gpu_clock_hz: float = 2.5e9
    simds: int = 192
    dispatch_overhead_ns: float = 3_000.0  # launch + drain of a dispatch, however small
    # cycles per wave-instruction by kind (speck.usbgpu.sim.rdna3 Stats.by_kind); unlisted kinds cost 1
    cycle_costs: dict[str, float] = field(
        default_factory=lambda: {"valu": 1.0, "salu": 1.0, "trans": 4.0, "smem": 4.0, "vmem": 8.0, "lds": 2.0}
    )
    vram_bytes_per_s: float = 960e9  # a dispatch takes at least its global memory traffic at this rate (GDDR6)
    # more wave-instructions than this: the dispatch is hung. The main job's largest kernel (a 3x3 convolution's
    # weight gradient) runs over 50M at batch 32 and about 4x that at batch 128; fault tests set a small budget.
    dispatch_max_instructions: int = 1_000_000_000


FaultMode = Literal["error", "short", "timeout", "stall"]


@dataclass
class TransferFault:
    """Make the `nth` (1-based, counted from injection) transfer on `endpoint` fail after `after_bytes` bytes.

    Endpoint 0 selects control transfers; `request` narrows that to one vendor request (0xE4, 0xE5, 0xF0, 0xF2,
    0xF3, 0xF4), and only matching transfers count towards `nth`. A faulted control transfer is not executed: it
    stalls ("stall"), fails ("error"), gets no reply until the host's timeout ("timeout"), or - with a data stage
    - moves only half of it ("short").
    """

    endpoint: int
    nth: int
    mode: FaultMode
    after_bytes: int | None = None  # None: half of the transfer, rounded down to a sector (bulk only)
    request: int | None = None  # control transfers only: the bRequest to match (None: any)


@dataclass
class SimFaults:
    """Switchable faults (PROTOCOL.md 7). Transfer faults and disconnects are one-shot; the rest stay on."""

    transfer_faults: list[TransferFault] = field(default_factory=list)
    disconnect_after_out_bytes: int | None = None  # unplug once this many more EP 0x02 bytes moved
    f4_bail: Literal["once", "always"] | None = None  # 0xF4 bails at once instead of waiting when the fence is short
    f4_compares: Literal["first", "full", "either"] = "first"  # which flag 0xF4 waits for (fw unknown)
    gpu_hang_after_packets: int | None = None  # the SDMA engine stops dead after this many more packets
    full_window_corruption: bool = False  # an arm whose data ends on a 256 KiB boundary corrupts its last sector
    cq_clobber: bool = False  # the engine writes a 16-byte CQE into the CQ page per completed OUT arm (wrapping)
    sq_scribble: bool = False  # ... and scribbles in the SQ page below +0x800
    second_latch: Literal["error", "replace"] = "error"  # an arm while one is already latched
    misroute_nak: bool = True  # after a misrouted packet the endpoint NAKs until something is armed
    link_training_fails: bool = False  # 0xF3(1) never brings LTSSM to L0
    tlp_engine_errors: int = 0  # the next N single TLPs report ret_status 1 (engine error flag)
