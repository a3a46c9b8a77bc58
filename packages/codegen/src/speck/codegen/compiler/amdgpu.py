"""AMDGPUCompiler: LLVM IR text for `amdgcn-amd-amdhsa` -> an HSA code object, through llvmlite's AMDGPU target.

llvmlite optimizes the module with LLVM's standard O2 pipeline (which includes the AMDGPU attributor, address-space
inference and alloca promotion) and emits a relocatable object for `cpu=<arch>` (wave32 on RDNA3); the code object
writer (speck.codegen.compiler.code_object) links it into the shared object a GPU loads. The object cache stores
the code object. `disassemble(lib)` gives the listing: LLVM's own assembly of the kernel (recompiled from the source
this compiler saw for that object), or llvm-objdump's when the object came from elsewhere and the tool is
installed."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
import tempfile
import threading
from typing import Any

from speck.codegen.compiler.base import Compiler, source_digest
from speck.codegen.compiler.code_object import link_code_object
from speck.codegen.compiler.llvm import _llvmlite_version, llvm_all_targets, parse_module
from speck.codegen.compiler.pool import WorkerRecipe
from speck.codegen.errors import CodegenValueError, CompileError, ToolError
from speck.codegen.settings import LLVM_OBJDUMP

TRIPLE = "amdgcn-amd-amdhsa"
# the GPUs the AMD backend compiles for (LLVM's -mcpu names; the registry has one backend per arch, the first is
# "AMD"): gfx1101/gfx1102 are gfx1100's smaller siblings (same ISA, fewer compute units), gfx1150 (RDNA3.5) runs
# the same wave32 code
ARCHS: tuple[str, ...] = ("gfx1100", "gfx1101", "gfx1102", "gfx1150")
# LLVM 20+ compile 16-bit values on RDNA3 to its "true16" forms (operands in the 16-bit halves of VGPRs, v0.h/v0.l),
# which LLVM 16's disassembler cannot decode; the "fake16" forms keep each 16-bit value in a whole VGPR. Both are
# RDNA3 machine code; speck emits the fake16 ones, which every tool (and a simpler emulator) reads.
FEATURES = "-real-true16"
MAX_LISTING_SOURCES = 4096  # sources remembered for `disassemble`, most recent compiles first


class AMDGPUCompiler(Compiler):
    """Compiles the AMDGPU renderer's LLVM IR for `arch` (gfx1100 by default) at optimization level `opt` into an
    HSA code object (bytes). Compiles are serialized per compiler (its target machine is shared)."""

    def __init__(self, arch: str = "gfx1100", opt: int = 2) -> None:
        if arch not in ARCHS:
            raise CodegenValueError(f"AMDGPUCompiler arch must be one of {', '.join(ARCHS)}, got {arch!r}")
        if opt not in (0, 1, 2, 3):
            raise CodegenValueError(f"AMDGPUCompiler opt level must be 0..3, got {opt!r}")
        llvm = llvm_all_targets()
        self.arch, self.opt = arch, opt
        self.name = f"amdgpu-{arch}"
        self.flags = (f"O{opt}", TRIPLE, arch, FEATURES, f"llvmlite-{_llvmlite_version()}", f"code={_code_digest()}")
        target = llvm.Target.from_triple(TRIPLE)
        self._tm = target.create_target_machine(cpu=arch, features=FEATURES, opt=opt, reloc="pic", codemodel="default")
        self._data_layout = str(self._tm.target_data)
        self._lock = threading.Lock()
        self._sources: dict[str, str] = {}  # sha256 of a code object -> the IR it was compiled from (listings)

    def worker_recipe(self) -> WorkerRecipe:
        """How a CompilePool worker process rebuilds this compiler (same arch and level, so the same objects). An
        object compiled there is listed by llvm-objdump (`disassemble`): this process never saw its source."""
        return WorkerRecipe(type(self).__module__, type(self).__qualname__, (("arch", self.arch), ("opt", self.opt)),
                            (), tuple(self.flags))  # fmt: skip

    def _optimized_module(self, src: str) -> Any:
        _refuse_inline_asm(src, self.name)
        llvm = llvm_all_targets()
        mod = parse_module(src, f"llvm (llvmlite, {self.arch})", TRIPLE, self._data_layout)
        if self.opt:
            pb = llvm.create_pass_builder(self._tm, llvm.create_pipeline_tuning_options(speed_level=self.opt))
            pb.getModulePassManager().run(mod, pb)
        return mod

    def relocatable(self, src: str) -> bytes:
        """The relocatable object LLVM emits for `src` (the input of the code-object writer)."""
        with self._lock:
            return bytes(self._tm.emit_object(self._optimized_module(src)))

    def compile_uncached(self, src: str) -> bytes:
        """Parse, verify, optimize, emit and link: the HSA code object. Raises CompileError with LLVM's message."""
        return link_code_object(self.relocatable(src), _kernel_label(src))

    def compile(self, src: str) -> bytes:
        lib = super().compile(src)
        self._sources[hashlib.sha256(lib).hexdigest()] = src
        if len(self._sources) > MAX_LISTING_SOURCES:  # the oldest go first
            del self._sources[next(iter(self._sources))]
        return lib

    def to_asm(self, src: str) -> str:
        """The kernel as LLVM's AMDGPU assembly (instructions, the `.amdhsa_kernel` descriptor directives and the
        metadata), from the same optimized module the object is emitted from."""
        with self._lock:
            return str(self._tm.emit_assembly(self._optimized_module(src)))

    def disassemble(self, lib: bytes) -> str:
        src = self._sources.get(hashlib.sha256(lib).hexdigest())
        if src is not None:
            return self.to_asm(src)
        objdump = next(filter(None, map(shutil.which, _objdumps())), None)
        if objdump is None:
            raise ToolError(f"{self.name}: this code object was not compiled by this compiler (its listing is "
                            "LLVM's assembly of the source) and no llvm-objdump is on PATH to disassemble it; "
                            "install llvm (llvm-objdump) or set LLVM_OBJDUMP")  # fmt: skip
        with tempfile.NamedTemporaryFile(suffix=".hsaco") as f:
            f.write(lib)
            f.flush()
            proc = subprocess.run([objdump, f"--mcpu={self.arch}", "-d", f.name], capture_output=True, text=True)
        if proc.returncode != 0:
            raise ToolError(f"{objdump} failed on a {len(lib)}-byte code object: {proc.stderr.strip()}")
        return proc.stdout


