"""tinygrad.runtime.ops_null: speck.hcq's NULL device (`NullDevice`, `NullProgram`, `NullAllocator`): it accepts
buffers and kernels and runs nothing."""

from speck.hcq.allocator import NullAllocator
from speck.hcq.null import NullDevice, NullProgram

__all__ = ["NullAllocator", "NullDevice", "NullProgram"]
