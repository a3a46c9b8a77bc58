"""cffi builder (out-of-line API mode) for speck.usbgpu's two compiled artifacts, run by setup.py's cffi_modules.

- `ffibuilder` -> speck.usbgpu._helper: the async bulk-submission helper (c_helpers/usbgpu_helper.{c,h,cdef}),
  stamped with the package version it was built for.
- `fake_ffibuilder` -> speck.usbgpu._fakeusb: the simulator's fake libusb (c_helpers/fake_libusb.{c,h,cdef}); its
  shared object exports the libusb-1.0 API, so ctypes (python-libusb1) and the helper can load it as "libusb".

Neither needs libusb headers: the C sources declare the few libusb layouts they use and resolve libusb at run time.
"""

from __future__ import annotations

import os
import re
import shutil
import sysconfig
from pathlib import Path

from cffi import FFI

# The C sources of both modules, in c_helpers/ (the repository's top level, or the copy inside an sdist).
C_HELPER_FILES = (
    "usbgpu_helper.c",
    "usbgpu_helper.h",
    "usbgpu_helper.cdef",
    "fake_libusb.c",
    "fake_libusb_descriptors.c",
    "fake_libusb.h",
    "fake_libusb_internal.h",
    "fake_libusb.cdef",
)
# What provides a C compiler (and Python's headers), by platform; quoted by the missing-compiler error.
COMPILER_PACKAGES = (
    "Debian/Ubuntu: apt-get install build-essential python3-dev",
    "Fedora/RHEL: dnf install gcc python3-devel",
    "Alpine: apk add build-base python3-dev",
    "macOS: xcode-select --install",
)


def find_c_helpers() -> Path:
    """c_helpers/ next to src/ (inside an sdist) or at the repository root (two levels above packages/usbgpu)."""
    here = Path(__file__).resolve()
    candidates = [Path(os.environ["SPECK_C_HELPERS"])] if os.environ.get("SPECK_C_HELPERS") else []
    candidates += [p / "c_helpers" for p in here.parents]
    for c in candidates:
        if all((c / n).is_file() for n in C_HELPER_FILES):
            return c
    raise FileNotFoundError(
        f"speck-usbgpu build: c_helpers/ with {', '.join(C_HELPER_FILES)} not found above {here}; build from a "
        "checkout of the speck repository (packages/usbgpu needs ../../c_helpers), from the sdist (which carries "
        "c_helpers/), or set SPECK_C_HELPERS to that folder"
    )


def require_c_compiler() -> None:
    """Fail with what to install when the C compiler the build would run (or Python's headers) is missing."""
    if os.name != "posix":
        return  # other platforms: let the compiler abstraction report its own error
    from distutils.ccompiler import new_compiler
    from distutils.errors import DistutilsPlatformError
    from distutils.sysconfig import customize_compiler

    compiler = new_compiler()
    customize_compiler(compiler)
    command = list(getattr(compiler, "compiler_so", None) or ["cc"])
    where = "the CC environment variable" if os.environ.get("CC") else "Python's build configuration (sysconfig CC)"
    if shutil.which(command[0]) is None:
        raise DistutilsPlatformError(
            f"speck-usbgpu needs a C compiler to build its two C extensions (the async USB helper and the "
            f"simulator's fake libusb), but the compiler {command[0]!r} (from {where}) was not found on PATH. "
            f"Install gcc or clang - {'; '.join(COMPILER_PACKAGES)} - or set CC to an installed compiler."
        )
    include = Path(sysconfig.get_paths()["include"])
    if not (include / "Python.h").is_file():
        raise DistutilsPlatformError(
            f"speck-usbgpu needs Python's C headers to build its C extensions, but {include / 'Python.h'} does "
            f"not exist. Install them - {'; '.join(COMPILER_PACKAGES)}."
        )


def _package_version() -> str:
    """The version in src/speck/usbgpu/_version.py, read as text (the package is not importable while building)."""
    text = (Path(__file__).resolve().parent / "_version.py").read_text()
    match = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    if match is None:
        raise RuntimeError('speck-usbgpu build: no __version__ = "..." in src/speck/usbgpu/_version.py')
    return match.group(1)


C_HELPERS = find_c_helpers()
VERSION = _package_version()
# SPECK_USBGPU_CFLAGS adds flags for development builds (e.g. "-fsanitize=address -g").
_CFLAGS = ["-O2", "-Wall", "-Wno-unused-function", *os.environ.get("SPECK_USBGPU_CFLAGS", "").split()]
_LDFLAGS = [f for f in _CFLAGS if f.startswith("-fsanitize")]

ffibuilder = FFI()
ffibuilder.cdef((C_HELPERS / "usbgpu_helper.cdef").read_text())
ffibuilder.set_source(
    "speck.usbgpu._helper",
    '#include "usbgpu_helper.h"\n#include "usbgpu_helper.c"\n',
    include_dirs=[str(C_HELPERS)],
    define_macros=[("USBGPU_PACKAGE_VERSION", f'"{VERSION}"')],
    libraries=["dl"],
    extra_compile_args=_CFLAGS,
    extra_link_args=_LDFLAGS,
    depends=[str(C_HELPERS / n) for n in ("usbgpu_helper.c", "usbgpu_helper.h", "usbgpu_helper.cdef")],
)

fake_ffibuilder = FFI()
fake_ffibuilder.cdef((C_HELPERS / "fake_libusb.cdef").read_text())
_FAKE_SOURCES = ("fake_libusb.c", "fake_libusb_descriptors.c")
# One translation unit that includes the C files: setuptools accepts only sources below setup.py's folder.
fake_ffibuilder.set_source(
    "speck.usbgpu._fakeusb",
    '#include "fake_libusb.h"\n' + "".join(f'#include "{n}"\n' for n in _FAKE_SOURCES),
    include_dirs=[str(C_HELPERS)],
    libraries=["pthread"],
    extra_compile_args=_CFLAGS,
    extra_link_args=_LDFLAGS,
    depends=[
        str(C_HELPERS / n) for n in (*_FAKE_SOURCES, "fake_libusb.h", "fake_libusb_internal.h", "fake_libusb.cdef")
    ],
)

if __name__ == "__main__":
    ffibuilder.compile(verbose=True)
    fake_ffibuilder.compile(verbose=True)
