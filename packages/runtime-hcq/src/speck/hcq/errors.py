"""Every exception speck.hcq raises on purpose, in one place. Each message names what was expected, what was found
and, where there is one, what to do about it."""

from __future__ import annotations

from speck.uop.errors import reduce_error


class HCQError(RuntimeError):
    """Base class of speck.hcq's runtime errors."""

    __reduce__ = reduce_error  # pickles class, args and attributes (errors cross process boundaries)


class SignalTimeoutError(HCQError, TimeoutError):
    """A wait on a timeline signal did not see the awaited value in time. Carries the signal, the value awaited and
    the value seen, which is usually enough to tell a missing submit from a wedged kernel."""

    def __init__(self, signal_name: str, awaited: int, seen: int, timeout: float) -> None:
        super().__init__(
            f"signal {signal_name!r} did not reach {awaited} within {timeout:g} s (it is at {seen}); is the command "
            "that signals it submitted, and is nothing ahead of it waiting on a signal that never comes?"
        )
        self.signal_name, self.awaited, self.seen, self.timeout = signal_name, awaited, seen, timeout


class OutOfMemoryError(HCQError, MemoryError):
    """An allocation did not fit in the device's memory (after the LRU cache of freed allocations was emptied)."""

    def __init__(self, device: str, requested: int, available: int, detail: str = "", limit_setting: str = "") -> None:
        super().__init__(
            f"out of memory on {device}: requested {requested} bytes, {available} bytes available"
            + (f" ({detail})" if detail else "")
            + "; free some buffers"
            + (f", or raise {limit_setting}" if limit_setting else "")
        )
        self.device, self.requested, self.available = device, requested, available


class ProgramArgumentError(HCQError, ValueError):
    """A program was called with buffers or variables that do not match what it expects (count, size, dtype,
    device). Raised before anything runs, so no buffer is touched."""


class CopySizeError(HCQError, ValueError):
    """A copy between a buffer and host memory (or between two buffers) whose byte sizes differ."""


class DeviceNotFoundError(HCQError, KeyError, ModuleNotFoundError):
    """An unknown device name; the message lists the known ones. A ModuleNotFoundError as for an unknown device type
    in tinygrad, and a KeyError as a failed registry lookup."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class DefaultDeviceAssignmentError(HCQError, AttributeError):
    """`Device.DEFAULT = ...`: the default device is the DEV setting's to choose (Context(DEV=...) or DEV.value)."""


class DeviceUnavailableError(HCQError):
    """A registered device whose backend is not installed or not implemented yet."""


class ElfLinkError(HCQError):
    """An ELF object could not be loaded: unsupported format or relocation, undefined symbol, out-of-range fixup."""


class CodeObjectError(ElfLinkError, ValueError):
    """An HSA code object (an AMDGPU ELF shared object) that is truncated, corrupt or not one: the message names the
    object, the place (header, section, note, descriptor, metadata field) and what was expected."""


class ElfSymbolError(ElfLinkError, KeyError):
    """A symbol asked of a loaded object (the kernel's function) that the object does not define. A KeyError too, so
    lookups can treat it as a missing key; an ElfLinkError, so a loader that retries a bad object sees it."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0])


class HCQValueError(HCQError, ValueError):
    """A bad argument value: a negative size, a view outside its buffer, a byte count that can't be read, a device
    kind name that isn't one, a timeline signal set backwards."""


class HCQTypeError(HCQError, TypeError):
    """An argument of the wrong kind: a dtype with no numpy equivalent, a kernel call with the wrong argument count."""


class BufferStateError(HCQError):
    """A buffer used in a way its state does not allow (allocated twice, a host view of memory the host can't map)."""


class GraphArgumentError(HCQError, IndexError):
    """A graph command's argument index outside that command's arguments."""


class LibraryLoadError(HCQError, OSError):
    """A shared library a device needs could not be found or opened; the message names the setting to point at it."""


class HostMappingError(OSError, HCQError):
    """The OS refused to map or protect host memory (mmap, mprotect); `errno` says why. An OSError first, so the
    allocator's retry and the caller's `except OSError` see it as the OS's refusal."""


class CorruptFileError(HCQError, ValueError):
    """Bytes read from a file do not match the checksum the file's own container recorded for them (a zip member's
    CRC-32): the file was damaged after it was written. The message names the range, the member and both sums."""
