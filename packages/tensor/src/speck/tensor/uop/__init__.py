"""speck.uop under tinygrad's module name (`tinygrad.uop`, `tinygrad.uop.ops`). The package itself exports the op
enums, as tinygrad's does (`from tinygrad.uop import Ops, GroupOp`)."""

from speck.uop import AxisType, GroupOp, Ops, UOp

__all__ = ["AxisType", "GroupOp", "Ops", "UOp"]
