"""tinygrad.uop.symbolic: speck.uop.symbolic's rule sets (`symbolic_simple`, `symbolic`) and `sym`, the rules the
codegen pipeline simplifies kernels with (speck.codegen.lower.simplify.pm_simplify: `symbolic` plus range cleanup)."""

from speck.codegen.lower.simplify import pm_simplify as sym
from speck.uop.symbolic import symbolic, symbolic_simple

__all__ = ["sym", "symbolic", "symbolic_simple"]
