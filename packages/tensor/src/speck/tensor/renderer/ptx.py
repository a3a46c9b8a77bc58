"""tinygrad.renderer.ptx: `PTXRenderer`, a marker for tinygrad's CUDA assembly renderer, which speck does not have."""

from __future__ import annotations

from typing import Any

from speck.codegen.renderer import Renderer
from speck.tensor.errors import TensorNotImplementedError


class PTXRenderer(Renderer):
    """tinygrad's PTX (CUDA assembly) renderer. speck has no CUDA device and no PTX backend: no device's renderer is a
    PTXRenderer (so `isinstance(Device[d].renderer, PTXRenderer)` is False everywhere), and making one raises."""

    name = "ptx"
    device = "CUDA"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TensorNotImplementedError("speck has no PTX renderer (it has no CUDA device); render with a CPU backend")


__all__ = ["PTXRenderer"]
