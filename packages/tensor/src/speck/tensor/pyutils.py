"""Small utilities tinygrad's helpers namespace offers and user code imports from it: sequence and string helpers,
bit twiddling, memoryview/ctypes views, a pickle-valued disk cache, a progress bar and `fetch` (download into the
cache). speck.tensor.helpers re-exports them."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import http.client
import os
import pathlib
import pickle
import re
import secrets
import sys
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, BinaryIO, TypeVar

from speck.codegen.cache import DiskCache, cache_root
from speck.tensor.errors import FetchError, SaveError, TensorFileNotFoundError, TensorTypeError, TensorValueError
from speck.tensor.settings import DISABLE_HTTP_CACHE, MAX_DECOMPRESSED_BYTES

T = TypeVar("T")
U = TypeVar("U")

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


# ---------------- sequences and strings ----------------
def partition(itr: Iterable[T], fxn: Callable[[T], bool]) -> tuple[list[T], list[T]]:
    """(items where fxn is true, items where it is false), order kept."""
    yes: list[T] = []
    no: list[T] = []
    for x in itr:
        (yes if fxn(x) else no).append(x)
    return yes, no


def fully_flatten(x: Any) -> list[Any]:
    """Every leaf of arbitrarily nested lists/tuples (and array-likes with .shape), in order."""
    if isinstance(x, (list, tuple)) or (hasattr(x, "shape") and hasattr(x, "__iter__") and len(x.shape) > 0):
        return [y for item in x for y in fully_flatten(item)]
    return [x]


def make_tuple(x: int | Sequence[int], cnt: int) -> tuple[int, ...]:
    """x repeated cnt times when it is an int, else x as a tuple."""
    return (x,) * cnt if isinstance(x, int) else tuple(x)


def merge_dicts(ds: Iterable[dict[T, U]]) -> dict[T, U]:
    """One dict from many; a key mapped to two different values is an error."""
    out: dict[T, U] = {}
    for d in ds:
        for k, v in d.items():
            if k in out and out[k] != v:
                raise TensorValueError(f"merge_dicts: key {k!r} has two values, {out[k]!r} and {v!r}")
            out[k] = v
    return out


def get_child(obj: Any, key: str) -> Any:
    """obj.a.0.b for key 'a.0.b': attributes, list indices (digits) and dict keys."""
    for k in key.split("."):
        if k.isnumeric():
            obj = obj[int(k)]
        elif isinstance(obj, dict):
            obj = obj[k]
        else:
            obj = getattr(obj, k)
    return obj


def ansistrip(s: str) -> str:
    """s without ANSI colour codes."""
    return _ANSI.sub("", s)


def ansilen(s: str) -> int:
    """The printed length of s (ANSI colour codes do not count)."""
    return len(ansistrip(s))


def strip_parens(fst: str) -> str:
    """fst without one pair of enclosing parentheses, when they enclose all of it."""
    if not (fst.startswith("(") and fst.endswith(")")):
        return fst
    depth = 0
    for i, c in enumerate(fst):
        depth += (c == "(") - (c == ")")
        if depth == 0 and i < len(fst) - 1:
            return fst  # the first '(' closes before the end: "(a)+(b)"
    return fst[1:-1]


def to_function_name(s: str) -> str:
    """s as a C identifier: colour codes removed, other characters as two hex digits."""
    return "".join(c if c.isalnum() or c == "_" else f"{ord(c):02X}" for c in ansistrip(s))


def pluralize(st: str, cnt: int) -> str:
    """'1 kernel', '3 kernels'."""
    return f"{cnt} {st}" + ("" if cnt == 1 else "s")


def word_wrap(x: str, wrap: int = 80) -> str:
    """x with lines longer than wrap (printed width) broken."""
    if len(ansistrip(x)) <= wrap and "\n" not in x:
        return x
    return "\n".join(line[i : i + wrap] for line in x.split("\n") for i in range(0, max(len(line), 1), wrap))


def time_to_str(t: float, w: int = 8) -> str:
    """Seconds as a fixed-width string in s, ms or us."""
    if t >= 10:
        return f"{t:{w}.2f}s "
    return f"{t * 1e3:{w}.2f}ms" if t >= 1e-2 else f"{t * 1e6:{w}.2f}us"


def is_numpy_ndarray(x: Any) -> bool:
    return str(type(x)) == "<class 'numpy.ndarray'>"


def ceildiv(num: int, amt: int) -> int:
    """num / amt rounded up (speck.uop's cdiv is C division, rounding toward zero)."""
    return -(num // -amt)


def round_down(num: int, amt: int) -> int:
    return num - num % amt


def next_power2(x: int) -> int:
    return 1 if x == 0 else 1 << (x - 1).bit_length()


# ---------------- bits ----------------
def getbits(value: int, start: int, end: int) -> int:
    """Bits start..end (inclusive) of value."""
    return (value >> start) & ((1 << (end - start + 1)) - 1)


def i2u(bits: int, value: int) -> int:
    """A signed value as its unsigned two's-complement in `bits` bits."""
    return value + (1 << bits) if value < 0 else value


def polyN(x: T, p: Sequence[float]) -> T:
    """p[0]*x^(n-1) + ... + p[-1] by Horner's rule (x may be a Tensor or a number)."""
    acc: Any = 0.0
    for c in p:
        acc = acc * x + c
    return acc  # type: ignore[no-any-return]


def lo32(x: int) -> int:
    return x & 0xFFFFFFFF


def hi32(x: int) -> int:
    return x >> 32


def data64(data: int) -> tuple[int, int]:
    """(high, low) 32-bit halves."""
    return (data >> 32, data & 0xFFFFFFFF)


def data64_le(data: int) -> tuple[int, int]:
    """(low, high) 32-bit halves."""
    return (data & 0xFFFFFFFF, data >> 32)


# ---------------- memory views ----------------
def from_mv(mv: memoryview, to_type: Any = ctypes.c_char) -> Any:
    """A ctypes array aliasing a writable memoryview."""
    return ctypes.cast(ctypes.addressof(to_type.from_buffer(mv)), ctypes.POINTER(to_type * len(mv))).contents


def to_mv(ptr: int, sz: int) -> memoryview:
    """A byte memoryview of sz bytes at address ptr."""
    return memoryview((ctypes.c_uint8 * sz).from_address(ptr)).cast("B")


def mv_address(mv: memoryview) -> int:
    """The address of a memoryview's first byte."""
    return ctypes.addressof(ctypes.c_char.from_buffer(mv))


def flat_mv(mv: memoryview) -> memoryview:
    """mv as a flat byte view."""
    return mv if len(mv) == 0 else mv.cast("B", shape=(mv.nbytes,))


def init_c_var(ctypes_var: T, creat_cb: Callable[[T], Any]) -> T:
    creat_cb(ctypes_var)
    return ctypes_var


# ---------------- decorators / context managers ----------------
def suppress_finalizing(func: Callable[..., T]) -> Callable[..., T | None]:
    """func, made silent when it fails while the interpreter shuts down (for __del__ methods)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        try:
            return func(*args, **kwargs)
        except (AttributeError, TypeError, ImportError):
            if not sys.is_finalizing():
                raise
            return None

    return wrapper


class Profiling(contextlib.ContextDecorator):
    """`with Profiling():` profiles the block with cProfile and prints the top entries by cumulative time."""

    def __init__(self, enabled: bool = True, sort: str = "cumtime", frac: float = 0.2, fn: str | None = None,
                 ts: str = "ms") -> None:  # fmt: skip
        self.enabled, self.sort, self.frac, self.fn = enabled, sort, frac, fn

    def __enter__(self) -> Profiling:
        import cProfile  # (here: speck.tensor has a module named profile, which a script's path could shadow)

        self.pr = cProfile.Profile()
        if self.enabled:
            self.pr.enable()
        return self

    def __exit__(self, *exc: object) -> None:
        if not self.enabled:
            return
        self.pr.disable()
        if self.fn:
            self.pr.dump_stats(self.fn)
        import pstats

        stats = pstats.Stats(self.pr, stream=sys.stdout).strip_dirs().sort_stats(self.sort)
        stats.print_stats(self.frac)


@dataclass(frozen=True)
class Metadata:
    """Where a graph node came from: the Tensor method name, and whether it was a backward step."""

    name: str
    caller: str = ""
    backward: bool = False

    def __str__(self) -> str:
        return self.name + (" bw" if self.backward else "")


# ---------------- disk cache of Python values ----------------
def _cache_key(key: Any) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()


def _table(table: str) -> DiskCache:
    return DiskCache("user/" + re.sub(r"[^A-Za-z0-9_.\-]", "_", table)[:120])


def diskcache_get(table: str, key: Any) -> Any:
    """The value stored under (table, key), or None (also when CACHELEVEL=0 or the entry is unusable)."""
    blob = _table(table).get(_cache_key(key))
    return None if blob is None else pickle.loads(blob)


def diskcache_put(table: str, key: Any, val: Any, prepickled: bool = False) -> Any:
    """Store val under (table, key) (pickled unless prepickled); returns val."""
    _table(table).put(_cache_key(key), val if prepickled else pickle.dumps(val))
    return val


def diskcache(func: Callable[..., T]) -> Callable[..., T]:
    """Memoize func's results on disk, keyed by its arguments' repr."""
    table = f"cache_{func.__name__}"

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        key = (args, sorted(kwargs.items()))
        if (ret := diskcache_get(table, key)) is not None:
            return ret  # type: ignore[no-any-return]
        return diskcache_put(table, key, func(*args, **kwargs))  # type: ignore[no-any-return]

    return wrapper


# ---------------- progress bar ----------------
class tqdm(Iterator[T]):
    """A minimal progress bar: iterate it like the wrapped iterable, or `update(n)` it by hand; writes one line to
    stderr (or nothing with disable=True)."""

    def __init__(self, iterable: Iterable[T] | None = None, desc: str = "", disable: bool = False, unit: str = "it",
                 unit_scale: bool = False, total: int | None = None, rate: int = 100) -> None:  # fmt: skip
        self.iterable, self.desc, self.disable, self.unit, self.unit_scale = iterable, desc, disable, unit, unit_scale
        if total is None and iterable is not None:
            total = len(iterable) if hasattr(iterable, "__len__") else None  # type: ignore[arg-type]
        self.total, self.n, self.st = total, 0, time.perf_counter()
        self._it = iter(iterable) if iterable is not None else None

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._it is None:
            raise TensorTypeError("tqdm without an iterable cannot be iterated; call update(n)")
        try:
            x = next(self._it)
        except StopIteration:
            self.close()
            raise
        self.update(1)
        return x

    def __enter__(self) -> tqdm[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def update(self, n: int = 0) -> None:
        self.n += n
        if not self.disable:
            el = time.perf_counter() - self.st
            tot = f"/{self.total}" if self.total is not None else ""
            sys.stderr.write(f"\r{self.desc + ': ' if self.desc else ''}{self.n}{tot} {self.unit} [{el:.1f}s]")

    def close(self) -> None:
        if not self.disable and self.n:
            sys.stderr.write("\n")
        self.disable = True


def trange(n: int, **kwargs: Any) -> tqdm[int]:
    """tqdm(range(n))."""
    return tqdm(range(n), **kwargs)


# ---------------- downloads ----------------
def fetch(url: str, name: pathlib.Path | str | None = None, subdir: str | None = None, gunzip: bool = False,
          allow_caching: bool | None = None) -> pathlib.Path:  # fmt: skip
    """Download url into the cache (`<cache root>/downloads[/subdir]/<name or hash of url>`) once and return the
    path; `gunzip` stores the decompressed body. A `file://` url or local path is returned as is. Offline or failing
    downloads raise ConnectionError naming the url and the cause."""
    if not isinstance(url, str):  # ("'NoneType' object has no attribute 'startswith'")
        raise TensorTypeError(f"fetch: url must be a str, got {type(url).__name__} {url!r:.40}; pass "
                              "'https://...', 'file://...' or a path starting with / or .")  # fmt: skip
    if url.startswith(("/", ".")):
        return pathlib.Path(url)
    if url.startswith("file://"):
        return pathlib.Path(url[len("file://") :])
    if name is not None and (isinstance(name, pathlib.Path) or "/" in str(name)):
        fp = pathlib.Path(name)
    else:
        fn = str(name) if name else hashlib.md5(url.encode()).hexdigest() + (".gunzip" if gunzip else "")
        fp = cache_root() / "downloads" / (subdir or "") / fn
    if allow_caching is None:
        allow_caching = not DISABLE_HTTP_CACHE.value
    if fp.is_file() and allow_caching:
        return fp
    if "://" not in url:  # (urllib's bare "unknown url type")
        raise TensorValueError(f"fetch: {url!r} is neither a url (scheme://...) nor a path starting with / or .; "
                               f"pass './{url}' for a local file")  # fmt: skip
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            if r.status != 200:
                raise FetchError(f"fetch {url}: HTTP status {r.status}")
            if gunzip:  # (decompressed in memory, both sides capped by MAX_DECOMPRESSED_BYTES)
                data = _read_capped(r, int(MAX_DECOMPRESSED_BYTES.value), url)
                _write_atomic(fp, gunzip_bounded(data, f"fetch {url}"))
            else:  # streamed to disk in chunks: a large file never sits in memory whole
                with atomic_file(fp, "saving a download", make_dirs=True) as f:
                    _copy_body(r, f, url)
    except (FetchError, SaveError, TensorValueError):
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError) as e:
        raise FetchError(f"fetch {url} failed ({e!r}); check the network or put the file at {fp} yourself") from e
    return fp


_CHUNK = 1 << 20


def _copy_body(r: Any, f: BinaryIO, url: str) -> None:
    """The HTTP body of `r` into `f`; a body shorter than its Content-Length is a FetchError (a dropped connection
    must not leave a truncated file in the cache)."""
    expected, got = r.headers.get("Content-Length"), 0
    while chunk := _read_chunk(r, url):
        f.write(chunk)
        got += len(chunk)
    if expected is not None and expected.isdigit() and got != int(expected):
        raise FetchError(f"fetch {url}: the server sent {got} of the {expected} bytes it announced; try again")


def _read_chunk(r: Any, url: str) -> bytes:
    """The next chunk of the body; the connection's errors are FetchErrors here, so that the file being written
    reports only its own errors as SaveErrors."""
    try:
        return r.read(_CHUNK)  # type: ignore[no-any-return]
    except (http.client.HTTPException, OSError) as e:
        raise FetchError(f"fetch {url}: reading the body failed ({e!r}); check the network and try again") from e


def _read_capped(r: Any, limit: int, url: str) -> bytes:
    out = bytearray()
    while chunk := _read_chunk(r, url):
        out += chunk
        if len(out) > limit:
            raise TensorValueError(
                f"fetch {url}: the gzip download is larger than MAX_DECOMPRESSED_BYTES={limit} bytes; if you trust "
                "it, raise MAX_DECOMPRESSED_BYTES (environment or Context)"
            )
    return bytes(out)


def gunzip_bounded(data: bytes, what: str) -> bytes:
    """The gzip stream `data` (one or more members) decompressed, at most MAX_DECOMPRESSED_BYTES of it: a bomb (a
    few KB that expand to gigabytes) or a stream that is no gzip, truncated or corrupt is a TensorValueError naming
    `what` (gzip.decompress took any size and raised bare OSError/EOFError)."""
    limit, out, rest = int(MAX_DECOMPRESSED_BYTES.value), bytearray(), data
    try:
        while True:
            d = zlib.decompressobj(16 + zlib.MAX_WBITS)
            out += d.decompress(rest, limit + 1 - len(out))
            if len(out) > limit:
                raise TensorValueError(f"{what}: the gzip data expands to more than MAX_DECOMPRESSED_BYTES={limit} "
                                       "bytes; if you trust it, raise MAX_DECOMPRESSED_BYTES (environment or "
                                       "Context)")  # fmt: skip
            if not d.eof:
                raise TensorValueError(f"{what}: the gzip data is truncated ({len(data)} bytes)")
            rest = d.unused_data
            if not rest.strip(b"\0"):  # (zero padding after the last member, as gzip allows)
                return bytes(out)
    except zlib.error as e:
        raise TensorValueError(f"{what}: not valid gzip data ({e})") from None


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], what: str = "writing", make_dirs: bool = False) -> Iterator[BinaryIO]:
    """A binary file whose contents replace `path` when the block ends without an error (a failure leaves neither
    a partial `path` nor the temporary file). The temporary file is a fresh name beside `path`, created with O_EXCL
    (never a file or symlink someone placed there) and the mode the umask gives. An OSError is a SaveError naming
    `path` and what was being done; `make_dirs` creates missing parent directories first."""
    dest = pathlib.Path(path)
    tmp = dest.with_name(f"{dest.name}.{secrets.token_hex(6)}.tmp")
    made = False
    try:
        if make_dirs:
            dest.parent.mkdir(parents=True, exist_ok=True)
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
            made = True
            yield f
        tmp.replace(dest)
    except BaseException as e:
        if made:
            with contextlib.suppress(OSError):
                tmp.unlink()
        if isinstance(e, OSError) and not isinstance(e, (SaveError, FetchError)):
            raise SaveError(
                e.errno,
                f"{what}: can't write {dest}: {e.strerror or e}; check that its directory "
                "exists, is writable and has space, and that the path is no directory",
            ) from e
        raise


def _write_atomic(path: pathlib.Path, data: bytes) -> None:
    with atomic_file(path, "saving a download", make_dirs=True) as f:
        f.write(data)


def gunzip_local(path: Any) -> pathlib.Path:
    """A local gzip file decompressed into the download cache (once per file content)."""
    src = pathlib.Path(path)
    try:
        raw = src.read_bytes()
    except FileNotFoundError as e:
        raise TensorFileNotFoundError(f"from_url: no file at {src}") from e
    except OSError as e:
        raise TensorValueError(f"from_url(gunzip=True): can't read {src} ({e})") from e
    data = gunzip_bounded(raw, f"from_url(gunzip=True) of {src}")
    out = cache_root() / "downloads" / (hashlib.md5(raw).hexdigest() + ".gunzip")
    if not out.is_file():
        _write_atomic(out, data)
    return out
