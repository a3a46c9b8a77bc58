"""A corpus of kernel ASTs for the AMD backend's tests (codegen, hcq) and its bench: elementwise ops of every dtype
the backend handles, casts and bitcasts, reductions, a matmul, gated (padded) loads, transcendentals, symbolic
sizes, more output axes than the grid has dimensions. `amd_corpus()` yields (ast, inputs): inputs[0] is the
output buffer (zeros), the others hold values for which every op is defined."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Callable
from functools import cache
from typing import Any

import numpy as np
from hypothesis import strategies as st

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.numeric import storage_np, to_storage
from speck.codegen.program import ProgramSpec, to_program
from speck.uop import AxisType, DType, Ops, UOp, dtypes

# the LLVM 16 tools the code-object tests check against (Debian's llvm-16 and lld-16; the README's test command
# installs them): found by their versioned names, or unversioned ones of the same release
TOOLS = {"objdump": "llvm-objdump-16", "lld": "ld.lld-16", "readelf": "llvm-readelf-16"}


def tool(which: str) -> str:
    path = shutil.which(TOOLS[which])
    if path is None:
        raise RuntimeError(
            f"{TOOLS[which]} is not installed: the AMD code-object tests need Debian's llvm-16 and "
            "lld-16 packages (apt-get install llvm-16 lld-16, as the README's test command does)"
        )
    return path


def damaged(data: Any, blob: bytes, flips: int = 6) -> bytes:
    """`blob` cut short, or with up to `flips` bits flipped, as hypothesis's `data` draws it."""
    out = bytearray(blob)
    if data.draw(st.booleans()):
        return bytes(out[: data.draw(st.integers(0, len(out) - 1))])
    for _ in range(data.draw(st.integers(1, flips))):
        out[data.draw(st.integers(0, len(out) - 1))] ^= 1 << data.draw(st.integers(0, 7))
    return bytes(out)


def values(rng: np.random.Generator, dt: DType, n: int, positive: bool = False) -> np.ndarray:
    if dt == dtypes.bool:
        return rng.integers(0, 2, n).astype(np.bool_)
    if dtypes.is_float(dt):
        v = rng.uniform(0.25 if positive else -4, 4, n)
        return to_storage(v.astype(np.float64 if dt == dtypes.float64 else np.float32), dt)
    info = np.iinfo(storage_np(dt))
    lo, hi = (1 if positive else max(info.min, -1000)), min(info.max, 1000)
    return rng.integers(lo, hi, n).astype(storage_np(dt))


def _nm(dt: DType) -> str:
    return dt.name.replace(" ", "_")


def _kernel(name: str, out: DType, ins: list[DType], n: int, fn: Callable[[list[UOp], UOp], UOp]) -> UOp:
    i = UOp.range(n, 0, AxisType.GLOBAL)
    loads = [UOp.param(k + 1, dt.ptr(n)).index(i).load() for k, dt in enumerate(ins)]
    return UOp.sink(UOp.param(0, out.ptr(n)).index(i).store(fn(loads, i)).end(i), arg=KernelInfo(name))


def elementwise(dt: DType, n: int = 96) -> UOp:
    """out = a op b op a for the ops every dtype has (float: (a*b+a)-max(a,b); int: (a*b+a)^b, max; bool: or/and)."""
    if dt == dtypes.bool:
        return _kernel(f"ew_{_nm(dt)}", dt, [dt, dt], n, lambda x, i: (x[0] | x[1]) & x[0].ne(x[1]))
    if dtypes.is_float(dt):
        return _kernel(f"ew_{_nm(dt)}", dt, [dt, dt], n, lambda x, i: (x[0] * x[1] + x[0]) - x[0].maximum(x[1]))
    return _kernel(f"ew_{_nm(dt)}", dt, [dt, dt], n, lambda x, i: ((x[0] * x[1] + x[0]) ^ x[1]).maximum(x[0]))


