"""The settings speck.tensor reads (tinygrad's names and meanings), declared in speck.uop's settings table: each is a
ContextVar created once from the same-named environment variable or its default, scoped with `Context(NAME=value)`,
writable through `.value`. Settings of lower layers are declared there (DEBUG, SPEC, CACHELEVEL in speck.uop; BEAM,
NOOPT, TRANSCENDENTAL in speck.codegen; DEV, PROFILE, NUM_CPU_THREADS, LRU in speck.hcq); speck.tensor.helpers
exports them all."""

from __future__ import annotations

from speck.uop.settings import declare

T = "speck.tensor"


def _noop(name: str, default: object, why: str) -> object:
    """A tinygrad setting kept so code that sets or reads it runs; it selects nothing here (`why`)."""
    return declare(name, default, T, (), why, noop=why)


# ---------------- read ----------------
JIT = declare(
    "JIT",
    1,
    T,
    ("speck.tensor.jit",),
    "0: TinyJit calls the function; 1: capture and replay, each run of "
    "a device's calls one device graph; 2: capture and replay call by call",
)
CAPTURING = declare(
    "CAPTURING",
    1,
    T,
    ("speck.tensor.realize",),
    "while a TinyJit captures, realizations are recorded; 0: they run unrecorded",
)
CHECK_OOB = declare(
    "CHECK_OOB",
    1,
    T,
    ("speck.tensor.bounds",),
    "index tensors (getitem, setitem, gather, scatter, one_hot, Embedding, sparse_categorical_crossentropy labels) are "
    "bounds-checked inside the kernels that read them; a violation raises IndexOutOfBoundsError at the next data read, "
    "Device.synchronize() or (on a host device) realize. "
    "0: no check code (an out-of-range index reads 0 or writes nothing)",
)
TRAINING = declare("TRAINING", 0, T, ("speck.tensor.tensor",), "dropout, BatchNorm batch statistics, optimizer steps")
SPLIT_REDUCEOP = declare(
    "SPLIT_REDUCEOP",
    1,
    T,
    ("speck.tensor.reduce",),
    "split reductions whose input/output ratio is at least REDUCEOP_SPLIT_THRESHOLD in two",
)
REDUCEOP_SPLIT_THRESHOLD = declare("REDUCEOP_SPLIT_THRESHOLD", 32768, T, ("speck.tensor.reduce",), "see SPLIT_REDUCEOP")
USB_KERNEL_TIMEOUT = declare("USB_KERNEL_TIMEOUT", 10.0, T, ("speck.tensor.usb",), "seconds of GPU time a USB "
                             "device waits for its compute queue before raising GpuHang (the simulator's GPU time is "
                             "modeled, so this is deterministic there)", minimum=0.0, maximum=1e9)  # fmt: skip
