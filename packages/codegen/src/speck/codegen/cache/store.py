"""One integrity-checked on-disk key -> bytes store that every on-disk cache of speck uses.

An entry is one file, `<root>/<namespace>/<key>`, written to a temporary file in the same directory and renamed into
place (readers see a whole entry or none). The file is a fixed header, the key, then the data:

    magic  b"SPECKCAC"                      8 bytes
    format FORMAT (the layout of this file) u16
    version (the namespace's payload version, chosen by its user)  u16
    key length                               u16
    reserved (0)                             u16
    data length                              u64
    SHA-256 of everything else in the file   32 bytes (header fields, key, data)

A reader trusts nothing: an empty, short, foreign, old-format, moved (key differs from the file name) or damaged
entry is a miss, never an exception and never wrong data, and the next `put` replaces it. Entries are opened as
regular files of at most MAX_ENTRY_BYTES only (without following a symlink, without blocking on a FIFO): a FIFO,
symlink, directory, device or oversized file in an entry's place is a miss too. Each such entry is reported
with one CacheWarning per process naming the file (old-format entries, which an upgrade leaves behind by the hundred,
with one warning per namespace directory). A crash mid-write leaves at most a `.tmp-*` file, which `clear` removes.

The root is `$SPECK_CACHE_DIR` (default `~/.cache/speck`, read at each call); the CACHELEVEL setting (`CACHELEVEL=0`
in the environment, or `Context(CACHELEVEL=0)`) turns every cache off."""

from __future__ import annotations

import errno
import hashlib
import os
import pathlib
import re
import stat
import struct
import tempfile
import threading
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import NoReturn

from speck.codegen.errors import CacheEntryError, CacheEntryMissing, CacheWarning, CodegenValueError, EntryProblem
from speck.codegen.settings import CACHE_DIR
from speck.uop.helpers import CACHELEVEL

MAGIC = b"SPECKCAC"
FORMAT = 1
_HEAD = struct.Struct("<8sHHHHQ")  # magic, format, version, key length, reserved, data length
_DIGEST = 32
HEADER_SIZE = _HEAD.size + _DIGEST
TMP_PREFIX = ".tmp-"
# the largest entry file read or written: entries are compiled objects and lowered programs (KiB to a few MiB)
MAX_ENTRY_BYTES = 1 << 30
_KINDS = {stat.S_IFIFO: "a FIFO", stat.S_IFDIR: "a directory", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}  # fmt: skip
# keys and namespace parts are plain file names: no separators, no leading dot (temporary files start with one)
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,127}")


def cache_root() -> pathlib.Path:
    """Where speck's on-disk caches live: `$SPECK_CACHE_DIR`, else `~/.cache/speck`."""
    root = str(CACHE_DIR.value)
    return pathlib.Path(root) if root else pathlib.Path.home() / ".cache" / "speck"


def cache_enabled() -> bool:
    """False when the CACHELEVEL setting (speck.uop's, from the environment or `Context(CACHELEVEL=0)`) is 0: every
    cache is then bypassed, nothing is read or written."""
    return int(CACHELEVEL.value) > 0


def _digest(head: bytes, key: bytes, data: bytes | memoryview) -> bytes:
    h = hashlib.sha256(head)
    h.update(key)
    h.update(data)
    return h.digest()


def encode_entry(key: str, data: bytes, version: int = 1) -> bytes:
    """The bytes of an entry file holding `data` under `key` (what `DiskCache.put` writes)."""
    k = key.encode()
    head = _HEAD.pack(MAGIC, FORMAT, version, len(k), 0, len(data))
    return head + _digest(head, k, data) + k + data


def decode_entry(blob: bytes, path: str | pathlib.Path, key: str | None = None, version: int | None = None) -> bytes:
    """The data of entry file contents `blob` read from `path`. Checks the header, the checksum, that the stored key is
    `key` (default: the file's name) and, when given, the payload `version`. Raises CacheEntryError (carrying an
    EntryProblem) on any mismatch."""
    expect = os.path.basename(path) if key is None else key
    if not blob:
        _bad(path, "the file is empty (an interrupted write?)")
    if len(blob) < HEADER_SIZE:
        if MAGIC.startswith(blob[: len(MAGIC)]):
            _bad(path, f"truncated: {len(blob)} bytes, less than the header")
        _foreign(blob, path)
    magic, fmt, ver, klen, reserved, dlen = _HEAD.unpack_from(blob)
    if magic != MAGIC:
        _foreign(blob, path)
    if fmt != FORMAT:
        _bad(path, f"written in cache format {fmt}; this speck reads {FORMAT}", old=True)
    stored = blob[HEADER_SIZE : HEADER_SIZE + klen]
    data = memoryview(blob)[HEADER_SIZE + klen :]
    if len(data) != dlen or len(stored) != klen:
        _bad(path, f"length mismatch: the header announces {klen}+{dlen} bytes of key and data, the file holds "
                   f"{len(blob) - HEADER_SIZE} (truncated or appended to)")  # fmt: skip
    if _digest(blob[: _HEAD.size], stored, data) != blob[_HEAD.size : HEADER_SIZE] or reserved != 0:
        _bad(path, "checksum mismatch: the entry is corrupt")
    if stored != expect.encode():
        _bad(path, f"holds the entry for key {stored.decode(errors='replace')!r}, not {expect!r} (a moved or copied "
                   "file)")  # fmt: skip
    if version is not None and ver != version:
        _bad(path, f"payload version {ver}; this speck writes version {version}", old=True)
    return bytes(data)


