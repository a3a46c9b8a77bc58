"""Small helpers shared by every speck package: environment-backed settings (`getenv`, `ContextVar`, `Context`)
and a few sequence utilities. Standard library only."""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")


@functools.cache
def getenv(key: str, default: Any = 0) -> Any:
    """Read an environment variable converted to the type of `default` (cached: settings are read once)."""
    value = os.environ.get(key)
    if value is None:
        return default
    return type(default)(value)


class ContextVar:
    """A named process-wide setting: created once from the same-named environment variable (converted to the type
    of `default`: int, float or str) or `default`; scoped with `Context(NAME=value)`; `.value` is writable."""

    _registry: dict[str, ContextVar] = {}
    value: Any

    def __init__(self, key: str, default: Any) -> None:
        if key in ContextVar._registry:
            raise RuntimeError(f"ContextVar {key!r} is already defined; import it instead of defining it twice")
        raw = os.environ.get(key)
        try:
            value = default if raw is None else type(default)(raw)
        except ValueError:
            raise ValueError(f"environment variable {key}={raw!r} is not a {type(default).__name__}") from None
        self.key, self.default, self.value = key, default, value
        ContextVar._registry[key] = self

    def __bool__(self) -> bool:
        return bool(self.value)

    def __index__(self) -> int:
        return int(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __ge__(self, x: int) -> bool:
        return bool(self.value >= x)

    def __gt__(self, x: int) -> bool:
        return bool(self.value > x)

    def __le__(self, x: int) -> bool:
        return bool(self.value <= x)

    def __lt__(self, x: int) -> bool:
        return bool(self.value < x)

    def __eq__(self, x: object) -> bool:
        return bool(self.value == x)

    def __hash__(self) -> int:
        return hash(self.key)

    def __repr__(self) -> str:
        return f"ContextVar({self.key}={self.value})"

    def save(self) -> Any:
        """What `Context` restores on exit (the value; a setting read at each use keeps its override instead)."""
        return self.value

    def restore(self, state: Any) -> None:
        self.value = state

    @staticmethod
    def get(key: str) -> ContextVar:
        """Look up a defined ContextVar by name."""
        if key not in ContextVar._registry:
            raise KeyError(f"unknown setting {key!r}; known settings: {', '.join(sorted(ContextVar._registry))}")
        return ContextVar._registry[key]


class Context(contextlib.ContextDecorator):
    """Scope settings: `with Context(DEBUG=2): ...` restores the previous values on exit.

    Unknown names raise KeyError listing the known settings; a setting defined by a package that is imported later
    can still be scoped once it exists. Values are stored as given (not type-checked)."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.old: dict[str, Any] = {}

    def __enter__(self) -> Context:
        for k in self.kwargs:
            ContextVar.get(k)  # every name is checked before any value changes
        for k, v in self.kwargs.items():
            cv = ContextVar._registry[k]
            self.old[k] = cv.save()
            cv.value = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.old.items():
            ContextVar._registry[k].restore(v)


DEBUG = ContextVar("DEBUG", 0)
SPEC = ContextVar("SPEC", 0)
PMCOMPILE = ContextVar("PMCOMPILE", 1)
# 0 turns off every on-disk cache (compiled objects, BEAM winners); any value >= 1 enables them
CACHELEVEL = ContextVar("CACHELEVEL", 2)


def prod(xs: Iterable[Any], start: Any = 1) -> Any:
    """Product of a sequence (works on ints and UOps)."""
    out = start
    for x in xs:
        out = out * x
    return out


def all_same(items: Sequence[Any]) -> bool:
    return all(x == items[0] for x in items)


def all_int(xs: Iterable[Any]) -> bool:
    return all(isinstance(x, int) for x in xs)


def dedup(xs: Iterable[T]) -> list[T]:
    return list(dict.fromkeys(xs))


def flatten(xss: Iterable[Iterable[T]]) -> list[T]:
    return [x for xs in xss for x in xs]


def argsort(xs: Sequence[Any]) -> list[int]:
    return sorted(range(len(xs)), key=xs.__getitem__)


def round_up(n: int, multiple: int) -> int:
    """n rounded up to a multiple of `multiple` (an alignment, a block size)."""
    return -(-n // multiple) * multiple


def cdiv(a: int, b: int) -> int:
    """Integer division truncating toward zero (C semantics), the meaning of Ops.CDIV."""
    q = abs(a) // abs(b)
    return q if (a < 0) == (b < 0) else -q


def cmod(a: int, b: int) -> int:
    """Remainder with the sign of the dividend (C semantics), the meaning of Ops.CMOD: a == cdiv(a,b)*b + cmod(a,b)."""
    return a - cdiv(a, b) * b
