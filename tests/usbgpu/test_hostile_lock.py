"""Hostile round 4, the USB bridge lock: a lock directory that can't be made (a file in its place, a parent that is
no directory) was a bare FileExistsError/NotADirectoryError; now a LockFileError naming SPECK_USB_LOCK_DIR, and
nothing is left held. A second open (this process or another) is refused naming the holder; a lock file left by a
process that died (stale) never blocks the next open."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from speck.usbgpu.devlock import DeviceLock, lock_path
from speck.usbgpu.errors import DeviceInUseError, LockFileError


@pytest.fixture
def lock_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECK_USB_LOCK_DIR", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize("where", ["a_file", "under_a_file", "under_a_missing_proc_dir"])
def test_a_lock_dir_that_cant_be_made_is_a_lock_file_error(where: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    (tmp_path / "f").write_text("x")
    bad = {"a_file": tmp_path / "f", "under_a_file": tmp_path / "f" / "sub", "under_a_missing_proc_dir": Path(
        "/proc/1/speck-nope")}[where]  # fmt: skip
    monkeypatch.setenv("SPECK_USB_LOCK_DIR", str(bad))
    with pytest.raises(LockFileError, match="SPECK_USB_LOCK_DIR"):
        DeviceLock.acquire("sim-h1", "USB:SIM")
    monkeypatch.setenv("SPECK_USB_LOCK_DIR", str(tmp_path))  # nothing was left held: the next open works
    DeviceLock.acquire("sim-h1", "USB:SIM").release()


@pytest.mark.usefixtures("lock_dir")
def test_a_second_open_in_this_process_is_refused_until_release() -> None:
    first = DeviceLock.acquire("sim-h2", "USB:SIM")
    with pytest.raises(DeviceInUseError, match="already open in this process"):
        DeviceLock.acquire("sim-h2", "USB:SIM:1")
    first.release()
    first.release()  # (idempotent)
    DeviceLock.acquire("sim-h2", "USB:SIM").release()


HOLDER = """
import sys, time
from speck.usbgpu.devlock import DeviceLock
lock = DeviceLock.acquire("sim-h3", "USB:SIM")
print("held", flush=True)
time.sleep(120)
"""


@pytest.mark.usefixtures("lock_dir")
def test_another_process_holding_it_is_named_and_its_death_frees_it() -> None:
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdout=subprocess.PIPE, text=True, env=dict(os.environ))
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        with pytest.raises(DeviceInUseError, match=f"another process \\(pid {proc.pid}"):
            DeviceLock.acquire("sim-h3", "USB:SIM")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    lock = DeviceLock.acquire("sim-h3", "USB:SIM")  # the dead holder's file is stale: no flock on it
    try:
        assert lock_path("sim-h3").read_text().strip() == str(os.getpid())
    finally:
        lock.release()


@pytest.mark.usefixtures("lock_dir")
def test_a_stale_lock_file_with_a_long_pid_is_taken_and_rewritten() -> None:
    lock_path("sim-h4").write_text("99999999999999999999\n")
    lock = DeviceLock.acquire("sim-h4", "USB:SIM")
    try:
        assert lock_path("sim-h4").read_text().strip() == str(os.getpid())
    finally:
        lock.release()
