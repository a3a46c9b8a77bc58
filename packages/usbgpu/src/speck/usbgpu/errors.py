"""speck.usbgpu's exceptions. libusb errors and transfer statuses become named classes generated from libusb's tables.

Every libusb-level exception carries `.operation` (what speck was doing, e.g. "bulk OUT 0x02 (4096 bytes)"),
`.code` (the libusb_error or libusb_transfer_status value), `.libusb_name` and `.libusb_message` (libusb's own
name and text). Asynchronous completion errors are latched by the C helper and raised by the next wait
(PROTOCOL.md 4.6); the latch is never cleared, so the driver must be reopened.

A transfer-status class also derives from the matching libusb_error class (a stalled async transfer is a
`TransferStallError` and a `UsbPipeError`), so `except UsbNoDeviceError` catches a disconnect whichever way it
surfaced.
"""

from __future__ import annotations

from typing import Any, NamedTuple

__all__ = [
    "BridgeError",
    "CodeObjectError",
    "CopyCancelledError",
    "CopyWaitTimeout",
    "DeviceInUseError",
    "DeviceUnusableError",
    "EmulationError",
    "F4BailError",
    "FieldError",
    "GpuBringUpError",
    "GpuBringUpUnverified",
    "GpuFault",
    "GpuFenceTimeout",
    "LockFileError",
    "GpuHang",
    "GpuNotSupported",
    "HelperBuildMismatch",
    "HelperImportError",
    "LIBUSB_ERRORS",
    "LIBUSB_TRANSFER_STATUSES",
    "LibusbLoadError",
    "PcieLinkError",
    "PcieSetupError",
    "ShaderError",
    "ShaderHang",
    "ShaderHazardError",
    "ShaderMemoryFault",
    "ShaderTrap",
    "SimAccessError",
    "SimNotImplementedError",
    "TlpCompletionError",
    "TlpError",
    "TransferCancelledError",
    "TransferError",
    "TransferFailedError",
    "TransferNoDeviceError",
    "TransferOverflowError",
    "TransferShortError",
    "TransferShortReadError",
    "TransferStallError",
    "TransferTimedOutError",
    "UsbAccessError",
    "UsbBusyError",
    "UsbClosedError",
    "UsbDeviceNotFound",
    "UsbError",
    "UsbGpuError",
    "UsbGpuTypeError",
    "UsbGpuUsageError",
    "UsbGpuValueError",
    "UsbInterruptedError",
    "UsbInvalidParamError",
    "UsbIoError",
    "UsbLibraryConflict",
    "UsbNoDeviceError",
    "UsbNoMemError",
    "UsbNotFoundError",
    "UsbNotSupportedError",
    "UsbOtherError",
    "UsbOverflowError",
    "UsbPipeError",
    "UsbTimeoutError",
    "UsbWaitTimeout",
    "VramAllocError",
    "error_for_code",
    "error_for_status",
]


class LibusbCode(NamedTuple):
    """One row of a libusb table: numeric value, libusb's enum name, libusb's English message, speck's class name."""

    value: int
    name: str
    message: str
    class_name: str
    hint: str = ""


