"""Build glue for speck-usbgpu: the two cffi modules (async helper and simulator fake libusb) from c_helpers/.

Metadata lives in pyproject.toml; this file adds what only setup.py can:

- `cffi_modules`: the C sources are the repository's top-level c_helpers/ (or the copy inside an sdist).
- `sdist` copies those sources into the archive as c_helpers/, so the sdist builds on its own.
- Every intermediate file (build/, the egg-info, cffi's generated C) goes to a scratch folder outside the source
  tree that is removed when the build ends: building never writes into the checkout.
- `build_ext` checks for the C compiler before compiling and, if it is missing, says which one it looked for and
  which package provides it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "src" / "speck" / "usbgpu"))  # _build_helper is imported here without the package
from _build_helper import C_HELPER_FILES, find_c_helpers, require_c_compiler  # noqa: E402

sys.path.pop(0)

SCRATCH = Path(tempfile.mkdtemp(prefix="speck-usbgpu-build-"))
atexit.register(shutil.rmtree, SCRATCH, True)


class BuildExt(build_ext):
    """build_ext that fails early, and clearly, when there is no C compiler."""

    def run(self) -> None:
        require_c_compiler()
        super().run()


class Sdist(sdist):
    """sdist that carries the C sources from the repository's c_helpers/ (outside this folder)."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        # The egg-info lives in the scratch folder: keep it out of the archive (PKG-INFO is written at its root).
        inside = [f for f in files if not os.path.isabs(f) and not os.path.normpath(f).startswith(os.pardir)]
        super().make_release_tree(base_dir, inside)
        source = find_c_helpers()
        target = Path(base_dir) / "c_helpers"
        target.mkdir(exist_ok=True)
        for name in C_HELPER_FILES:
            shutil.copy2(source / name, target / name)


setup(
    cmdclass={"build_ext": BuildExt, "sdist": Sdist},
    options={
        "build": {"build_base": str(SCRATCH / "build")},
        "egg_info": {"egg_base": os.path.relpath(SCRATCH, HERE)},
    },
    cffi_modules=[
        "src/speck/usbgpu/_build_helper.py:ffibuilder",
        "src/speck/usbgpu/_build_helper.py:fake_ffibuilder",
    ],
)
