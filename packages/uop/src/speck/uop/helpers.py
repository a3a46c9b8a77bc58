"""Small helpers shared by every speck package: environment-backed settings (`getenv`, `ContextVar`, `Context`)
and a few sequence utilities. Standard library only."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from speck.uop.errors import SettingAttributeError, SettingError, SettingTypeError, UnknownSettingError

T = TypeVar("T")


def getenv(key: str, default: Any = 0) -> Any:
    """Read an environment variable converted to the type of `default`: int, float, str or bool (cached: settings are
    read once)."""
    if type(key) is not str or type(default) not in _GETENV_KINDS:
        _check_getenv_args(key, default)
    return _getenv(key, default)


_GETENV_KINDS = (int, float, str, bool)


def _check_getenv_args(key: Any, default: Any) -> None:
    if not isinstance(key, str):
        raise SettingTypeError(f"getenv: the key must be an environment variable's name (a str), got {key!r} "
                               f"({type(key).__name__})")  # fmt: skip
    if not isinstance(default, _GETENV_KINDS):
        raise SettingTypeError(f"getenv({key!r}, ...): the default must be an int, float, str or bool (its type is "
                               f"what the value is read as), got {default!r} ({type(default).__name__})")  # fmt: skip


@functools.cache
def _getenv(key: str, default: Any) -> Any:
    value = os.environ.get(key)
    if value is None:
        return default
    return parse_setting(key, value, default)


_FLAGS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_KINDS = {int: ("an int", "an integer, e.g. {key}=1"), float: ("a float", "a number, e.g. {key}=1.5")}


def parse_setting(key: str, raw: str, default: Any) -> Any:
    """The environment value `raw` of setting `key` converted to the type of `default`; a value that isn't one is a
    SettingError naming the setting, what it takes and what was found (never a silent fallback to the default)."""
    kind = type(default)
    if kind is bool:  # (bool("0") is True: a flag is read by its spelling)
        if (flag := _FLAGS.get(raw.strip().lower())) is None:
            raise SettingError(f"environment variable {key}={raw!r} is not a flag: {key} takes 1 or 0 (or true/false, "
                               "yes/no, on/off); fix its value or unset it")  # fmt: skip
        return flag
    try:
        value = kind(raw)
    except ValueError:
        what, example = _KINDS.get(kind, (f"a {kind.__name__}", f"a {kind.__name__}"))
        raise SettingError(f"environment variable {key}={raw!r} is not {what}: {key} takes "
                           f"{example.format(key=key)}; fix its value or unset it") from None  # fmt: skip
    if kind is float and value != value:  # NaN orders against nothing: a limit or timeout of NaN means nothing
        raise SettingError(f"environment variable {key}={raw!r} is not a number: {key} takes a number, e.g. {key}=1.5")
    return value


class ContextVar:
    """A named process-wide setting: created once from the same-named environment variable (converted to the type
    of `default`: int, float or str) or `default`; scoped with `Context(NAME=value)`; `.value` is writable."""

    _registry: dict[str, ContextVar] = {}
    value: Any

    def __init__(self, key: str, default: Any) -> None:
        if key in ContextVar._registry:
            raise SettingError(f"ContextVar {key!r} is already defined; import it instead of defining it twice")
        raw = os.environ.get(key)
        value = default if raw is None else parse_setting(key, raw, default)
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

    def tolist(self, obj: Any = None) -> list[Any]:
        """A string setting of comma-separated names as a list (`"long,half"` -> `["long", "half"]`; empty -> `[]`);
        with `obj`, each name looked up as an attribute of it (`EMULATED_DTYPES.tolist(dtypes)` -> dtypes)."""
        names = [n.strip() for n in str(self.value).split(",") if n.strip()]
        if obj is None:
            return names
        missing = [n for n in names if not hasattr(obj, n)]
        if missing:
            raise SettingAttributeError(f"{self.key}={self.value!r}: {obj!r} has no {', '.join(map(repr, missing))}")
        return [getattr(obj, n) for n in names]

    @staticmethod
    def get(key: str) -> ContextVar:
        """Look up a defined ContextVar by name."""
        if key not in ContextVar._registry:
            raise UnknownSettingError(
                f"unknown setting {key!r}; known settings: {', '.join(sorted(ContextVar._registry))}"
            )
        return ContextVar._registry[key]


def _scoped_value(cv: ContextVar, v: Any) -> Any:
    """v as a value of cv's kind (the type of its default), or a SettingTypeError naming what it takes."""
    kind = type(cv.default)
    if kind is float and isinstance(v, float) and v != v:  # (as parse_setting: a timeout or limit of NaN means nothing)
        raise SettingError(f"Context({cv.key}=nan): {cv.key} takes a number, e.g. {cv.key}={cv.default!r}; NaN orders "
                           "against nothing")  # fmt: skip
    if kind not in (int, float, str) or isinstance(v, kind) or (kind is not int and isinstance(v, (int, float))):
        return v  # (a string setting may take a number as it is: PROFILE=1, as its environment variable reads)
    try:
        if isinstance(v, str):
            return parse_setting(cv.key, v, cv.default)
    except SettingError:
        pass  # (its message names the environment; this value came from Context)
    else:
        if kind is not str and not isinstance(v, (str, float)) and hasattr(type(v), "__index__"):  # (a numpy int)
            return int(v)
    what = {int: "an int (or a bool)", float: "a number", str: "a string"}[kind]
    raise SettingTypeError(f"Context({cv.key}={v!r}): {cv.key} takes {what}, got {type(v).__name__}; pass e.g. "
                           f"{cv.key}={cv.default!r}")  # fmt: skip