# libusb_error (libusb.h) with libusb_strerror's English text; the hint says what to do about it.
LIBUSB_ERRORS: tuple[LibusbCode, ...] = (
    LibusbCode(-1, "LIBUSB_ERROR_IO", "Input/Output Error", "UsbIoError"),
    LibusbCode(-2, "LIBUSB_ERROR_INVALID_PARAM", "Invalid parameter", "UsbInvalidParamError"),
    LibusbCode(
        -3,
        "LIBUSB_ERROR_ACCESS",
        "Access denied (insufficient permissions)",
        "UsbAccessError",
        "run as root or add a udev rule granting access to the bridge",
    ),
    LibusbCode(
        -4,
        "LIBUSB_ERROR_NO_DEVICE",
        "No such device (it may have been disconnected)",
        "UsbNoDeviceError",
        "the device is gone: reconnect it and reopen",
    ),
    LibusbCode(-5, "LIBUSB_ERROR_NOT_FOUND", "Entity not found", "UsbNotFoundError"),
    LibusbCode(
        -6,
        "LIBUSB_ERROR_BUSY",
        "Resource busy",
        "UsbBusyError",
        "another process or kernel driver holds the interface; close it first",
    ),
    LibusbCode(-7, "LIBUSB_ERROR_TIMEOUT", "Operation timed out", "UsbTimeoutError"),
    LibusbCode(-8, "LIBUSB_ERROR_OVERFLOW", "Overflow", "UsbOverflowError"),
    LibusbCode(-9, "LIBUSB_ERROR_PIPE", "Pipe error", "UsbPipeError", "the endpoint stalled or refused the request"),
    LibusbCode(
        -10, "LIBUSB_ERROR_INTERRUPTED", "System call interrupted (perhaps due to signal)", "UsbInterruptedError"
    ),
    LibusbCode(
        -11,
        "LIBUSB_ERROR_NO_MEM",
        "Insufficient memory",
        "UsbNoMemError",
        "on Linux the usbfs memory cap may be too small (/sys/module/usbcore/parameters/usbfs_memory_mb)",
    ),
    LibusbCode(
        -12,
        "LIBUSB_ERROR_NOT_SUPPORTED",
        "Operation not supported or unimplemented on this platform",
        "UsbNotSupportedError",
    ),
    LibusbCode(-99, "LIBUSB_ERROR_OTHER", "Other error", "UsbOtherError"),
)

# libusb_transfer_status (libusb.h) with the meaning libusb documents; COMPLETED is not an error.
# The last field of each row names the libusb_error class the status also derives from.
LIBUSB_TRANSFER_STATUSES: tuple[tuple[LibusbCode, str], ...] = (
    (LibusbCode(1, "LIBUSB_TRANSFER_ERROR", "Transfer failed", "TransferFailedError"), "UsbIoError"),
    (LibusbCode(2, "LIBUSB_TRANSFER_TIMED_OUT", "Transfer timed out", "TransferTimedOutError"), "UsbTimeoutError"),
    (LibusbCode(3, "LIBUSB_TRANSFER_CANCELLED", "Transfer was cancelled", "TransferCancelledError"), "UsbIoError"),
    (
        LibusbCode(
            4,
            "LIBUSB_TRANSFER_STALL",
            "Halt condition detected (endpoint stalled)",
            "TransferStallError",
            "the endpoint stalled: reopen the device (open resets the endpoints)",
        ),
        "UsbPipeError",
    ),
    (
        LibusbCode(
            5,
            "LIBUSB_TRANSFER_NO_DEVICE",
            "Device was disconnected",
            "TransferNoDeviceError",
            "the device is gone: reconnect it and reopen",
        ),
        "UsbNoDeviceError",
    ),
    (
        LibusbCode(6, "LIBUSB_TRANSFER_OVERFLOW", "Device sent more data than requested", "TransferOverflowError"),
        "UsbOverflowError",
    ),
)


def _rebuild_error(cls: type[BaseException], args: tuple[Any, ...]) -> BaseException:
    """Unpickle an exception without calling its __init__ (see UsbGpuError.__reduce__)."""
    solid: Any = cls  # the builtin base whose __new__ lays the instance out (OSError's for an OSError subclass)
    while solid.__module__ != "builtins":
        solid = solid.__base__
    exc: BaseException = solid.__new__(cls, *args)
    exc.args = args  # OSError.__new__ leaves them to __init__ when a subclass has its own
    return exc


class UsbGpuError(Exception):
    """Base of every exception speck.usbgpu raises on purpose: `except UsbGpuError` catches them all. USB-, bridge-
    and GPU-level failures are UsbErrors; bad arguments and misuse derive from the builtin class users expect too."""

    def __reduce__(self) -> tuple[Any, ...]:
        # class, args and attributes: the default (class(*args)) would pass the formatted message to __init__ as the
        # operation, giving "... failed failed", and fails for classes whose __init__ takes other parameters
        return _rebuild_error, (type(self), self.args), self.__dict__ or None