# what turns the renderer's IR into a code object (parse, optimize, emit, link): their digest is in the cache key
_CODE_FILES = ("compiler/amdgpu.py", "compiler/code_object.py", "compiler/llvm.py", "compiler/symbols.py")
_DIGEST: list[str] = []  # computed once per process


def _code_digest() -> str:
    if not _DIGEST:
        _DIGEST.append(source_digest(_CODE_FILES))
    return _DIGEST[0]


def _objdumps() -> list[str]:
    """llvm-objdump candidates: $LLVM_OBJDUMP, then versioned ones newest first (RDNA3 needs LLVM 15 or later; an
    unversioned llvm-objdump may be older), then the unversioned one."""
    env = str(LLVM_OBJDUMP.value)
    return [env] * bool(env) + [f"llvm-objdump-{v}" for v in range(30, 14, -1)] + ["llvm-objdump"]


def _kernel_label(src: str) -> str:
    for line in src.splitlines():
        if line.startswith("define amdgpu_kernel"):
            return line.split("@", 1)[1].split("(", 1)[0]
    return ""


# LLVM IR inline assembly (`call ... asm sideeffect "..."`, `module asm "..."`): this llvmlite has no AMDGPU assembly
# parser, and LLVM's object streamer then aborts the whole process (report_fatal_error) instead of failing the compile
_INLINE_ASM = re.compile(r'(\basm\s+(?:(?:sideeffect|alignstack|inteldialect|unwind)\s+)*"|^\s*module\s+asm\b)', re.M)


def _refuse_inline_asm(src: str, compiler: str) -> None:
    found = _INLINE_ASM.search(src)
    if found is not None:
        line = src.count("\n", 0, found.start()) + 1
        raise CompileError(compiler, f"line {line}: inline assembly is not supported (llvmlite has no AMDGPU assembly "
                           "parser, and LLVM would abort the process); write the instruction as an LLVM intrinsic "
                           "(llvm.amdgcn.*) instead", src)  # fmt: skip


__all__ = ["ARCHS", "FEATURES", "TRIPLE", "AMDGPUCompiler"]
