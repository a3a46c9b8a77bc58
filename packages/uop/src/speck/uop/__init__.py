"""speck.uop: the IR everything in speck stands on (standard library only).

dtypes, `Ops`/`GroupOp`, hash-consed `UOp` graphs, `UPat`/`PatternMatcher`, `graph_rewrite`, symbolic rules and
specs. The public names follow tinygrad's, so its users find what they expect."""

# imported for what they register: the symbolic rules and rendering behind UOp.simplify/render (graph_rewrite
# registers through the rewrite import below)
from speck.uop import render as _render  # noqa: F401
from speck.uop import symbolic as _symbolic  # noqa: F401
from speck.uop._version import __version__
from speck.uop.dtype import (
    AddrSpace,
    ConstType,
    DType,
    Invalid,
    InvalidType,
    PtrDType,
    bitcast,
    can_lossless_cast,
    cast_value,
    dtypes,
    least_upper_dtype,
    least_upper_float,
    sum_acc_dtype,
    to_dtype,
    truncate,
)
from speck.uop.helpers import CACHELEVEL, DEBUG, SPEC, Context, ContextVar, getenv
from speck.uop.ops import GroupOp, Ops
from speck.uop.rewrite import graph_rewrite, graph_rewrite_map, rewrites_anything
from speck.uop.uop import AxisType, UOp, exec_alu, resolve, sint, smax, ssimplify, validate_shape
from speck.uop.upat import PatternMatcher, UPat

__all__ = [
    "CACHELEVEL",
    "DEBUG",
    "SPEC",
    "AddrSpace",
    "AxisType",
    "ConstType",
    "Context",
    "ContextVar",
    "DType",
    "GroupOp",
    "Invalid",
    "InvalidType",
    "Ops",
    "PatternMatcher",
    "PtrDType",
    "UOp",
    "UPat",
    "__version__",
    "bitcast",
    "can_lossless_cast",
    "cast_value",
    "dtypes",
    "exec_alu",
    "getenv",
    "graph_rewrite",
    "graph_rewrite_map",
    "rewrites_anything",
    "least_upper_dtype",
    "least_upper_float",
    "resolve",
    "sint",
    "smax",
    "ssimplify",
    "sum_acc_dtype",
    "to_dtype",
    "truncate",
    "validate_shape",
]
