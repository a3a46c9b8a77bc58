"""Counts of the source tree's structure that the design tests hold down (tests/integration/test_design.py), read
from the code's syntax alone (nothing is imported or run). Run it to print them:

    python tests/integration/house.py

- launch sites: functions that hand a kernel or a batch of kernels to a device by hand (submit an exec command, run
  or replay a device graph, call a device's batch). The runner (speck.hcq.runner) is the one that should, beside
  the device primitives it uses (the engine's executor, the programs' and graphs' own methods).
- counter sites: functions that add to GlobalCounters.kernel_count.
- function-level imports: import statements inside a function body (TYPE_CHECKING blocks left out), per package.
- hook readers: imports of speck.tensor.hook, the module that once held the Tensor class for code below tensor.py
  (a module tensor.py imports, even lazily, can't import tensor.py back: it takes the class from a tensor at hand,
  `type(t)`, or as an argument). The module is gone; none may come back.
- import cycles: strongly connected groups of modules, counting imports made by string (importlib.import_module,
  __import__, a "speck.x.y" module path stored in a table) as imports.
- environment reads: os.environ / os.getenv / getenv(...) reads outside the settings modules.
- device-name checks: string tests of a device name against a literal kind ("DISK", "USB", "CPU", ...)."""

from __future__ import annotations

import ast
import re
from collections import Counter
from pathlib import Path

PACKAGES = Path(__file__).resolve().parents[2] / "packages"

# the attribute calls that launch kernels on a device
LAUNCH_CALLS = frozenset({"submit_exec", "enqueue", "run_batch", "add_exec", "add_kernel", "launch"})
# the modules allowed to make them: the runner and the device layer's own primitives (an engine runs its commands, a
# graph launches its interpreter, a program its kernel)
LAUNCH_HOMES = frozenset({"speck.hcq.runner", "speck.hcq.queue", "speck.hcq.graph", "speck.hcq.cpu",
                          "speck.hcq.program", "speck.hcq.python_device", "speck.hcq.null"})  # fmt: skip
# the settings modules: the only code that reads the environment for settings
# (speck.usbgpu._build_helper is a build script: it runs in the build backend, before any speck package imports)
SETTINGS_HOMES = frozenset({"speck.uop.settings", "speck.uop.helpers", "speck.usbgpu.settings",
                            "speck.usbgpu._build_helper"})  # fmt: skip
DEVICE_KINDS = ("DISK", "USB", "CPU", "NULL", "PYTHON", "NPY", "AMD", "CUDA", "METAL", "GPU")


def modules() -> dict[str, Path]:
    """Every module of the five packages by dotted name (a package by its __init__.py)."""
    out: dict[str, Path] = {}
    for f in sorted(PACKAGES.glob("*/src/speck/**/*.py")):
        parts = f.parts[f.parts.index("src") + 1 :]
        out[".".join(parts)[: -len(".py")].removesuffix(".__init__")] = f
    return out