def read_entry_file(path: str | pathlib.Path) -> bytes:
    """The bytes of the entry file at path, opened as a regular file only: a symlink is not followed and a FIFO never
    blocks (O_NOFOLLOW | O_NONBLOCK), and at most MAX_ENTRY_BYTES are read. Raises FileNotFoundError when there is
    no such file, CacheEntryError (an EntryProblem saying what is there instead) for anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as e:
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            raise CacheEntryMissing(e.errno, e.strerror, str(path)) from None
        if e.errno == errno.ELOOP:
            _bad(path, "a symlink, not a regular file (speck writes none; it is not followed)")
        _bad(path, f"unreadable: {e.strerror}")
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            _bad(path, f"not a regular file ({_KINDS.get(stat.S_IFMT(st.st_mode), 'a special file')})")
        if st.st_size > MAX_ENTRY_BYTES:
            _bad(path, f"{st.st_size} bytes, more than the {MAX_ENTRY_BYTES}-byte ceiling of an entry")
        with os.fdopen(os.dup(fd), "rb") as f:
            return f.read(st.st_size + 1)  # (a file that grew meanwhile: decoding sees the length mismatch)
    finally:
        os.close(fd)


def _foreign(blob: bytes, path: str | pathlib.Path) -> NoReturn:
    if blob.startswith(b"\x7fELF") or (str(path).endswith(".json") and blob[:1] in (b"[", b"{")):
        _bad(path, "a bare entry written by speck before entries carried a checksummed header", old=True)
    _bad(path, f"not a speck cache entry (starts with {blob[:8]!r}, expected {MAGIC!r})")


def _bad(path: str | pathlib.Path, reason: str, old: bool = False) -> NoReturn:
    raise CacheEntryError(EntryProblem(pathlib.Path(path), reason, old))


_warned: set[str] = set()
_warned_lock = threading.Lock()


def _warn_once(problem: EntryProblem) -> None:
    # damage is reported per file; old-format entries once per directory (an upgrade leaves them by the hundred)
    token = str(problem.path.parent) + "/*old*" if problem.old else str(problem.path)
    with _warned_lock:
        if token in _warned:
            return
        _warned.add(token)
    what = "ignored and will be rewritten" + (
        "; further old-format entries in this directory are replaced without a warning" if problem.old else ""
    )
    warnings.warn(f"speck cache entry {problem}: {what}", CacheWarning, stacklevel=4)


def check_name(name: str, what: str) -> str:
    """`name` if it can be a key or namespace part (a plain file name), else ValueError saying what is allowed."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise CodegenValueError(f"cache {what} must be 1-128 characters of [A-Za-z0-9_.-] not starting with '.' or "
                                f"'-', got {name!r}")  # fmt: skip
    return name


