"""Build glue for speck-runtime-hcq: the optional C extension speck.hcq._native_runner (runner.run's short route in
one native call; see that module's C source).

Metadata lives in pyproject.toml; this file adds what only setup.py can:

- the extension, a plain CPython extension (its hot path handles Python objects, which cffi cannot pass);
- it is optional: without a C compiler or Python's headers the build says so and goes on, and speck.hcq runs its
  Python route (the reference the extension is tested against);
- intermediate files (build/, the egg-info) go to a scratch folder outside the source tree, removed when the build
  ends. An editable install (`pip install -e`) builds the extension in place, next to runner.py, where both the
  editable install and a PYTHONPATH pointing at src/ find it.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = Path(__file__).resolve().parent
SCRATCH = Path(tempfile.mkdtemp(prefix="speck-hcq-build-"))
atexit.register(shutil.rmtree, SCRATCH, True)


class OptionalBuildExt(build_ext):
    """build_ext that never fails the install: a missing compiler or header leaves the pure-Python route."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as e:  # (setuptools' own errors for a missing compiler are of several classes)
            self._skip(e)

    def build_extension(self, ext: Extension) -> None:
        try:
            super().build_extension(ext)
        except Exception as e:
            self._skip(e)

    @staticmethod
    def _skip(e: Exception) -> None:
        print(f"speck-runtime-hcq: the C extension speck.hcq._native_runner was not built ({e}); speck.hcq runs "
              "its Python route instead. Install a C compiler (gcc, e.g. apt install gcc) and Python's headers "
              "(python3-dev) and reinstall for the native route.", file=sys.stderr)  # fmt: skip


setup(
    cmdclass={"build_ext": OptionalBuildExt},
    options={
        "build": {"build_base": str(SCRATCH / "build")},
        "egg_info": {"egg_base": os.path.relpath(SCRATCH, HERE)},
    },
    ext_modules=[
        Extension(
            "speck.hcq._native_runner",
            ["src/speck/hcq/_native_runner.c"],
            extra_compile_args=["-O2"],
            optional=True,
        )
    ],
)
