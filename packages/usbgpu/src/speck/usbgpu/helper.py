"""Python face of the compiled async bulk helper (speck.usbgpu._helper, built from c_helpers/usbgpu_helper.c).

`load_libusb(path)` binds the helper to the libusb shared library the transport loaded (once per process);
`AsyncBulkPool` submits bulk OUT transfers from Python buffers without copying, keeps each buffer referenced until
its tag is known complete, and turns the helper's return codes into speck.usbgpu.errors exceptions. The first
failed or short completion is latched in C and raised by every later wait.
"""

from __future__ import annotations

import time
import weakref
from collections import deque
from typing import Any

from speck.usbgpu import errors
from speck.usbgpu._version import __version__

try:
    from speck.usbgpu._helper import ffi, lib
except ImportError as exc:  # pragma: no cover - only without a built package
    raise errors.HelperImportError(
        "speck.usbgpu._helper (the compiled async USB helper) is missing: install the package with "
        "`pip install packages/usbgpu` (or `pip install -e packages/usbgpu`) so setup.py builds it"
    ) from exc

# Transfers (and their buffers) that could not be reclaimed because libusb still owned them; kept for the life of
# the process so nothing libusb may touch is ever freed.
_LEAKED: list[object] = []

__all__ = [
    "ffi",
    "lib",
    "HELPER_ABI",
    "HELPER_BUILT_FOR",
    "AsyncBulkPool",
    "check_build",
    "libusb_text",
    "load_libusb",
    "loaded_libusb_path",
]

HELPER_ABI: int = lib.USBGPU_HELPER_ABI
HELPER_BUILT_FOR: str = ffi.string(lib.usbgpu_helper_version()).decode()
_EXPECTED_ABI = 2


def check_build(built_for: str, abi: int, package_version: str = __version__) -> None:
    """Raise HelperBuildMismatch unless the compiled helper matches this Python package (version and C ABI)."""
    if built_for != package_version or abi != _EXPECTED_ABI:
        raise errors.HelperBuildMismatch(
            f"speck.usbgpu._helper was built for speck-usbgpu {built_for} (helper ABI {abi}) but the Python package "
            f"is {package_version} (expects helper ABI {_EXPECTED_ABI}); rebuild the compiled helper with "
            "`pip install -e packages/usbgpu` (or reinstall speck-usbgpu)"
        )


check_build(HELPER_BUILT_FOR, HELPER_ABI)


def load_libusb(path: str) -> None:
    """Resolve the helper's libusb functions from the shared library at `path` (the same file usb1 loaded)."""
    err = ffi.new("char[]", 512)
    if lib.usbgpu_load_libusb(path.encode(), err, 512) != 0:
        message = ffi.string(err).decode(errors="replace")
        if "already loaded" in message:
            raise errors.UsbLibraryConflict("load libusb into the async helper", message)
        raise errors.LibusbLoadError("load libusb into the async helper", message)


def loaded_libusb_path() -> str:
    """Path of the libusb the helper is bound to ("" before load_libusb)."""
    return str(ffi.string(lib.usbgpu_loaded_path()).decode())


def libusb_text(code: int) -> str:
    """libusb_strerror(code) of the loaded library ("" if unavailable)."""
    return str(ffi.string(lib.usbgpu_strerror(code)).decode(errors="replace"))


def _free_pool(pool: Any, owners: tuple[object, ...], cancel_timeout_ms: int) -> int:
    """Finalizer: cancel and free the pool's transfers. `owners` (device handle, context) are held here so they
    cannot be finalized before the transfers that point into them."""
    lib.usbgpu_cancel_all(pool, cancel_timeout_ms)
    leaked = int(lib.usbgpu_pool_free(pool))
    del owners
    return leaked