RING = declare("RING", 1, T, ("speck.tensor.allreduce",), "allreduce: 0 naive, 1 ring for large buffers, 2 ring")
ALL2ALL = declare("ALL2ALL", 0, T, ("speck.tensor.allreduce",), "allreduce: 1 all-to-all for large buffers, 2 always")
RING_ALLREDUCE_THRESHOLD = declare(
    "RING_ALLREDUCE_THRESHOLD",
    256000,
    T,
    ("speck.tensor.allreduce",),
    "elements from which RING=1/ALL2ALL=1 pick their algorithm",
)
ALLREDUCE_CAST = declare(
    "ALLREDUCE_CAST", 1, T, ("speck.tensor.allreduce",), "allreduce transfers narrow dtypes widened"
)
ALLOW_DEVICE_USAGE = declare(
    "ALLOW_DEVICE_USAGE",
    1,
    T,
    ("speck.tensor.realize",),
    "0 forbids running kernels (an @function body is traced, not run)",
)
MAX_BUFFER_SIZE = declare(
    "MAX_BUFFER_SIZE",
    0,
    T,
    ("speck.tensor.realize",),
    "> 0: a buffer of more elements raises RuntimeError when it is made",
)
MAX_DECOMPRESSED_BYTES = declare(
    "MAX_DECOMPRESSED_BYTES",
    4 << 30,
    T,
    ("speck.tensor.nn.checkpoints", "speck.tensor.nn.datasets", "speck.tensor.pyutils"),
    "the most bytes one archive (zip/tar) member, and all of an archive's members together, may expand to",
)
FUSE_OPTIM = declare("FUSE_OPTIM", 0, T, ("speck.tensor.nn.optim",), "optimizers' default for fused=")
DISALLOW_BROADCAST = declare(
    "DISALLOW_BROADCAST",
    0,
    T,
    ("speck.tensor.elementwise",),
    "1: implicit broadcasting in elementwise ops raises RuntimeError",
)
TRACEMETA = declare("TRACEMETA", 1, T, ("speck.tensor.metadata",), "tag graph nodes with the Tensor method making them")
SCACHE = declare("SCACHE", 1, T, ("speck.tensor.schedule_cache",), "0: no in-process schedule cache")
NUMPY_FALLBACK = declare(
    "SPECK_NUMPY_FALLBACK",
    0,
    T,
    ("speck.tensor.realize",),
    "1: a kernel codegen can't compile runs through codegen's reference interpreter",
)
NUMPY_FALLBACK_LIMIT = declare(
    "SPECK_NUMPY_FALLBACK_LIMIT",
    1 << 27,
    T,
    ("speck.tensor.realize",),
    "grid points the interpreter may take on for one kernel",
)
USE_CODEGEN = declare("SPECK_CODEGEN", 1, T, ("speck.tensor.realize",), "0: every kernel runs in the interpreter")
COMPILE_THREADS = declare(
    "SPECK_COMPILE_THREADS",
    -1,
    T,
    ("speck.tensor.realize",),
    "lanes compiling a schedule's new kernels ahead (-1: one per core but the calling thread's, 1 to 4; 0: none; "
    "at most 64)",
)
PLAN_MEMORY = declare(
    "SPECK_PLAN_MEMORY",
    1,
    T,
    ("speck.tensor.realize",),
    "a multi-target realize places its schedule's intermediate buffers in one shared arena per device, reusing "
    "memory between buffers whose uses don't overlap (speck.tensor.engine.memory); 0: each gets its own allocation",
)
PROGRAM_CACHE = declare(
    "SPECK_PROGRAM_CACHE",
    1024,
    T,
    ("speck.tensor.realize", "speck.tensor.schedule_cache"),
    "loaded programs (and cached schedules) kept; the least recently used go first",
)
UNSAFE_ALLOW_JIT_BUFFER = declare(
    "UNSAFE_ALLOW_JIT_BUFFER",
    0,
    T,
    ("speck.tensor.jit",),
    "1: reading data inside a TinyJit capture is allowed (the capture call's value)",
)
SEED = declare("SEED", -1, T, ("speck.tensor.random",), "the random seed (-1: from the clock)")
OPTIM_DTYPE = declare("OPTIM_DTYPE", "float32", T, ("speck.tensor.nn.optim",), "optimizer state dtype")
CONST_LR = declare("CONST_LR", 0, T, ("speck.tensor.nn.optim",), "1: learning rates are baked into kernels")
MPI_BUCKET_BYTES = declare(
    "SPECK_MPI_BUCKET_BYTES",
    4 << 20,
    T,
    ("speck.tensor.distributed",),
    "bytes of small tensors packed into one MPI message",
)
MPI_TIMEOUT = declare(
    "SPECK_MPI_TIMEOUT",
    120.0,
    T,
    ("speck.tensor.distributed",),
    "seconds an MPI collective may take before it is reported stuck",
)
DATASETS = declare(
    "SPECK_DATASETS", "", T, ("speck.tensor.nn.datasets",), "where datasets are looked for first", live=True
)
DISABLE_HTTP_CACHE = declare("DISABLE_HTTP_CACHE", 0, T, ("speck.tensor.pyutils",), "1: fetch() downloads again")
CI = declare("CI", "", T, ("speck.tensor.helpers",), "set by CI systems (tinygrad's helpers.CI)")

