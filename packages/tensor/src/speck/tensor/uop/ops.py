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

__all__ = [
    "AxisType", "GroupOp", "KernelInfo", "Ops", "PatternMatcher", "UOp", "UPat", "graph_rewrite",
    "graph_rewrite_map", "resolve", "sint", "smax", "ssimplify",
]  # fmt: skip
