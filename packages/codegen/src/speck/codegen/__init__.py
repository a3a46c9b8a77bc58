"""speck.codegen: kernel AST (UOps) -> program form -> C / LLVM IR / Python / x86-64, an optimizer, and a reference
interpreter. Usable on its own with only speck-uop installed (see packages/codegen/README.md).

Public API: `full_rewrite_to_sink`, `to_program`, `ProgramSpec`, `BufferArg`, `KernelInfo`, `Estimates`,
`Renderer`, `PythonRenderer`, `eval_ast`, `run_program`, `Opt`, `OptOps`, `apply_opts`,
`hand_coded_optimizations`, `beam_search`. Renderers and compilers written elsewhere in the package
(ClangRenderer, LLVMRenderer, X86Renderer, LLVMCompiler, ClangCompiler) are imported lazily:
`speck.codegen.ClangRenderer` works once speck.codegen.renderer.cstyle exists."""

from __future__ import annotations

import importlib
from typing import Any

from speck.codegen._version import __version__
from speck.codegen.interpret import eval_ast, run_program
from speck.codegen.kernel_info import Estimates, KernelInfo
from speck.codegen.pipeline import full_rewrite_graph, full_rewrite_to_sink
from speck.codegen.program import BufferArg, ProgramSpec, to_program
from speck.codegen.renderer import Renderer, UnsupportedOpError
from speck.codegen.renderer.python import PythonRenderer

# names provided by sibling modules that may not exist in every checkout: resolved on first use
_LAZY: dict[str, str] = {
    "ClangRenderer": "speck.codegen.renderer.cstyle",
    "LLVMRenderer": "speck.codegen.renderer.llvmir",
    "X86Renderer": "speck.codegen.x86.renderer",
    "LLVMCompiler": "speck.codegen.compiler",
    "ClangCompiler": "speck.codegen.compiler",
    "Opt": "speck.codegen.opt",
    "OptOps": "speck.codegen.opt",
    "apply_opts": "speck.codegen.opt",
    "hand_coded_optimizations": "speck.codegen.opt",
    "beam_search": "speck.codegen.opt",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        try:
            mod = importlib.import_module(_LAZY[name])
        except ImportError as e:
            raise AttributeError(
                f"speck.codegen.{name} is unavailable: {_LAZY[name]} could not be imported ({e})"
            ) from e
        return getattr(mod, name)
    raise AttributeError(f"module 'speck.codegen' has no attribute {name!r}")


__all__ = [
    "BufferArg",
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
