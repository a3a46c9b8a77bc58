"""The device registry (`Device["CPU"]`, `Device.DEFAULT`) and the plugin hook that adds device kinds to it.

A device kind is registered with `register_device("NAME", opener)`: each device module of speck.hcq registers its own
kind when imported (speck.hcq imports them all), installed packages add kinds through the `speck.devices` entry-point
group (each entry point is a function that calls register_device), and speck.tensor registers USB."""

from __future__ import annotations

import functools
import re
import threading
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from speck.hcq.errors import DefaultDeviceAssignmentError, DeviceNotFoundError, HCQValueError
from speck.hcq.interfaces import DeviceLike
from speck.uop.helpers import DEV, Target

# DEV (speck.uop.helpers) names the default device as targets ("CPU", "CPU:X86", "USB+NULL"; see parse_dev)


# ---------------- device kinds: the plugin hook ----------------
Opener = Callable[[str], DeviceLike]  # (the device modules' classes: DeviceBase subclasses)


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device: `open(canonical_name)` builds a device; `suffix(text)` gives the canonical form of what
    follows "KIND:" in a name ("" for none) or None when that suffix is not valid for this kind; `forms` shows how
    names of the kind are written (for error messages); `probe` False keeps it out of `get_available_devices`
    (kinds opened only by name: DISK needs a path, USB claims a bridge and binds the process's libusb)."""

    name: str
    open: Opener
    suffix: Callable[[str], str | None]
    forms: tuple[str, ...]
    probe: bool = True
    serves: tuple[str, ...] = ()  # devices this kind is the interface to: DEV=<kind>+<device> opens this kind
    file_backed: bool = False  # its devices' buffers are regions of a file (DeviceBase.file_backed), known unopened


def numbered(rest: str) -> str | None:
    """Suffix rule of numbered devices: "" or "0" -> "" (device 0), "3" -> "3"."""
    if rest in ("", "0"):
        return ""
    return rest if re.fullmatch(r"[1-9][0-9]*", rest) else None


_KINDS: dict[str, DeviceKind] = {}
_entry_points_loaded = False


def register_device(
    name: str,
    opener: Opener,
    *,
    suffix: Callable[[str], str | None] = numbered,
    forms: Sequence[str] | None = None,
    probe: bool = True,
    serves: Sequence[str] = (),
    file_backed: bool = False,
) -> DeviceKind:
    """Add (or replace) the device kind `name` ("USB"): `Device["USB:1"]` then calls `opener("USB:1")` once. The
    default suffix rule accepts NAME and NAME:<n>; `probe=False` for kinds `get_available_devices` must not open;
    `serves`: the devices it is the interface to (USB serves AMD: DEV=USB+AMD, DEV=USB:1+AMD open USB, USB:1);
    `file_backed`: the kind's devices declare DeviceBase.file_backed (so it can be asked without opening one)."""
    kind_name = name.upper()
    if not re.fullmatch(r"[A-Z][A-Z0-9_]*", kind_name):
        raise HCQValueError(f"device kind names are letters, digits and _, starting with a letter; got {name!r}")
    kind = DeviceKind(kind_name, opener, suffix, tuple(forms) if forms else (kind_name, f"{kind_name}:<n>"), probe,
                      tuple(d.upper() for d in serves), file_backed)  # fmt: skip
    _KINDS[kind_name] = kind
    return kind


def _load_entry_points() -> None:
    """Let installed packages register their kinds (entry-point group `speck.devices`), once per process."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="speck.devices"):
        try:
            ep.load()()
        except Exception as e:  # a broken plugin must not take the built-in devices down with it
            warnings.warn(f"speck.devices entry point {ep.name!r} ({ep.value}) failed to register: {e!r}",
                          stacklevel=2)  # fmt: skip


def device_kinds() -> dict[str, DeviceKind]:
    """Every registered kind (entry points included), by name."""
    _load_entry_points()
    return dict(_KINDS)


def known_devices() -> tuple[str, ...]:
    """How every registered device name is written, for listings and error messages."""
    return tuple(f for k in device_kinds().values() for f in k.forms)


def _unknown(name: object, why: str = "") -> DeviceNotFoundError:
    return DeviceNotFoundError(f"unknown device {name!r}{why}; known devices: {', '.join(known_devices())}")


def canonicalize(name: str) -> str:
    """Canonical device name: upper-case kind, the kind's canonical suffix, ":0" dropped ("cpu:0" -> "CPU",
    "cpu:llvm" -> "CPU:LLVM"; a DISK path kept verbatim). Raises DeviceNotFoundError listing the known names."""
    kind, suffix = _kind_and_suffix(name)
    return f"{kind.name}:{suffix}" if suffix else kind.name


def kind_of(name: str) -> DeviceKind:
    """The registered kind of device `name` (what it declares, without opening the device). Raises
    DeviceNotFoundError listing the known names."""
    return _kind_and_suffix(name)[0]


def _kind_and_suffix(name: str) -> tuple[DeviceKind, str]:
    if not isinstance(name, str) or not name:
        raise _unknown(name, " (device names are non-empty strings)")
    kind_name, _, rest = name.partition(":")
    kind = _KINDS.get(kind_name.upper())
    if kind is None:
        _load_entry_points()
        kind = _KINDS.get(kind_name.upper())
    if kind is None:
        raise _unknown(name)
    suffix = kind.suffix(rest)
    if suffix is None:
        raise _unknown(name, f" ({kind.name} names are written {' or '.join(kind.forms)})")
    return kind, suffix


@functools.lru_cache(maxsize=64)  # Device.DEFAULT is read whenever a tensor is made without a device
def parse_dev(target: str | Target) -> str:
    """The default device named by a DEV target (text `[INTERFACE+]DEVICE[:RENDERER[:ARCH]]`, several split by ';':
    the first is used). A CPU renderer picks the CPU device built on that backend ("CPU:X86")."""
    first = target if isinstance(target, Target) else Target.parse_all(target)[0]
    dev = first.device or "CPU"
    via = _KINDS.get(first.interface.upper()) if first.interface else None
    if via is not None and dev in via.serves:  # the device through its interface ("USB+AMD": the USB kind)
        index = first.indices.split(",")[0]
        return canonicalize(f"{via.name}:{index}" if index else via.name)
    return canonicalize(f"{dev}:{first.renderer}" if first.renderer else dev)


class _DeviceRegistry:
    """`Device[name]` opens (once) and returns the device called `name`; `Device.DEFAULT` is `$DEV` or "CPU"."""

    def __init__(self) -> None:
        self._open: dict[str, DeviceLike] = {}
        self._lock = threading.Lock()

    def canonicalize(self, name: str | Sequence[str] | None) -> Any:
        """Canonical name; None -> DEFAULT; a tuple/list canonicalizes each name (one name collapses to a str)."""
        if name is None:
            return self.DEFAULT
        if isinstance(name, (tuple, list)):
            names = tuple(canonicalize(n) for n in name)
            return names[0] if len(names) == 1 else names
        return canonicalize(str(name))

    def __getitem__(self, name: str) -> DeviceLike:
        try:
            return self._open[name]
        except (KeyError, TypeError):
            pass
        canon = canonicalize(name)
        with self._lock:
            if (dev := self._open.get(canon)) is None:
                dev = self._open[canon] = _KINDS[canon.partition(":")[0]].open(canon)
            self._open[name] = dev
        return dev

    @property
    def DEFAULT(self) -> str:
        """The default device: the DEV setting's first target, else "CPU"."""
        try:
            return parse_dev(DEV.value[0])
        except DeviceNotFoundError as e:  # (the name came from the environment: say which setting holds it)
            dev = ";".join(str(t) for t in DEV.value)
            raise DeviceNotFoundError(f"the DEV setting (DEV={dev}) names no device: {e}; set DEV to one of them or "
                                      "unset it") from None  # fmt: skip

    @DEFAULT.setter
    def DEFAULT(self, name: str | None) -> None:
        # (a default assigned here would also silently outlive every later Context(DEV=...))
        raise DefaultDeviceAssignmentError(
            f"Device.DEFAULT can't be assigned (got {name!r}); the DEV setting chooses it: use "
            f"`with Context(DEV={name!r}):` for a block, or `DEV.value = {name!r}` (speck.tensor.helpers.DEV)"
        )

    @property
    def default(self) -> DeviceLike:
        """The default device object (`Device[Device.DEFAULT]`)."""
        return self[self.DEFAULT]

    def get_available_devices(self) -> Iterator[str]:
        """Device kinds that open on this machine, in auto-selection order (kinds registered with probe=False are
        left out: they open only by name)."""
        for kind, info in device_kinds().items():
            if not info.probe:
                continue
            try:
                self[kind]
            except Exception:
                continue
            yield kind

    @property
    def opened(self) -> list[str]:
        """Canonical names of the devices opened so far."""
        return sorted({d.name for d in self._open.values()})

    def known(self) -> tuple[str, ...]:
        return known_devices()

    def finalize_all(self) -> None:
        for dev in {id(d): d for d in self._open.values()}.values():
            dev.finalize()


Device = _DeviceRegistry()