WINO = declare(
    "WINO",
    0,
    T,
    ("speck.tensor.nnops",),
    "Winograd convolution (speck.tensor.winograd) for stride-1, undilated, single-group 2-d float32 convolutions "
    "with 3x3 or 5x5 kernels: 0 never (the default, as tinygrad's: the direct sum is about 10x more accurate and "
    "makes one kernel); 1 where it pays off (at least 16 input and output channels; the main job's choice); 2 every "
    "such convolution of any float dtype",
    minimum=0,
    maximum=2,
)


# ---------------- kept for tinygrad's users: they select nothing here ----------------
JIT_BATCH_SIZE = _noop("JIT_BATCH_SIZE", 32, "JIT=1 batches each run of a device's consecutive calls into one graph")
USE_ATOMICS = _noop("USE_ATOMICS", 0, "Embedding's backward is a gather's gradient; CPU backends have no atomics")
VIZ = _noop("VIZ", 0, "no graph viewer; PROFILE records and writes traces")
IMAGE = _noop("IMAGE", 0, "no image dtypes on CPU backends")
FLOAT16 = _noop("FLOAT16", 0, "half precision follows the tensors' dtypes")
TC = _noop("TC", 1, "no tensor cores on CPU backends")
TC_SELECT = _noop("TC_SELECT", -1, "no tensor cores on CPU backends")
TC_OPT = _noop("TC_OPT", 0, "no tensor cores on CPU backends")
ALLOW_TF32 = _noop("ALLOW_TF32", 0, "no TF32 on CPU backends")
NOLOCALS = _noop("NOLOCALS", 0, "CPU backends have no local (workgroup) memory")
NO_MEMORY_PLANNER = _noop("NO_MEMORY_PLANNER", 0, "no schedule-level memory planner (allocator caches reuse memory)")
MAX_KERNEL_BUFFERS = _noop("MAX_KERNEL_BUFFERS", 0, "CPU kernels take any number of buffers")
EMULATED_DTYPES = _noop("EMULATED_DTYPES", "", "each renderer declares the dtypes it computes in wider ones")
VALIDATE_WITH_CPU = _noop("VALIDATE_WITH_CPU", 0, "every device is checked against numpy in the tests instead")
NO_COLOR = _noop("NO_COLOR", 0, "DEBUG output has no colors")
CPU_LLVM = _noop("CPU_LLVM", 0, "DEV=CPU:LLVM picks the LLVM backend")
AMD_LLVM = _noop("AMD_LLVM", 0, "no AMD device yet")
AMX = _noop("AMX", 0, "Apple's matrix unit")
PTX = _noop("PTX", 0, "CUDA's assembly renderer")
DEVECTORIZE = _noop("DEVECTORIZE", 1, "speck devectorizes for each renderer as it needs")
FUSE_ARANGE = _noop("FUSE_ARANGE", 0, "a tinygrad pass speck does not have")
QUANTIZE = _noop("QUANTIZE", 0, "a tinygrad pass speck does not have")
DISABLE_COMPILER_CACHE = _noop("DISABLE_COMPILER_CACHE", 0, "CACHELEVEL=0 turns speck's compile cache off")
SUM_DTYPE = _noop("SUM_DTYPE", "", "float sums accumulate in float32 and up, by the dtype rules")
IGNORE_JIT_FIRST_BEAM = _noop("IGNORE_JIT_FIRST_BEAM", 0, "BEAM applies to every compile alike")
NULL_ALLOW_COPYOUT = _noop("NULL_ALLOW_COPYOUT", 0, "NULL buffers read back as zeros")
JITBEAM = _noop("JITBEAM", 0, "BEAM applies to every compile alike")
CCACHE = _noop("CCACHE", 1, "CACHELEVEL=0 turns speck's compile cache off")