class UsbError(UsbGpuError):
    """Base of every USB-level error raised by speck.usbgpu."""

    code: int = 0
    libusb_name: str = ""
    default_message: str = ""
    hint: str = ""

    def __init__(self, operation: str, libusb_message: str | None = None, detail: str = "") -> None:
        self.operation = operation
        self.libusb_message = libusb_message if libusb_message else self.default_message
        self.detail = detail
        super().__init__(self._format())

    def _format(self) -> str:
        text = f"{self.operation} failed"
        if self.libusb_name:
            text += f": {self.libusb_name} ({self.libusb_message})"
        elif self.libusb_message:
            text += f": {self.libusb_message}"
        if self.detail:
            text += f"; {self.detail}"
        if self.hint:
            text += f"; {self.hint}"
        return text


class TransferError(UsbError):
    """An asynchronous transfer completed badly; raised (sticky) by the wait after the completion."""

    tag: int | None = None


# One class per table row. Their codes, libusb names, messages, hints and docstrings are filled in from the tables
# below by _bind_tables(), which also checks that every row has its class and the right bases.
class UsbIoError(UsbError): ...


class UsbInvalidParamError(UsbError): ...


class UsbAccessError(UsbError): ...


class UsbNoDeviceError(UsbError): ...


class UsbNotFoundError(UsbError): ...


class UsbBusyError(UsbError): ...


class UsbTimeoutError(UsbError): ...


class UsbOverflowError(UsbError): ...


class UsbPipeError(UsbError): ...


class UsbInterruptedError(UsbError): ...


class UsbNoMemError(UsbError): ...


class UsbNotSupportedError(UsbError): ...


class UsbOtherError(UsbError): ...


class TransferFailedError(TransferError, UsbIoError): ...


class TransferTimedOutError(TransferError, UsbTimeoutError): ...


class TransferCancelledError(TransferError, UsbIoError): ...


class TransferStallError(TransferError, UsbPipeError): ...


class TransferNoDeviceError(TransferError, UsbNoDeviceError): ...


class TransferOverflowError(TransferError, UsbOverflowError): ...


_BY_CODE: dict[int, type[UsbError]] = {}
_BY_STATUS: dict[int, type[TransferError]] = {}


def _bind_tables() -> None:
    """Attach each libusb table row to its class (the tables are the source of truth for codes and texts)."""
    namespace = globals()
    for row in LIBUSB_ERRORS:
        cls = namespace[row.class_name]
        assert issubclass(cls, UsbError) and not issubclass(cls, TransferError), row
        cls.code, cls.libusb_name, cls.default_message, cls.hint = row.value, row.name, row.message, row.hint
        cls.__doc__ = f"A libusb call failed with {row.name} ({row.message})."
        _BY_CODE[row.value] = cls
    for row, also in LIBUSB_TRANSFER_STATUSES:
        cls = namespace[row.class_name]
        assert issubclass(cls, TransferError) and issubclass(cls, namespace[also]), row
        cls.code, cls.libusb_name, cls.default_message = row.value, row.name, row.message
        cls.hint = row.hint or namespace[also].hint
        cls.__doc__ = f"An async transfer completed with {row.name} ({row.message})."
        _BY_STATUS[row.value] = cls


_bind_tables()


class TransferShortError(TransferError):
    """An async transfer completed with status COMPLETED but moved fewer bytes than submitted (latched as -1)."""

    code = -1
    libusb_name = "LIBUSB_TRANSFER_COMPLETED"
    default_message = "short completion"
    hint = "the device accepted less than it was sent: reopen the device"


class TransferShortReadError(TransferShortError):
    """A bulk IN ended early: the device sent a short packet before the length the read arm (or stream) covered."""

    default_message = "short read"
    hint = "the bridge ended the IN stream early (a short packet): reopen the device"


