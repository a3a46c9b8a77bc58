"""The Compiler base class: a cached `compile(src) -> bytes`, with the cache on disk keyed by compiler+flags+source.

Objects are kept in the integrity-checked store of speck.codegen.cache, namespace `compile/<compiler name>` (so
`$SPECK_CACHE_DIR/compile/llvm/<key>`, default root `~/.cache/speck`); `CACHELEVEL=0` (or `Context(CACHELEVEL=0)`)
turns it off. A damaged entry is a miss with a CacheWarning: the object is compiled again and the entry rewritten.
Both are looked up at every call, so tests and tools can change them (environment, Context) without
re-creating compilers."""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import subprocess
import tempfile

from speck.codegen.cache import DiskCache, cache_enabled, cache_root
from speck.codegen.errors import ToolError
from speck.codegen.settings import OBJDUMP


def cache_dir() -> pathlib.Path:
    """The directory compiled objects are cached in: `$SPECK_CACHE_DIR/compile`, else `~/.cache/speck/compile`."""
    return cache_root() / "compile"


def disassemble_object(lib: bytes, objdump_flags: tuple[str, ...] = ("-d", "-r", "--no-show-raw-insn")) -> str:
    """Disassemble an ELF object with binutils `objdump` (Intel syntax) and return its listing; raises a
    RuntimeError saying what to install when objdump is missing."""
    objdump = shutil.which(str(OBJDUMP.value))
    if objdump is None:
        raise ToolError("disassemble needs binutils' objdump on PATH (or OBJDUMP=/path/to/objdump); none was found")
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(lib)
        f.flush()
        proc = subprocess.run([objdump, *objdump_flags, "-M", "intel", f.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolError(f"objdump failed on a {len(lib)}-byte object: {proc.stderr.strip()}")
    return proc.stdout


def source_digest(patterns: tuple[str, ...]) -> str:
    """A digest of the speck.codegen source files (globs relative to the package) that turn a source text into an
    object: part of a compiler's cache key, so an object cached by other compiler code (an upgrade, a local change
    to a pass pipeline or an object writer) is never reused for this one's."""
    root = pathlib.Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for pattern in patterns:
        for path in sorted(root.glob(pattern)):
            h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


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

    def disk_cache(self) -> DiskCache:
        """The store this compiler's objects are cached in (namespace `compile/<name>`)."""
        return DiskCache(f"compile/{self.name}")

    def compile(self, src: str) -> bytes:
        """Compile `src`, reusing a cached result when one exists (unless CACHELEVEL is 0). An unusable cache entry
        is a miss (with a CacheWarning naming the file) and is replaced by the fresh object."""
        if not cache_enabled():
            return self.compile_uncached(src)
        store, key = self.disk_cache(), self.cache_key(src)
        lib = store.get(key)
        if lib is None:
            lib = self.compile_uncached(src)
            store.put(key, lib)  # atomic; an unwritable cache is not an error: the object is still returned
        return lib

    def name_free(self, src: str) -> tuple[str, str] | None:
        """(the source with its one function's name taken out, that name) when the object depends on the name only
        through that function's symbol, so two sources equal but for the name compile to objects equal but for it
        (`CompilePool` then compiles one and renames, `compiler.symbols.rename_symbol`); None when that is not known
        (the default)."""
        return None

    def invalidate(self, src: str) -> bool:
        """Drop the cached object of `src` (True when there was one), so the next `compile` compiles afresh."""
        return self.disk_cache().delete(self.cache_key(src))

    def recompile(self, src: str) -> bytes:
        """Compile `src` afresh, replacing its cache entry: what a loader does once when a cached object it was
        handed fails to load (an entry whose checksum is intact but whose object is not what `src` compiles to)."""
        self.invalidate(src)
        return self.compile(src)

    def compile_uncached(self, src: str) -> bytes:
        """Compile without looking at the cache. Raises CompileError with the compiler's message on failure."""
        raise NotImplementedError(f"{type(self).__name__} does not implement compile_uncached")

    def disassemble(self, lib: bytes) -> str:
        """A human-readable listing of what `compile` produced."""
        return disassemble_object(lib)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} {' '.join(self.flags)}>"
