"""tinygrad.codegen.opt: speck.codegen.opt's optimizer actions (`Opt`, `OptOps`); `KernelOptError` is speck's
OptError (an Opt that does not apply to the kernel)."""

from speck.codegen.errors import OptError as KernelOptError
from speck.codegen.opt import Opt, OptOps

__all__ = ["KernelOptError", "Opt", "OptOps"]
