"""X86Compiler: the `compile` step of the CPU:X86 device - an X86Renderer listing -> the relocatable ELF object.

The listing already holds the encoded bytes of every instruction plus the .rodata constants and relocations (see
speck.codegen.x86.renderer), so compiling is reading them back and wrapping them with the ELF writer: no stage of
the backend runs twice and nothing is cached on disk (it takes microseconds). A listing X86Renderer.render has just
returned skips even that: the renderer leaves its object behind (`remember_object`) and compile hands it back."""

from __future__ import annotations

import re
import threading

from speck.codegen.compiler.base import Compiler
from speck.codegen.errors import CompileError
from speck.codegen.x86.elf_object import write_elf_object
from speck.codegen.x86.encoder import Relocation

_HEAD = re.compile(r"^# speck x86-64 kernel (\w+):")
_LINE = re.compile(r"^\s*([0-9a-f]+):\t([0-9a-f ]+?)\s*\t")


def parse_listing(src: str) -> tuple[str, bytes, list[Relocation], bytes]:
    """(function name, code bytes, relocations, rodata) of an X86Renderer listing; CompileError when the text is
    not one (it names what was expected)."""
    lines = src.splitlines()
    m = _HEAD.match(lines[0]) if lines else None
    if m is None:
        raise CompileError("x86", "expected an X86Renderer listing starting with '# speck x86-64 kernel <name>:'; "
                           "render the kernel with speck.codegen.x86.X86Renderer", src)  # fmt: skip
    name = m.group(1)
    code = bytearray()
    relocs: list[Relocation] = []
    rodata = b""
    for ln in lines[1:]:
        if ln.startswith("# .rodata "):
            rodata = bytes.fromhex(ln.split()[2])
        elif ln.startswith("# .reloc "):
            _, _, off, kind, sym, addend = ln.split()
            relocs.append(Relocation(int(off, 16), kind, sym, int(addend)))
        elif (lm := _LINE.match(ln)) is not None:
            if int(lm.group(1), 16) != len(code):
                raise CompileError("x86", f"listing line at offset {lm.group(1)} does not follow the previous one "
                                   f"(expected {len(code):x}); the listing was edited or truncated", src)  # fmt: skip
            code += bytes.fromhex(lm.group(2))
    return name, bytes(code), relocs, rodata


# Objects X86Renderer.render just built, keyed by the listing it returned: the usual render -> compile hand-over then
# skips parsing the text back (the object is exactly what parsing would rebuild - the listing is its full description;
# an edited listing is a different key and is parsed). A few entries suffice: compile follows render directly.
_RECENT_LIMIT = 32
_recent: dict[str, bytes] = {}
_recent_lock = threading.Lock()


def remember_object(listing: str, obj: bytes) -> None:
    """Record the object `listing` describes, so compiling that listing returns it without parsing (bounded FIFO)."""
    with _recent_lock:
        _recent[listing] = obj
        while len(_recent) > _RECENT_LIMIT:
            del _recent[next(iter(_recent))]


def recall_object(listing: str) -> bytes | None:
    """The object remembered for exactly this listing text, or None."""
    with _recent_lock:
        return _recent.get(listing)


class X86Compiler(Compiler):
    """Listing -> ELF object (see the module docstring). `disassemble(lib)` gives objdump's Intel listing."""

    name = "x86"
    flags: tuple[str, ...] = ()

    def compile(self, src: str) -> bytes:
        """Build the object from the listing (never cached: rebuilding is cheaper than a cache lookup)."""
        return self.compile_uncached(src)

    def compile_uncached(self, src: str) -> bytes:
        obj = recall_object(src)
        if obj is not None:
            return obj
        name, code, relocs, rodata = parse_listing(src)
        return write_elf_object(name, code, relocs, rodata)


__all__ = ["X86Compiler", "parse_listing", "recall_object", "remember_object"]
