"""The Compiler base class: a cached `compile(src) -> bytes`, with the cache on disk keyed by compiler+flags+source.

The cache lives in `$SPECK_CACHE_DIR/compile` (default `~/.cache/speck/compile`); `CACHELEVEL=0` in the environment
turns it off. Both are read at every call so tests and tools can change them without re-creating compilers."""

from __future__ import annotations

import hashlib
import os
import pathlib
import shutil
import subprocess
import tempfile


class CompileError(RuntimeError):
    """A compiler rejected its input. The message carries the compiler's own diagnostics and the first lines of the
    source, numbered, so the failure can be read without re-running anything."""

    def __init__(self, compiler: str, message: str, src: str, max_lines: int = 20) -> None:
        lines = src.splitlines()
        shown = "\n".join(f"{i + 1:4d} | {ln}" for i, ln in enumerate(lines[:max_lines]))
        more = f"\n     ... ({len(lines) - max_lines} more lines)" if len(lines) > max_lines else ""
        super().__init__(f"{compiler} failed to compile:\n{message.strip()}\nsource (first lines):\n{shown}{more}")
        self.compiler, self.diagnostics, self.src = compiler, message, src


def cache_dir() -> pathlib.Path:
    """The directory compiled objects are cached in: `$SPECK_CACHE_DIR/compile`, else `~/.cache/speck/compile`."""
    root = os.environ.get("SPECK_CACHE_DIR")
    base = pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "speck"
    return base / "compile"


def _cache_enabled() -> bool:
    return int(os.environ.get("CACHELEVEL", "1") or "0") > 0


def disassemble_object(lib: bytes, objdump_flags: tuple[str, ...] = ("-d", "-r", "--no-show-raw-insn")) -> str:
    """Disassemble an ELF object with binutils `objdump` (Intel syntax) and return its listing; raises a
    RuntimeError saying what to install when objdump is missing."""
    objdump = shutil.which(os.environ.get("OBJDUMP", "objdump"))
    if objdump is None:
        raise RuntimeError("disassemble needs binutils' objdump on PATH (or OBJDUMP=/path/to/objdump); none was found")
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(lib)
        f.flush()
        proc = subprocess.run([objdump, *objdump_flags, "-M", "intel", f.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"objdump failed on a {len(lib)}-byte object: {proc.stderr.strip()}")
    return proc.stdout


class Compiler:
    """Turns source text into bytes (an ELF object for the CPU compilers). Subclasses set `name` and `flags`
    (both part of the cache key) and implement `compile_uncached`. `compile` consults the disk cache first."""

    name: str = "base"
    flags: tuple[str, ...] = ()

    def cache_key(self, src: str) -> str:
        """The hex digest identifying (compiler name, flags, source); the cache file is named after it."""
        h = hashlib.sha256()
        for part in (self.name, *self.flags):
            h.update(part.encode())
            h.update(b"\0")
        h.update(src.encode())
        return h.hexdigest()

    def compile(self, src: str) -> bytes:
        """Compile `src`, reusing a cached result when one exists (unless `CACHELEVEL=0`)."""
        if not _cache_enabled():
            return self.compile_uncached(src)
        path = cache_dir() / self.name / self.cache_key(src)
        try:
            return path.read_bytes()
        except OSError:
            pass
        lib = self.compile_uncached(src)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            # write-then-rename so a concurrent reader never sees a half-written object
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            with os.fdopen(fd, "wb") as f:
                f.write(lib)
            os.replace(tmp, path)
        except OSError:
            pass  # an unwritable cache is not an error: the object is still returned
        return lib

    def compile_uncached(self, src: str) -> bytes:
        """Compile without looking at the cache. Raises CompileError with the compiler's message on failure."""
        raise NotImplementedError(f"{type(self).__name__} does not implement compile_uncached")

    def disassemble(self, lib: bytes) -> str:
        """A human-readable listing of what `compile` produced."""
        return disassemble_object(lib)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {' '.join(self.flags)}>"
