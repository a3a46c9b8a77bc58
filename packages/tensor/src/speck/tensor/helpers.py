"""The helpers a tinygrad user imports (`from tinygrad.helpers import getenv, Context, DEBUG, GlobalCounters`):
the settings of every layer, the kernel/byte counters and small utilities, in one namespace. The definitions live
where they belong (speck.uop, speck.codegen, speck.hcq, speck.tensor.settings); this module only gathers them."""

from __future__ import annotations

import contextlib
import getpass
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from speck.codegen.settings import BEAM, IGNORE_BEAM_CACHE, NOOPT, TRANSCENDENTAL
from speck.hcq.settings import LRU, NUM_CPU_THREADS, PROFILE
from speck.tensor.counters import GlobalCounters
from speck.tensor.dims import argfix
from speck.tensor.errors import TensorValueError
from speck.tensor.pyutils import (
    Metadata,
    Profiling,
    T,
    ansilen,
    ansistrip,
    ceildiv,
    data64,
    data64_le,
    diskcache,
    diskcache_get,
    diskcache_put,
    fetch,
    flat_mv,
    from_mv,
    fully_flatten,
    get_child,
    getbits,
    hi32,
    i2u,
    init_c_var,
    is_numpy_ndarray,
    lo32,
    make_tuple,
    merge_dicts,
    mv_address,
    next_power2,
    partition,
    pluralize,
    polyN,
    round_down,
    strip_parens,
    suppress_finalizing,
    time_to_str,
    to_function_name,
    to_mv,
    tqdm,
    trange,
    word_wrap,
)
from speck.tensor.settings import (
    ALL2ALL,
    ALLOW_DEVICE_USAGE,
    ALLOW_TF32,
    ALLREDUCE_CAST,
    AMD_LLVM,
    AMX,
    CAPTURING,
    CCACHE,
    CHECK_OOB,
    CPU_LLVM,
    DEVECTORIZE,
    DISABLE_COMPILER_CACHE,
    DISALLOW_BROADCAST,
    EMULATED_DTYPES,
    FLOAT16,
    FUSE_ARANGE,
    FUSE_OPTIM,
    IGNORE_JIT_FIRST_BEAM,
    IMAGE,
    JIT,
    JIT_BATCH_SIZE,
    JITBEAM,
    MAX_BUFFER_SIZE,
    MAX_KERNEL_BUFFERS,
    NO_COLOR,
    NO_MEMORY_PLANNER,
    NOLOCALS,
    PTX,
    QUANTIZE,
    REDUCEOP_SPLIT_THRESHOLD,
    RING,
    RING_ALLREDUCE_THRESHOLD,
    SCACHE,
    SPLIT_REDUCEOP,
    TC,
    TC_OPT,
    TC_SELECT,
    TRACEMETA,
    TRAINING,
    UNSAFE_ALLOW_JIT_BUFFER,
    USE_ATOMICS,
    VALIDATE_WITH_CPU,
    VIZ,
    WINO,
)
from speck.tensor.settings import CI as _CI
from speck.uop.dtype import DEFAULT_FLOAT, DEFAULT_INT
from speck.uop.helpers import (
    CACHELEVEL,
    DEBUG,
    DEV,
    SPEC,
    Context,
    ContextVar,
    Target,
    all_int,
    all_same,
    argsort,
    cdiv,
    dedup,
    flatten,
    getenv,
    prod,
    round_up,
)

OSX = sys.platform == "darwin"
WIN = sys.platform == "win32"
WINDOWS = WIN
LINUX = sys.platform.startswith("linux")
CI = str(_CI.value) != ""
ARCH_X86 = platform.machine() in ("x86_64", "AMD64")
CPU_COUNT = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1))


def unwrap(x: Any) -> Any:
    """x, asserting it is not None."""
    assert x is not None
    return x


def temp(name: str, append_user: bool = False) -> str:
    """A path in the system's temporary directory."""
    return os.path.join(tempfile.gettempdir(), f"{name}.{getpass.getuser()}" if append_user else name)


def colored(st: str, color: str | None, background: bool = False) -> str:
    """`st` wrapped in an ANSI colour (plain when color is None or NO_COLOR is set)."""
    if color is None or NO_COLOR:
        return st
    colors = ["black", "red", "green", "yellow", "blue", "magenta", "cyan", "white"]
    code = 10 * background + 60 * (color.upper() == color) + 30 + colors.index(color.lower())
    return f"\u001b[{code}m{st}\u001b[0m"


