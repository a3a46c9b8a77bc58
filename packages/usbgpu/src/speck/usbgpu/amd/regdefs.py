"""The value types of the generated AMD tables (speck.usbgpu.amd.tables): registers with their fields, command
packets with their fields, and packed C structures. Both the driver and the simulator read every register offset,
field position, packet layout and structure layout through these, so neither side types a hardware number.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from speck.usbgpu.errors import FieldError as FieldError

_FORMATS = {"B": 1, "H": 2, "I": 4, "Q": 8}


def _mask(width: int) -> int:
    return (1 << width) - 1


def _check_value(owner: str, name: str, value: int, width: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise FieldError(f"{owner}.{name} takes an int, got {type(value).__name__} {value!r}")
    if not 0 <= value <= _mask(width):
        raise FieldError(f"{owner}.{name} is {width} bits wide; {value:#x} does not fit")
    return value


@dataclass(frozen=True)
class Reg:
    """One MMIO register: its IP block, dword offset inside that block's base segment `base_idx`, reset value and
    fields {name: (shift, width)}. The byte address on a card is (ip base[base_idx] + offset) * 4, with the bases read
    from the card's IP discovery table."""

    ip: str
    name: str
    offset: int
    base_idx: int
    default: int
    fields: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    def _field(self, name: str) -> tuple[int, int]:
        try:
            return self.fields[name]
        except KeyError:
            raise FieldError(f"register {self.name} has no field {name!r} (fields: {', '.join(self.fields)})") from None

    def encode(self, base: int | None = None, /, **values: int) -> int:
        """`base` (default: the reset value) with the named fields replaced."""
        word = self.default if base is None else base
        for name, value in values.items():
            shift, width = self._field(name)
            value = _check_value(self.name, name, value, width)
            word = (word & ~(_mask(width) << shift)) | value << shift
        return word & 0xFFFFFFFF

    def get(self, word: int, name: str) -> int:
        """The value of field `name` in the register value `word`."""
        shift, width = self._field(name)
        return word >> shift & _mask(width)

    def mask(self, name: str) -> int:
        shift, width = self._field(name)
        return _mask(width) << shift

    def decode(self, word: int) -> dict[str, int]:
        return {name: word >> shift & _mask(width) for name, (shift, width) in self.fields.items()}


@dataclass(frozen=True)
class Packet:
    """A command packet layout: `dwords` is its length without variable payload, fields {name: (dword, shift,
    width)}. PM4 body fields count dwords from the header (dword 0)."""

    name: str
    dwords: int
    fields: Mapping[str, tuple[int, int, int]]

    def _field(self, name: str) -> tuple[int, int, int]:
        try:
            return self.fields[name]
        except KeyError:
            raise FieldError(f"packet {self.name} has no field {name!r} (fields: {', '.join(self.fields)})") from None

    def encode(self, into: list[int] | None = None, /, **values: int) -> list[int]:
        """The packet's dwords with the named fields set (others 0), or `into` updated in place."""
        out = into if into is not None else [0] * self.dwords
        for name, value in values.items():
            dword, shift, width = self._field(name)
            value = _check_value(self.name, name, value, width)
            out[dword] = (out[dword] & ~(_mask(width) << shift)) | value << shift
        return out

    def get(self, dwords: Sequence[int], name: str) -> int:
        dword, shift, width = self._field(name)
        return dwords[dword] >> shift & _mask(width)

    def mask(self, name: str) -> tuple[int, int]:
        """(dword index, mask within that dword) of field `name`."""
        dword, shift, width = self._field(name)
        return dword, _mask(width) << shift

    def decode(self, dwords: Sequence[int]) -> dict[str, int]:
        return {n: dwords[d] >> s & _mask(w) for n, (d, s, w) in self.fields.items() if d < len(dwords)}


# A structure member: (byte offset, format char "B"/"H"/"I"/"Q" or a nested Struct, count, bit shift, bit width);
# count 0 marks a flexible array at the end; bit width 0 means the whole unit.
Member = tuple[int, "str | Struct", int, int, int]


@dataclass(frozen=True)
class Struct:
    """A packed little-endian C structure (or union: every member at offset 0): size in bytes (without a flexible
    array member) and its members."""

    name: str
    size: int
    members: Mapping[str, Member]
    union: bool = False

    def offset(self, name: str) -> int:
        return self._member(name)[0]

    def _member(self, name: str) -> Member:
        try:
            return self.members[name]
        except KeyError:
            raise FieldError(f"struct {self.name} has no member {name!r}") from None

    def unpack(self, buf: bytes | bytearray | memoryview, offset: int = 0) -> dict[str, Any]:
        """The members of the structure at `buf[offset:]` (nested structures and arrays as dicts and lists;
        a flexible array member is left out)."""
        if offset < 0 or offset + self.size > len(buf):
            raise FieldError(
                f"struct {self.name} needs {self.size} bytes at offset {offset}, the buffer has {len(buf)}"
            )
        out: dict[str, Any] = {}
        for name, (off, kind, count, shift, width) in self.members.items():
            if count == 0:
                continue
            items = [self._one(buf, offset + off, kind, i, shift, width) for i in range(count)]
            out[name] = items[0] if count == 1 else items
        return out

    @staticmethod
    def _one(buf: bytes | bytearray | memoryview, at: int, kind: str | Struct, i: int, shift: int, width: int) -> Any:
        if isinstance(kind, Struct):
            return kind.unpack(buf, at + i * kind.size)
        size = _FORMATS[kind]
        value = int.from_bytes(bytes(buf[at + i * size : at + (i + 1) * size]), "little")
        return value >> shift & _mask(width) if width else value

    def pack(self, /, **values: Any) -> bytearray:
        """The structure's bytes with the named members set (the rest zero). Nested structures take dicts, arrays
        take sequences."""
        buf = bytearray(self.size)
        self.pack_into(buf, 0, **values)
        return buf

    def pack_into(self, buf: bytearray, offset: int, /, **values: Any) -> None:
        for name, value in values.items():
            off, kind, count, shift, width = self._member(name)
            items = list(value) if count != 1 else [value]
            if count and len(items) > count:
                raise FieldError(f"struct {self.name}.{name} holds {count} items, got {len(items)}")
            for i, item in enumerate(items):
                if isinstance(kind, Struct):
                    kind.pack_into(buf, offset + off + i * kind.size, **item)
                    continue
                size = _FORMATS[kind]
                at = offset + off + i * size
                if width:
                    _check_value(self.name, name, item, width)
                    old = int.from_bytes(buf[at : at + size], "little")
                    item = (old & ~(_mask(width) << shift)) | item << shift
                else:
                    _check_value(self.name, name, item, 8 * size)
                buf[at : at + size] = item.to_bytes(size, "little")


def dwords(data: bytes | bytearray | memoryview) -> tuple[int, ...]:
    """Little-endian dwords of `data` (a multiple of 4 bytes)."""
    return struct.unpack(f"<{len(data) // 4}I", data)
