"""tinygrad.renderer.llvmir: speck.codegen's `LLVMRenderer` (LLVM IR; the CPU device's default backend)."""

from speck.codegen.renderer.llvmir import LLVMRenderer

__all__ = ["LLVMRenderer"]
