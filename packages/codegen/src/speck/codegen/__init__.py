"""speck.codegen: kernel AST (UOps) -> program form -> C / LLVM IR / Python / x86-64, an optimizer, and a reference
interpreter. Usable on its own with only speck-uop installed (see packages/codegen/README.md).

Public API: `full_rewrite_to_sink`, `to_program`, `ProgramSpec`, `BufferArg`, `KernelInfo`, `Estimates`,
`Renderer` and the renderers (`ClangRenderer`, `LLVMRenderer`, `PythonRenderer`, `X86Renderer`), the compilers
(`LLVMCompiler`, `ClangCompiler`), `eval_ast`, `run_program`, `Opt`, `OptOps`, `apply_opts`,
`hand_coded_optimizations`, `beam_search`, and the backend registry (`Backend`, `get_backend`, `register_backend`,
`backend_names`): a backend is a name for one renderer + compiler pair, which is how devices choose them."""

from __future__ import annotations

from speck.codegen._version import __version__
from speck.codegen.backends import Backend, backend_names, get_backend, register_backend
from speck.codegen.compiler import ClangCompiler, LLVMCompiler
from speck.codegen.interpret import eval_ast, run_program
from speck.codegen.kernel_info import Estimates, KernelInfo
from speck.codegen.opt import Opt, OptOps, apply_opts, beam_search, hand_coded_optimizations
from speck.codegen.pipeline import full_rewrite_graph, full_rewrite_to_sink
from speck.codegen.program import BufferArg, ProgramSpec, to_program
from speck.codegen.renderer import Renderer, UnsupportedOpError
from speck.codegen.renderer.cstyle import ClangRenderer
from speck.codegen.renderer.llvmir import LLVMRenderer
from speck.codegen.renderer.python import PythonRenderer
from speck.codegen.x86.renderer import X86Renderer

__all__ = [
    "Backend",
    "BufferArg",
    "ClangCompiler",
    "ClangRenderer",
    "LLVMCompiler",
    "LLVMRenderer",
    "Opt",
    "OptOps",
    "X86Renderer",
    "apply_opts",
    "backend_names",
    "beam_search",
    "get_backend",
    "hand_coded_optimizations",
    "register_backend",
    "Estimates",
    "KernelInfo",
    "ProgramSpec",
    "PythonRenderer",
    "Renderer",
    "UnsupportedOpError",
    "__version__",
    "eval_ast",
    "full_rewrite_graph",
    "full_rewrite_to_sink",
    "run_program",
    "to_program",
]
