"""tinygrad.runtime.support.compiler_cuda: the `PTX` setting (speck.tensor.settings; speck has no CUDA device, so it
changes nothing) and `PTXRenderer`, the marker class no speck device uses."""

from speck.tensor.renderer.ptx import PTXRenderer
from speck.tensor.settings import PTX

__all__ = ["PTX", "PTXRenderer"]