def division(dt: DType, n: int = 64) -> UOp:
    if dtypes.is_float(dt):
        return _kernel(f"div_{_nm(dt)}", dt, [dt, dt], n, lambda x, i: x[0] / x[1] + x[1].sqrt())
    return _kernel(f"div_{_nm(dt)}", dt, [dt, dt], n, lambda x, i: x[0] // x[1] + x[0] % x[1])


def cast(fr: DType, to: DType, n: int = 64) -> UOp:
    return _kernel(f"cast_{_nm(fr)}_{_nm(to)}", to, [fr], n, lambda x, i: x[0].cast(to))


def bitcast(fr: DType, to: DType, n: int = 64) -> UOp:
    return _kernel(f"bitcast_{_nm(fr)}_{_nm(to)}", to, [fr], n, lambda x, i: x[0].bitcast(to))


def unary(op: Ops, n: int = 64) -> UOp:
    return _kernel(f"un_{op.name.lower()}", dtypes.float32, [dtypes.float32], n, lambda x, i: x[0].alu(op))


def gated(n: int = 40, pad: int = 3) -> UOp:
    """out[i] = a[i - pad] where 0 <= i - pad < n - 2*pad, else 0 (a padded read)."""
    i = UOp.range(n, 0, AxisType.GLOBAL)
    m = n - 2 * pad
    a = UOp.param(1, dtypes.float32.ptr(m)).index((i - pad).valid((i >= pad) & (i < pad + m))).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(i).store(a * 2.0).end(i), arg=KernelInfo("gated"))


def reduce(op: Ops, rows: int = 24, cols: int = 37, dt: DType = dtypes.float32) -> UOp:
    r, c = UOp.range(rows, 0, AxisType.GLOBAL), UOp.range(cols, 1, AxisType.REDUCE)
    v = UOp.param(1, dt.ptr(rows * cols)).index(r * cols + c).load()
    return UOp.sink(UOp.param(0, dt.ptr(rows)).index(r).store(v.reduce(c, op=op)).end(r),
                    arg=KernelInfo(f"red_{op.name.lower()}_{_nm(dt)}"))  # fmt: skip


def full_sum(n: int = 1000) -> UOp:
    c = UOp.range(n, 0, AxisType.REDUCE)
    v = UOp.param(1, dtypes.float32.ptr(n)).index(c).load()
    out = UOp.param(0, dtypes.float32.ptr(1)).index(UOp.const(dtypes.weakint, 0))
    return UOp.sink(out.store(v.reduce(c, op=Ops.ADD)), arg=KernelInfo("full_sum"))


def matmul(m: int = 32, n: int = 48, k: int = 20) -> UOp:
    i, j, r = UOp.range(m, 0, AxisType.GLOBAL), UOp.range(n, 1, AxisType.GLOBAL), UOp.range(k, 2, AxisType.REDUCE)
    a = UOp.param(1, dtypes.float32.ptr(m * k)).index(i * k + r).load()
    b = UOp.param(2, dtypes.float32.ptr(k * n)).index(r * n + j).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(m * n)).index(i * n + j).store((a * b).reduce(r, op=Ops.ADD))
                    .end(i, j), arg=KernelInfo("matmul"))  # fmt: skip


def four_axes(shape: tuple[int, ...] = (3, 5, 4, 8)) -> UOp:
    """A transpose over four output axes: more than the grid's three dimensions."""
    rs = [UOp.range(s, d, AxisType.GLOBAL) for d, s in enumerate(shape)]
    n = int(np.prod(shape))
    src_idx = ((rs[3] * shape[2] + rs[2]) * shape[1] + rs[1]) * shape[0] + rs[0]
    dst_idx = ((rs[0] * shape[1] + rs[1]) * shape[2] + rs[2]) * shape[3] + rs[3]
    a = UOp.param(1, dtypes.float32.ptr(n)).index(src_idx).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(n)).index(dst_idx).store(a + 1.0).end(*rs), arg=KernelInfo("axes4"))


def symbolic(hi: int = 50) -> UOp:
    v = UOp.variable("n", 1, hi)
    i = UOp.range(v, 0, AxisType.GLOBAL)
    a = UOp.param(1, dtypes.float32.ptr(hi)).index(i).load()
    return UOp.sink(UOp.param(0, dtypes.float32.ptr(hi)).index(i).store(a * a).end(i), arg=KernelInfo("symbolic"))


ELEMENTWISE_DTYPES = (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int8, dtypes.uint8,
                      dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64, dtypes.bool)  # fmt: skip
