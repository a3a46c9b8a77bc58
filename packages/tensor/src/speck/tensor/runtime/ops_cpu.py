"""tinygrad.runtime.ops_cpu: speck.hcq's CPU device (`CPUDevice`, its `CPUProgram` and `CPUGraph`), with the
compilers its backends use (`ClangCompiler` for CPU:CLANG, `LLVMCompiler` for CPU and CPU:LLVM)."""

from speck.codegen.compiler import ClangCompiler, LLVMCompiler
from speck.hcq.cpu import CPUDevice, CPUProgram
from speck.hcq.graph import CPUGraph

__all__ = ["CPUDevice", "CPUGraph", "CPUProgram", "ClangCompiler", "LLVMCompiler"]
