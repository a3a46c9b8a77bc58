"""X86Compiler: the `compile` step of the CPU:X86 device - an X86Renderer program text -> the relocatable ELF object.

Compiling is the backend proper (speck.codegen.x86.backend.render_x86: legalize, select, allocate, encode, ELF), so
it runs where LLVM's compiles run: in CompilePool worker processes (`worker_recipe`) beside the lowering thread, or
here. Objects are cached on disk like LLVM's (namespace compile/x86), keyed by the program text and `flags`, which
name a digest of the backend's own source files: a changed backend never reuses an object an older one built. The
object carries the function's listing (`disassemble`).

A kernel the selector refuses only once it gets there (SelectionError) raises CompileRefused: the backend registry
(speck.codegen.backends, which loads this module by name) renders it again with the X86 entry's fallback (LLVM), so
the program's source describes the object it gets, and a kernel does not fail on CPU:X86 that the device can run."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

from speck.codegen.compiler.base import Compiler, source_digest
from speck.codegen.compiler.pool import WorkerRecipe
from speck.codegen.errors import CompileRefused, UnsupportedOpError
from speck.codegen.x86.elf_object import read_listing

_BACKEND_FILES = ("x86/*.py", "regalloc.py", "renderer/common.py")  # what builds an object from a program text


def backend_digest() -> str:
    """A digest of the source files that turn a program text into an object (the cache key's compiler identity)."""
    return source_digest(_BACKEND_FILES)


_DIGEST: list[str] = []  # computed once per process


class X86Compiler(Compiler):
    """Program text -> ELF object (see the module docstring). `disassemble(lib)` gives the encoder's listing."""

    name = "x86"

    def __init__(self) -> None:
        if not _DIGEST:
            _DIGEST.append(backend_digest())
        self.flags: tuple[str, ...] = (f"backend={_DIGEST[0]}",)

    def compile_uncached(self, src: str) -> bytes:
        from speck.codegen.x86.backend import render_x86
        from speck.codegen.x86.program_text import load_program

        with _cyclic_gc_paused():
            uops, fp_contract = load_program(src)
            try:
                return render_x86(uops, fp_contract).obj
            except UnsupportedOpError as e:  # (the registry takes it to the fallback)
                raise CompileRefused(str(e)) from e

    def worker_recipe(self) -> WorkerRecipe:
        """How a CompilePool worker process rebuilds this compiler (the worker imports speck.uop for real: the
        program text is read back into UOps)."""
        return WorkerRecipe(type(self).__module__, type(self).__qualname__, (), (), self.flags, ("speck.uop",))

    def disassemble(self, lib: bytes) -> str:
        """The listing the encoder wrote into the object (objdump's text, instruction for instruction); objdump's
        own listing for an object without one (the fallback backend's)."""
        listing = read_listing(lib)
        return listing if listing is not None else super().disassemble(lib)


@contextlib.contextmanager
def _cyclic_gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off while the backend runs. A kernel makes some 10^5 short-lived objects (UOps,
    instructions, operands) and no reference cycles (tests/codegen/test_x86_program_text.py checks it): refcounting
    frees them all, and collections triggered by their allocation would only traverse the process's long-lived
    objects to find nothing. Cycles made meanwhile elsewhere are collected once it is back on."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


__all__ = ["X86Compiler", "backend_digest"]
