"""On-disk cache of lowered kernels: (kernel AST, renderer, settings, speck's lowering code) -> the rendered program
(a ProgramSpec without its object), in namespace `lowered/<renderer name>` of speck's cache store.

The compile cache is keyed by the rendered source, so a run with a warm cache still lowered and rendered every kernel
just to find its object (the main job's first CNN step: ~1.9 s of the ~2.5 s its main thread spends). This key is
known before lowering starts. It covers everything lowering reads: the AST (its pickle, a flat node table), the
renderer's class and settings (instance and class data attributes), every speck setting (ContextVar) not at its
default, and a digest of speck.uop's and speck.codegen's source files, so a changed setting or an upgrade never
reuses an older result.

Lowering always runs when SPEC=1 (the stages' checks were asked for), DEBUG>=3 (their output was), BEAM searches
(`beam_timer`), or CACHELEVEL=0. An entry that can't be read back is a miss: the kernel is lowered again and the
entry rewritten. Entries hold the program's UOps once, as a flat table with sources by position; they are written
at exit (or `flush()`), so a cold run's lowering pays for no entry; and while the namespace has no directory (a cold
cache) nothing is looked up and each key's hashing of its AST waits for the write too."""

from __future__ import annotations

import atexit
import enum
import hashlib
import io
import os
import pathlib
import pickle
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from speck.codegen.cache.store import DiskCache, cache_enabled, cache_root
from speck.uop import DEBUG, SPEC, UOp
from speck.uop.helpers import ContextVar
from speck.uop.settings import LiveVar

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer

VERSION = 2  # the entries' payload layout (2: the local size joined the tuple)
_DIGEST: list[str] = []  # the lowering code's digest, computed once per process


def sources_digest() -> str:
    """A digest of every source file of speck.uop and speck.codegen (all of them take part in lowering)."""
    if not _DIGEST:
        import speck.uop

        h = hashlib.sha256()
        for root in (pathlib.Path(str(speck.uop.__file__)).resolve().parent, pathlib.Path(__file__).resolve().parent):
            for path in sorted(root.rglob("*.py")):
                h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
        _DIGEST.append(h.hexdigest())
    return _DIGEST[0]


def usable(beam_timer: Any = None) -> bool:
    """Whether lowering may come from the cache (see the module docstring for when it never does)."""
    return beam_timer is None and cache_enabled() and not SPEC and DEBUG < 3


def _canon(v: Any) -> str:
    """A text for a setting's value that is the same in every process (sets sorted; enums by name)."""
    if isinstance(v, (set, frozenset)):
        return "{" + ",".join(sorted(_canon(x) for x in v)) + "}"
    if isinstance(v, (tuple, list)):
        return "(" + ",".join(_canon(x) for x in v) + ")"
    if isinstance(v, dict):
        return "{" + ",".join(sorted(f"{_canon(k)}:{_canon(x)}" for k, x in v.items())) + "}"
    if isinstance(v, enum.Enum):
        return f"{type(v).__name__}.{v.name}"
    r = repr(v)
    return f"<{type(v).__qualname__}>" if " at 0x" in r else r  # an address differs in every process


def _renderer_settings(renderer: Renderer) -> str:
    """The renderer's data attributes, its class's (and bases') included: what a subclass or a test may change."""
    seen: dict[str, Any] = {}
    for cls in reversed(type(renderer).__mro__):
        for k, v in vars(cls).items():
            if not k.startswith("__") and not callable(v) and not isinstance(v, (property, staticmethod, classmethod)):
                seen[k] = v
    seen.update(getattr(renderer, "__dict__", {}))
    return ";".join(f"{k}={_canon(v)}" for k, v in sorted(seen.items()) if not callable(v))


def key_context(renderer: Renderer, optimize: bool) -> bytes:
    """Everything in a key but the AST, as this process's settings and `renderer` are now."""
    # settings away from their defaults: one not registered yet (its module not imported) is at its default too,
    # so the key doesn't depend on what happens to be imported; settings read at each use name places and tools
    # (cache directories, library paths), not what lowering does
    settings = ";".join(f"{k}={v.value!r}" for k, v in sorted(ContextVar._registry.items())
                        if not isinstance(v, LiveVar) and v.value != v.default)  # fmt: skip
    cls = type(renderer)
    parts = (sources_digest(), f"{cls.__module__}.{cls.__qualname__}", renderer.name, _renderer_settings(renderer),
             settings, f"optimize={optimize}")  # fmt: skip
    return b"".join(part.encode() + b"\0" for part in parts)


def key_of(context: bytes, ast: UOp) -> str:
    """The key of lowering `ast` in `context` (a `key_context`)."""
    h = hashlib.sha256(context)
    h.update(pickle.dumps(ast, protocol=4))
    return h.hexdigest()


