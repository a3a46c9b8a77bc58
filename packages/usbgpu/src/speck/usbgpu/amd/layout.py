"""Where the driver keeps things: its VRAM layout and the GPU virtual addresses of VRAM and of the bridge's memory.

VRAM offset x is GPU virtual address x in the driver's VM (context 1); the first 2 MiB stay unmapped so a null
pointer faults; rings, queue pointers and signals follow, then the page-table pool, then the heap. The bridge's
memory (bounce SRAM, SQ and CQ pages) appears at SYS_VA + its PCIe address.
"""

from __future__ import annotations

from speck.usbgpu.amd.sdma import RING_SIZE

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
DRIVER_MAPPED = (RING_VA, 2 * MIB)  # what the GPU reaches of the driver's area
PT_POOL = (4 * MIB, 8 * MIB)
HEAP_VA = 8 * MIB
TOP_RESERVED = 64 * MIB  # the discovery table and firmware regions in the top of VRAM
SYS_VA = 0x7000_0000_0000  # GPU virtual address of bridge PCIe address 0
LAST_PAGE = (1 << 47 >> 12) - 1  # the VM covers the low half of the 48-bit space
