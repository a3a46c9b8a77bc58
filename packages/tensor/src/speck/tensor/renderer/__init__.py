"""tinygrad.renderer: speck.codegen's `Renderer` base class (every device's `.renderer` is one), `ProgramSpec` and
`Estimates`."""

from speck.codegen.kernel_info import Estimates
from speck.codegen.program import ProgramSpec
from speck.codegen.renderer import Renderer

__all__ = ["Estimates", "ProgramSpec", "Renderer"]