def lowered_key(ast: UOp, renderer: Renderer, optimize: bool) -> str:
    """The cache key of lowering `ast` for `renderer` in this process's settings."""
    return key_of(key_context(renderer, optimize), ast)


def may_hold(renderer: Renderer) -> bool:
    """Whether the renderer's namespace directory exists: with none (a cold cache) there is nothing to look up, and
    a lowering's key (a pickle and a hash of its AST) is computed only when its entry is written (`put_later`)."""
    return os.path.isdir(os.path.join(str(cache_root()), "lowered", _namespace(renderer)))


def _namespace(renderer: Renderer) -> str:
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in renderer.name) or "renderer"


def _store(renderer: Renderer) -> DiskCache:
    return DiskCache(f"lowered/{_namespace(renderer)}", VERSION)


def dumps(value: Any, order: Sequence[UOp] = ()) -> bytes:
    """Pickle `value` with every UOp in it stored once in a flat node table (sources by position). `order`, UOps
    that `value` holds with sources mostly before users (a linear program), fills the table without graph walks."""
    nodes: list[UOp] = []
    pos: dict[UOp, int] = {}

    def add(obj: UOp) -> None:
        for u in obj.toposort(gate=lambda x: x not in pos):
            if u not in pos:
                pos[u] = len(nodes)
                nodes.append(u)

    for u in order:
        if u not in pos:
            if all(s in pos for s in u.src):
                pos[u] = len(nodes)
                nodes.append(u)
            else:
                add(u)

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> int | None:
            if type(obj) is not UOp:
                return None
            if obj not in pos:
                add(obj)
            return pos[obj]

    buf = io.BytesIO()
    _Pickler(buf, protocol=4).dump(value)
    table = [(u.op, u.dtype, tuple([pos[s] for s in u.src]), u.arg, u.tag) for u in nodes]
    return pickle.dumps((table, buf.getvalue()), protocol=4)


def loads(blob: bytes) -> Any:
    """The value `dumps` pickled (its UOps rebuilt through the constructor, so hash-consing holds)."""
    table, payload = pickle.loads(blob)
    nodes: list[UOp] = []
    for op, dtype, srcs, arg, tag in table:
        nodes.append(UOp(op, dtype, tuple(nodes[i] for i in srcs), arg, tag))

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> UOp:
            return nodes[int(pid)]

    return _Unpickler(io.BytesIO(payload)).load()


def get(key: str, renderer: Renderer) -> Any:
    """The cached value for `key`, or None (a miss, also for an entry that can't be read back)."""
    blob = _store(renderer).get(key)
    if blob is None:
        return None
    try:
        return loads(blob)
    except Exception:  # an entry this speck can't rebuild is a miss; the caller lowers and rewrites it
        return None


# entries are written when the process exits (or at `flush()`), not while kernels are lowered: pickling a program
# costs about as much as a tenth of lowering it, and a cold first step is the time that matters
_pending: dict[tuple[str, Any], tuple[Renderer, Any]] = {}  # (renderer name, key or (context, AST)) -> entry
_owner: list[int] = [os.getpid()]  # a forked child inherits the queue: the parent writes it, not the child
_pending_lock = threading.Lock()
_registered: list[bool] = []
FLUSH_AT = 512  # queued entries that are written at once (a long session doesn't hold every program until exit)


def put(key: str, renderer: Renderer, value: Any) -> None:
    """Queue `value` as the entry for `key`; it is written at `flush()` (at the latest when the process exits)."""
    _queue(key, renderer, value)


def put_later(ast: UOp, renderer: Renderer, optimize: bool, value: Any) -> None:
    """`put` under `lowered_key(ast, renderer, optimize)` as that key is now, the AST's part computed at `flush()`."""
    _queue((key_context(renderer, optimize), ast), renderer, value)


def _queue(key: Any, renderer: Renderer, value: Any) -> None:
    with _pending_lock:
        if os.getpid() != _owner[0]:  # queued in a forked child: this process owns its own queue
            _pending.clear()
            _owner[0] = os.getpid()
        _pending[(renderer.name, key)] = (renderer, value)
        if not _registered:
            _registered.append(True)
            atexit.register(flush)
        full = len(_pending) >= FLUSH_AT
    if full:
        flush()


def flush() -> int:
    """Write every queued entry (see `put`); returns how many were written."""
    with _pending_lock:
        todo = list(_pending.items()) if os.getpid() == _owner[0] else []
        _pending.clear()
    written = 0
    for (_, key), (renderer, value) in todo:
        if isinstance(key, tuple):
            key = key_of(*key)
        order = value[2] if isinstance(value, tuple) and len(value) > 2 and isinstance(value[2], list) else ()
        written += bool(_store(renderer).put(key, dumps(value, order)))
    return written


__all__ = [
    "dumps",
    "flush",
    "get",
    "key_context",
    "key_of",
    "loads",
    "lowered_key",
    "may_hold",
    "put",
    "put_later",
    "sources_digest",
    "usable",
]
