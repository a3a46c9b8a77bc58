"""speck's on-disk caches: one integrity-checked key -> bytes store (`DiskCache`) that every cache uses (compiled
objects in "compile/<compiler>", BEAM winners, anything added later), and its command line,
`python -m speck.codegen.cache info|verify|clear`. See store.py for the entry format and the guarantees: a damaged,
moved or old-format entry is a miss with a CacheWarning, never an exception and never wrong data.

    from speck.codegen.cache import DiskCache
    store = DiskCache("beam", version=1)
    data = store.get(key)            # bytes | None
    store.put(key, data)             # atomic write-then-rename"""

from speck.codegen.cache.store import (
    FORMAT,
    DiskCache,
    cache_enabled,
    cache_root,
    scan,
)
from speck.codegen.errors import CacheWarning, EntryProblem

__all__ = ["FORMAT", "CacheWarning", "DiskCache", "EntryProblem", "cache_enabled", "cache_root", "scan"]
