"""tinygrad-style unittest modules (`tinygrad_style/*.py`) run unchanged through the alias, each of their tests
reported as one test here. `import_surface.py` is issue 28 §1, the import-time surface as tinygrad test files meet
it: a module that reads `helpers.DEV`, `ContextVar.tolist`, the dtype module's conversions,
`Renderer.code_for_op`/`.device` and the signatures users call at import time; it runs here through
`python -m speck.tensor.compat` (the alias, in a subprocess so it does not leak), and each of its tests is reported
as one test of this file. The in-process tests below check the same names' properties more broadly."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor.helpers import DEV, Context, ContextVar, Target

MODULES = sorted(p for p in (Path(__file__).parent / "tinygrad_style").glob("*.py") if p.name != "__init__.py")
_TEST = re.compile(r"^    def (test_\w+)\(self", re.M)
CASES = [(m.stem, n) for m in MODULES for n in sorted(set(_TEST.findall(m.read_text())))]


@pytest.fixture(scope="module")
def results() -> dict[tuple[str, str], str]:
    out: dict[tuple[str, str], str] = {}
    for m in MODULES:
        proc = subprocess.run([sys.executable, "-m", "speck.tensor.compat", str(m), "-v"], capture_output=True,
                              text=True, timeout=600)  # fmt: skip
        found = re.findall(r"^(test_\w+) \(.*?\) \.\.\. (\w+)", proc.stderr, re.M)
        assert found, proc.stderr
        out.update({(m.stem, name): status for name, status in found})
    return out


@pytest.mark.parametrize("module, name", CASES)
def test_tinygrad_style_module_passes_under_the_alias(results: dict[tuple[str, str], str], module: str,
                                                      name: str) -> None:  # fmt: skip
    assert results.get((module, name)) == "ok", f"{module}.{name}: {results.get((module, name))}"


_field = st.text(alphabet="abcxyz019_", min_size=0, max_size=5)


@given(_field, _field, st.text(alphabet="abcxyz019_,", max_size=8), _field, st.text(alphabet="0123,", max_size=4))
def test_target_repr_parses_back_to_the_same_target(dev: str, ren: str, arch: str, iface: str, idx: str) -> None:
    t = Target(dev.upper(), ren.upper(), arch, iface if iface or not idx else "pci", idx)
    assert Target.parse(repr(t)) == t and str(t) == repr(t)


@pytest.mark.parametrize("bad", ["A+B+CPU", "CPU:LLVM:x:y", "USB:1:2+AMD"])
def test_malformed_dev_raises_where_it_is_read(bad: str) -> None:
    with Context(DEV=bad), pytest.raises(RuntimeError, match="INTERFACE"):
        _ = DEV.value


def test_dev_restores_and_equals_its_text() -> None:
    before = list(DEV.value)
    with Context(DEV="cpu:x86"):
        assert DEV == "CPU:X86" and bool(DEV) and DEV.renderer == "X86"
    assert DEV.value == before


def test_tolist_names_a_missing_attribute() -> None:
    cv = ContextVar.get("EMULATED_DTYPES")
    with Context(EMULATED_DTYPES="long, nope"):
        assert cv.tolist() == ["long", "nope"]
        from speck.tensor import dtypes

        with pytest.raises(AttributeError, match="'nope'"):
            cv.tolist(dtypes)
