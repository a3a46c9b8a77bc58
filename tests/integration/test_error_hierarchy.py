"""Every error speck raises on purpose is one of its package's named classes (speck.<pkg>.errors), derived from the
package's base class and from the builtin class users catch: `except TensorError` catches what speck.tensor raises
and `except ValueError` still works. Read from the code's syntax (nothing is run) plus the errors modules' classes."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import house
import pytest

# each package's errors module and the base class every class there derives from
BASES = {
    "speck.uop": "UOpError",
    "speck.codegen": "CodegenError",
    "speck.hcq": "HCQError",
    "speck.tensor": "TensorError",
    "speck.usbgpu": "UsbGpuError",
}
BUILTIN_EXCEPTIONS = frozenset(
    name for name, v in vars(builtins).items() if isinstance(v, type) and issubclass(v, BaseException)
)
# raises of a builtin class that are right as they are, by (module, class), with the reason
ALLOWED_RAISES: dict[tuple[str, str], str] = {
    ("speck.tensor.compat", "SystemExit"): "the command line's usage message (python -m speck.tensor.compat)",
    ("speck.tensor.examples.train", "SystemExit"): "an example script's command-line usage error",
    ("speck.tensor.usb", "MemoryError"): "the allocator hook's protocol: HCQAllocator catches MemoryError from "
    "_alloc, drops its cache of freed buffers, retries and raises OutOfMemoryError (an HCQError) if it still fails",
    ("speck.tensor.schedule", "AssertionError"): "an unreachable branch: an internal invariant, like assert",
    ("speck.codegen.x86.encoder", "AssertionError"): "unreachable branches: internal invariants, like assert",
    ("speck.usbgpu.bridge", "AssertionError"): "an unreachable branch: an internal invariant, like assert",
    ("speck.usbgpu._build_helper", "FileNotFoundError"): "a build script: it runs in the build backend, before "
    "speck.usbgpu (and its errors module) can be imported",
    ("speck.usbgpu._build_helper", "RuntimeError"): "a build script (see above)",
}
# exception classes defined outside an errors module, by (module, class), with the reason they stay there
INTERNAL_CLASSES: dict[tuple[str, str], str] = {
    ("speck.tensor.nn.gguf", "_Truncated"): "gguf_load's signal for reading past the end; caught there and raised "
    "as GGUFError naming the file",
    ("speck.usbgpu.sim.firmware", "Stall"): "the simulated firmware's signal to STALL a control transfer; the "
    "simulated device turns it into the STALL status, so it never leaves the simulator",
    ("speck.usbgpu.sim.model_api", "ModelError"): "the simulator model API's way for a device model to make a "
    "libusb call fail with a code; the fake libusb returns that code and the transport raises its UsbError",
    ("speck.usbgpu.sim.model_api", "ModelSubmitError"): "ModelError for a transfer submission (see ModelError)",
    ("speck.usbgpu.sim.rdna3.decode", "_NeedMore"): "the decoder's signal to fetch more instruction words",
    ("speck.usbgpu.sim.vm", "VmFault"): "a translation fault raised to the simulated engine that made the access, "
    "which stops its queue with a fault record (GpuFault / ShaderMemoryFault reach the user)",
}


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


class _Raises(ast.NodeVisitor):
    """Raises of a builtin exception class that are not a protocol: AttributeError from __getattr__,
    NotImplementedError as the whole body of an overridable method, StopIteration and friends are protocols."""

    def __init__(self) -> None:
        self.found: list[tuple[int, str]] = []
        self.functions: list[ast.FunctionDef | ast.AsyncFunctionDef] = []

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.functions.append(node)
        self.generic_visit(node)
        self.functions.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Raise(self, node: ast.Raise) -> None:
        exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
        if isinstance(exc, ast.Name) and exc.id in BUILTIN_EXCEPTIONS and not self._protocol(node, exc.id):
            self.found.append((node.lineno, exc.id))
        if isinstance(node.exc, ast.Call):  # its arguments (the Call itself was judged above)
            for child in (*node.exc.args, *node.exc.keywords):
                self.visit(child)
        if node.cause is not None:
            self.visit(node.cause)

    def visit_Call(self, node: ast.Call) -> None:
        """A builtin exception built to be raised elsewhere (`return RuntimeError(...)` from an error factory)."""
        if isinstance(node.func, ast.Name) and node.func.id in BUILTIN_EXCEPTIONS:
            self.found.append((node.lineno, node.func.id))
        self.generic_visit(node)

    def _protocol(self, node: ast.Raise, name: str) -> bool:
        fn = self.functions[-1] if self.functions else None
        if name in ("StopIteration", "StopAsyncIteration", "GeneratorExit", "KeyboardInterrupt"):
            return True
        if name == "AttributeError" and fn is not None and fn.name in ("__getattr__", "__getattribute__"):
            return True
        if name == "NotImplementedError" and fn is not None:
            body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
            return body == [node]  # an abstract hook: the method is only the raise
        return False


def bare_raises() -> list[str]:
    """`module:line Class` for every raise of a builtin exception class outside the protocols and ALLOWED_RAISES."""
    out = []
    for module, path in sorted(house.MODULES.items()):
        finder = _Raises()
        finder.visit(ast.parse(path.read_text(), str(path)))
        out += [f"{module}:{line} {name}" for line, name in finder.found if (module, name) not in ALLOWED_RAISES]
    return out


def exception_classes_outside_errors() -> list[tuple[str, str]]:
    """(module, class) of every exception class defined outside an errors module: a class is one when a base names
    a builtin exception or another exception class (followed across modules by name until nothing changes)."""
    classes = [
        (module, node)
        for module, path in sorted(house.MODULES.items())
        for node in ast.walk(ast.parse(path.read_text(), str(path)))
        if isinstance(node, ast.ClassDef)
    ]
    known = set(BUILTIN_EXCEPTIONS) | {"Exception"}
    while True:
        more = {
            node.name
            for _, node in classes
            if node.name not in known
            and any((b.attr if isinstance(b, ast.Attribute) else getattr(b, "id", None)) in known for b in node.bases)
        }
        if not more:
            break
        known |= more
    return [(m, n.name) for m, n in classes if n.name in known and not m.endswith(".errors")]


def test_the_raise_finder_sees_a_bare_builtin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check below can fail: a bare RuntimeError and ValueError are found, and a TypeError built by an error
    factory; a package class, a re-raise, an abstract method and __getattr__'s AttributeError are not."""
    (tmp_path / "m.py").write_text(
        "from speck.x.errors import XError\n"
        "def f(a):\n    if a:\n        raise RuntimeError('no')\n    raise XError('fine')\n"
        "def g():\n    try:\n        pass\n    except OSError as e:\n        raise e\n    raise ValueError\n"
        "class C:\n    def hook(self):\n        '''doc'''\n        raise NotImplementedError\n"
        "    def __getattr__(self, name):\n        raise AttributeError(name)\n"
        "def factory() -> TypeError:\n    return TypeError('built here, raised by the caller')\n"
    )
    monkeypatch.setattr(house, "MODULES", {"speck.x.m": tmp_path / "m.py"})
    assert bare_raises() == ["speck.x.m:4 RuntimeError", "speck.x.m:11 ValueError", "speck.x.m:19 TypeError"]


