"""The import-time surface of issue 28 §1, as tinygrad test files meet it: `tinygrad_style/import_surface.py` is a
tinygrad-style unittest module that reads `helpers.DEV`, `ContextVar.tolist`, the dtype module's conversions,
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

SCRIPT = Path(__file__).parent / "tinygrad_style" / "import_surface.py"
NAMES = sorted(set(re.findall(r"^    def (test_\w+)\(self", SCRIPT.read_text(), re.M)))


@pytest.fixture(scope="module")
def results() -> dict[str, str]:
    proc = subprocess.run([sys.executable, "-m", "speck.tensor.compat", str(SCRIPT), "-v"], capture_output=True,
                          text=True, timeout=600)  # fmt: skip
    out = dict(re.findall(r"^(test_\w+) \(.*?\) \.\.\. (\w+)", proc.stderr, re.M))
    assert out, proc.stderr
    return out


@pytest.mark.parametrize("name", NAMES)
def test_tinygrad_style_module_passes_under_the_alias(results: dict[str, str], name: str) -> None:
    assert results.get(name) == "ok", f"{name}: {results.get(name)}"


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
