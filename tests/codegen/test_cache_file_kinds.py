"""The on-disk cache opens its entries as regular files of bounded size only: a FIFO, a symlink (to /dev/zero or
anything else), a directory or an oversized file in an entry's place is a miss with one CacheWarning naming it,
never a hang, an unbounded read or a silently disabled cache. And `verify --delete` on a cache it can't change
says which files it could not remove and exits non-zero."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Iterator

import pytest

from speck.codegen.cache import CacheWarning, DiskCache
from speck.codegen.cache import store as store_mod
from speck.codegen.cache.cli import main as cli
from speck.codegen.cache.store import encode_entry

KEY = "ab" * 32


@pytest.fixture(autouse=True)
def private_cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[pathlib.Path]:
    monkeypatch.setenv("SPECK_CACHE_DIR", str(tmp_path / "cache"))
    yield tmp_path / "cache"


def _entry_path(store: DiskCache) -> pathlib.Path:
    path = store.path(KEY)
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _get(store: DiskCache) -> tuple[bytes | None, list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = store.get(KEY)
    return got, [str(w.message) for w in caught if issubclass(w.category, CacheWarning)]


def test_a_fifo_entry_is_a_miss_not_a_hang() -> None:
    store = DiskCache("compile/fifo")
    path = _entry_path(store)
    os.mkfifo(path)
    result: list[tuple[bytes | None, list[str]]] = []
    reader = threading.Thread(target=lambda: result.append(_get(store)), daemon=True)
    reader.start()
    reader.join(timeout=20)  # a hang detector: a correct get returns at once
    hung = reader.is_alive()
    if hung:  # release a reader blocked in open() (it waits for a writer), then report
        os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
        reader.join()
    assert not hung, "get() blocked opening a FIFO entry"
    got, warned = result[0]
    assert got is None and len(warned) == 1 and "not a regular file" in warned[0] and str(path) in warned[0]
    assert _get(store) == (None, [])  # one warning per file and process


def test_a_directory_in_an_entrys_place_is_a_miss_with_a_warning() -> None:
    store = DiskCache("compile/dir")
    _entry_path(store).mkdir()
    got, warned = _get(store)
    assert got is None and len(warned) == 1 and "not a regular file" in warned[0]
    assert not store.put(KEY, b"data")  # (it stays: speck never deletes what it did not write)


def test_a_symlinked_entry_is_a_miss_with_a_warning(tmp_path: pathlib.Path) -> None:
    store = DiskCache("compile/link")
    target = tmp_path / "elsewhere"
    target.write_bytes(encode_entry(KEY, b"data"))
    _entry_path(store).symlink_to(target)
    got, warned = _get(store)
    assert got is None and len(warned) == 1 and "symlink" in warned[0]


def test_a_symlink_to_dev_zero_is_not_read(private_cache: pathlib.Path) -> None:
    """In a child process with 1 GiB of address space: an unbounded read of /dev/zero ends in MemoryError there."""
    store = DiskCache("compile/zero")
    _entry_path(store).symlink_to("/dev/zero")
    child = textwrap.dedent(f"""
        import resource, warnings
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        from speck.codegen.cache import DiskCache
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = DiskCache("compile/zero").get({KEY!r})
        print(got, len(w))
    """)
    proc = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                          env={**os.environ, "SPECK_CACHE_DIR": str(private_cache)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["None", "1"]


def test_an_entry_larger_than_the_ceiling_is_not_read(monkeypatch: pytest.MonkeyPatch) -> None:
    store = DiskCache("compile/big")
    assert store.put(KEY, b"x" * 1000)
    monkeypatch.setattr(store_mod, "MAX_ENTRY_BYTES", 500)
    got, warned = _get(store)
    assert got is None and len(warned) == 1 and "500" in warned[0]
    assert not store.put("cd" * 32, b"y" * 1000)  # nor written: it could never be read back


def test_verify_and_scan_skip_what_is_not_a_regular_file(private_cache: pathlib.Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    store = DiskCache("compile/mixed")
    path = _entry_path(store)
    os.mkfifo(path)
    (path.parent / ("cd" * 32)).symlink_to("/dev/zero")
    assert store.put("ef" * 32, b"ok")
    reasons = sorted(p.reason for p in store.verify())
    assert len(reasons) == 2 and reasons[0] == "a symlink, not a regular file (speck writes none; it is not followed)"
    assert reasons[1] == "not a regular file (a FIFO)"
    assert cli(["verify"]) == 0 and "verified 1 entries: all intact" in capsys.readouterr().out


def test_verify_delete_reports_what_it_could_not_remove(private_cache: pathlib.Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    store = DiskCache("compile/ro")
    for i in range(3):
        key = f"{i:02d}" * 32
        assert store.put(key, b"data")
        store.path(key).write_bytes(b"damaged")

    def refuse(self: pathlib.Path, missing_ok: bool = False) -> None:
        raise PermissionError(13, "Permission denied", str(self))

    monkeypatch.setattr(pathlib.Path, "unlink", refuse)  # a read-only cache (as root, chmod would not refuse)
    assert cli(["verify", "--delete"]) == 1
    out = capsys.readouterr().out
    assert "0 removed, could not remove 3" in out and out.count("Permission denied") == 3
    assert len(list(store.directory.iterdir())) == 3