def test_no_bare_builtin_raises() -> None:
    """Every raise names one of its package's error classes (or is a protocol, or is allowed above with why)."""
    found = bare_raises()
    assert not found, "raise a class from the package's errors.py instead of: " + ", ".join(found)


def test_the_allow_list_names_raises_that_are_there() -> None:
    """An allowed raise that is gone is removed from the list, so it stays a record of real exceptions."""
    raised: set[tuple[str, str]] = set()
    for module, path in house.MODULES.items():
        finder = _Raises()
        finder.visit(ast.parse(path.read_text(), str(path)))
        raised |= {(module, name) for _, name in finder.found}
    assert set(ALLOWED_RAISES) <= raised, set(ALLOWED_RAISES) - raised


def test_the_class_finder_sees_an_exception_class(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.py").write_text("class Oops(ValueError): ...\nclass Worse(Oops): ...\nclass Fine: ...\n")
    (tmp_path / "b.py").write_text("import a\nclass Far(a.Worse): ...\n")
    monkeypatch.setattr(house, "MODULES", {"speck.x.a": tmp_path / "a.py", "speck.x.b": tmp_path / "b.py"})
    assert exception_classes_outside_errors() == [("speck.x.a", "Oops"), ("speck.x.a", "Worse"), ("speck.x.b", "Far")]


def test_exception_classes_live_in_errors_modules() -> None:
    """An exception class users can meet is defined in its package's errors.py; the few that stay beside their
    code are internal signals, listed with why."""
    outside = [c for c in exception_classes_outside_errors() if c not in INTERNAL_CLASSES]
    assert not outside, f"move these to the package's errors.py (or list them as internal, with why): {outside}"


@pytest.mark.parametrize("package", sorted(BASES))
def test_every_error_class_derives_from_the_package_base(package: str) -> None:
    """`except <Base>` catches every class the package's errors module defines (warnings aside)."""
    errors = importlib.import_module(f"{package}.errors")
    base = getattr(errors, BASES[package])
    classes = [
        c
        for c in vars(errors).values()
        if isinstance(c, type) and issubclass(c, BaseException) and c.__module__ == errors.__name__
    ]
    assert base in classes
    stray = [c.__name__ for c in classes if not issubclass(c, (base, Warning))]
    assert not stray, f"{package}.errors classes not derived from {base.__name__}: {stray}"


@pytest.mark.parametrize("package", ["speck.uop", "speck.codegen", "speck.hcq", "speck.tensor"])
def test_every_error_class_keeps_a_builtin_users_catch(package: str) -> None:
    """Each class is also a builtin more specific than Exception (ValueError, TypeError, RuntimeError...), so
    code written against the builtins keeps catching it. The packages' bases and internal classes aside."""
    errors = importlib.import_module(f"{package}.errors")
    base = getattr(errors, BASES[package])
    plain = (Exception, BaseException, object)
    internal = {"CacheEntryError"}  # the disk cache's own signal: readers turn it into a miss with a CacheWarning
    missing = [
        c.__name__
        for c in vars(errors).values()
        if isinstance(c, type)
        and issubclass(c, base)
        and c is not base
        and c.__name__ not in internal
        and not any(b.__module__ == "builtins" and b not in plain for b in c.__mro__)
    ]
    assert not missing, f"{package}.errors classes that are no builtin error: {missing}"
