"""speck-usbgpu ships: `python -m build` makes an sdist that carries the top-level c_helpers/ and a wheel built from
that sdist, without writing into the checkout; the sdist installs into a fresh virtual environment (build isolation
fetching setuptools and cffi from the package index) and copies through the simulator there; so does a plain
install of the package folder; and with no C compiler the build says which compiler it looked for and what to
install.

The build itself runs without isolation (its requirements - setuptools, wheel, cffi, build - are in the test
environment: see noxfile.py), so it needs no network; the fresh-environment installs need the package index.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PKG = REPO / "packages" / "usbgpu"
C_HELPERS = REPO / "c_helpers"
pytestmark = pytest.mark.slow

ROUNDTRIP = """
import os, sys
import speck.usbgpu
from speck.usbgpu.api import UsbGpu
assert not speck.usbgpu.__file__.startswith(sys.argv[1]), speck.usbgpu.__file__  # the installed copy, not the repo
data = os.urandom(600_000)
with UsbGpu.open(sim=True) as gpu:
    buf = gpu.alloc(len(data))
    gpu.copyin(buf, data)
    out = bytearray(len(data))
    gpu.copyout(out, buf)
    assert out == data and gpu.sim.violations == []
print("roundtrip ok")
"""


def _clean_env() -> dict[str, str]:
    """The environment minus anything that would make a subprocess import this checkout or the simulator."""
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "SPECK_USB_SIM", "SPECK_C_HELPERS")}


def _run(args: list[str | Path], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, env=_clean_env(), cwd=cwd)


def _tree() -> dict[str, tuple[int, int]]:
    """Every file of the package folder and c_helpers/ (bytecode caches aside) with its size and mtime."""
    files = {}
    for root in (PKG, C_HELPERS):
        for path in root.rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                st = path.stat()
                files[str(path.relative_to(REPO))] = (st.st_size, st.st_mtime_ns)
    return files


def _venv(path: Path) -> tuple[Path, list[str]]:
    """A fresh virtual environment and the command that (re)installs into it (uv when available, else pip)."""
    python = path / "bin" / "python"
    uv = shutil.which("uv")
    if uv:
        made = _run([uv, "venv", "--python", sys.executable, path])
        assert made.returncode == 0, made.stderr
        return python, [uv, "pip", "install", "--reinstall", "--python", str(python)]
    made = _run([sys.executable, "-m", "venv", path])
    assert made.returncode == 0, made.stderr
    return python, [str(python), "-m", "pip", "install", "--force-reinstall", "--disable-pip-version-check"]


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, tuple[int, int]]]:
    """`python -m build` of the package folder: (sdist, wheel, the source tree as it was before)."""
    out = tmp_path_factory.mktemp("dist")
    before = _tree()
    built = _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", out, PKG])
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    (sdist,) = out.glob("speck[-_]usbgpu-*.tar.gz")  # setuptools < 69 keeps the dash
    (wheel,) = out.glob("speck_usbgpu-*.whl")
    return sdist, wheel, before


def test_build_makes_a_self_contained_sdist_and_a_wheel_without_touching_the_tree(
    dists: tuple[Path, Path, dict[str, tuple[int, int]]],
) -> None:
    sdist, wheel, before = dists
    assert _tree() == before, "the build wrote into the source tree"
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    expected_c = {f"c_helpers/{p.name}" for p in C_HELPERS.iterdir() if p.suffix in (".c", ".h", ".cdef")}
    assert expected_c and expected_c <= names, sorted(expected_c - names)
    assert {"setup.py", "pyproject.toml", "README.md", "src/speck/usbgpu/py.typed"} <= names
    assert not [n for n in names if n.endswith((".so", ".o")) or "egg-info" in n]
    with zipfile.ZipFile(wheel) as whl:
        members = whl.namelist()
    for module in ("_helper", "_fakeusb"):
        assert any(m.startswith(f"speck/usbgpu/{module}.") and m.endswith(".so") for m in members), module
    assert "speck/usbgpu/py.typed" in members and "speck/usbgpu/sim/device.py" in members
    assert not [m for m in members if m.endswith((".c", ".h", ".cdef"))]


def test_the_sdist_and_the_package_folder_install_into_a_fresh_venv_and_copy(
    dists: tuple[Path, Path, dict[str, tuple[int, int]]], tmp_path: Path
) -> None:
    sdist, _, before = dists
    python, install = _venv(tmp_path / "venv")
    for source in (sdist, PKG):
        done = _run([*install, source], cwd=tmp_path)
        assert done.returncode == 0, f"installing {source}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        ran = _run([python, "-c", ROUNDTRIP, str(REPO)], cwd=tmp_path)
        assert ran.returncode == 0 and "roundtrip ok" in ran.stdout, ran.stderr[-3000:]
        info = _run([python, "-m", "speck.usbgpu", "info", "--sim"], cwd=tmp_path)
        assert info.returncode == 0 and "(simulated)" in info.stdout, info.stderr[-3000:]
    assert _tree() == before, "installing the package folder wrote into the source tree"


def test_without_a_c_compiler_the_build_names_the_compiler_and_the_package(tmp_path: Path) -> None:
    before = _tree()
    env = {**_clean_env(), "CC": "speck-no-such-cc"}
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(tmp_path), str(PKG)],
        capture_output=True,
        text=True,
        env=env,
    )
    text = built.stdout + built.stderr
    assert built.returncode != 0 and not list(tmp_path.glob("*.whl"))
    assert "'speck-no-such-cc' (from the CC environment variable) was not found" in text, text[-3000:]
    assert "apt-get install build-essential" in text
    assert _tree() == before
