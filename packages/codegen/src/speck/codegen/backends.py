"""The backend registry: one name -> one renderer and one compiler. A device names its backend ("LLVM", "CLANG",
"X86", "PYTHON", "NULL"; "AMD" for RDNA3 GPUs, gfx1100, or "AMD_GFX1101"/"AMD_GFX1102"/"AMD_GFX1150") and gets both
from here; nothing else keeps a table of renderer names.

    from speck.codegen.backends import get_backend
    be = get_backend("llvm")              # names are case-insensitive
    spec = be.to_program(ast)             # lowered, rendered and compiled for this backend

A new backend is one `register_backend(Backend(name, renderer_factory, compiler_factory))` call. `fallback` names
the backend that renders a kernel this backend refuses: its renderer early (UnsupportedOpError, before expensive
work), or its compiler late (CompileRefused: the x86 selector meets a form it has no rule for). The registry decides
before the object exists, so a program's source always describes its object: the x86 backend falls back to LLVM
for forms it does not select, one kernel at a time."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from speck.codegen.compiler.amdgpu import ARCHS
from speck.codegen.compiler.base import Compiler
from speck.codegen.compiler.llvm import QUICK_OPT, LLVMCompiler, quick_enough
from speck.codegen.errors import CompileRefused, UnknownBackendError, UnsupportedOpError
from speck.codegen.settings import FP_CONTRACT

if TYPE_CHECKING:
    from speck.codegen.program import ProgramSpec
    from speck.codegen.renderer import Renderer
    from speck.uop import UOp


class IdentityCompiler(Compiler):
    """A 'compiler' whose object is the source text itself: for runtimes that execute the program form (PYTHON runs
    the ProgramSpec's UOps through the interpreter) or nothing at all (NULL)."""

    def __init__(self, name: str) -> None:
        self.name = name

    def compile(self, src: str) -> bytes:
        return src.encode()

    def compile_uncached(self, src: str) -> bytes:
        return src.encode()

    def disassemble(self, lib: bytes) -> str:
        return lib.decode(errors="replace")


@dataclass
class Backend:
    """A code generator for one target: `renderer()` and `compiler()` are created on first use and shared.
    `quick`: (make a second compiler, which specs it compiles) for a backend with a cheaper compile that kernels too
    small for optimization to pay get (the LLVM backend's opt=QUICK_OPT for `compiler.llvm.quick_enough`)."""

    name: str
    make_renderer: Callable[[], Renderer]
    make_compiler: Callable[[], Compiler]
    fallback: str | None = None
    aliases: tuple[str, ...] = ()
    host: bool = False  # its programs are native code for this machine: a CPU device can be built on it (CPU:<name>)
    quick: tuple[Callable[[], Compiler], Callable[[Any], bool]] | None = None
    _renderer: Renderer | None = field(default=None, repr=False)
    _compiler: Compiler | None = field(default=None, repr=False)
    _quick_compiler: Compiler | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def renderer(self) -> Renderer:
        if self._renderer is None:
            with self._lock:
                if self._renderer is None:
                    self._renderer = self.make_renderer()
        return self._renderer

    @property
    def compiler(self) -> Compiler:
        if self._compiler is None:
            with self._lock:
                if self._compiler is None:
                    self._compiler = self.make_compiler()
        return self._compiler

    def renderer_names(self) -> frozenset[str]:
        """Names of the renderers whose programs this backend's runtime loads: its own and its fallback's."""
        names = {self.renderer.name}
        if self.fallback is not None:
            names |= get_backend(self.fallback).renderer_names()
        return frozenset(names)

    def to_program(self, ast: UOp, compile: bool = True, beam_timer: Any = None, beam_tag: str = "") -> ProgramSpec:
        """Lower, render and (when `compile`) compile `ast`. A kernel the renderer refuses with UnsupportedOpError
        goes to the fallback backend when there is one (said under DEBUG>=2); otherwise the error propagates.
        `beam_timer`/`beam_tag`: BEAM's candidate timer and its device's name (see speck.codegen.opt.search)."""
        from speck.codegen.program import to_program

        try:
            spec = to_program(ast, self.renderer, beam_timer=beam_timer, beam_tag=beam_tag)
            if compile:  # (after lowering: which compiler depends on the spec, see compiler_for)
                spec.lib = self.compiler_for(spec).compile(spec.src)
            return spec
        except (UnsupportedOpError, CompileRefused) as e:
            return self.refused(ast, e, compile, beam_timer, beam_tag)

    def refused(self, ast: UOp, refusal: Exception, compile: bool = True, beam_timer: Any = None,
                beam_tag: str = "") -> ProgramSpec:  # fmt: skip
        """The program of a kernel this backend refused (its renderer, or its compiler later: a compile ahead's
        CompileRefused comes here), from the backend the refusal names or this one's fallback; the refusal is raised
        again when there is none."""
        from speck.uop import DEBUG

        # a refusal may name the backend to try first (the AVX-512 x86 renderer's: the AVX2 one)
        fallback = getattr(refusal, "fallback", None) or self.fallback
        if fallback is None:
            raise refusal
        if DEBUG >= 2:
            print(f"speck.codegen: {self.name} refused a kernel ({refusal}); rendering it with {fallback}")
        return get_backend(fallback).to_program(ast, compile, beam_timer, beam_tag)

    def compiler_for(self, spec: ProgramSpec | Any) -> Compiler:
        """The compiler for a spec this backend produced (its own, or the fallback's for a fallback kernel): the
        `quick` one for a spec it accepts."""
        if getattr(spec, "renderer", None) in (None, self.renderer.name) or self.fallback is None:
            if self.quick is not None and self.quick[1](spec):
                if self._quick_compiler is None:
                    with self._lock:
                        if self._quick_compiler is None:
                            self._quick_compiler = self.quick[0]()
                return self._quick_compiler
            return self.compiler
        return get_backend(self.fallback).compiler_for(spec)


_REGISTRY: dict[str, Backend] = {}
_ALIASES: dict[str, str] = {}


def register_backend(backend: Backend) -> Backend:
    """Add (or replace) a backend under its name and aliases (case-insensitive)."""
    key = backend.name.upper()
    _REGISTRY[key] = backend
    for a in (key, *backend.aliases):
        _ALIASES[a.upper()] = key
    return backend


def get_backend(name: str) -> Backend:
    """The registered backend called `name` (or one of its aliases), case-insensitive."""
    key = _ALIASES.get(name.upper()) if isinstance(name, str) else None
    if key is None:
        raise UnknownBackendError(f"unknown codegen backend {name!r}; registered: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[key]


def backend_names() -> list[str]:
    return sorted(_REGISTRY)


def host_backends() -> tuple[str, ...]:
    """The backends whose programs run on this machine's CPU (each names a CPU device: CPU:<name>), in the order
    they were registered."""
    return tuple(name for name, b in _REGISTRY.items() if b.host)


# ---------------- the built-in backends ----------------
def _llvm_renderer() -> Renderer:
    from speck.codegen.renderer.llvmir import LLVMRenderer

    return LLVMRenderer(fp_contract=_fp_contract())


def _clang_renderer() -> Renderer:
    from speck.codegen.renderer.cstyle import ClangRenderer

    return ClangRenderer()


def _clang_compiler() -> Compiler:
    from speck.codegen.compiler.clang import ClangCompiler

    return ClangCompiler()


# The x86 backend's modules are loaded by name, like a plugin's: its compiler looks its fallback up in this registry
# (a kernel it refuses late, while selecting, compiles on LLVM), so the registry must not import them.
def _x86_renderer() -> Renderer:
    renderer: Renderer = importlib.import_module("speck.codegen.x86.renderer").X86Renderer(
        fp_contract=_fp_contract()  # fused multiply-add, as the LLVM path
    )
    return renderer


def _x86_avx2_renderer() -> Renderer:
    renderer: Renderer = importlib.import_module("speck.codegen.x86.renderer").X86Renderer(
        fp_contract=_fp_contract(), avx512=False
    )
    return renderer


def _x86_compiler() -> Compiler:
    compiler: Compiler = importlib.import_module("speck.codegen.x86.compiler").X86Compiler()
    return compiler


def _python_renderer() -> Renderer:
    from speck.codegen.renderer.python import PythonRenderer

    return PythonRenderer()


def _fp_contract() -> bool:
    # FP_CONTRACT=1 (the default, as BLAS libraries do): renderers may fuse a*b+c into one FMA; 0 rounds every op
    return bool(FP_CONTRACT.value)


def _amd_backend(arch: str) -> Backend:
    """The AMD GPU backend for one RDNA3 arch: LLVM IR for amdgcn-amd-amdhsa, compiled to an HSA code object."""

    def renderer() -> Renderer:
        from speck.codegen.renderer.amdgpu import AMDGPURenderer

        return AMDGPURenderer(arch, fp_contract=_fp_contract())

    def compiler() -> Compiler:
        from speck.codegen.compiler.amdgpu import AMDGPUCompiler

        return AMDGPUCompiler(arch)

    default = arch == ARCHS[0]
    return Backend("AMD" if default else f"AMD_{arch.upper()}", renderer, compiler,
                   aliases=(f"AMD_{arch.upper()}",) if default else ())  # fmt: skip


# (the quick compiler: kernels too small for optimization to pay, see speck.codegen.compiler.llvm.quick_enough)
register_backend(
    Backend("LLVM", _llvm_renderer, LLVMCompiler, host=True, quick=(lambda: LLVMCompiler(opt=QUICK_OPT), quick_enough))
)
register_backend(Backend("CLANG", _clang_renderer, _clang_compiler, host=True))
register_backend(Backend("X86", _x86_renderer, _x86_compiler, fallback="LLVM", host=True))
# the AVX2 x86 renderer: takes the kernels the AVX-512 one refuses (ZmmRefusal names it), LLVM those it refuses
register_backend(Backend("X86_AVX2", _x86_avx2_renderer, _x86_compiler, fallback="LLVM"))
register_backend(Backend("PYTHON", _python_renderer, lambda: IdentityCompiler("python")))
# NULL runs nothing: programs are rendered (C is the cheapest renderer) so scheduling and counting are real
register_backend(Backend("NULL", _clang_renderer, lambda: IdentityCompiler("null")))
for _arch in ARCHS:  # the RDNA3 GPUs the AMD renderer serves (the first, gfx1100, is backend "AMD")
    register_backend(_amd_backend(_arch))


__all__ = ["Backend", "IdentityCompiler", "UnknownBackendError", "backend_names", "get_backend", "host_backends",
           "register_backend"]  # fmt: skip
