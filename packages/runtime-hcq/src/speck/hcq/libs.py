"""Finding and opening the shared libraries that loaded kernels link against (libm, libc, libgcc_s).

`find_library("m")` honours a `LIBM_PATH` environment override (in general `LIB<NAME>_PATH`, upper-cased), then
ctypes' search, then the usual sonames."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

from speck.hcq.errors import LibraryLoadError
from speck.hcq.settings import LIBC_PATH, LIBGCC_S_PATH, LIBM_PATH

# the settings naming a library to load instead of the one found, by library name
LIBRARY_PATHS = {"m": LIBM_PATH, "gcc_s": LIBGCC_S_PATH, "c": LIBC_PATH}

# sonames tried when ctypes.util.find_library finds nothing (it needs ldconfig or a compiler)
_FALLBACK_SONAMES: dict[str, tuple[str, ...]] = {
    "m": ("libm.so.6", "libm.so"),
    "c": ("libc.so.6", "libc.so"),
    "gcc_s": ("libgcc_s.so.1", "libgcc_s.so"),
}


class Library:
    """A loaded shared library the ELF linker resolves undefined symbols against. `lookup(name)` returns the
    symbol's address or None."""

    def __init__(self, path: str, handle: ctypes.CDLL | None = None) -> None:
        self.path = path
        self.handle = handle if handle is not None else ctypes.CDLL(path)

    def lookup(self, name: str) -> int | None:
        """The address of `name` in this library, or None when it does not define it."""
        try:
            return ctypes.cast(getattr(self.handle, name), ctypes.c_void_p).value
        except AttributeError:
            return None

    def __repr__(self) -> str:
        return f"Library({self.path!r})"


def find_library(name: str) -> str | None:
    """The path or soname of library `name` ("m" for libm): `$LIB<NAME>_PATH` (LIBM_PATH) if set, else
    ctypes.util.find_library, else a known soname that loads. None when nothing is found."""
    if (setting := LIBRARY_PATHS.get(name)) is not None and (path := str(setting.value)):
        return path
    if found := ctypes.util.find_library(name):
        return found
    for so in _FALLBACK_SONAMES.get(name, (f"lib{name}.so",)):
        try:
            ctypes.CDLL(so)
            return so
        except OSError:
            continue
    return None


@functools.cache
def load_library(name: str) -> Library:
    """Open library `name` (see find_library); raises RuntimeError naming the library and the override variable."""
    path = find_library(name)
    if path is None:
        raise LibraryLoadError(f"library lib{name} not found; set LIB{name.upper()}_PATH=/path/to/lib{name}.so")
    try:
        return Library(path)
    except OSError as e:
        raise LibraryLoadError(f"could not open lib{name} at {path!r}: {e}") from None


def default_libraries() -> list[Library]:
    """The libraries CPU kernels are linked against: libm (expf, powf...), libgcc_s (half-precision helpers such as
    __truncsfhf2/__extendhfsf2) when present, and libc (memcpy, memset)."""
    libs = [load_library("m")]
    try:
        libs.append(load_library("gcc_s"))
    except RuntimeError:
        pass  # only half-precision helpers live there; a kernel needing one gets an undefined-symbol error naming it
    libs.append(Library("libc", ctypes.CDLL(None)))
    return libs
