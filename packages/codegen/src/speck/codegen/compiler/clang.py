"""ClangCompiler: C source -> relocatable freestanding PIC x86-64 ELF object through clang, or gcc if no clang."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile

from speck.codegen.compiler.base import Compiler
from speck.codegen.errors import CompileError, ToolError
from speck.codegen.settings import CC

# The exact flags, shared by clang and gcc (both accept all of them):
#   -x c -std=gnu11        the source is C with GNU vector extensions
#   -c -fPIC               a relocatable, position-independent object (the runtime's ELF loader links it anywhere)
#   -O2 -march=native      optimize for the host CPU (AVX2/FMA here; AVX-512 where present)
#   -ffreestanding         no hosted libc assumptions; the kernel is a leaf function
#   -fno-math-errno        math builtins (sqrtf...) compile to instructions instead of libm calls that set errno
#   -ffp-contract=off      no implicit a*b+c -> fma fusion, so results match the LLVM path and the interpreter
#   -fno-stack-protector   no __stack_chk_fail reference (nothing to link it against)
#   -fno-asynchronous-unwind-tables -fno-exceptions   no .eh_frame: the loader does not need unwind info
#   -fno-plt               external calls go through the GOT (GOTPCRELX), which the loader builds
#   -w                     warnings are not errors and clutter CompileError messages
CLANG_FLAGS: tuple[str, ...] = (
    "-x", "c", "-std=gnu11", "-c", "-fPIC", "-O2", "-march=native", "-ffreestanding", "-fno-math-errno",
    "-ffp-contract=off", "-fno-stack-protector", "-fno-asynchronous-unwind-tables", "-fno-exceptions", "-fno-plt", "-w",
)  # fmt: skip


COMPILE_TIMEOUT = 600.0  # seconds one kernel may take before the compiler is stopped (a hung compiler hung speck)
VERSION_TIMEOUT = 60.0  # seconds `cc --version` may take
MAX_DIAGNOSTICS = 20000  # characters of the compiler's stderr kept in a CompileError


def find_c_compiler() -> str | None:
    """The C compiler to use: `$CC` if set, else `clang` on PATH, else `gcc`; None when there is none."""
    if cc := str(CC.value):
        found = _with_args(cc)
        return found[0] if found else None
    return shutil.which("clang") or shutil.which("gcc")


def _with_args(cc: str) -> tuple[str, tuple[str, ...]] | None:
    """(the program, its leading arguments) that `cc` names: a program name or path, or, as make reads $CC, a
    command line (`ccache gcc`, `gcc -m64`) whose first word is the program. None when no program is found."""
    if found := shutil.which(cc):  # (a path with spaces in it names one program)
        return found, ()
    try:
        words = shlex.split(cc)
    except ValueError:  # (an unclosed quote)
        return None
    found = shutil.which(words[0]) if len(words) > 1 else None
    return (found, tuple(words[1:])) if found else None


class ClangCompiler(Compiler):
    """Compiles freestanding C (GNU C11 with vector extensions) into a PIC relocatable object with the flags in
    `CLANG_FLAGS` (documented line by line above): `-x c -std=gnu11 -c -fPIC -O2 -march=native -ffreestanding
    -fno-math-errno -ffp-contract=off -fno-stack-protector -fno-asynchronous-unwind-tables -fno-exceptions
    -fno-plt -w`. Uses clang when present, else gcc (`$CC` overrides). The compiler's path and version are part
    of the cache key. Raises RuntimeError at construction when no C compiler exists."""

    def __init__(self, cc: str | None = None, extra_flags: tuple[str, ...] = ()) -> None:
        want = cc or str(CC.value)  # (an explicit cc, else $CC; empty: clang/gcc are looked up on PATH)
        if want:
            found, args = _with_args(want) or (None, ())
        else:
            found, args = find_c_compiler(), ()
        if found is None:
            what = f"CC={want!r} is not an executable found on PATH" if want else "no clang or gcc was found on PATH"
            raise ToolError(
                f"ClangCompiler needs a C compiler, but {what}; install clang or gcc, set CC to the name or path of "
                "an installed C compiler (or unset it), or use the LLVM compiler (llvmlite)"
            )
        self.cc = found
        try:
            ver = subprocess.run([found, *args, "--version"], capture_output=True, text=True, errors="replace",
                                 timeout=VERSION_TIMEOUT).stdout.splitlines()  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as e:  # (not a program: "Exec format error"; or it hangs)
            raise ToolError(f"ClangCompiler: the C compiler {found!r} can't be run ({type(e).__name__}: {e}); set CC "
                            "to an installed clang or gcc, or unset it") from None  # fmt: skip
        self.version = ver[0] if ver else "unknown"
        self.name = "clang" if "clang" in os.path.basename(found) or "clang" in self.version else "gcc"
        self.flags = (*args, *CLANG_FLAGS, *extra_flags, self.cc, self.version)
        self._cmd_flags = (*args, *CLANG_FLAGS, *extra_flags)

    def compile_uncached(self, src: str) -> bytes:
        """Run the C compiler on `src` (fed through stdin) and return the object's bytes. Whatever goes wrong - the
        compiler's diagnostics, a signal, a hang past COMPILE_TIMEOUT, an exit 0 without an ELF object - is a
        CompileError naming the compiler and carrying the source."""
        who = f"{self.name} ({self.cc})"
        try:
            text = src.encode()
        except UnicodeEncodeError as e:
            raise CompileError(who, f"the source is not valid text ({e}); nothing was compiled", src) from None
        with tempfile.TemporaryDirectory(prefix="speck-cc-") as d:
            out = os.path.join(d, "kernel.o")
            try:
                proc = subprocess.run([self.cc, *self._cmd_flags, "-", "-o", out], input=text, capture_output=True,
                                      timeout=COMPILE_TIMEOUT)  # fmt: skip
            except subprocess.TimeoutExpired:
                raise CompileError(
                    who, f"no result after {COMPILE_TIMEOUT:.0f} s: the compiler was stopped", src
                ) from None
            except OSError as e:
                raise CompileError(who, f"the compiler can't be run ({type(e).__name__}: {e})", src) from None
            diag = proc.stderr.decode(errors="replace")
            if len(diag) > MAX_DIAGNOSTICS:
                diag = diag[:MAX_DIAGNOSTICS] + f"\n... ({len(diag) - MAX_DIAGNOSTICS} more characters)"
            if proc.returncode != 0:
                how = (
                    f"killed by signal {-proc.returncode}" if proc.returncode < 0 else f"exit status {proc.returncode}"
                )
                raise CompileError(who, f"({how}) {diag}", src)
            try:
                with open(out, "rb") as f:
                    obj = f.read()
            except OSError:
                obj = b""
            if not obj.startswith(b"\x7fELF"):
                raise CompileError(who, f"the compiler exited 0 but wrote no ELF object ({len(obj)} bytes, starting "
                                   f"{obj[:8]!r}) {diag}", src)  # fmt: skip
            return obj
