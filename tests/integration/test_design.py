"""The house rules of the source tree: no import cycles inside the packages, and every module importable on its
own in a fresh interpreter (a module that only works after some other import hides a dependency or a cycle)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import house
import pytest

PACKAGES = house.PACKAGES
MODULES = house.MODULES


def test_the_cycle_finder_sees_a_cycle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check below can fail: two modules importing each other (one inside a function, one by name through
    importlib) form a cycle, and a TYPE_CHECKING import does not."""
    (tmp_path / "a.py").write_text("import speck.x.b\n")
    (tmp_path / "b.py").write_text("def f():\n    from speck.x import a\n")
    (tmp_path / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import speck.x.a\n")
    (tmp_path / "d.py").write_text("import importlib\nM = importlib.import_module('speck.x.e')\n")
    (tmp_path / "e.py").write_text("def g():\n    import speck.x.d\n")
    fake = {f"speck.x.{m}": tmp_path / f"{m}.py" for m in "abcde"}
    monkeypatch.setattr(house, "MODULES", fake)
    assert house.import_cycles() == [["speck.x.a", "speck.x.b"], ["speck.x.d", "speck.x.e"]]


def test_no_import_cycles() -> None:
    """Layers inside a package are one-way too: a module that needs something from a module above it gets it
    from an object it is handed (speck.tensor's op modules take the Tensor class from a tensor at hand, `type(t)`)
    or through a registration hook (schedule.register_schedule_rule, gradient.register_gradient_rule: tensor.py
    registers what builds tensors from bare nodes over its class), not by importing it (at load time, in a
    function, or by name through importlib)."""
    cycles = house.import_cycles()
    assert not cycles, "import cycles (each list imports itself round): " + "; ".join(map(str, cycles))


# ---------------- layers without detours (tests/integration/house.py counts) ----------------
# import statements inside speck.tensor's functions: those that remain import optional dependencies late (usbgpu in
# usb.py, mpi4py, tqdm, cProfile/pstats) or sit in realize.py (the compile pool and BEAM, read at use); an import added
# only to break a cycle belongs at module level or in another layer (tensor.py's methods reach the modules above
# the op layer - autograd, function, keccak, pickling - at module level: those take the class from `type(t)`)
TENSOR_FUNCTION_IMPORT_CEILING = 17
# speck.hcq's one: the registry reads installed entry points with importlib.metadata, which nothing else loads
HCQ_FUNCTION_IMPORT_CEILING = 1


def test_the_layer_counters_see_a_hook_read_and_an_import(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks below can fail: a hook read inside a method and an import inside a function are found (a
    TYPE_CHECKING import is not an import at run time)."""
    _fake_tree(tmp_path, monkeypatch, {
        "speck.tensor.ops": ("class M:\n    def f(self):\n        from speck.tensor.hook import Tensor\n"
                             "        return Tensor\n"),
        "speck.tensor.lazy": ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import numpy\n"
                              "def g():\n    import json\n    return json\n"),
        "speck.tensor.top": "from speck.tensor import hook\n",
    })  # fmt: skip
    assert house.hook_readers() == ["speck.tensor.ops:M.f", "speck.tensor.top:<module>"]
    assert house.function_level_imports() == {"speck.tensor": 2}


def test_the_tensor_class_is_reached_without_detours() -> None:
    """Modules get the Tensor class from a tensor they are handed (`type(t)`, a classmethod's `cls`) or as an
    argument from tensor.py (the write queue, pickle's loaders, the services tensor.py registers over its class);
    no module holds the class for others to read (speck.tensor.hook is gone, and nothing reads it)."""
    assert "speck.tensor.hook" not in MODULES, "speck.tensor.hook is back: hand the class over instead"
    readers = house.hook_readers()
    assert not readers, f"readers of speck.tensor.hook (take the class from a tensor at hand): {readers}"


@pytest.mark.parametrize("package,ceiling", [("speck.tensor", TENSOR_FUNCTION_IMPORT_CEILING),
                                             ("speck.hcq", HCQ_FUNCTION_IMPORT_CEILING)])  # fmt: skip
def test_function_level_imports_stay_few(package: str, ceiling: int) -> None:
    n = house.function_level_imports().get(package, 0)
    assert n <= ceiling, (
        f"{n} function-level imports in {package} (at most {ceiling}): move an import that only breaks a cycle to "
        "module level"
    )


def test_the_size_check_sees_a_long_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The check below can fail: a hand-written module over the limit is found, a generated one is not."""
    body = "x = 1\n" * (house.MAX_MODULE_LINES + 1)
    _fake_tree(tmp_path, monkeypatch, {
        "speck.tensor.big": body,
        "speck.tensor.table": '"""GENERATED by a tool: do not edit."""\n' + body,
        "speck.tensor.small": "x = 1\n",
    })  # fmt: skip
    assert house.oversized_modules() == {"speck.tensor.big": house.MAX_MODULE_LINES + 1}


def test_modules_stay_small() -> None:
    """Small modules named for what they do: none over house.MAX_MODULE_LINES lines (split one along a real seam,
    as tensor.py's mixins and x86's select_* rule modules are)."""
    big = house.oversized_modules()
    assert not big, f"modules over {house.MAX_MODULE_LINES} lines: {big}"


# Imports each module in a forked child of an interpreter that has loaded no speck module (third-party libraries are
# preloaded only to make each child cheap: a module that forgets an import still fails with NameError). A child
# reports its traceback on stderr and exits non-zero.
_IMPORT_EACH = """
import json, os, sys, traceback
import numpy, llvmlite.binding  # noqa: F401  (preloaded for speed only)
assert not any(m.startswith("speck") for m in sys.modules), "the runner must start without speck"
failed, running = {}, {}
todo = list(reversed(sys.argv[1:]))
while todo or running:
    while todo and len(running) < (os.cpu_count() or 1):  # one child per core at a time
        module = todo.pop()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                __import__(module)
                code = 0
            except BaseException:
                os.write(w, traceback.format_exc()[-2000:].encode())  # (fits the pipe: never blocks)
                code = 1
            os._exit(code)
        os.close(w)
        running[pid] = (module, r)
    pid, status = os.wait()
    module, r = running.pop(pid)
    with os.fdopen(r, "rb") as f:
        err = f.read().decode(errors="replace")
    if status != 0:
        failed[module] = err or "the child died"
print(json.dumps(failed))
"""


def test_every_module_imports_alone() -> None:
    """`import speck.X.Y` works in a fresh interpreter for every module (scripts run by -m excepted)."""
    modules = sorted(m for m in MODULES if not m.endswith(".__main__"))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(p) for p in sorted(PACKAGES.glob("*/src")))}
    r = subprocess.run([sys.executable, "-c", _IMPORT_EACH, *modules], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    failed = json.loads(r.stdout.strip().splitlines()[-1])
    assert not failed, "modules that fail to import alone:\n" + "\n".join(f"{m}:\n{e}" for m, e in failed.items())


def test_the_import_check_sees_a_module_that_needs_another_first(tmp_path: Path) -> None:
    """The runner above can fail: a module that only works after some other import is reported with its error."""
    pkg = tmp_path / "speckfake"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "base.py").write_text("import sys\nX = 1\n")
    (pkg / "user.py").write_text("import sys\nY = sys.modules['speckfake.base'].X\n")  # needs base imported first
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", _IMPORT_EACH, "speckfake.base", "speckfake.user"], capture_output=True,
                       text=True, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    failed = json.loads(r.stdout.strip().splitlines()[-1])
    assert list(failed) == ["speckfake.user"] and "KeyError" in failed["speckfake.user"]


# ---------------- one execution path (tests/integration/house.py counts) ----------------
def _fake_tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, files: dict[str, str]) -> None:
    """Point house's module table at fake modules (name -> source)."""
    fake = {}
    for name, src in files.items():
        (tmp_path / f"{name.replace('.', '_')}.py").write_text(src)
        fake[name] = tmp_path / f"{name.replace('.', '_')}.py"
    monkeypatch.setattr(house, "MODULES", fake)


def test_the_launch_counters_see_a_launch_and_a_count(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The checks below can fail: a tensor module submitting an exec command or running a device graph by hand,
    and a function adding to kernel_count, are found."""
    _fake_tree(tmp_path, monkeypatch, {
        "speck.tensor.fast": "def go(q, prog):\n    q.exec(prog, (), (1,))\n\ndef more(g):\n    g.graph.replay()\n",
        "speck.tensor.count": "def bump(gc):\n    gc.kernel_count += 1\n",
        "speck.hcq.runner": "def run(q, prog):\n    q.exec(prog, (), (1,))\n",
    })  # fmt: skip
    assert house.launch_sites() == ["speck.tensor.fast:go", "speck.tensor.fast:more"]
    assert house.counter_sites() == ["speck.tensor.count:bump"]


def test_one_runner_launches_everything() -> None:
    """No code outside speck.hcq's runner (and the device primitives it drives) launches kernels by hand: eager
    realize, the warm path, TinyJit replays, multi-device schedules and direct program calls all run plans."""
    sites = house.launch_sites()
    assert not sites, f"kernels launched outside speck.hcq.runner: {sites}"


def test_counters_grow_in_one_place() -> None:
    assert house.counter_sites() == ["speck.hcq.runner:count_run"]


def test_the_name_check_finder_sees_a_device_name_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tree(tmp_path, monkeypatch, {
        "speck.tensor.a": "def f(d):\n    return d.startswith('DISK')\n",
        "speck.tensor.b": "def g(dev):\n    return dev.name == 'CPU' or 'USB:' in (dev.name,)\n",
        "speck.tensor.c": "def h(dev):\n    return dev.file_backed\n",
    })  # fmt: skip
    assert house.device_name_checks() == ["speck.tensor.a:2", "speck.tensor.b:2"]


def test_no_code_branches_on_a_device_or_renderer_name() -> None:
    """Devices and renderers declare what they can do (file_backed, runs_kernels, host_visible, graph; a renderer's
    registers_are_cpu; a backend's host): code asks those, never a name."""
    checks = house.device_name_checks()
    assert not checks, f"tests of a device or renderer name: {checks}"


# ---------------- one settings table ----------------
def test_no_module_reads_the_environment_for_a_setting() -> None:
    """Settings are declared in the table (speck.uop.settings; speck.usbgpu's own): no other module reads os.environ
    or getenv for one."""
    reads = house.environment_reads()
    assert not reads, f"environment reads outside the settings modules: {reads}"


def test_the_environment_read_finder_sees_a_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_tree(tmp_path, monkeypatch, {
        "speck.tensor.a": "import os\nX = os.environ.get('X')\n",
        "speck.tensor.b": "import os\nY = os.environ['Y']\nfrom speck.uop import getenv\nZ = getenv('Z', 0)\n",
        "speck.uop.settings": "import os\nW = os.environ.get('W')\n",
    })  # fmt: skip
    assert house.environment_reads() == ["speck.tensor.a:2", "speck.tensor.b:2", "speck.tensor.b:4"]


def test_every_setting_is_read_or_declared_a_no_op() -> None:
    """A declared setting that nothing reads must say why it changes nothing (a name kept for tinygrad's users)."""
    unread = house.unread_settings()
    assert not unread, f"settings whose declared readers don't read them: {unread}"


def test_every_declared_setting_works_with_context() -> None:
    import speck.tensor  # noqa: F401  (declares every setting)
    from speck.uop import Context, ContextVar
    from speck.uop.settings import TABLE

    assert len(TABLE) > 60
    for name in TABLE:
        var = ContextVar.get(name)
        before = var.value
        with Context(**{name: before}):
            assert var.value == before
        assert var.value == before
    with pytest.raises(KeyError, match="unknown setting 'JIT_BATCHH'"):
        Context(JIT_BATCHH=0).__enter__()


def test_a_live_setting_follows_the_environment_and_context(monkeypatch: pytest.MonkeyPatch) -> None:
    from speck.codegen.settings import CACHE_DIR
    from speck.uop import Context

    monkeypatch.setenv("SPECK_CACHE_DIR", "/tmp/a")
    assert CACHE_DIR.value == "/tmp/a"
    with Context(SPECK_CACHE_DIR="/tmp/b"):
        assert CACHE_DIR.value == "/tmp/b"
    monkeypatch.setenv("SPECK_CACHE_DIR", "/tmp/c")
    assert CACHE_DIR.value == "/tmp/c"  # the Context's value did not stick
