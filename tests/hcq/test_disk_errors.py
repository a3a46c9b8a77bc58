"""A DISK buffer the OS can't map is an HCQError naming the device, the size and the OS's own message: a file that
can't grow to the buffer's size (Linux's /proc files report 0 bytes and ignore truncate; mmap then raised a bare
ValueError), a directory, a path under a missing directory."""

from __future__ import annotations

import os
import pathlib

import numpy as np
import pytest

from speck.hcq import Buffer, BufferOptions
from speck.hcq.errors import HCQError


@pytest.mark.skipif(not os.path.exists("/proc/version"), reason="needs Linux's /proc (a file that can't be extended)")
def test_a_file_that_cannot_grow_is_an_hcq_error_with_the_os_message() -> None:
    buf = Buffer("DISK:/proc/version", 16, np.uint8, BufferOptions(writable=True))
    with pytest.raises(HCQError) as ei:
        buf.allocate()
    msg = str(ei.value)
    assert "cannot map DISK:/proc/version (16 bytes)" in msg and "ValueError" in msg


@pytest.mark.parametrize("where", ["dir", "missing/f"])
def test_paths_that_are_no_file_are_hcq_errors(tmp_path: pathlib.Path, where: str) -> None:
    path = tmp_path if where == "dir" else tmp_path / where
    with pytest.raises(HCQError, match=rf"cannot map DISK:{path} \(8 bytes\): .*Error"):
        Buffer(f"DISK:{path}", 8, np.uint8).allocate()
