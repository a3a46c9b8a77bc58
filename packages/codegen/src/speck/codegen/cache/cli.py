"""`python -m speck.codegen.cache info|verify|clear`: where speck's on-disk caches live, how big they are, whether
every entry is intact, and removing them. Only files that are speck's are counted or removed (see `store.scan`)."""

from __future__ import annotations

import argparse
import pathlib
import sys
from collections.abc import Sequence

from speck.codegen.cache.store import ScannedFile, cache_enabled, cache_root, scan
from speck.codegen.settings import CACHE_DIR


def _size(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    x = float(n)
    for unit in ("KiB", "MiB", "GiB"):
        x /= 1024
        if x < 1024 or unit == "GiB":
            break
    return f"{x:.1f} {unit}"


def _kind(f: ScannedFile) -> str:
    if f.kind == "bad":
        return "old" if f.problem is not None and f.problem.old else "damaged"
    return f.kind


def _selected(files: list[ScannedFile], namespaces: Sequence[str]) -> list[ScannedFile]:
    if not namespaces:
        return files
    return [f for f in files if any(f.namespace == ns or f.namespace.startswith(ns + "/") for ns in namespaces)]


def _where() -> str:
    env = str(CACHE_DIR.value)
    state = "on" if cache_enabled() else "off (CACHELEVEL=0)"
    where = "$SPECK_CACHE_DIR" if env else "default; set $SPECK_CACHE_DIR to move it"
    return f"{cache_root()} ({where}); caching {state}"


def info(namespaces: Sequence[str]) -> int:
    files = _selected(list(scan()), namespaces)
    print(f"speck caches: {_where()}")
    if not files:
        print("no entries")
        return 0
    cols = ("entry", "old", "damaged", "tmp")
    rows: dict[str, list[int]] = {}  # namespace -> [bytes, then a count per column]
    for f in files:
        row = rows.setdefault(f.namespace, [0] * (1 + len(cols)))
        row[0] += f.size
        row[1 + cols.index(_kind(f))] += 1
    rows["total"] = [sum(r[i] for r in rows.values()) for i in range(1 + len(cols))]
    width = max(len("namespace"), *(len(ns) for ns in rows))
    print(f"{'namespace':<{width}}  {'entries':>8}  {'size':>10}  {'old format':>10}  {'damaged':>8}  {'temporary':>9}")
    for ns in [*sorted(set(rows) - {"total"}), "total"]:
        b, e, o, d, t = rows[ns]
        print(f"{ns:<{width}}  {e:>8}  {_size(b):>10}  {o:>10}  {d:>8}  {t:>9}")
    return 0


def verify(namespaces: Sequence[str], delete: bool) -> int:
    """Exit status 1 when an entry is damaged or a temporary file is left over (without --delete), or when --delete
    could not remove one; old-format entries are listed but are no damage (speck ignores them and rewrites them
    when next used)."""
    files = _selected(list(scan()), namespaces)
    listed = [f for f in files if f.kind != "entry"]
    print(f"speck caches: {_where()}")
    failed = 0
    for f in listed:
        why = f.problem.reason if f.problem is not None else "temporary file of a write in progress or interrupted"
        label = {"old": "old format", "tmp": "temporary"}.get(_kind(f), _kind(f))
        if not delete:
            print(f"{label}: {f.path}: {why}")
            continue
        try:
            f.path.unlink()
            print(f"removed {label}: {f.path}: {why}")
        except OSError as e:
            failed += 1
            print(f"could not remove {label}: {f.path}: {why} ({e.strerror or e})")
    old = sum(_kind(f) == "old" for f in listed)
    bad = len(listed) - old
    intact = len(files) - len(listed)
    if not listed:
        print(f"verified {intact} entries: all intact")
        return 0
    if delete:
        print(f"verified {len(files)} files: {intact} intact, {len(listed) - failed} removed"
              + (f", could not remove {failed} (see above: the cache or its files are not writable by you)"
                 if failed else ""))  # fmt: skip
        return 1 if failed else 0
    print(f"verified {len(files)} files: {intact} intact, {old} in an old format, {bad} damaged or left over. speck "
          "treats them as misses (it recomputes and rewrites them); `verify --delete` removes them now")  # fmt: skip
    return 1 if bad else 0


def clear(namespaces: Sequence[str]) -> int:
    root = cache_root()
    files = _selected(list(scan(root)), namespaces)
    removed = sum(f.size for f in files if _unlink(f.path))
    # drop directories left empty (deepest first), never the root itself
    for f in sorted({f.path.parent for f in files}, key=lambda p: len(p.parts), reverse=True):
        d = f
        while d != root and root in d.parents:
            try:
                d.rmdir()
            except OSError:
                break
            d = d.parent
    print(f"removed {len(files)} files ({_size(removed)}) from {root}" + (f" ({', '.join(namespaces)})" if namespaces
                                                                          else ""))  # fmt: skip
    return 0


def _unlink(path: pathlib.Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    """The command line; returns the exit status (verify: 1 when an entry is damaged)."""
    p = argparse.ArgumentParser(prog="python -m speck.codegen.cache", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in (("info", "where the caches live, entries and sizes per namespace"),
                        ("verify", "check every entry's header and checksum; exit 1 if one is damaged"),
                        ("clear", "remove the entries (all namespaces, or those named)")):  # fmt: skip
        sp = sub.add_parser(name, help=help_)
        sp.add_argument("namespaces", nargs="*", help="restrict to these namespaces (e.g. compile, compile/llvm, beam)")
        if name == "verify":
            sp.add_argument("--delete", action="store_true", help="remove the unusable entries and temporary files")
    args = p.parse_args(argv)
    if args.command == "info":
        return info(args.namespaces)
    if args.command == "verify":
        return verify(args.namespaces, args.delete)
    return clear(args.namespaces)


if __name__ == "__main__":
    sys.exit(main())