class Timing(contextlib.ContextDecorator):
    """`with Timing("step: "):` prints how long the block took (ms)."""

    def __init__(self, prefix: str = "", on_exit: Any = None, enabled: bool = True) -> None:
        self.prefix, self.on_exit, self.enabled = prefix, on_exit, enabled

    def __enter__(self) -> Timing:
        self.st = time.perf_counter_ns()
        return self

    def __exit__(self, *exc: object) -> None:
        self.et = time.perf_counter_ns() - self.st
        if self.enabled:
            print(f"{self.prefix}{self.et * 1e-6:6.2f} ms" + (self.on_exit(self.et) if self.on_exit else ""))


@contextlib.contextmanager
def cpu_time() -> Iterator[list[float]]:
    """Measure the process CPU seconds a block used: `with cpu_time() as t: ...; t[0]`."""
    out = [0.0]
    t0 = time.process_time()
    try:
        yield out
    finally:
        out[0] = time.process_time() - t0


def cpu_time_execution(fn: Callable[[], Any], enable: bool) -> float | None:
    """Call fn(); return the wall seconds it took when `enable`, else None (how a runtime times one launch)."""
    st = time.perf_counter()
    fn()
    return time.perf_counter() - st if enable else None


def get_single_element(xs: Any) -> Any:
    """The one element of a sequence; ValueError naming the length when it has another number of elements."""
    items = list(xs)
    if len(items) != 1:
        raise TensorValueError(f"expected exactly one element, found {len(items)}")
    return items[0]


def memsize_to_str(nbytes: int) -> str:
    """A byte count with a binary-sized unit: '512.00 B', '1.50 KB', '2.00 GB' (1 KB = 1024 B)."""
    size, unit = float(nbytes), "B"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if round(abs(size), 2) < 1024 or unit == "TB":  # so 1048575 bytes reads 1.00 MB, not 1024.00 KB
            break
        size /= 1024
    return f"{size:.2f} {unit}"


@dataclass(frozen=True)
class TracingKey:
    """The name a traced rewrite is shown under (`display_name`), the keys it is looked up by, and what it returned.
    speck keeps no rewrite traces (see speck.tensor.uop.ops.track_rewrites), so this only carries names."""

    display_name: str
    keys: tuple[Any, ...] = ()
    ret: Any = None


__all__ = [
    "ALL2ALL", "ALLOW_DEVICE_USAGE", "ALLOW_TF32", "ALLREDUCE_CAST", "ARCH_X86", "BEAM", "CACHELEVEL", "CAPTURING",
    "CHECK_OOB", "CI", "DEBUG", "DEFAULT_FLOAT", "DEFAULT_INT", "DEV", "DISALLOW_BROADCAST", "EMULATED_DTYPES",
    "FLOAT16", "FUSE_OPTIM", "IMAGE", "JIT", "JIT_BATCH_SIZE", "LINUX", "LRU", "MAX_BUFFER_SIZE", "MAX_KERNEL_BUFFERS",
    "NOLOCALS", "NOOPT", "NO_COLOR", "NO_MEMORY_PLANNER", "NUM_CPU_THREADS", "OSX", "PROFILE",
    "REDUCEOP_SPLIT_THRESHOLD", "RING", "RING_ALLREDUCE_THRESHOLD", "SPEC", "SPLIT_REDUCEOP", "TC", "TC_OPT",
    "TC_SELECT", "TRACEMETA", "TRAINING", "TRANSCENDENTAL", "USE_ATOMICS", "VALIDATE_WITH_CPU", "VIZ", "WIN", "WINO",
    "Context", "ContextVar", "GlobalCounters", "Timing", "all_int", "all_same", "argfix", "argsort", "cdiv",
    "colored", "cpu_time", "dedup", "flatten", "getenv", "prod", "round_up", "temp", "unwrap",
    "Metadata", "Profiling", "T", "ansilen", "ansistrip", "ceildiv", "data64", "data64_le", "diskcache",
    "diskcache_get", "diskcache_put", "fetch", "flat_mv", "from_mv", "fully_flatten", "get_child", "getbits", "hi32",
    "i2u", "init_c_var", "is_numpy_ndarray", "lo32", "make_tuple", "merge_dicts", "mv_address", "next_power2",
    "partition", "pluralize", "polyN", "round_down", "strip_parens", "suppress_finalizing", "time_to_str",
    "to_function_name", "to_mv", "tqdm", "trange", "word_wrap", "CPU_COUNT",
    "AMD_LLVM", "AMX", "CPU_LLVM", "DEVECTORIZE", "DISABLE_COMPILER_CACHE", "FUSE_ARANGE", "PTX", "QUANTIZE", "WINDOWS",
    "CCACHE", "IGNORE_BEAM_CACHE", "IGNORE_JIT_FIRST_BEAM", "JITBEAM", "SCACHE", "UNSAFE_ALLOW_JIT_BUFFER",
    "Target", "TracingKey", "cpu_time_execution", "get_single_element", "memsize_to_str",
]  # fmt: skip