class UsbWaitTimeout(UsbTimeoutError):
    """A wait gave up while its transfer was still in flight (nothing is latched; the wait may be retried)."""

    default_message = "transfer still in flight when the wait timed out"


class UsbClosedError(UsbError):
    """The transport (or its async pool) was used after close()."""

    hint = "open a new UsbTransport"


class DeviceInUseError(UsbBusyError):
    """The bridge is already open: in another process (its lock file is held) or by another session in this one."""

    libusb_name = ""  # refused by speck's device lock before libusb was asked
    default_message = ""
    hint = "close the other session first (UsbGpu.close), or open a different bridge (index=...)"


class UsbDeviceNotFound(UsbError):
    """Discovery found no usable bridge; the message lists every candidate tried and why each failed."""

    def __init__(self, operation: str, candidates: list[str], hint: str) -> None:
        self.candidates = candidates
        self.hint = hint
        super().__init__(operation, "no usable device", "\n  " + "\n  ".join(candidates) if candidates else "")

    def _format(self) -> str:
        return f"{self.operation}: no usable device; tried:{self.detail}\n{self.hint}"


class LibusbLoadError(UsbError):
    """The libusb shared library (real or simulated) could not be loaded."""


class UsbLibraryConflict(LibusbLoadError):
    """A different libusb (real vs simulator) is already loaded; one process can use only one."""


class HelperImportError(UsbGpuError, ImportError):
    """The compiled async USB helper (speck.usbgpu._helper) is missing: the package was not built."""


class HelperBuildMismatch(HelperImportError):
    """The compiled helper was built for a different speck-usbgpu version than the Python code importing it."""


# --- bad arguments and misuse ---


class UsbGpuValueError(UsbGpuError, ValueError):
    """A bad argument value: a size, alignment, mode or index out of range, a buffer of another session; the message
    names the argument, the range it takes and the value given."""


class UsbGpuTypeError(UsbGpuError, TypeError):
    """An argument of the wrong kind (a non-int size, a read-only buffer to copy into, a non-model in sim=[...])."""


class FieldError(UsbGpuValueError):
    """A field name that the register, packet or structure does not have, or a value that does not fit its field."""


class UsbGpuUsageError(UsbGpuError, RuntimeError):
    """A call made where it is not allowed: closing a UsbGpu or issuing a synchronous operation from inside one of
    its own operations (a progress callback), declaring a setting twice."""


class LockFileError(UsbGpuError, OSError):
    """The device's lock file is not a regular file this process may use (a symlink, a FIFO, a directory): it is
    never followed, truncated or written through; the message names the path and what to remove."""


class CopyWaitTimeout(UsbGpuError, TimeoutError):
    """An asynchronous copy's wait(timeout) gave up while the copy kept running (wait again, or close to cancel)."""


class SimAccessError(UsbGpuError, IndexError):
    """The simulator's memory (bridge SRAM, VRAM) was accessed outside its size."""


class SimNotImplementedError(UsbGpuError, NotImplementedError):
    """Something the simulator does not model (an access spanning discontiguous pages, a page table entry past the
    end of VRAM); on hardware it would do something, so the simulator stops rather than guess."""


def error_for_code(code: int, operation: str, libusb_message: str | None = None, detail: str = "") -> UsbError:
    """The named exception for a negative libusb_error `code` raised during `operation`."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return UsbOtherError(operation, libusb_message or f"unknown libusb error {code}", detail)
    return cls(operation, libusb_message, detail)


def error_for_status(
    status: int, operation: str, actual_length: int, length: int, tag: int | None = None
) -> TransferError:
    """The named exception for an async transfer that completed with `status` (0 with a short length = short)."""
    detail = f"{actual_length}/{length} bytes transferred"
    if status == 0:
        err: TransferError = TransferShortError(operation, None, detail)
    else:
        cls = _BY_STATUS.get(status)
        if cls is None:
            err = TransferFailedError(operation, f"unknown transfer status {status}", detail)
        else:
            err = cls(operation, None, detail)
    err.tag = tag
    return err


# --- bridge / GPU errors ---
# Raised above the transport (speck.usbgpu.bridge / sdma / copyin / api): the USB transfers succeeded but the bridge
# firmware, the PCIe fabric or the GPU did not do what the protocol says. `operation` names the step.


class BridgeError(UsbError):
    """A bridge-firmware, PCIe or GPU-level step failed although its USB transfers completed."""


class PcieLinkError(BridgeError):
    """The bridge's downstream PCIe link did not come up (LTSSM never reached L0 = 0x78)."""

    hint = "check that the GPU is seated and powered; the bridge retrains the link on 0xF3(1)"


