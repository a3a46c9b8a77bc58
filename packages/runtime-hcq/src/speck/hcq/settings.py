"""speck.hcq's settings (see speck.uop.settings for the table they join)."""

from __future__ import annotations

from speck.uop.settings import declare

OWNER = "speck.hcq"
PROFILE = declare(
    "PROFILE",
    "0",
    OWNER,
    ("speck.hcq.runner", "speck.hcq.device"),
    "record every call (and each device command); a path: speck.tensor writes the trace there at exit",
)
NUM_CPU_THREADS = declare(
    "NUM_CPU_THREADS",
    0,
    OWNER,
    ("speck.hcq.cpu",),
    "workers a CPU kernel splits across (0: the usable cores)",
    also="CPU_THREADS",
)
PARALLEL_MIN_BYTES = declare(
    "CPU_PARALLEL_MIN_BYTES",
    1 << 20,
    OWNER,
    ("speck.hcq.cpu",),
    "kernels estimated below this many bytes (and flops) run on one thread",
)
PARALLEL_MIN_FLOPS = declare(
    "CPU_PARALLEL_MIN_FLOPS",
    1 << 18,
    OWNER,
    ("speck.hcq.cpu",),
    "kernels estimated below this many flops (and bytes) run on one thread",
)
CHUNK_S = declare(
    "CPU_CHUNK_S",
    0.05,
    OWNER,
    ("speck.hcq.cpu",),
    "seconds a piece of a kernel's range runs before an interrupt is looked at",
)
PARTS_PER_THREAD = declare(
    "CPU_PARTS_PER_THREAD", 8, OWNER, ("speck.hcq.cpu",), "parts per worker a big kernel is cut into, taken in turn"
)
PIN_WORKERS = declare(
    "CPU_PIN_WORKERS",
    1,
    OWNER,
    ("speck.hcq.cpu",),
    "1: each CPU worker thread stays on one core of the allowed set, never the first (left to the launching thread); "
    "0: the OS places them",
    live=True,
)
CPU_IDLE_SPIN_US = declare(
    "CPU_IDLE_SPIN_US",
    1000,
    OWNER,
    ("speck.hcq.cpu",),
    "after a CPU graph run, its workers wait for the next one without sleeping for as long as that run took, at most "
    "this many microseconds (0: they sleep at once)",
    live=True,
)
CPU_MEM_LIMIT = declare(
    "CPU_MEM_LIMIT",
    "",
    OWNER,
    ("speck.hcq.cpu",),
    "bytes a CPU device may hold (e.g. 2G; default the available RAM)",
    live=True,
)
CPU_GRAPH_WORKERS = declare(
    "CPU_GRAPH_WORKERS",
    0,
    OWNER,
    ("speck.hcq.graph",),
    "workers a new CPU graph runs on (0: chosen by timing its first runs)",
    live=True,
)
HCQ_TIMEOUT = declare(
    "HCQ_TIMEOUT",
    600.0,
    OWNER,
    ("speck.hcq.signal",),
    "seconds a synchronize or signal wait blocks before raising SignalTimeoutError",
    live=True,
)
LIBM_PATH = declare("LIBM_PATH", "", OWNER, ("speck.hcq.libs",), "where libm is (a path or soname)", live=True)
LIBGCC_S_PATH = declare("LIBGCC_S_PATH", "", OWNER, ("speck.hcq.libs",), "where libgcc_s is", live=True)
LIBC_PATH = declare("LIBC_PATH", "", OWNER, ("speck.hcq.libs",), "where libc is", live=True)
NATIVE_RUNNER = declare(
    "NATIVE_RUNNER",
    1,
    OWNER,
    ("speck.hcq.runner",),
    "1: runner.run's short route (a plan that is one settled CPU batch) runs in the optional C extension "
    "speck.hcq._native_runner when it is built; 0: always the Python route",
)
LRU = declare(
    "LRU",
    1,
    OWNER,
    ("speck.hcq.allocator", "speck.tensor.realize"),
    "1: allocators keep freed memory for reuse (and warm plans their small outputs); 0: free it",
)
