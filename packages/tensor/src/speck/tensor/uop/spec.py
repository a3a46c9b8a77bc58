"""tinygrad.uop.spec: speck.uop.spec's specs (`tensor_spec`, `kernel_spec`, `program_spec`) and `type_verify`."""

from __future__ import annotations

from speck.codegen.kernel_info import KernelInfo
from speck.uop import Ops, PatternMatcher, UOp
from speck.uop.spec import spec_kernel as kernel_spec
from speck.uop.spec import spec_program as program_spec
from speck.uop.spec import spec_tensor as tensor_spec
from speck.uop.spec import type_verify as _type_verify


def type_verify(ast: UOp | list[UOp], check_spec: PatternMatcher | None = None) -> None:
    """Check a graph or a linearized program against `check_spec` and raise RuntimeError naming the first node that
    breaks it. Without a spec, a list (linearized uops) is checked against `program_spec` and a graph against
    `kernel_spec` when it is a kernel SINK, else `tensor_spec`."""
    if check_spec is None:
        if isinstance(ast, list):
            check_spec = program_spec
        else:
            check_spec = kernel_spec if ast.op is Ops.SINK and isinstance(ast.arg, KernelInfo) else tensor_spec
    _type_verify(ast, check_spec)


__all__ = ["kernel_spec", "program_spec", "tensor_spec", "type_verify"]
