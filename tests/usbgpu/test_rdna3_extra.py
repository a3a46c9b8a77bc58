"""The emulator's numpy dependency lives in the extra speck-usbgpu[sim]: the driver and the USB simulator import
without numpy, and the package declares the extra."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

PKG = Path(__file__).resolve().parents[2] / "packages" / "usbgpu"


def test_the_driver_and_the_usb_simulator_import_without_numpy() -> None:
    code = (
        "import sys\n"
        "import speck.usbgpu, speck.usbgpu.api, speck.usbgpu.sim, speck.usbgpu.errors\n"
        "assert 'numpy' not in sys.modules, 'the driver imported numpy'\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_the_sim_extra_declares_numpy() -> None:
    meta = tomllib.loads((PKG / "pyproject.toml").read_text())["project"]
    assert not any(d.startswith("numpy") for d in meta["dependencies"])
    assert any(d.startswith("numpy") for d in meta["optional-dependencies"]["sim"])
