"""The host CPU's features, read once from /proc/cpuinfo: the one source of truth for "does this CPU have avx512f"
(the LLVM renderer's vector width and the x86 backend's choice between AVX-512 and AVX2 both ask here).

`X86_AVX512` (speck setting, default 1): 0 makes the x86 backend select AVX2 even on an AVX-512 host, so both paths
run on one machine. It can only turn AVX-512 off: on a CPU without avx512f the backend never emits it.
`LLVM_VECTOR_BYTES` (default 0, the host's): the LLVM renderer's vector width, read when a renderer is made."""

from __future__ import annotations

import functools

from speck.codegen.errors import CodegenValueError
from speck.codegen.settings import LLVM_VECTOR_BYTES, X86_AVX512


@functools.cache
def host_cpu_flags() -> frozenset[str]:
    """The `flags` line of /proc/cpuinfo (empty where there is none: no x86 feature is assumed then)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def host_has_avx512f() -> bool:
    """Whether this CPU runs AVX-512 Foundation instructions (zmm registers, opmasks, EVEX encoding)."""
    return "avx512f" in host_cpu_flags()


def host_vector_bytes() -> int:
    """Widest vector register of this host in bytes: 64 with AVX-512F, else 32 (AVX2 and the default elsewhere)."""
    return 64 if host_has_avx512f() else 32


def llvm_vector_bytes() -> int:
    """The LLVM renderer's default vector width in bytes: LLVM_VECTOR_BYTES when set (32 keeps an AVX-512 host to
    AVX2's ymm vectors and 16 registers' blocking, for comparing the two), else the host's widest."""
    want = int(LLVM_VECTOR_BYTES.value)
    if want == 0:
        return host_vector_bytes()
    if want not in (16, 32, 64):
        raise CodegenValueError(f"LLVM_VECTOR_BYTES must be 0 (the host's), 16, 32 or 64, got {want}; set one of those")
    return want


def x86_avx512_enabled() -> bool:
    """Whether the x86 backend selects AVX-512 by default: the host has avx512f and X86_AVX512 is not 0."""
    return bool(X86_AVX512.value) and host_has_avx512f()


__all__ = ["LLVM_VECTOR_BYTES", "X86_AVX512", "host_cpu_flags", "host_has_avx512f", "host_vector_bytes",
           "llvm_vector_bytes", "x86_avx512_enabled"]  # fmt: skip
