"""`pm_simplify`: speck.uop's symbolic rules plus the cleanup of ranges the kernel AST checks leave (one place, used
by the pipeline's simplification stages, by opts after each one applies, and by BEAM's base kernel)."""

from speck.codegen.lower.ast_check import pm_cleanup_ranges
from speck.uop.symbolic import symbolic

# built once: combining matchers compiles their rules
pm_simplify = symbolic + pm_cleanup_ranges

__all__ = ["pm_simplify"]