class Context(contextlib.ContextDecorator):
    """Scope settings: `with Context(DEBUG=2): ...` restores the previous values on exit.

    Unknown names raise KeyError listing the known settings; a setting defined by a package that is imported later
    can still be scoped once it exists. A value must be of the setting's kind: an int setting takes an int (or a
    bool), a float one an int or float, a string one a string; a string given to a number setting is converted as
    the environment's would be. Anything else is a SettingTypeError (`DEBUG="abc"` failed later, deep inside a
    realize, as a TypeError of a comparison)."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.old: dict[str, Any] = {}

    def __enter__(self) -> Context:
        values = {k: _scoped_value(ContextVar.get(k), v) for k, v in self.kwargs.items()}  # all checked first
        for k, v in values.items():
            cv = ContextVar._registry[k]
            self.old[k] = cv.save()
            cv.value = v
        return self

    def __exit__(self, *exc: object) -> None:
        for k, v in self.old.items():
            ContextVar._registry[k].restore(v)


@dataclasses.dataclass(frozen=True)
class Target:
    """One DEV target, `[INTERFACE[:INDICES]+]DEVICE[:RENDERER[:ARCH]]`: device and renderer upper-cased, interface,
    indices and arch kept as written, every part "" when absent. `Target.parse("usb:0,1+amd:llvm:gfx950")`;
    repr() and str() write the syntax back (`Target.parse(repr(t)) == t`)."""

    device: str = ""
    renderer: str = ""
    arch: str = ""
    interface: str = ""
    indices: str = ""

    @staticmethod
    def parse(text: str) -> Target:
        head, plus, body = text.strip().rpartition("+")
        if head.count("+") or body.count(":") > 2 or head.count(":") > 1:
            raise SettingError(f"DEV target {text!r}: expected [INTERFACE[:INDICES]+]DEVICE[:RENDERER[:ARCH]] "
                               "(at most one '+', two ':' after it)")  # fmt: skip
        interface, _, indices = head.partition(":")
        device, _, rest = body.partition(":")
        renderer, _, arch = rest.partition(":")
        return Target(device.upper(), renderer.upper(), arch, interface, indices)

    @staticmethod
    def parse_all(text: str) -> list[Target]:
        """Every target of a DEV setting (targets are separated by ';'); `[Target()]` for an empty one."""
        return [Target.parse(t) for t in text.split(";") if t.strip()] or [Target()]

    def replacedefault(self, **defaults: str) -> Target:
        """This target with each empty field among `defaults` filled from it (set fields are kept)."""
        return dataclasses.replace(self, **{k: v for k, v in defaults.items() if not getattr(self, k)})

    def __str__(self) -> str:
        out = f"{self.interface}{':' + self.indices if self.indices else ''}+" if self.interface or self.indices else ""
        out += self.device + (f":{self.renderer}" if self.renderer or self.arch else "")
        return out + (f":{self.arch}" if self.arch else "")

    __repr__ = __str__


def _first_target_field(name: str) -> Any:
    """A property of TargetVar reading field `name` of its first target."""
    return property(lambda self: getattr(self.value[0], name), doc=f'The first DEV target\'s {name} ("" if unset).')


class TargetVar(ContextVar):
    """The DEV setting: its value is the list of `Target`s its text names (`DEV.value`, `[Target()]` when unset);
    assigning a string, a Target or a list of them re-parses. Other attributes (`DEV.device`, `.renderer`, `.arch`,
    `.interface`, `.indices`) read the first target and are "" when DEV is unset. Text is parsed when first read, so
    a malformed DEV raises RuntimeError where it is used, not at import."""

    _source: Any
    _parsed: list[Target] | None

    @property
    def value(self) -> list[Target]:
        if self._parsed is None:
            src = self._source
            if isinstance(src, Target):
                self._parsed = [src]
            elif isinstance(src, (list, tuple)):
                self._parsed = [t if isinstance(t, Target) else Target.parse(str(t)) for t in src] or [Target()]
            else:
                self._parsed = Target.parse_all(str(src))
        return self._parsed

    @value.setter
    def value(self, v: Any) -> None:
        self._source, self._parsed = v, None

    device = _first_target_field("device")
    renderer = _first_target_field("renderer")
    arch = _first_target_field("arch")
    interface = _first_target_field("interface")
    indices = _first_target_field("indices")

    def target(self, devtype: str, **defaults: str) -> Target:
        """The Target selecting device type `devtype`: the first naming it, else the first with no device, else
        `Target(device=devtype)`; empty fields filled from `defaults`, device set to `devtype`."""
        dt = devtype.upper()
        ts = self.value
        t = next((t for t in ts if t.device == dt), None) or next((t for t in ts if not t.device), Target())
        return dataclasses.replace(t.replacedefault(**defaults), device=dt)

    def __bool__(self) -> bool:
        return any(t != Target() for t in self.value)

    def __eq__(self, x: object) -> bool:
        return self.value == x or (isinstance(x, str) and repr(self) == x)

    __hash__ = ContextVar.__hash__

    def __repr__(self) -> str:
        return ";".join(map(repr, self.value)) if self else ""


DEBUG = ContextVar("DEBUG", 0)
SPEC = ContextVar("SPEC", 0)
PMCOMPILE = ContextVar("PMCOMPILE", 1)
# 0 turns off every on-disk cache (compiled objects, BEAM winners); any value >= 1 enables them
CACHELEVEL = ContextVar("CACHELEVEL", 2)
# the target devices, `[INTERFACE[:INDICES]+]DEVICE[:RENDERER[:ARCH]]`, several split by ';' (the first is the default)
DEV = TargetVar("DEV", "")
DEV.default = [Target()]


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
