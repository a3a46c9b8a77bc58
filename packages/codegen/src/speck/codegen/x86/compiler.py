"""X86Compiler: the `compile` step of the CPU:X86 device - an X86Renderer listing -> the relocatable ELF object.

The listing already holds the encoded bytes of every instruction plus the .rodata constants and relocations (see
speck.codegen.x86.renderer), so compiling is reading them back and wrapping them with the ELF writer: no stage of
the backend runs twice and nothing is cached on disk (it takes microseconds)."""

from __future__ import annotations

import re

from speck.codegen.compiler.base import CompileError, Compiler
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


class X86Compiler(Compiler):
    """Listing -> ELF object (see the module docstring). `disassemble(lib)` gives objdump's Intel listing."""

    name = "x86"
    flags: tuple[str, ...] = ()

    def compile(self, src: str) -> bytes:
        """Build the object from the listing (never cached: rebuilding is cheaper than a cache lookup)."""
        return self.compile_uncached(src)

    def compile_uncached(self, src: str) -> bytes:
        name, code, relocs, rodata = parse_listing(src)
        return write_elf_object(name, code, relocs, rodata)


__all__ = ["X86Compiler", "parse_listing"]