class AsyncBulkPool:
    """Pooled async bulk OUT transfers on one libusb context + device handle (raw pointers from usb1).

    `owners` are Python objects that must outlive the transfers (the usb1 handle and context wrappers); they are
    kept alive by this pool's finalizer, which runs cancel_all before freeing (CONVENTIONS.md item 13).
    """

    def __init__(
        self, context_ptr: int, handle_ptr: int, owners: tuple[object, ...] = (), initial_transfers: int = 4
    ) -> None:
        if not loaded_libusb_path():
            raise errors.LibusbLoadError("create the async bulk pool", "libusb is not loaded into the helper")
        if not context_ptr or not handle_ptr:
            raise errors.UsbInvalidParamError(
                "create the async bulk pool", None, "needs the driver's own libusb context and an open device handle"
            )
        pool = lib.usbgpu_pool_new(ffi.cast("void *", context_ptr), ffi.cast("void *", handle_ptr), initial_transfers)
        if pool == ffi.NULL:
            raise errors.UsbNoMemError("create the async bulk pool")
        self._pool = pool
        # (tag, cffi buffer over the caller's object) in tag order: keeps the bytes alive and, for a bytearray,
        # locked against resizing, until the tag is known complete.
        self._buffers: deque[tuple[int, Any]] = deque()
        self._closed = False
        self.interrupted_waits = 0  # waits a signal interrupted and that resumed (or raised, for Ctrl-C) in Python
        self._finalizer = weakref.finalize(self, _free_pool, pool, owners, 1000)

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise errors.UsbClosedError(operation, "the async bulk pool is closed")

    @property
    def inflight(self) -> int:
        """Transfers submitted and not yet completed."""
        return 0 if self._closed else int(lib.usbgpu_inflight(self._pool))

    @property
    def pool_size(self) -> int:
        """Transfer objects allocated so far (the pool grows to the deepest pipeline, then is reused)."""
        return 0 if self._closed else int(lib.usbgpu_pool_size(self._pool))

    def submit(self, endpoint: int, data: bytes | bytearray | memoryview, timeout_ms: int) -> int:
        """Submit `data` as one bulk OUT on `endpoint`; returns a tag for wait(). The buffer is not copied."""
        if self._closed:
            self._check_open(f"submit async bulk OUT 0x{endpoint:02x}")
        # No memoryview of our own here: a memoryview with a live cffi export that ends up in a reference cycle
        # (e.g. through a traceback) crashes CPython's GC, so the export is taken on the caller's object directly
        # and released explicitly on every path that does not keep it.
        try:
            cbuf = ffi.from_buffer("unsigned char[]", data)
        except (TypeError, BufferError, ValueError) as exc:
            raise errors.UsbInvalidParamError(
                f"submit async bulk OUT 0x{endpoint:02x}", None, f"needs a C-contiguous bytes-like buffer ({exc})"
            ) from None
        nbytes = len(cbuf)
        if nbytes > 0x7FFFFFFF:
            ffi.release(cbuf)
            raise errors.UsbInvalidParamError(
                f"submit async bulk OUT 0x{endpoint:02x}", None, f"{nbytes} bytes is more than one transfer can carry"
            )
        tag: int = lib.usbgpu_submit_bulk_out(self._pool, endpoint, cbuf, nbytes, timeout_ms)
        if tag < 0:
            ffi.release(cbuf)
            raise self._error(tag, f"submit async bulk OUT 0x{endpoint:02x} ({nbytes} bytes)")
        self._buffers.append((tag, cbuf))
        return tag

    def wait(self, tag: int, timeout_ms: int) -> None:
        """Pump libusb events on the pool's own context until `tag` completes; raise any latched error."""
        if self._closed:
            self._check_open(f"wait for async bulk OUT tag {tag}")
        deadline = time.monotonic() + timeout_ms / 1e3
        rc = lib.usbgpu_wait(self._pool, tag, timeout_ms)
        while rc == lib.USBGPU_WAIT_INTERRUPTED:
            # a signal interrupted the event loop: back in Python its handler has run (Ctrl-C raised
            # KeyboardInterrupt above); any other signal resumes the wait for the time that is left
            self.interrupted_waits += 1
            rc = lib.usbgpu_wait(self._pool, tag, max(0, int((deadline - time.monotonic()) * 1e3)))
        if self._buffers:
            self._release_completed()
        if rc != 0:
            raise self._error(rc, f"wait for async bulk OUT tag {tag}")

    def is_done(self, tag: int) -> bool:
        """Whether `tag` has completed (successfully or not)."""
        self._check_open(f"query async bulk OUT tag {tag}")
        rc = int(lib.usbgpu_is_done(self._pool, tag))
        if rc < 0:
            raise self._error(rc, f"query async bulk OUT tag {tag}")
        return rc == 1

    def latched_error(self) -> errors.TransferError | None:
        """The latched completion error, if any (it never clears)."""
        if self._closed:
            return None
        latch = ffi.new("usbgpu_latch *")
        if not lib.usbgpu_latched(self._pool, latch):
            return None
        operation = f"async bulk OUT 0x{latch.endpoint:02x} (tag {latch.tag}, {latch.length} bytes)"
        err = errors.error_for_status(latch.status, operation, latch.actual_length, latch.length, int(latch.tag))
        err.detail += "; the error is latched: every later wait reports it until the device is reopened"
        err.args = (err._format(),)
        return err

    def _release_completed(self) -> None:
        # Buffers are kept in tag order; every tag below the oldest one in flight has completed.
        oldest = lib.usbgpu_oldest_inflight(self._pool)
        buffers = self._buffers
        while buffers and buffers[0][0] < oldest:
            ffi.release(buffers.popleft()[1])

    def _error(self, rc: int, operation: str) -> errors.UsbError:
        if rc == lib.USBGPU_LATCHED:
            latched = self.latched_error()
            assert latched is not None
            latched.detail += f" (reported by: {operation})"
            latched.args = (latched._format(),)
            return latched
        if rc == lib.USBGPU_WAIT_TIMEOUT:
            return errors.UsbWaitTimeout(operation)
        if rc == lib.USBGPU_CLOSED:
            return errors.UsbClosedError(operation, "the async bulk pool is closing")
        return errors.error_for_code(rc, operation, libusb_text(rc) or None)

    def cancel_all(self, timeout_ms: int = 1000) -> int:
        """Cancel every in-flight transfer and wait for them to come back; returns how many did not."""
        if self._closed:
            return 0
        remaining = int(lib.usbgpu_cancel_all(self._pool, timeout_ms))
        self._release_completed()
        return remaining

    def close(self, timeout_ms: int = 1000) -> int:
        """cancel_all, then free the transfers; returns how many transfers had to be leaked (still in flight)."""
        if self._closed:
            return 0
        self._closed = True
        self._finalizer.detach()
        leaked = _free_pool(self._pool, (), timeout_ms)
        if leaked:
            _LEAKED.append(list(self._buffers))
        else:
            for _, cbuf in self._buffers:
                ffi.release(cbuf)
        self._buffers.clear()
        return leaked
