"""The settings speck.tensor reads (tinygrad's names and meanings). Each is a speck.uop ContextVar: created once
from the same-named environment variable or its default, scoped with `Context(NAME=value)`, writable through
`.value`. Settings of lower layers live there (DEBUG, SPEC, CACHELEVEL in speck.uop; BEAM, NOOPT, TRANSCENDENTAL in
speck.codegen; DEV, PROFILE, NUM_CPU_THREADS in speck.hcq); speck.tensor.helpers exports them all."""

from __future__ import annotations

from speck.uop import ContextVar

# 0: TinyJit just calls the function; 1: capture and replay, batching kernels into device graphs; 2: capture and
# replay kernel by kernel
JIT = ContextVar("JIT", 1)
JIT_BATCH_SIZE = ContextVar("JIT_BATCH_SIZE", 32)
# while a TinyJit captures, realizations are recorded for replay; Context(CAPTURING=0) runs them unrecorded
CAPTURING = ContextVar("CAPTURING", 1)
# dropout, BatchNorm batch statistics and optimizer steps
TRAINING = ContextVar("TRAINING", 0)
# split reductions whose input/output ratio is at least REDUCEOP_SPLIT_THRESHOLD into two kernels
SPLIT_REDUCEOP = ContextVar("SPLIT_REDUCEOP", 1)
REDUCEOP_SPLIT_THRESHOLD = ContextVar("REDUCEOP_SPLIT_THRESHOLD", 32768)
# allreduce algorithm across devices: RING 0 naive, 1 ring for large buffers, 2 always ring; ALL2ALL likewise
RING = ContextVar("RING", 1)
ALL2ALL = ContextVar("ALL2ALL", 0)
RING_ALLREDUCE_THRESHOLD = ContextVar("RING_ALLREDUCE_THRESHOLD", 256000)
ALLREDUCE_CAST = ContextVar("ALLREDUCE_CAST", 1)
# 0 forbids opening devices other than DISK/NPY/PYTHON (used while tracing @function bodies)
ALLOW_DEVICE_USAGE = ContextVar("ALLOW_DEVICE_USAGE", 1)
# > 0: allocating a buffer of more elements raises RuntimeError
MAX_BUFFER_SIZE = ContextVar("MAX_BUFFER_SIZE", 0)
# the most bytes one archive (zip/tar) member may expand to when decompressed, and all of an archive's members
# together (torch_load, zip_extract): a small deflated file can't fill memory; raise it for trusted large files
MAX_DECOMPRESSED_BYTES = ContextVar("MAX_DECOMPRESSED_BYTES", 4 << 30)
# optimizers' default for fused=
FUSE_OPTIM = ContextVar("FUSE_OPTIM", 0)
USE_ATOMICS = ContextVar("USE_ATOMICS", 0)
# 1: implicit broadcasting in elementwise ops raises RuntimeError
DISALLOW_BROADCAST = ContextVar("DISALLOW_BROADCAST", 0)
TRACEMETA = ContextVar("TRACEMETA", 1)
LRU = ContextVar("LRU", 1)
VIZ = ContextVar("VIZ", 0)

# accepted for compatibility; they select code paths speck's CPU backends do not have, so they change nothing
IMAGE = ContextVar("IMAGE", 0)
FLOAT16 = ContextVar("FLOAT16", 0)
WINO = ContextVar("WINO", 0)
TC = ContextVar("TC", 1)
TC_SELECT = ContextVar("TC_SELECT", -1)
TC_OPT = ContextVar("TC_OPT", 0)
ALLOW_TF32 = ContextVar("ALLOW_TF32", 0)
NOLOCALS = ContextVar("NOLOCALS", 0)
NO_MEMORY_PLANNER = ContextVar("NO_MEMORY_PLANNER", 0)
MAX_KERNEL_BUFFERS = ContextVar("MAX_KERNEL_BUFFERS", 0)
EMULATED_DTYPES = ContextVar("EMULATED_DTYPES", "")
CHECK_OOB = ContextVar("CHECK_OOB", 0)
VALIDATE_WITH_CPU = ContextVar("VALIDATE_WITH_CPU", 0)
NO_COLOR = ContextVar("NO_COLOR", 0)
# tinygrad's switches for backends and passes speck does not have; read from the environment like every setting so
# code that tests them runs, and they change nothing: CPU_LLVM/AMD_LLVM pick LLVM for tinygrad's CPU/AMD devices
# (speck picks the CPU backend with DEV=CPU:LLVM, CPU:CLANG or CPU:X86), AMX is Apple's matrix unit, PTX CUDA's
# assembly renderer, DEVECTORIZE/FUSE_ARANGE/QUANTIZE tinygrad passes (speck devectorizes for each renderer as it
# needs), DISABLE_COMPILER_CACHE tinygrad's compile cache (speck's is off with CACHELEVEL=0)
CPU_LLVM = ContextVar("CPU_LLVM", 0)
AMD_LLVM = ContextVar("AMD_LLVM", 0)
AMX = ContextVar("AMX", 0)
PTX = ContextVar("PTX", 0)
DEVECTORIZE = ContextVar("DEVECTORIZE", 1)
FUSE_ARANGE = ContextVar("FUSE_ARANGE", 0)
QUANTIZE = ContextVar("QUANTIZE", 0)
DISABLE_COMPILER_CACHE = ContextVar("DISABLE_COMPILER_CACHE", 0)
