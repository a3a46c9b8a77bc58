"""tinygrad.runtime.ops_disk: speck.hcq's DISK device (`DiskDevice`, a file as device memory); `DiskBuffer` is what a
DISK allocation is (speck.hcq.allocator.DiskMapping: the mapped file), and `DiskAllocator` makes them."""

from speck.hcq.allocator import DiskAllocator
from speck.hcq.allocator import DiskMapping as DiskBuffer
from speck.hcq.disk import DiskDevice

__all__ = ["DiskAllocator", "DiskBuffer", "DiskDevice"]