class TlpError(BridgeError):
    """The bridge's TLP engine kept reporting an error or poll timeout (ret_status != 0) through every retry."""

    hint = "the PCIe link may have dropped: power-cycle the GPU and reopen"


class TlpCompletionError(TlpError):
    """A non-posted TLP completed with a non-success status: UR, Completer Abort or Config Retry."""

    hint = "check the address: nothing on the fabric claimed it (UR) or the target refused it"


class PcieSetupError(BridgeError):
    """Bridge/BAR setup found something unexpected downstream (no GPU on bus 4, a BAR that cannot be placed)."""


class GpuFenceTimeout(BridgeError):
    """The GPU did not reach a fence or timeline value within the poll limit (hung queue or lost data)."""

    hint = "the GPU queue may be hung: reopen the device (open resets the SDMA queue)"


class F4BailError(BridgeError):
    """Every 0xF4 fence-gated arm attempt bailed: the device gave up waiting for the GPU fence."""

    hint = "the GPU is not draining the bounce buffers: reopen the device; USB_F4GATE=0 selects the E4 gate"


class VramAllocError(BridgeError):
    """An allocation does not fit in the GPU's VRAM (or its CPU-visible BAR)."""


class DeviceUnusableError(BridgeError):
    """The UsbGpu was closed or an earlier failure left it in an unknown state."""

    hint = "close it and open the device again (UsbGpu.open)"


class GpuBringUpError(BridgeError):
    """A step of bringing the GPU up failed: a bad discovery table, firmware that is missing or malformed, a
    management processor (PSP) that did not answer; `operation` names the step."""


class GpuNotSupported(GpuBringUpError):
    """The PCIe function behind the bridge is not a GPU speck drives (checked before anything is written to it)."""

    hint = "speck.usbgpu drives AMD RDNA3 cards (GC 11.0.x, SDMA 6.0.x) behind an ASM2464-class bridge"


class GpuBringUpUnverified(GpuBringUpError):
    """The card was never verified with speck's bring-up, and the caller did not opt in to running it anyway."""

    hint = (
        "bring-up (firmware loading through the PSP, GMC/VM setup, queue programming) follows the public amdgpu "
        "formats but was verified only against speck's simulator; to run it on this card at your own risk, open it "
        "with UsbGpu.open(unverified=True) or set SPECK_USBGPU_UNVERIFIED=1"
    )


class GpuFault(BridgeError):
    """A GPU queue stopped on a fault (a page fault, a bad packet, an illegal instruction). `record` describes it:
    the queue, the kind, the faulting address and access when known. Reset the queue (or reopen) to continue."""

    hint = (
        "the queue is stopped: UsbGpu.reset_queue() restarts the compute queue; after a failed copy, or to reset "
        "every queue, reopen the device (UsbGpu.open)"
    )

    def __init__(self, operation: str, record: object, detail: str = "") -> None:
        self.record = record
        super().__init__(operation, str(record), detail)


class GpuHang(GpuFenceTimeout):
    """A GPU queue made no progress within the timeout (or its hang watchdog fired); `queue` names it and `status`
    says what it was doing."""

    hint = (
        "the queue is hung: UsbGpu.reset_queue() restarts the compute queue; after a failed copy, or to reset every "
        "queue, reopen the device (UsbGpu.open)"
    )

    def __init__(self, operation: str, queue: str, status: str, detail: str = "") -> None:
        self.queue, self.status = queue, status
        super().__init__(operation, f"{queue} hung: {status}", detail)