class DiskCache:
    """The entries of one namespace (a '/'-separated relative path such as "compile/llvm" or "beam"):
    `get(key) -> bytes | None`, `put(key, data)`, `delete(key)`, `keys()`, `verify()`, `clear()`. Keys are plain file
    names (a hex digest is typical). `version` is the namespace's payload version: bump it when the meaning of the
    stored bytes changes and entries of other versions become misses. Every method is a no-op miss when the cache is
    off (`CACHELEVEL=0`); an unwritable or missing directory is a miss too, never an error."""

    def __init__(self, namespace: str, version: int = 1) -> None:
        for part in namespace.split("/"):
            check_name(part, "namespace part")
        if not 0 <= version < 1 << 16:
            raise CodegenValueError(f"cache payload version must fit 16 bits, got {version}")
        self.namespace, self.version = namespace, version

    @property
    def directory(self) -> pathlib.Path:
        """The namespace's directory under the current cache root."""
        return cache_root() / self.namespace

    def path(self, key: str) -> pathlib.Path:
        """The file holding `key`'s entry."""
        return self.directory / check_name(key, "key")

    def get(self, key: str) -> bytes | None:
        """The data stored under `key`, or None: no entry, the cache is off, or the entry is unusable (warned once)."""
        if not cache_enabled():
            return None
        check_name(key, "key")
        name = os.path.join(str(CACHE_DIR.value) or cache_root(), self.namespace, key)  # no Path: hot
        try:
            return decode_entry(read_entry_file(name), name, key, self.version)
        except FileNotFoundError:  # no entry: a plain miss
            return None
        except CacheEntryError as e:
            _warn_once(e.problem)
            return None

    def put(self, key: str, data: bytes) -> bool:
        """Store `data` under `key`, replacing any entry atomically; True when written (False when the cache is off
        or the directory is not writable: caching is an optimisation, never an error)."""
        if not cache_enabled():
            return False
        path = self.path(key)
        blob = encode_entry(key, bytes(data), self.version)
        if len(blob) > MAX_ENTRY_BYTES:  # it could never be read back
            return False
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=TMP_PREFIX)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
            os.replace(tmp, path)
            return True
        except OSError:
            if tmp is not None:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
            return False

    def delete(self, key: str) -> bool:
        """Remove `key`'s entry; True when there was one."""
        try:
            self.path(key).unlink()
            return True
        except OSError:
            return False

    def keys(self) -> list[str]:
        """The keys that have something in their entry's place (an entry file, usable or not, or anything else that
        `get` treats as a miss), sorted."""
        try:
            return sorted(p.name for p in self.directory.iterdir() if _NAME.fullmatch(p.name))
        except OSError:
            return []

    def verify(self) -> list[EntryProblem]:
        """Every entry of this namespace that `get` would reject, with the reason."""
        problems = []
        for key in self.keys():
            path = self.path(key)
            try:
                decode_entry(read_entry_file(path), path, key, self.version)
            except FileNotFoundError:  # removed meanwhile
                continue
            except CacheEntryError as e:
                problems.append(e.problem)
            except OSError as e:
                problems.append(EntryProblem(path, f"unreadable: {e}"))
        return problems

    def clear(self) -> int:
        """Remove every entry file (and leftover temporary file) of this namespace; returns how many were removed."""
        removed = 0
        try:
            files = [p for p in self.directory.iterdir() if p.is_file()]
        except OSError:
            return 0
        for p in files:
            if _NAME.fullmatch(p.name) or p.name.startswith(TMP_PREFIX):
                try:
                    p.unlink()
                    removed += 1
                except OSError:
                    pass
        return removed

    def __repr__(self) -> str:
        return f"<DiskCache {self.namespace} v{self.version} at {self.directory}>"


@dataclass(frozen=True)
class ScannedFile:
    """One file found under the cache root by `scan`: its namespace (directory relative to the root), size, and
    kind: "entry" (a usable entry), "bad" (unusable: `problem` says why) or "tmp" (a write in progress or
    interrupted)."""

    path: pathlib.Path
    namespace: str
    size: int
    kind: str
    problem: EntryProblem | None = None


# top-level directories speck's caches used before entries had a header: their bare files are speck's too
LEGACY_NAMESPACES = ("compile", "beam")


def scan(root: pathlib.Path | None = None) -> Iterator[ScannedFile]:
    """Every cache file under `root` (default the cache root), checked: files with speck's header, bare files in the
    legacy namespaces, and temporary files. Other files (not speck's) are skipped, so a root shared with other
    programs is never misread or cleared. Payload versions are not checked (only a namespace's user knows them)."""
    root = cache_root() if root is None else root
    for dirpath, _dirs, files in os.walk(root):
        d = pathlib.Path(dirpath)
        ns = d.relative_to(root).as_posix()
        legacy = ns.split("/")[0] in LEGACY_NAMESPACES
        for name in sorted(files):
            path = d / name
            try:
                if path.is_symlink() or not path.is_file():
                    continue
                size = path.stat().st_size
                if name.startswith(TMP_PREFIX):
                    yield ScannedFile(path, ns, size, "tmp")
                    continue
                blob = read_entry_file(path)
            except (OSError, CacheEntryError):  # gone, or not a regular file of bounded size: not speck's
                continue
            if not legacy and not (blob and MAGIC.startswith(blob[: len(MAGIC)])):
                continue  # not speck's
            try:
                decode_entry(blob, path)
                yield ScannedFile(path, ns, size, "entry")
            except CacheEntryError as e:
                yield ScannedFile(path, ns, size, "bad", e.problem)
