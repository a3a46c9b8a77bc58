"""`from tinygrad.engine.jit import TinyJit, JitError` works here; the code is in speck.tensor.jit."""

from speck.tensor.jit import JitError, TinyJit

__all__ = ["JitError", "TinyJit"]
