"""tinygrad.codegen: speck.codegen's lowering pipeline (`full_rewrite_to_sink` -> lowered SINK, `full_rewrite` ->
linearized uops) and `get_program` (kernel AST -> rendered ProgramSpec)."""

from __future__ import annotations

from collections.abc import Sequence

from speck.codegen.kernel_info import KernelInfo
from speck.codegen.opt import Opt
from speck.codegen.pipeline import full_rewrite_graph
from speck.codegen.pipeline import full_rewrite_to_sink as _linearized
from speck.codegen.program import ProgramSpec, to_program
from speck.codegen.renderer import Renderer
from speck.tensor.device import Device
from speck.uop import UOp


def _default_renderer() -> Renderer:
    return Device[Device.DEFAULT].renderer


def full_rewrite_to_sink(sink: UOp, ren: Renderer | None = None, optimize: bool = True) -> UOp:
    """Every graph stage of the pipeline for renderer `ren` (default: the default device's): the lowered SINK, before
    linearization."""
    return full_rewrite_graph(sink, ren or _default_renderer(), optimize=optimize)


def full_rewrite(sink: UOp, ren: Renderer | None = None) -> list[UOp]:
    """The whole pipeline for renderer `ren` (default: the default device's): the linearized program, the list of
    uops a renderer renders (its last one is the SINK)."""
    return _linearized(sink, ren or _default_renderer())


def get_program(ast: UOp, renderer: Renderer | None = None, opts: Sequence[Opt] | None = None) -> ProgramSpec:
    """The ProgramSpec of a kernel AST (e.g. `Tensor.schedule()[i].ast`) rendered for `renderer` (default: the default
    device's), not compiled: `.src` is the source its device's compiler takes. `opts`, when given, are applied instead
    of the optimizer's choice (an empty list: no optimizations)."""
    if opts is not None:
        info = ast.arg if isinstance(ast.arg, KernelInfo) else KernelInfo()
        ast = ast.replace(arg=info.replace(opts_to_apply=tuple(opts)))
    if renderer is None:
        # the device's backend, so a kernel its renderer refuses goes to the backend's fallback as when realizing
        return Device[Device.DEFAULT].backend.to_program(ast, compile=False)
    return to_program(ast, renderer)


__all__ = ["full_rewrite", "full_rewrite_to_sink", "get_program"]
