"""`from tinygrad.uop.ops import UOp, Ops` works here: speck.uop's IR names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from speck.codegen.kernel_info import KernelInfo
from speck.uop import (
    AxisType,
    DType,
    GroupOp,
    Ops,
    PatternMatcher,
    UOp,
    UPat,
    dtypes,
    exec_alu,
    graph_rewrite,
    graph_rewrite_map,
    resolve,
    sint,
    smax,
    ssimplify,
)
from speck.uop.symbolic import sym_infer as _sym_infer
from speck.uop.uop import python_alu

F = TypeVar("F", bound=Callable[..., Any])


def Variable(name: str, min_val: int, max_val: int, dtype: DType = dtypes.weakint) -> UOp:
    """A symbolic int in [min_val, max_val] of `dtype` (an index by default; tinygrad's UOp.variable)."""
    return UOp.variable(name, min_val, max_val, dtype)


def smin(*xs: sint) -> sint:
    """The smallest of ints and symbolic ints (a simplified MIN expression when any is symbolic); `smax`'s twin."""
    vals = xs[0] if len(xs) == 1 and isinstance(xs[0], (tuple, list)) else xs
    out: sint = vals[0]
    for x in vals[1:]:
        if isinstance(out, int) and isinstance(x, int):
            out = min(out, x)
        else:
            a = out if isinstance(out, UOp) else UOp.const(dtypes.weakint, out)
            out = a.minimum(x).simplify()
    return ssimplify(out)


def sym_infer(u: sint, var_vals: dict[Any, int]) -> int:
    """The value of a symbolic int with its Variables at var_vals (keyed by name or by the Variable UOp); ints are
    returned as they are."""
    if isinstance(u, int):
        return u
    names = {(k.arg[0] if isinstance(k, UOp) else k): int(v) for k, v in var_vals.items()}
    return int(_sym_infer(u, names))


def track_rewrites(name: Callable[..., Any] | bool = True, replay: bool = False) -> Callable[[F], F]:
    """tinygrad's decorator recording the graph rewrites a function does for its VIZ viewer. speck has no rewrite
    tracer or viewer, so the function is returned unchanged (codegen's stages print with DEBUG>=3 instead)."""

    def wrap(fn: F) -> F:
        return fn

    return wrap


__all__ = [
    "AxisType", "GroupOp", "KernelInfo", "Ops", "PatternMatcher", "UOp", "UPat", "Variable", "exec_alu",
    "graph_rewrite", "graph_rewrite_map", "python_alu", "resolve", "sint", "smax", "smin", "ssimplify", "sym_infer",
    "track_rewrites",
]  # fmt: skip
