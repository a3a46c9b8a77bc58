"""Cross-check helpers: disassemble bytes or objects with binutils objdump and normalise its Intel-syntax text.

Used by the encoder tests (every encoding must decode back to its own listing) and handy when debugging generated
code; needs `objdump` on PATH.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

from speck.codegen.errors import ToolError


def normalise(text: str) -> str:
    """Drop objdump/listing comments (`# 0x..`, `<sym+off>`) and collapse whitespace."""
    text = re.split(r"\s*(?:#|<)", text, maxsplit=1)[0]
    return re.sub(r"\s+", " ", text).strip()


def parse_objdump(out: str) -> list[tuple[int, str]]:
    """(offset, normalised text) of the instruction lines of an objdump listing; continuation lines are skipped."""
    result = []
    for line in out.splitlines():
        m = re.match(r"^\s*([0-9a-f]+):\t[0-9a-f ]+\t(.*)$", line)
        if m:
            result.append((int(m.group(1), 16), normalise(m.group(2))))
    return result


def _objdump(args: list[str]) -> str:
    if shutil.which("objdump") is None:
        raise ToolError("objdump: not found on PATH; install binutils to cross-check x86 encodings")
    proc = subprocess.run(["objdump", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise ToolError(f"objdump {' '.join(args)} failed: {proc.stderr.strip()}")
    return proc.stdout


def disassemble_raw(code: bytes) -> list[tuple[int, str]]:
    """Disassemble raw x86-64 bytes (`objdump -D -b binary -m i386:x86-64 -M intel`)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "code.bin"
        path.write_bytes(code)
        return parse_objdump(_objdump(["-D", "-b", "binary", "-m", "i386:x86-64", "-M", "intel", str(path)]))


def disassemble_object(obj: bytes, relocs: bool = False) -> str:
    """The full `objdump -d -M intel` (plus `-r` if asked) text of an ELF object."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "code.o"
        path.write_bytes(obj)
        return _objdump(["-d", "-M", "intel"] + (["-r"] if relocs else []) + [str(path)])
