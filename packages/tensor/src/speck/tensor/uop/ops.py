"""`from tinygrad.uop.ops import UOp, Ops` works here: speck.uop's IR names."""

from speck.codegen.kernel_info import KernelInfo
from speck.uop import (
    AxisType,
    GroupOp,
    Ops,
    PatternMatcher,
    UOp,
    UPat,
    graph_rewrite,
    graph_rewrite_map,
    resolve,
    sint,
    smax,
    ssimplify,
)


def Variable(name: str, min_val: int, max_val: int) -> UOp:
    """A symbolic size in [min_val, max_val] (tinygrad's UOp.variable)."""
    return UOp.variable(name, min_val, max_val)


__all__ = [
    "AxisType", "GroupOp", "KernelInfo", "Ops", "PatternMatcher", "UOp", "UPat", "Variable", "graph_rewrite",
    "graph_rewrite_map", "resolve", "sint", "smax", "ssimplify",
]  # fmt: skip
