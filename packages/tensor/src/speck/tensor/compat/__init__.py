"""Running tinygrad code on speck unchanged: `install_tinygrad_alias()` makes `import tinygrad` (and every
`tinygrad.X.Y` that speck.tensor has as `speck.tensor.X.Y`) import speck.tensor's modules.

    import speck.tensor.compat; speck.tensor.compat.install_tinygrad_alias()
    from tinygrad import Tensor          # speck.tensor.Tensor
    from tinygrad.helpers import Context # speck.tensor.helpers.Context

or from the shell: `python -m speck.tensor.compat script.py args...`.

Whatever puts speck.tensor (or one of its packages) into sys.modules under another name, submodules imported
through that name are the same module objects as under their speck names: the `_AliasFinder` below, installed when
speck.tensor is imported, resolves them so (otherwise Python would execute each module a second time and, e.g.,
`tinygrad.tensor.Tensor` would be a different class from `speck.tensor.Tensor`)."""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import types
from collections.abc import Sequence

from speck.tensor.errors import TensorRuntimeError

_ROOT = "speck.tensor"


class _AliasLoader(importlib.abc.Loader):
    """Loads a module by returning the already-importable speck module `real`."""

    def __init__(self, real: str) -> None:
        self.real = real

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return importlib.import_module(self.real)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # already executed under its own name


class _AliasFinder(importlib.abc.MetaPathFinder):
    """`alias.child`, where sys.modules[alias] is a speck.tensor package, imports `<that package>.child`."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        parent, _, child = fullname.rpartition(".")
        pmod = sys.modules.get(parent) if parent else None
        real_parent = getattr(pmod, "__name__", None)
        if not isinstance(real_parent, str) or real_parent == parent:
            return None
        if real_parent != _ROOT and not real_parent.startswith(_ROOT + "."):
            return None
        real = f"{real_parent}.{child}"
        if importlib.util.find_spec(real) is None:
            return None
        return importlib.util.spec_from_loader(fullname, _AliasLoader(real))


def install_alias_finder() -> None:
    """Put the alias finder first on sys.meta_path (once)."""
    if not any(isinstance(f, _AliasFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())


def install_tinygrad_alias(name: str = "tinygrad") -> types.ModuleType:
    """Make `import <name>` give speck.tensor (and `<name>.X` give speck.tensor.X). Returns speck.tensor."""
    mod = importlib.import_module(_ROOT)
    existing = sys.modules.get(name)
    if existing is not None and existing is not mod:
        raise TensorRuntimeError(
            f"a module named {name!r} is already imported ({existing!r}); alias it before importing it"
        )
    install_alias_finder()
    sys.modules[name] = mod
    return mod


_USAGE = (
    "usage: python -m speck.tensor.compat script.py [args...] | -m module [args...] | -c code [args...]  "
    "(runs it with tinygrad -> speck)"
)


def main(argv: Sequence[str] | None = None) -> None:
    """`python -m speck.tensor.compat script.py [args]`: run a script with `tinygrad` imports pointed at speck; like
    python itself, `-m module` runs a module (`-m pytest test_ops.py`, `-m unittest ...`) and `-c code` a string."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or (args[0] in ("-m", "-c") and len(args) < 2):
        raise SystemExit(_USAGE)
    if args[0] in ("-h", "--help"):
        print(_USAGE)
        return
    if args[0] not in ("-m", "-c") and not os.path.isfile(args[0]):
        raise SystemExit(f"speck.tensor.compat: no script {args[0]!r} (a file path was expected)\n{_USAGE}")
    install_tinygrad_alias()
    if args[0] == "-m":
        sys.argv = [args[1], *args[2:]]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    elif args[0] == "-c":
        sys.argv = ["-c", *args[2:]]
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = args
        runpy.run_path(args[0], run_name="__main__")
