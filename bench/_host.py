"""What every benchmark prints first, and the environment it needs: real baselines.

These machines set OPENBLAS_CORETYPE=Haswell (and OPENBLAS_L2_SIZE), which makes numpy's OpenBLAS run its AVX2
kernels on AVX-512 CPUs, about 4x slower for float32 matmul. A benchmark comparing against numpy must not inherit
that: importing this module (before numpy is loaded: OpenBLAS reads the variables when the library loads) removes
them from the process environment, and `describe()` prints the CPU and the BLAS kernel numpy actually runs.

    import _host  # first import of a benchmark script
    _host.describe()
"""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

_REMOVED = {k: os.environ.pop(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
if "numpy" in sys.modules and _REMOVED:
    raise RuntimeError(
        f"bench/_host.py must be imported before numpy: numpy's OpenBLAS already loaded with {_REMOVED}; "
        "move `import _host` to the top of the script"
    )


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_vector_isa() -> str:
    """The widest x86 vector extension the CPU reports (avx512f, avx2, ...)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((ln.split(":", 1)[1].split() for ln in f if ln.startswith("flags")), [])
    except OSError:
        flags = []
    for isa in ("avx512f", "avx2", "avx", "sse4_2"):
        if isa in flags:
            return isa
    return "unknown"


def blas_info() -> list[dict[str, Any]]:
    """threadpoolctl's view of the BLAS libraries loaded in this process (after numpy is imported)."""
    import numpy as np
    from threadpoolctl import threadpool_info

    np.ones((2, 2)) @ np.ones((2, 2))  # make sure the BLAS is loaded
    return [i for i in threadpool_info() if i.get("user_api") == "blas"]


def describe() -> str:
    """One paragraph naming the host and the baselines; printed by every benchmark before its table."""
    lines = [f"host: {cpu_model()} ({cpu_vector_isa()}), {os.cpu_count()} cores"]
    if _REMOVED:
        lines.append(f"unset for this process: {', '.join(f'{k}={v}' for k, v in _REMOVED.items())}")
    try:
        for b in blas_info():
            lines.append(
                f"numpy BLAS: {b.get('internal_api')} {b.get('version')}, kernel {b.get('architecture')}, "
                f"{b.get('num_threads')} threads"
            )
    except ImportError:
        lines.append("numpy BLAS: unknown (threadpoolctl is not installed; `nox -s bench` installs it)")
    text = "\n".join(lines)
    print(text, flush=True)
    return text
