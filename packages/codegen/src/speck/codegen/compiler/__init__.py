"""Compilers: pure functions from a rendering (LLVM IR text or C source) to a relocatable x86-64 ELF object.

They know nothing about the IR, so they are usable on their own: `LLVMCompiler().compile(ir_text) -> bytes`.
Results are cached on disk keyed by compiler name, flags and a hash of the source (see `base.Compiler`)."""

from speck.codegen.compiler.base import Compiler, cache_dir, disassemble_object
from speck.codegen.compiler.clang import ClangCompiler
from speck.codegen.compiler.llvm import LLVMCompiler
from speck.codegen.errors import CompileError

__all__ = ["ClangCompiler", "CompileError", "Compiler", "LLVMCompiler", "cache_dir", "disassemble_object"]
