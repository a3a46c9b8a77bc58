"""CC as make reads it: a command line whose first word is the compiler (`ccache gcc`, `env clang`, `gcc -pipe`)
was refused as "not an executable found on PATH"; now its words lead every compiler command (the version probe and
each compile, and the cache key). A path with spaces that names a program still names that one program, and a CC
that is no command line at all (an unclosed quote, a missing program) is the ToolError naming it."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from speck.codegen.compiler import ClangCompiler
from speck.codegen.errors import ToolError

CC = shutil.which("gcc") or shutil.which("clang")
needs_cc = pytest.mark.skipif(CC is None, reason="needs a C compiler")
SRC = "float k(float* a) { return a[0] * 3.0f + a[1]; }"


@needs_cc
@pytest.mark.parametrize("wrapper", ["env {cc}", "{cc} -pipe", "env -u SPECK_UNSET_VAR {cc}"])
def test_a_cc_command_line_compiles_what_the_plain_compiler_compiles(wrapper: str) -> None:
    plain = ClangCompiler(cc=CC)
    wrapped = ClangCompiler(cc=wrapper.format(cc=CC))
    assert wrapped.version == plain.version  # (the probe ran through the wrapper, reaching the same compiler)
    assert wrapped.compile_uncached(SRC) == plain.compile_uncached(SRC)
    assert wrapped.flags != plain.flags  # (the words are part of the cache key)


@needs_cc
def test_the_words_of_cc_lead_each_command(tmp_path: pathlib.Path) -> None:
    log = tmp_path / "argv"
    fake = tmp_path / "wrap"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\nshift\nexec {CC} "$@"\n')
    fake.chmod(0o755)
    ClangCompiler(cc=f"{fake} --marker").compile_uncached(SRC)
    lines = log.read_text().splitlines()
    assert len(lines) == 2 and all(line.startswith("--marker ") for line in lines)
    assert lines[0] == "--marker --version" and " -c " in lines[1]


@needs_cc
def test_a_path_with_spaces_names_one_program(tmp_path: pathlib.Path) -> None:
    d = tmp_path / "my tools"
    d.mkdir()
    (d / "cc").symlink_to(CC)
    c = ClangCompiler(cc=str(d / "cc"))
    assert c.cc == str(d / "cc") and c.compile_uncached(SRC).startswith(b"\x7fELF")


@pytest.mark.parametrize("cc", ["'gcc", "no-such-compiler-xyz -O2", "   "])
def test_a_cc_that_names_no_program_is_a_tool_error(cc: str) -> None:
    with pytest.raises(ToolError, match="is not an executable found on PATH"):
        ClangCompiler(cc=cc)
