"""Analysis of linearized programs (KERNEL_CONTRACT.md section 2) shared by the renderers (C, LLVM IR, x86), the
ProgramSpec builder and the interpreter: literals (casted consts), the CPU ABI signature (buffers, variables, the
range sliced across threads), and the bounds-based facts that decide whether an integer op needs a guard."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from speck.codegen.errors import ProgramFormError
from speck.codegen.kernel_info import kernel_name
from speck.uop import AxisType, Ops, PtrDType, UOp, cast_value, dtypes


def outer_global_range(uops: Sequence[UOp]) -> UOp | None:
    """The RANGE the CPU ABI slices across threads: the first GLOBAL range opened at loop depth 0 (None when the
    program has none)."""
    depth = 0
    for u in uops:
        if u.op is _RANGE:
            if depth == 0 and u.arg[-1] is AxisType.GLOBAL:
                return u
            depth += 1
        elif u.op is _END:
            depth -= 1
    return None


def batched_range(uops: Sequence[UOp]) -> UOp | None:
    """The outer GLOBAL range when numpy executors may run a whole slice of it as one batch (one row per index):
    None when there is none, or when the end of a loop inside it depends on its index (bounded tap loops), since a
    batch has one trip count per loop."""
    outer = outer_global_range(uops)
    if outer is None:
        return None
    if any(u.op is Ops.RANGE and u is not outer and outer in u.src[0].toposort() for u in uops):
        return None
    return outer


def casted_const(u: UOp) -> tuple[bool, Any]:
    """(True, value truncated to u.dtype) when u is a casted const `CAST(dt, CONST(v, from_py(v)))`, else (False,
    None)."""
    if u.op is Ops.CAST and len(u.src) == 1 and u.src[0].op is Ops.CONST:
        c = u.src[0]
        if c.dtype.is_weak or c.dtype == dtypes.bool:
            if c.dtype is not dtypes.from_py(c.arg):
                raise ProgramFormError(f"casted const {u.dtype} has inner CONST {c.arg!r} of dtype {c.dtype}; expected "
                                       f"{dtypes.from_py(c.arg)} (from_py of the value)")  # fmt: skip
            return True, cast_value(c.arg, u.dtype.scalar())
    return False, None


def bare_const_error(u: UOp, renderer: str) -> ProgramFormError:
    """The error a renderer raises when it meets a CONST outside a casted const."""
    return ProgramFormError(
        f"renderer {renderer!r} got a bare CONST {u.arg!r} of dtype {u.dtype}: programs must spell every literal as a "
        f"casted const CAST(dt, CONST(v, from_py(v))) (see IR.md); run the pipeline's casted-const stage first"
    )


@dataclasses.dataclass(frozen=True)
class KernelSignature:
    """What the CPU ABI function signature is made of: buffer PARAMs in slot order (with whether each is written),
    DEFINE_VARs in name order, and the RANGE sliced by core_start/core_end (None when there is no global range)."""

    name: str
    buffers: tuple[UOp, ...]
    written: frozenset[UOp]
    variables: tuple[UOp, ...]
    sliced: UOp | None


def check_kernel_name(name: str, renderer: str) -> str:
    """name, if it can name the kernel's function (it is written into the source and the symbol table)."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise ProgramFormError(
            f"renderer {renderer!r}: kernel name {name!r} is not a valid C/LLVM identifier; name kernels "
            "(KernelInfo(name=...)) with letters, digits and '_', not a digit first"
        )
    return name


def kernel_signature(uops: list[UOp], renderer: str) -> KernelSignature:
    """Analyse a linearized program for the CPU ABI (CPU_ABI.md); raises RuntimeError on a malformed program."""
    if not uops or uops[-1].op is not Ops.SINK:
        raise ProgramFormError(f"renderer {renderer!r}: a program must be a linear UOp list ending in SINK")
    name = check_kernel_name(kernel_name(uops[-1]), renderer)
    # one pass over the program (enum members read once: `Ops.X` is slow in Python 3.11, see _PARAM)
    params: list[UOp] = []
    written: set[UOp] = set()
    variables: list[UOp] = []
    for u in uops:
        if (op := u.op) is _PARAM:
            params.append(u)
        elif op is _STORE and u.src[0].op is _INDEX:
            written.add(u.src[0].src[0])
        elif op is _DEFINE_VAR:
            variables.append(u)
    buffers = sorted(params, key=lambda u: u.arg if isinstance(u.arg, int) else u.arg[0])
    for b in buffers:
        if not isinstance(b.dtype, PtrDType):
            raise ProgramFormError(f"renderer {renderer!r}: PARAM {b.arg} has dtype {b.dtype}; by-value parameters "
                                   "must be DEFINE_VARs in a program")  # fmt: skip
    variables.sort(key=lambda u: str(u.arg[0]))
    return KernelSignature(name, tuple(buffers), frozenset(written), tuple(variables), outer_global_range(uops))


# enum members kernel_signature reads per node, as module constants: in Python 3.11 each `Ops.X` goes through the
# enum metaclass's __getattr__ hook, several times the cost of reading a global
_PARAM, _STORE, _INDEX, _DEFINE_VAR = Ops.PARAM, Ops.STORE, Ops.INDEX, Ops.DEFINE_VAR
_RANGE, _END = Ops.RANGE, Ops.END


def int_fits(u: UOp) -> bool:
    """u's exact bounds lie strictly inside its integer dtype, so computing it in that dtype cannot overflow.
    (Bounds that could leave the dtype are reported as the full range, hence the strict comparison.)"""
    dt = u.dtype.scalar()
    try:
        lo, hi = u.vmin, u.vmax
    except Exception:  # bounds of an exotic node: be conservative
        return False
    return bool(isinstance(lo, int) and isinstance(hi, int) and dtypes.min(dt) < lo and hi < dtypes.max(dt))


def divisor_safe(a: UOp, b: UOp) -> bool:
    """C `/` and `%` are defined for a and b: b is never 0, and never -1 while a may be the type's minimum."""
    dt = b.dtype.scalar()
    lo, hi = b.vmin, b.vmax
    if not (isinstance(lo, int) and isinstance(hi, int)) or lo <= 0 <= hi:
        return False
    if dtypes.is_unsigned(dt) or dt.itemsize < 4 or not lo <= -1 <= hi:
        return True
    return bool(isinstance(a.vmin, int) and a.vmin > dtypes.min(dt))


def shift_safe(b: UOp, bits: int) -> bool:
    """The shift amount b always lies in [0, bits)."""
    lo, hi = b.vmin, b.vmax
    return bool(isinstance(lo, int) and isinstance(hi, int) and lo >= 0 and hi < bits)


__all__ = [
    "KernelSignature",
    "bare_const_error",
    "casted_const",
    "divisor_safe",
    "int_fits",
    "kernel_signature",
    "outer_global_range",
    "shift_safe",
]
