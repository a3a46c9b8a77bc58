"""speck.usbgpu.errors: one named class per libusb error / transfer status, checked against libusb itself."""

from __future__ import annotations

import ctypes

import pytest

from speck.usbgpu import errors
from speck.usbgpu.sim import shim


def _real_libusb() -> ctypes.CDLL:
    import libusb_package

    path = libusb_package.get_library_path()
    assert path is not None, "the libusb-package wheel ships a libusb-1.0 for this platform"
    return ctypes.CDLL(str(path))  # only its pure string functions are called


@pytest.mark.parametrize("row", errors.LIBUSB_ERRORS, ids=lambda r: r.name)
def test_error_table_rows_have_their_class_and_match_libusb(row: errors.LibusbCode) -> None:
    cls = getattr(errors, row.class_name)
    assert issubclass(cls, errors.UsbError) and not issubclass(cls, errors.TransferError)
    assert (cls.code, cls.libusb_name, cls.default_message) == (row.value, row.name, row.message)
    for lib in (_real_libusb(), ctypes.CDLL(shim.library_path())):
        lib.libusb_error_name.restype = ctypes.c_char_p
        lib.libusb_strerror.restype = ctypes.c_char_p
        assert lib.libusb_error_name(row.value).decode() == row.name
        assert lib.libusb_strerror(row.value).decode() == row.message
    err = errors.error_for_code(row.value, "control IN 0xE4 (wValue=0xb450)")
    assert type(err) is cls
    assert str(err).startswith(f"control IN 0xE4 (wValue=0xb450) failed: {row.name} ({row.message})")
    assert err.operation == "control IN 0xE4 (wValue=0xb450)" and err.libusb_message == row.message


@pytest.mark.parametrize(("row", "also"), errors.LIBUSB_TRANSFER_STATUSES, ids=lambda r: getattr(r, "name", r))
def test_status_table_rows_derive_from_the_matching_error_class(row: errors.LibusbCode, also: str) -> None:
    cls = getattr(errors, row.class_name)
    assert issubclass(cls, errors.TransferError) and issubclass(cls, getattr(errors, also))
    assert cls.code == row.value and cls.libusb_name == row.name
    lib = ctypes.CDLL(shim.library_path())
    lib.libusb_error_name.restype = ctypes.c_char_p
    assert lib.libusb_error_name(row.value).decode() == row.name  # libusb names statuses the same way
    err = errors.error_for_status(row.value, "async bulk OUT 0x02 (tag 9, 4096 bytes)", 100, 4096, tag=9)
    assert type(err) is cls and err.tag == 9
    assert row.name in str(err) and "100/4096 bytes transferred" in str(err)


def test_every_generated_class_is_distinct_and_exported() -> None:
    names = [r.class_name for r in errors.LIBUSB_ERRORS] + [r.class_name for r, _ in errors.LIBUSB_TRANSFER_STATUSES]
    classes = [getattr(errors, n) for n in names]
    assert len(set(classes)) == len(classes) == len(set(names))
    assert set(names) <= set(errors.__all__)
    assert all(c.__name__ == n and c.__module__ == "speck.usbgpu.errors" for c, n in zip(classes, names))


def test_short_completion_and_unknown_codes() -> None:
    short = errors.error_for_status(0, "async bulk OUT 0x02", 512, 1024, tag=3)
    assert isinstance(short, errors.TransferShortError) and "512/1024" in str(short)
    unknown = errors.error_for_code(-1234, "libusb_open")
    assert isinstance(unknown, errors.UsbOtherError) and "unknown libusb error -1234" in str(unknown)
    odd = errors.error_for_status(77, "async bulk OUT 0x02", 0, 8)
    assert isinstance(odd, errors.TransferFailedError) and "unknown transfer status 77" in str(odd)


def test_hints_say_what_to_do() -> None:
    assert "udev" in str(errors.error_for_code(-3, "open usb:1-2"))
    assert "reconnect" in str(errors.error_for_status(5, "async bulk OUT 0x02", 0, 8))
    found = errors.UsbDeviceNotFound("open bridge #0", ["add1:0001: none", "3801:0001: none"], "set SPECK_USB_SIM=1")
    assert (
        str(found)
        == "open bridge #0: no usable device; tried:\n  add1:0001: none\n  3801:0001: none\nset SPECK_USB_SIM=1"
    )
