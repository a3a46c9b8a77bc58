"""The device lock file lives at a predictable name in a shared directory: whatever is planted there (a symlink to
another file, a FIFO, a directory, a hard link) is refused or left unwritten, never followed, truncated or hung on; a
lock file speck creates is private to its user."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from speck.usbgpu.devlock import DeviceLock, lock_path
from speck.usbgpu.errors import LockFileError, UsbGpuError


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECK_USB_LOCK_DIR", str(tmp_path))
    return tmp_path


def test_a_symlink_at_the_lock_name_is_never_followed(lock_dir: Path) -> None:
    victim = lock_dir / "victim.txt"
    victim.write_text("precious data that must survive\n" * 4)
    before = victim.read_bytes()
    lock_path("sim-1").symlink_to(victim)
    with pytest.raises(LockFileError, match="symlink is never followed") as ei:
        DeviceLock.acquire("sim-1", "USB:SIM")
    assert isinstance(ei.value, UsbGpuError) and isinstance(ei.value, OSError)
    assert victim.read_bytes() == before  # not truncated, not written


@pytest.mark.parametrize("kind", ["fifo", "directory"])
def test_a_lock_name_that_is_not_a_regular_file_is_refused_without_hanging(lock_dir: Path, kind: str) -> None:
    path = lock_path("sim-2")
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    with pytest.raises(LockFileError, match=str(path)):
        DeviceLock.acquire("sim-2", "USB:SIM")


def test_a_hard_link_to_another_file_is_locked_but_never_written(lock_dir: Path) -> None:
    victim = lock_dir / "victim.bin"
    victim.write_bytes(b"x" * 100)
    os.link(victim, lock_path("sim-3"))
    lock = DeviceLock.acquire("sim-3", "USB:SIM")
    try:
        assert victim.read_bytes() == b"x" * 100
    finally:
        lock.release()


def test_a_new_lock_file_is_private_and_names_its_holder(lock_dir: Path) -> None:
    lock = DeviceLock.acquire("sim-4", "USB:SIM")
    try:
        st = os.stat(lock_path("sim-4"))
        assert stat.S_IMODE(st.st_mode) & 0o077 == 0
        assert lock_path("sim-4").read_text().strip() == str(os.getpid())
    finally:
        lock.release()
    # an earlier holder's longer pid is overwritten whole (the file is never truncated)
    lock_path("sim-4").write_text("123456789012\n")
    lock = DeviceLock.acquire("sim-4", "USB:SIM")
    try:
        assert lock_path("sim-4").read_text().strip() == str(os.getpid())
    finally:
        lock.release()
