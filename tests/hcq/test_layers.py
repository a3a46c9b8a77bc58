"""speck.hcq's modules form layers, counting every import a module names: at load time, inside a function and under
TYPE_CHECKING (tests/integration/test_design.py checks run-time cycles only; an annotation-only loop still ties the
modules in it into one). The registry, Buffer, Program and the runner are written against speck.hcq.interfaces'
Protocols, and the CPU graph against its own, so that nothing below device.py or cpu.py names them."""

from __future__ import annotations

import ast
from pathlib import Path

import speck.hcq

PACKAGE = "speck.hcq"


def _modules(folder: Path, package: str) -> dict[str, Path]:
    return {(package if p.stem == "__init__" else f"{package}.{p.stem}"): p for p in sorted(folder.glob("*.py"))}


def _imports(path: Path, package: str, modules: dict[str, Path]) -> set[str]:
    """The package's modules that `path` names in any import statement, wherever the statement stands."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            if node.module == package:  # `from speck.hcq import runner`: a submodule, else the package itself
                out.update(f"{package}.{a.name}" if f"{package}.{a.name}" in modules else package for a in node.names)
            elif node.module in modules:
                out.add(node.module)
    return out


def import_loops(folder: Path, package: str) -> list[list[str]]:
    """Every group of the package's modules that import each other round (strongly connected, more than one
    module, or one importing itself), each sorted, the groups sorted."""
    modules = _modules(folder, package)
    edges = {m: _imports(p, package, modules) for m, p in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    loops: list[list[str]] = []

    def visit(m: str) -> None:  # Tarjan's strongly connected components
        index[m] = low[m] = len(index)
        stack.append(m)
        for n in sorted(edges[m]):
            if n not in index:
                visit(n)
                low[m] = min(low[m], low[n])
            elif n in stack:
                low[m] = min(low[m], index[n])
        if low[m] == index[m]:
            group = []
            while True:
                n = stack.pop()
                group.append(n)
                if n == m:
                    break
            if len(group) > 1 or m in edges[m]:
                loops.append(sorted(group))

    for m in sorted(modules):
        if m not in index:
            visit(m)
    return sorted(loops)


def test_the_loop_finder_sees_annotation_and_function_level_loops(tmp_path: Path) -> None:
    """The check below can fail: a TYPE_CHECKING import closes a loop, so does one inside a function or one of a
    submodule through the package's name; modules that only import downwards form none."""
    files = {
        "a.py": "from typing import TYPE_CHECKING\nimport pkg.b\nif TYPE_CHECKING:\n    from pkg.c import C\n",
        "b.py": "def f():\n    from pkg import c\n",
        "c.py": "import pkg.a\n",
        "d.py": "from pkg.e import E\n",
        "e.py": "from pkg import d\n",
        "f.py": "import pkg.a\nfrom pkg.d import D\n",
        "g.py": "import os\nfrom pkg import g\n",
    }
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert import_loops(tmp_path, "pkg") == [["pkg.a", "pkg.b", "pkg.c"], ["pkg.d", "pkg.e"], ["pkg.g"]]


def test_hcq_modules_form_layers() -> None:
    folder = Path(speck.hcq.__file__).parent
    loops = import_loops(folder, PACKAGE)
    assert not loops, "speck.hcq modules that import each other round (TYPE_CHECKING imports count): " + "; ".join(
        map(str, loops)
    )


def test_the_runtime_core_is_written_against_the_protocols() -> None:
    """The modules below device.py name devices and programs only as interfaces.DeviceLike/ProgramLike."""
    folder = Path(speck.hcq.__file__).parent
    modules = _modules(folder, PACKAGE)
    for low in ("interfaces", "registry", "buffer", "counters", "runner", "program", "graph"):
        named = _imports(modules[f"{PACKAGE}.{low}"], PACKAGE, modules)
        assert not named & {f"{PACKAGE}.device", f"{PACKAGE}.cpu"}, f"{low}.py imports {sorted(named)}"
