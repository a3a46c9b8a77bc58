"""One session per bridge: a registry for this process plus an flock'ed lock file per device for the others.

The lock is taken after discovery and before the device is configured, so a second opener never resets or
reconfigures a bridge another session is using. A device is identified by where it is plugged in (bus and port
path) on hardware, and by VID:PID and serial number in the simulator (a simulated device exists only in the process
that made it, so its serial number is what stands for "the same physical bridge"; SimDevice picks a fresh one
unless given). Lock files live in $SPECK_USB_LOCK_DIR, else the system temporary directory; they are left in place
(removing a lock file races with its next user) and hold the owner's pid for the error message.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
import threading
from pathlib import Path

from speck.usbgpu.errors import DeviceInUseError, LockFileError
from speck.usbgpu.settings import LOCK_DIR

try:
    import fcntl
except ImportError:  # pragma: no cover - non-POSIX: only the in-process check applies
    fcntl = None  # type: ignore[assignment]

_HELD: dict[str, str] = {}  # identity -> the device name it was opened as
_GUARD = threading.Lock()


def lock_dir() -> Path:
    """Where lock files go: $SPECK_USB_LOCK_DIR, else the system temporary directory."""
    return Path(LOCK_DIR.value or tempfile.gettempdir())


def lock_path(identity: str) -> Path:
    return lock_dir() / f"speck-usbgpu-{re.sub(r'[^A-Za-z0-9.-]', '_', identity)}.lock"


class DeviceLock:
    """Held while a transport has the device open; `release()` (idempotent) lets the next session in."""

    def __init__(self, identity: str, fd: int | None) -> None:
        self.identity = identity
        self._fd = fd

    @classmethod
    def acquire(cls, identity: str, name: str) -> DeviceLock:
        """Take the device's lock or raise DeviceInUseError saying who holds it."""
        operation = f"open USB GPU bridge {name} ({identity})"
        with _GUARD:
            if identity in _HELD:
                raise DeviceInUseError(
                    operation, None, f"the bridge is already open in this process (as {_HELD[identity]})"
                )
            fd = cls._lock_file(identity, operation)
            _HELD[identity] = name
        return cls(identity, fd)

    @staticmethod
    def _lock_file(identity: str, operation: str) -> int | None:
        if fcntl is None:
            return None
        path = lock_path(identity)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as e:  # (a file in its place, a parent that is no directory: a bare FileExistsError)
            raise LockFileError(
                f"{operation}: cannot make the lock directory {path.parent} ({e.strerror}); point SPECK_USB_LOCK_DIR "
                "at a directory you can write, or unset it"
            ) from e
        # never through a symlink (one planted at this predictable name would make us write another file), never
        # blocking on a FIFO, private to this user when we create it
        flags = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            try:
                fd = os.open(path, os.O_RDWR | os.O_CREAT | flags, 0o600)
            except PermissionError:  # made by another user: flock works on a read-only descriptor too
                fd = os.open(path, os.O_RDONLY | flags)
        except OSError as e:
            raise LockFileError(
                f"{operation}: cannot use the lock file {path} ({e.strerror}; a symlink is never followed); remove "
                f"it, or point SPECK_USB_LOCK_DIR at a directory of your own"
            ) from e
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            os.close(fd)
            raise LockFileError(
                f"{operation}: the lock file {path} is not a regular file; remove it, or point SPECK_USB_LOCK_DIR at "
                "a directory of your own"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            try:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            finally:
                os.close(fd)
            raise DeviceInUseError(
                operation, None, f"the bridge is in use by another process (pid {holder}, lock file {path})"
            ) from None
        # the holder's pid, padded over any longer pid an earlier holder left; only into a file of this lock's own
        # shape (one link, at most one pid line): a hard link to another file is never written
        try:
            if st.st_nlink == 1 and st.st_size <= 32:
                os.pwrite(fd, f"{os.getpid():<31}\n".encode(), 0)
        except OSError:
            pass  # read-only lock file: the lock holds, only the pid in the message is missing
        return fd

    def release(self) -> None:
        with _GUARD:
            if self._fd is not None:
                os.close(self._fd)  # closing the descriptor drops the flock
                self._fd = None
            if _HELD.get(self.identity) is not None:
                del _HELD[self.identity]
                self.identity = ""