class CopyCancelledError(BridgeError):
    """An asynchronous copy was cancelled (its UsbGpu was closed) before or while it ran."""

    hint = "the device state is unknown after a cancelled copy: open it again (UsbGpu.open)"


# --- shader-core errors (the RDNA3 emulator, speck.usbgpu.sim.rdna3) ---
# Raised where the GPU would stop the queue: an instruction the emulator does not implement, a memory access outside
# every mapping (the hardware's page fault), a register read while a load into it is still outstanding.


class ShaderError(BridgeError):
    """The emulated shader core stopped a dispatch; `kernel`, `pc` and `mnemonic` say where (when known)."""

    hint = "the dispatch stopped like a faulting queue: fix the kernel (or the emulator) and dispatch again"

    def __init__(self, message: str, *, kernel: str = "", pc: int | None = None, mnemonic: str = "") -> None:
        self.message, self.kernel, self.pc, self.mnemonic = message, kernel, pc, mnemonic
        super().__init__("shader dispatch", message)

    def add_context(self, kernel: str, pc: int, mnemonic: str) -> None:
        """Fill in where the error happened (the run loop knows; the instruction's semantics do not)."""
        self.kernel = self.kernel or kernel
        self.pc = pc if self.pc is None else self.pc
        self.mnemonic = self.mnemonic or mnemonic
        self.args = (self._format(),)

    def _format(self) -> str:
        where = self.kernel or "<kernel>"
        if self.pc is not None:
            where += f" at pc {self.pc:#x}"
        if self.mnemonic:
            where += f" ({self.mnemonic})"
        return f"{where}: {self.message}; {self.hint}"

    def __str__(self) -> str:
        return self._format()


class EmulationError(ShaderError, NotImplementedError):
    """An instruction or encoding the RDNA3 emulator does not implement (named by mnemonic or raw words)."""

    hint = "the emulator never skips an instruction: implement it in speck.usbgpu.sim.rdna3 (see its coverage())"


class ShaderMemoryFault(ShaderError):
    """A shader access outside every mapped region (global/flat/scalar memory), the LDS allocation or scratch.

    `address`, `size`, `space` and `region` (the nearest mapping, or the segment's bounds) describe the access."""

    hint = "on hardware this is a page fault that stops the queue: check the kernel's indexing and buffer sizes"

    def __init__(self, message: str, *, address: int, size: int, space: str, region: str = "") -> None:
        self.address, self.size, self.space, self.region = address, size, space, region
        text = f"{space} access of {size} bytes at {address:#x} {message}"
        super().__init__(text + (f" ({region})" if region else ""))


class ShaderHazardError(ShaderError):
    """A register was used while a memory load into it was still outstanding (no s_waitcnt before the use)."""

    hint = "the hardware would return stale data: the kernel needs an s_waitcnt before this use"


class ShaderTrap(ShaderError):
    """The kernel executed s_trap (LLVM's llvm.trap / llvm.debugtrap); `code` is its immediate."""

    hint = "a trap stops the queue: the kernel asked for it (an assertion or llvm.trap)"

    def __init__(self, code: int) -> None:
        self.code = code
        super().__init__(f"the kernel executed s_trap {code}", mnemonic="s_trap")


class ShaderHang(ShaderError):
    """A dispatch ran more wave-instructions than its budget (`max_instructions`): on hardware, a hung queue."""

    hint = "the queue would never finish: look for a loop whose exit condition never holds"


class CodeObjectError(BridgeError, ValueError):
    """A code object (ELF64 for EM_AMDGPU) is malformed, truncated, or lacks the kernel or its descriptor."""

    hint = "pass an HSA code object (amdgcn-amd-amdhsa ELF shared object) that defines <kernel> and <kernel>.kd"