CASTS = ((dtypes.float32, dtypes.float16), (dtypes.float16, dtypes.float32), (dtypes.float32, dtypes.bfloat16),
         (dtypes.bfloat16, dtypes.float32), (dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32),
         (dtypes.float64, dtypes.float32), (dtypes.int64, dtypes.float32), (dtypes.float32, dtypes.uint8),
         (dtypes.int8, dtypes.int64), (dtypes.float32, dtypes.bool), (dtypes.bool, dtypes.float32),
         (dtypes.float32, dtypes.fp8e4m3))  # fmt: skip


def metadata_note(elf: bytes) -> dict[str, Any]:
    """The NT_AMDGPU_METADATA note of a code object, decoded by the msgpack package (not speck's decoder)."""
    import msgpack

    shoff, shnum = struct.unpack_from("<Q", elf, 40)[0], struct.unpack_from("<H", elf, 60)[0]
    for k in range(shnum):
        _, sh_type, _, _, off, size, _, _, _, _ = struct.unpack_from("<IIQQQQIIQQ", elf, shoff + 64 * k)
        if sh_type == 7:  # SHT_NOTE
            namesz, descsz, ntype = struct.unpack_from("<III", elf, off)
            assert elf[off + 12 : off + 12 + namesz] == b"AMDGPU\0" and ntype == 32
            desc = off + 12 + namesz + (-namesz % 4)
            value: dict[str, Any] = msgpack.unpackb(elf[desc : desc + descsz])
            return value
    raise AssertionError("no note section")


@cache
def amd_compiler() -> Any:
    """One gfx1100 compiler for a test session (its target machine is built once)."""
    from speck.codegen.compiler.amdgpu import AMDGPUCompiler

    return AMDGPUCompiler()


@cache
def corpus_spec(i: int) -> ProgramSpec:
    """Corpus kernel i lowered and compiled for gfx1100 without FMA contraction (so it computes what the interpreter
    does)."""
    from speck.codegen.renderer.amdgpu import AMDGPURenderer

    return to_program(CORPUS[i][0], AMDGPURenderer(), amd_compiler())


def amd_corpus(seed: int = 0) -> list[tuple[UOp, list[np.ndarray], dict[str, int]]]:
    """Every kernel of the corpus with its input buffers (output first, zeros) and variable values."""
    rng = np.random.default_rng(seed)
    out: list[tuple[UOp, list[np.ndarray], dict[str, int]]] = []

    def add(ast: UOp, var_vals: dict[str, int] | None = None, positive: bool = False) -> None:
        params = sorted({u for u in ast.toposort() if u.op is Ops.PARAM}, key=lambda p: p.arg)
        bufs = [np.zeros(p.dtype.size, storage_np(p.dtype.base)) if p.arg == 0 else  # type: ignore[attr-defined]
                values(rng, p.dtype.base, p.dtype.size, positive) for p in params]  # type: ignore[attr-defined]  # fmt: skip
        out.append((ast, bufs, var_vals or {}))

    for dt in ELEMENTWISE_DTYPES:
        add(elementwise(dt))
    for dt in (dtypes.float32, dtypes.float16, dtypes.float64, dtypes.int32, dtypes.int64, dtypes.uint8):
        add(division(dt), positive=True)
    for fr, to in CASTS:
        add(cast(fr, to))
    add(bitcast(dtypes.float32, dtypes.int32))
    add(bitcast(dtypes.uint16, dtypes.float16))
    for op in (Ops.EXP2, Ops.LOG2, Ops.SIN, Ops.SQRT, Ops.RECIPROCAL, Ops.TRUNC):
        add(unary(op), positive=op in (Ops.LOG2, Ops.SQRT))
    add(gated())
    for op in (Ops.ADD, Ops.MAX, Ops.MUL):
        add(reduce(op))
    add(reduce(Ops.ADD, dt=dtypes.int32))
    add(full_sum())
    add(matmul())
    add(four_axes())
    add(symbolic(), {"n": 37})
    return out


CORPUS = amd_corpus()
CORPUS_IDS = [ast.arg.name for ast, _, _ in CORPUS]

__all__ = [
    "CORPUS",
    "CORPUS_IDS",
    "TOOLS",
    "amd_compiler",
    "amd_corpus",
    "corpus_spec",
    "damaged",
    "metadata_note",
    "tool",
    "values",
]
