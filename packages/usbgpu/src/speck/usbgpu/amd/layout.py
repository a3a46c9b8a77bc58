"""Where the driver keeps things: its VRAM layout and the GPU virtual addresses of VRAM and of the bridge's memory.

VRAM offset x is GPU virtual address x in the driver's VM (context 1); the first 2 MiB stay unmapped so a null
pointer faults; rings, queue pointers and signals follow, then the page-table pool, then the heap. The bridge's
memory (bounce SRAM, SQ and CQ pages) appears at SYS_VA + its PCIe address.
"""

from __future__ import annotations

from speck.usbgpu.amd.sdma import RING_SIZE
from speck.usbgpu.amd.tables import CONST

MIB = 1 << 20
SRAM_PCIE, SQ_PCIE, CQ_PCIE = 0x200000, 0x820000, 0x822000
SRAM_BYTES, PAGE = 0x80000, 0x1000

NULL_GUARD = 2 * MIB
RING_VA = 2 * MIB  # SDMA0 queue 0 ring (1 MiB)
QUEUE_PAGE_VA = RING_VA + RING_SIZE  # SDMA rptr writeback at +0, wptr shadow at +8
SIGNAL_PAGE_VA = QUEUE_PAGE_VA + 0x1000  # the copy timeline
IH_WPTR_VA = QUEUE_PAGE_VA + 0x2000
IH_RING_VA = QUEUE_PAGE_VA + 0x10000
IH_RING_SIZE = 0x10000
COMPUTE_PAGE_VA = QUEUE_PAGE_VA + 0x3000  # compute queue rptr report at +0, wptr poll at +8
COMPUTE_SIGNAL_VA = QUEUE_PAGE_VA + 0x4000  # the compute timeline (u64, RELEASE_MEM writes it)
EOP_VA = QUEUE_PAGE_VA + 0x5000  # the compute queue's end-of-pipe buffer (2 KiB)
MQD_VA = QUEUE_PAGE_VA + 0x6000  # its MQD (2 KiB; the CP reads it through VMID 0)
COMPUTE_RING_VA = QUEUE_PAGE_VA + 0x40000
COMPUTE_RING_SIZE = 0x40000
COMPUTE_DOORBELL = 2 * CONST.AMDGPU_NAVI10_DOORBELL_MEC_RING0  # dword index of its 64-bit doorbell
DRIVER_MAPPED = (RING_VA, 2 * MIB)  # what the GPU reaches of the driver's area
PT_POOL = (4 * MIB, 8 * MIB)
HEAP_VA = 8 * MIB
# The PSP's buffers, 64 MiB below the top of VRAM (offsets from that base): its ring, a command buffer, a fence,
# a 1 MiB-aligned staging buffer for firmware images and its trusted memory region.
PSP_BELOW_TOP = 64 * MIB
PSP_RING, PSP_RING_BYTES = 0, 0x1000
PSP_CMD, PSP_FENCE = 0x10000, 0x20000
PSP_FW_PRI, PSP_FW_PRI_BYTES = 1 * MIB, 8 * MIB
PSP_TMR = 16 * MIB
KERNARG_POOL = 2 * MIB  # kernarg segments and indirect buffers come from heap allocations this size
TOP_RESERVED = 64 * MIB  # the discovery table and firmware regions in the top of VRAM
SYS_VA = 0x7000_0000_0000  # GPU virtual address of bridge PCIe address 0
LAST_PAGE = (1 << 47 >> 12) - 1  # the VM covers the low half of the 48-bit space
