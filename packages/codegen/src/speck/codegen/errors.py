"""Every exception speck.codegen raises on purpose, in one place, under one base class: `CodegenError`.

Each also keeps the builtin base it had before there was a common one (RuntimeError, ValueError, KeyError), so
code that catches those keeps working. Messages say what was expected, what was found and what to do; errors at a
tool boundary (a compiler, objdump) carry the tool's own diagnostics."""

from __future__ import annotations

import pathlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

from speck.uop.errors import reduce_error

if TYPE_CHECKING:
    from speck.uop import DType, Ops


class CodegenError(Exception):
    """Base class of speck.codegen's errors: `except CodegenError` catches everything the package raises on
    purpose."""

    __reduce__ = reduce_error  # pickles class, args and attributes (errors cross process boundaries)


class UnsupportedOpError(CodegenError, RuntimeError):
    """A renderer was asked for an op/dtype combination it cannot express. The message names op, dtype, renderer."""

    def __init__(self, renderer: str, op: Ops, dtype: DType, why: str = "") -> None:
        extra = f" ({why})" if why else ""
        super().__init__(
            f"renderer {renderer!r} cannot express {op.name} on {dtype}{extra}; add a decomposition for it in "
            f"speck.codegen.lower.decompositions or remove {op.name} from the renderer's supported_ops so the "
            f"pipeline lowers it"
        )
        self.renderer, self.op, self.dtype = renderer, op, dtype


class NoTypeError(CodegenError, RuntimeError):
    """A renderer has no type for a dtype (re-raised as UnsupportedOpError naming the UOp that needed it)."""

    def __init__(self, renderer: str, dtype: DType) -> None:
        super().__init__(f"renderer {renderer!r} cannot express dtype {dtype}: it has no type for {dtype.scalar()}")
        self.dtype = dtype


class X86UnsupportedError(UnsupportedOpError):
    """A kernel the x86 backend refuses (an op or dtype it has no instructions for), raised before any instruction is
    selected; the message names op, dtype and kernel. Being an UnsupportedOpError, it lets the backend registry run
    that one kernel on the backend's fallback (LLVM) instead."""

    def __init__(self, message: str, op: Ops, dtype: DType) -> None:
        RuntimeError.__init__(self, message)
        self.renderer, self.op, self.dtype = "x86", op, dtype


class ZmmRefusal(X86UnsupportedError):
    """A kernel whose 16-lane values the AVX-512 selector cannot take: `fallback` names the backend that renders it
    instead (the AVX2 x86 renderer, whose 8-lane vectors it selects; LLVM after that)."""

    fallback = "X86_AVX2"


class CompileRefused(CodegenError, RuntimeError):
    """A compiler refused a kernel its renderer accepted (the x86 selector meets a form it has no rule for, which the
    renderer can't tell up front). The backend registry then renders the kernel again with the backend's fallback,
    so a program's source always describes its object. Carries the refusal's message (it crosses process
    boundaries: compile workers)."""


class SelectionError(X86UnsupportedError):
    """No x86 selection rule for an op/dtype (the message names op, dtype and kernel)."""


class EncodingError(CodegenError, ValueError):
    """An x86 instruction whose operands match no encoding form (the message names the instruction and what fits)."""


class RegAllocError(CodegenError, RuntimeError):
    """The instruction list cannot be allocated as given (inconsistent classes, unbalanced loops, fixed clashes)."""


class OptError(CodegenError, RuntimeError):
    """An Opt that does not apply to this kernel (bad axis, amount not dividing the size, unsupported here)."""


class CompileError(CodegenError, RuntimeError):
    """A compiler rejected its input. The message carries the compiler's own diagnostics and the first lines of the
    source, numbered, so the failure can be read without re-running anything."""

    def __init__(self, compiler: str, message: str, src: str, max_lines: int = 20) -> None:
        lines = src.splitlines()
        shown = "\n".join(f"{i + 1:4d} | {ln}" for i, ln in enumerate(lines[:max_lines]))
        more = f"\n     ... ({len(lines) - max_lines} more lines)" if len(lines) > max_lines else ""
        super().__init__(f"{compiler} failed to compile:\n{message.strip()}\nsource (first lines):\n{shown}{more}")
        self.compiler, self.diagnostics, self.src = compiler, message, src


class CodeObjectLinkError(CodegenError, ValueError):
    """An AMDGPU relocatable object the code-object writer cannot link into an HSA code object (an unexpected section,
    relocation or symbol). The message names the object's kernel, the place and what was expected."""


class UnknownBackendError(CodegenError, KeyError):
    """A backend name that is not registered; the message lists the registered ones."""

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass(frozen=True)
class EntryProblem:
    """Why an entry file can't be used. `old` is True for entries written by an older format or payload version
    (expected after an upgrade), False for damage (truncation, bit rot, a foreign or moved file)."""

    path: pathlib.Path
    reason: str
    old: bool = False

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


class CacheEntryError(CodegenError):
    """An unusable on-disk cache entry (internal to the store: readers turn it into a miss). `problem` says which
    and why."""

    def __init__(self, problem: EntryProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


class CodegenValueError(CodegenError, ValueError):
    """A bad argument value: a compiler or renderer option outside its range, an x86 operand or register that does
    not exist, a cache name or payload version out of range, text that is not the x86 program format."""


class ProgramFormError(CodegenError, RuntimeError):
    """A kernel AST or linear program outside the program form (KERNEL_CONTRACT.md): an op a stage does not take, a
    loop that is never closed, a value used before it is defined. Raised by the lowering stages, the renderers and
    the reference interpreter; the message names the stage and the UOp."""


class RunArgumentError(CodegenError, RuntimeError, ValueError):
    """Arguments to the reference interpreter (eval_ast, run_program) that do not match the program: buffers of the
    wrong kind or count, a variable without a value."""


class OutOfBoundsAccessError(CodegenError, RuntimeError, IndexError):
    """A kernel run by the reference interpreter read or wrote outside its buffer; the message names the op, the
    index and the buffer's size."""


class ToolError(CodegenError, RuntimeError):
    """An external tool a compiler needs (a C compiler, objdump, llvm-objdump) is not installed or failed; the
    message says which and how to install or point at it."""


class WorkerError(CodegenError, RuntimeError):
    """A compile worker process died, could not start, or could not rebuild the compiler."""


class CacheEntryMissing(FileNotFoundError, CodegenError):
    """No cache entry file at the path (internal to the store: readers turn it into a miss). A FileNotFoundError
    first, so it carries errno and the path like the OS's own."""


class CacheWarning(UserWarning):
    """An on-disk cache entry was unusable (corrupt, truncated, moved, or written by an older format) and was treated
    as a miss: the result is recomputed and the entry rewritten. Nothing is wrong with the results."""


__all__ = [
    "CacheEntryError",
    "CacheEntryMissing",
    "CacheWarning",
    "CodeObjectLinkError",
    "CodegenError",
    "CodegenValueError",
    "CompileError",
    "EncodingError",
    "NoTypeError",
    "OptError",
    "OutOfBoundsAccessError",
    "ProgramFormError",
    "RegAllocError",
    "RunArgumentError",
    "SelectionError",
    "ToolError",
    "UnknownBackendError",
    "UnsupportedOpError",
    "WorkerError",
    "X86UnsupportedError",
    "ZmmRefusal",
]
