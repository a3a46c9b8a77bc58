"""The settings table: every setting speck reads is declared once here or in its package's settings module through
`declare`, with its type (its default's), default, owner package, the modules that read it and, for a name kept for
tinygrad's users that selects nothing here, why it changes nothing. This module and the ContextVar it builds on
(speck.uop.helpers) are the only code that reads the environment for settings; every setting is a ContextVar, so
`Context(NAME=value)` scopes each of them.

A `live` setting is read from the environment at each use (unless a Context sets it): what parent processes and
test harnesses set for the process as it runs (cache directories, library paths). The others are read once, when
declared."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from speck.uop.errors import SettingError
from speck.uop.helpers import CACHELEVEL, DEBUG, DEV, PMCOMPILE, SPEC, ContextVar, parse_setting


@dataclass(frozen=True)
class Setting:
    name: str
    default: Any
    owner: str  # the package that declares it ("speck.hcq")
    readers: tuple[str, ...]  # the modules that read it
    doc: str
    noop: str = ""  # why a setting kept for tinygrad's users changes nothing here ("": it is read)
    live: bool = False  # read from the environment at each use

    @property
    def type(self) -> type:
        return type(self.default)


TABLE: dict[str, Setting] = {}


class LiveVar(ContextVar):
    """A setting read from the environment at each use; `Context` (or assigning `.value`) overrides it."""

    _UNSET: Any = object()

    def __init__(self, key: str, default: Any) -> None:  # (no super().__init__: the value is read at each use)
        if key in ContextVar._registry:
            raise SettingError(f"ContextVar {key!r} is already defined; import it instead of defining it twice")
        self.key, self.default, self._override = key, default, LiveVar._UNSET
        ContextVar._registry[key] = self

    @property
    def value(self) -> Any:
        if self._override is not LiveVar._UNSET:
            return self._override
        raw = os.environ.get(self.key)
        return self.default if raw is None or raw == "" else parse_setting(self.key, raw, self.default)

    @value.setter
    def value(self, v: Any) -> None:
        self._override = v

    def save(self) -> Any:
        return self._override

    def restore(self, state: Any) -> None:
        self._override = state


def declare(name: str, default: Any, owner: str, readers: Sequence[str], doc: str, noop: str = "",
            live: bool = False, also: str = "", var: ContextVar | None = None,
            minimum: float | None = None, maximum: float | None = None) -> Any:  # fmt: skip
    """Declare a setting and return its ContextVar (`var`: one made before this table existed). `also`: an older
    spelling read when NAME is not set. `minimum`/`maximum`: the range of values that mean something (a number
    setting read from the environment outside it is a SettingError naming it, not a failure far from where it was
    set)."""
    if name in TABLE:
        raise SettingError(f"setting {name!r} is declared twice ({TABLE[name].owner} and {owner}); import it instead")
    TABLE[name] = Setting(name, default, owner, tuple(readers), doc, noop, live)
    if var is not None:
        return var
    if live:
        return LiveVar(name, default)
    if also and name not in os.environ and (raw := os.environ.get(also)):
        default = parse_setting(also, raw, default)
    cv = ContextVar(name, default)
    if minimum is not None and cv.value < minimum:
        raise SettingError(f"environment variable {name}={cv.value!r} is below {minimum}, the least it takes ({doc}); "
                           "raise it or unset it")  # fmt: skip
    if maximum is not None and cv.value > maximum:
        raise SettingError(f"environment variable {name}={cv.value!r} is above {maximum}, the most it takes ({doc}); "
                           "lower it or unset it")  # fmt: skip
    return cv


def unread_settings(references: dict[str, set[str]]) -> list[str]:
    """Declared settings that are not no-ops and that no module reads: `references` maps a setting's name to the
    modules that mention it (the design test reads them from the source)."""
    return sorted(n for n, s in TABLE.items() if not s.noop and not references.get(n))


# ---------------- speck.uop's settings ----------------
declare("DEBUG", 0, "speck.uop", ("speck.hcq.runner", "speck.codegen.program"), "1+: messages; 2: a line per "
        "kernel run; 3: kernel ASTs; 4: program sources; 7: machine code", var=DEBUG)  # fmt: skip
declare("SPEC", 0, "speck.uop", ("speck.codegen.pipeline",), "check the UOp spec after every codegen stage", var=SPEC)
declare("PMCOMPILE", 1, "speck.uop", ("speck.uop.upat",), "compile pattern matchers to Python", var=PMCOMPILE)
declare("CACHELEVEL", 2, "speck.uop", ("speck.codegen.cache.store",), "0 turns off every on-disk cache",
        var=CACHELEVEL)  # fmt: skip
declare("DEV", "", "speck.uop", ("speck.hcq.registry",), "the default device as DEV targets: "
        "[INTERFACE[:INDICES]+]DEVICE[:RENDERER[:ARCH]], ';'-separated", var=DEV)  # fmt: skip