MODULES = modules()


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _functions(tree: ast.AST) -> list[tuple[str, ast.AST]]:
    """(qualified name, node) of every function, methods as Class.method."""
    out: list[tuple[str, ast.AST]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                out.append((prefix + child.name, child))
                visit(child, prefix + child.name + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, prefix + child.name + ".")
            else:
                visit(child, prefix)

    visit(tree, "")
    return out


def _own_nodes(fn: ast.AST) -> list[ast.AST]:
    """The nodes of a function's body, not those of functions nested in it."""
    out: list[ast.AST] = []
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        n = stack.pop()
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
            continue
        out.append(n)
        stack.extend(ast.iter_child_nodes(n))
    return out


def _trees() -> dict[str, ast.AST]:
    return {m: ast.parse(p.read_text()) for m, p in MODULES.items()}


def launch_sites(trees: dict[str, ast.AST] | None = None) -> list[str]:
    """module:function of every function outside LAUNCH_HOMES that launches kernels by hand: submits an exec command
    (HWQueue.exec, Engine.submit_exec), enqueues or launches a program, adds commands to a device graph or runs one
    (a `graph`'s replay/run), or runs a device's batch. (Calling a loaded program is the runner's one-call plan.)"""
    out = []
    for mod, tree in (trees or _trees()).items():
        if mod in LAUNCH_HOMES or not mod.startswith(("speck.tensor", "speck.hcq")):
            continue
        for name, fn in _functions(tree):
            for n in _own_nodes(fn):
                if not isinstance(n, ast.Call) or not isinstance(f := n.func, ast.Attribute):
                    continue
                receiver = ast.unparse(f.value).lower()
                if (
                    f.attr in LAUNCH_CALLS
                    or (f.attr == "exec" and len(n.args) >= 2)
                    or (f.attr in ("replay", "run") and "graph" in receiver)
                ):
                    out.append(f"{mod}:{name}")
                    break
    return sorted(out)


def counter_sites(trees: dict[str, ast.AST] | None = None) -> list[str]:
    """module:function of every function that adds to a kernel_count."""
    out = []
    for mod, tree in (trees or _trees()).items():
        for name, fn in _functions(tree):
            for n in _own_nodes(fn):
                if (
                    isinstance(n, ast.AugAssign)
                    and isinstance(n.target, ast.Attribute)
                    and (n.target.attr == "kernel_count")
                ):
                    out.append(f"{mod}:{name}")
                    break
    return sorted(out)


def function_level_imports(trees: dict[str, ast.AST] | None = None) -> Counter[str]:
    """Import statements inside function bodies, by package (speck.<package>)."""
    counts: Counter[str] = Counter()
    for mod, tree in (trees or _trees()).items():
        pkg = ".".join(mod.split(".")[:2])

        counts[pkg] += _nested_imports(tree, False)
    return counts


MAX_MODULE_LINES = 1000


def oversized_modules() -> dict[str, int]:
    """Hand-written modules longer than MAX_MODULE_LINES lines, with their line counts (a generated module, whose
    docstring starts with GENERATED, is data and exempt)."""
    out = {}
    for mod, path in MODULES.items():
        text = path.read_text()
        n = text.count("\n")
        if n > MAX_MODULE_LINES and not (ast.get_docstring(ast.parse(text)) or "").startswith("GENERATED"):
            out[mod] = n
    return out


def _reads_hook(n: ast.AST) -> bool:
    if isinstance(n, ast.ImportFrom):
        named = n.module == "speck.tensor" and any(a.name == "hook" for a in n.names)
        return n.module == "speck.tensor.hook" or named
    return isinstance(n, ast.Import) and any(a.name == "speck.tensor.hook" for a in n.names)


def hook_readers(trees: dict[str, ast.AST] | None = None) -> list[str]:
    """module:function of every import of speck.tensor.hook inside a function, module:<module> of one at module
    level (TYPE_CHECKING imports included: the module is gone)."""
    out = []
    for mod, tree in (trees or _trees()).items():
        in_functions = set()
        for name, fn in _functions(tree):
            for n in _own_nodes(fn):
                in_functions.add(id(n))
                if _reads_hook(n):
                    out.append(f"{mod}:{name}")
        out += [f"{mod}:<module>" for n in ast.walk(tree) if _reads_hook(n) and id(n) not in in_functions]
    return sorted(out)


def _nested_imports(node: ast.AST, in_fn: bool) -> int:
    """Import statements under `node` that sit inside a function (in_fn: node itself is inside one)."""
    n = 0
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            n += sum(_nested_imports(sub, in_fn) for sub in child.orelse)
            continue
        if isinstance(child, (ast.Import, ast.ImportFrom)) and in_fn:
            n += 1
        n += _nested_imports(child, in_fn or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    return n


def _called(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


_IMPORTERS = frozenset({"import_module", "__import__", "find_spec"})  # calls that import a module named by a string
_MODULE_STRING = re.compile(r"^speck(\.[a-z_0-9]+)+$")


def imports(name: str, tree: ast.AST, is_pkg: bool) -> set[str]:
    """The modules of the tree that `name` imports, at module level, inside functions or by string (importlib's
    import_module("speck.codegen.x86.compiler") and the like); imports under `if TYPE_CHECKING:` never run."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for sub in child.orelse:
                    visit(sub)
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:  # relative: resolved against this module's package
                    pkg = name.split(".") if is_pkg else name.split(".")[:-1]
                    pkg = pkg[: len(pkg) - child.level + 1]
                    base = ".".join(pkg + ([base] if base else []))
                for a in child.names:  # `from pkg import mod` imports the submodule mod
                    found.add(f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base)
            elif isinstance(child, ast.Call) and _called(child) in _IMPORTERS:
                for a in child.args[:1]:
                    text = a.value.partition(":")[0] if isinstance(a, ast.Constant) and isinstance(a.value, str) else ""
                    # (a package naming its own submodules for lazy attributes, or a module naming a package it lies
                    # in, is not a hidden import: Python imports a module's packages before the module anyway)
                    if (
                        _MODULE_STRING.match(text)
                        and text in MODULES
                        and not (text.startswith(name + ".") or name.startswith(text + "."))
                    ):
                        found.add(text)
            visit(child)

    visit(tree)
    return {m for m in found if m in MODULES and m != name}


def import_cycles(trees: dict[str, ast.AST] | None = None) -> list[list[str]]:
    """Strongly connected components (more than one module) of the import graph (Tarjan, iterative)."""
    trees = trees or _trees()
    graph = {n: sorted(imports(n, t, MODULES[n].name == "__init__.py")) for n, t in trees.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    for root in graph:
        if root in index:
            continue
        work = [(root, 0)]
        while work:
            v, i = work.pop()
            if i == 0:
                index[v] = low[v] = len(index)
                stack.append(v)
                on_stack.add(v)
            if i < len(graph[v]):
                work.append((v, i + 1))
                w = graph[v][i]
                if w not in index:
                    work.append((w, 0))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
            if work:  # v is done: its parent takes its low link
                parent = work[-1][0]
                low[parent] = min(low[parent], low[v])
    return out


def environment_reads(trees: dict[str, ast.AST] | None = None) -> list[str]:
    """module:line of every environment read outside SETTINGS_HOMES: os.environ[...], os.environ.get(...),
    os.getenv(...), getenv(...)."""
    out = []
    for mod, tree in (trees or _trees()).items():
        if mod in SETTINGS_HOMES:
            continue
        for n in ast.walk(tree):
            hit = False
            if isinstance(n, ast.Call):
                f = n.func
                name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
                if name == "getenv":
                    hit = True
                elif name == "get" and isinstance(f, ast.Attribute) and ast.unparse(f.value) == "os.environ":
                    hit = True
            elif isinstance(n, ast.Subscript) and ast.unparse(n.value) == "os.environ" and isinstance(n.ctx, ast.Load):
                hit = True
            if hit:
                out.append(f"{mod}:{n.lineno}")
    return sorted(set(out))


def device_name_checks(trees: dict[str, ast.AST] | None = None) -> list[str]:
    """module:line of every test of a string against a device kind's literal name: `x.startswith("DISK")`,
    `x[:5] == "DISK:"`, `"USB" in name`, `name == "CPU"` and the like."""
    kinds = tuple(k for k in DEVICE_KINDS)

    def is_kind(c: ast.AST) -> bool:
        if isinstance(c, ast.Tuple):
            return any(is_kind(e) for e in c.elts)
        return isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value.rstrip(":") in kinds

    out = []
    for mod, tree in (trees or _trees()).items():
        if not mod.startswith(("speck.tensor", "speck.hcq", "speck.codegen")):
            continue
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in (
                "startswith", "endswith"
            ):  # fmt: skip
                if n.args and is_kind(n.args[0]):
                    out.append(f"{mod}:{n.lineno}")
            elif isinstance(n, ast.Compare) and any(isinstance(o, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                    for o in n.ops):  # fmt: skip
                if any(is_kind(c) for c in [n.left, *n.comparators]):
                    out.append(f"{mod}:{n.lineno}")
    return sorted(set(out))


def declared_settings(trees: dict[str, ast.AST] | None = None) -> dict[str, tuple[str, str]]:
    """setting name -> (declaring module, the variable holding it), from the `declare("NAME", ...)` calls (a
    `var=X` argument names the variable; a declaration inside a comprehension names the collection it fills)."""
    out: dict[str, tuple[str, str]] = {}
    for mod, tree in (trees or _trees()).items():
        for n in ast.walk(tree):
            if not isinstance(n, ast.Assign) or len(n.targets) != 1 or not isinstance(n.targets[0], ast.Name):
                continue
            target = n.targets[0].id
            for call in ast.walk(n.value):
                if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in (
                    "declare", "_noop"
                ):  # fmt: skip
                    first = call.args[0] if call.args else None
                    if isinstance(first, ast.Constant) and isinstance(first.value, str):
                        var = next((ast.unparse(k.value) for k in call.keywords if k.arg == "var"), target)
                        out[first.value] = (mod, var)
    return out


def unread_settings() -> list[str]:
    """Declared settings that are not no-ops and whose declared readers don't read them: a reader must mention the
    setting's variable (or its name). Imports the packages (the only count that does)."""
    import importlib

    for pkg in ("speck.uop", "speck.codegen", "speck.hcq", "speck.tensor"):
        importlib.import_module(pkg)
    from speck.uop.settings import TABLE

    where = declared_settings()
    out = []
    for name, setting in TABLE.items():
        if setting.noop:
            continue
        var = where.get(name, ("", name))[1]
        words = {var, name, var.split(".")[-1]}
        if not any(MODULES.get(r) and any(re.search(rf"\b{re.escape(w)}\b", MODULES[r].read_text()) for w in words)
                   for r in setting.readers):  # fmt: skip
            out.append(name)
    return sorted(out)


def main() -> None:
    trees = _trees()
    launches = launch_sites(trees)
    counters = counter_sites(trees)
    fli = function_level_imports(trees)
    cycles = import_cycles(trees)
    env = environment_reads(trees)
    names = device_name_checks(trees)
    print(f"launch sites outside the runner and device primitives: {len(launches)}")
    for s in launches:
        print(f"  {s}")
    print(f"kernel_count update sites: {len(counters)}")
    for s in counters:
        print(f"  {s}")
    print(f"function-level imports: {sum(fli.values())} ({', '.join(f'{k} {v}' for k, v in sorted(fli.items()))})")
    hooks = hook_readers(trees)
    print(f"hook readers: {len(hooks)}")
    for s in hooks:
        print(f"  {s}")
    print(f"import cycles (string imports included): {len(cycles)}")
    for c in cycles:
        print(f"  {c}")
    print(f"environment reads outside the settings modules: {len(env)}")
    for s in env:
        print(f"  {s}")
    print(f"device-name checks: {len(names)}")
    for s in names:
        print(f"  {s}")
    unread = unread_settings()
    print(f"settings without readers (not declared no-ops): {len(unread)} {unread}")


if __name__ == "__main__":
    main()
