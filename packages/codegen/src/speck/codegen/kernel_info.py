"""`KernelInfo` (the arg of a kernel AST's SINK) and `Estimates` (what a kernel costs: ops, bytes moved, lds)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from speck.uop import Ops, UOp, sint


@dataclass(frozen=True)
class KernelInfo:
    """Static facts about a kernel, carried as the arg of its AST's SINK.

    name: the function name renderers emit. opts: optimizer actions to apply instead of the heuristic (empty: let
    the optimizer decide). applied_opts: the actions the pipeline actually applied (filled in by the pipeline).
    dont_opt: skip the optimizer entirely (e.g. kernels whose loop order must be kept).
    opts_to_apply: tinygrad's spelling, accepted at construction only: None changes nothing, () means dont_opt,
    a non-empty tuple means opts; it is folded into those fields (and reads back as None) so they stay the one
    source of truth."""

    name: str = "kernel"
    opts: tuple[Any, ...] = ()
    applied_opts: tuple[Any, ...] = ()
    dont_opt: bool = False
    opts_to_apply: tuple[Any, ...] | None = None

    def __post_init__(self) -> None:
        if self.opts_to_apply is not None:
            wanted = tuple(self.opts_to_apply)
            object.__setattr__(self, "opts", wanted)
            object.__setattr__(self, "dont_opt", not wanted)
            object.__setattr__(self, "opts_to_apply", None)

    def replace(self, **kw: Any) -> KernelInfo:
        return dataclasses.replace(self, **kw)


def kernel_name(sink: UOp) -> str:
    """The function name of a kernel (its AST, or the final SINK of its linearized program): the name in the SINK's
    KernelInfo, "kernel" when it has none."""
    name = getattr(sink.arg, "name", None) if sink.op is Ops.SINK else None
    return "kernel" if name is None else str(name)


def _add(a: sint, b: sint) -> sint:
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return (UOp.const(_wi(), a) if isinstance(a, int) else a) + b


def _wi() -> Any:
    from speck.uop import dtypes

    return dtypes.weakint


@dataclass(frozen=True)
class Estimates:
    """Cost estimates of one kernel run: ops (ALU operations executed), mem (bytes read+written in global memory),
    lds (bytes loaded, global or register). Symbolic (weakint UOps) when loop sizes depend on variables."""

    ops: sint = 0
    mem: sint = 0
    lds: sint = 0
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def __add__(self, o: Estimates) -> Estimates:
        return Estimates(_add(self.ops, o.ops), _add(self.mem, o.mem), _add(self.lds, o.lds))


__all__ = ["Estimates", "KernelInfo", "kernel_name"]
