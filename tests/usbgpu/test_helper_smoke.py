"""The compiled async helper: import, build stamp, libusb binding, pool behaviour through the simulator."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

import speck.usbgpu
from speck.usbgpu import errors, helper
from speck.usbgpu.sim import shim
from speck.usbgpu.sim.model_api import ModelError
from speck.usbgpu.transport import UsbTransport
from test_transport_echo_model import EchoModel


@pytest.fixture
def model() -> EchoModel:
    return EchoModel()


@pytest.fixture
def usb(model: EchoModel) -> Iterator[UsbTransport]:
    t = UsbTransport.open(sim=[model])
    yield t
    t.close()


def test_helper_imports_and_records_the_package_version_it_was_built_for() -> None:
    from speck.usbgpu._helper import ffi, lib

    assert helper.HELPER_BUILT_FOR == speck.usbgpu.__version__ == ffi.string(lib.usbgpu_helper_version()).decode()
    assert helper.HELPER_ABI == lib.USBGPU_HELPER_ABI == 2
    codes = {lib.USBGPU_LATCHED, lib.USBGPU_WAIT_TIMEOUT, lib.USBGPU_NOT_LOADED, lib.USBGPU_CLOSED,
             lib.USBGPU_WAIT_INTERRUPTED}  # fmt: skip
    assert len(codes) == 5 and all(c < -99 for c in codes)  # never confused with a libusb_error


def test_build_mismatch_message_names_both_versions_and_the_fix() -> None:
    with pytest.raises(errors.HelperBuildMismatch) as info:
        helper.check_build("0.0.9", 1, "0.1.0")
    text = str(info.value)
    assert "built for speck-usbgpu 0.0.9" in text and "package is 0.1.0" in text and "pip install" in text
    with pytest.raises(errors.HelperBuildMismatch, match="helper ABI 1"):
        helper.check_build("0.1.0", 1, "0.1.0")
    helper.check_build("0.1.0", 2, "0.1.0")


def test_helper_is_bound_to_the_library_the_transport_loaded(usb: UsbTransport) -> None:
    assert helper.loaded_libusb_path() == shim.library_path()
    with pytest.raises(errors.UsbLibraryConflict, match="already loaded"):
        helper.load_libusb("/some/other/libusb-1.0.so")


def test_pool_refuses_the_null_context() -> None:
    with pytest.raises(errors.UsbInvalidParamError, match="own libusb context"):
        helper.AsyncBulkPool(0, 0x1000)


def test_pool_grows_to_the_pipeline_depth_then_reuses_transfers(usb: UsbTransport, model: EchoModel) -> None:
    pool = usb._pool
    assert pool.pool_size == 4
    tags = [usb.submit_bulk_out(0x02, bytes([i]) * 64) for i in range(6)]
    assert pool.pool_size == 6 and pool.inflight == 6  # one new transfer per extra transfer in flight
    usb.wait(tags[-1])
    for round_ in range(3):
        more = [usb.submit_bulk_out(0x02, bytes([round_]) * 32) for _ in range(8)]
        usb.wait(more[-1])
    assert pool.pool_size == 8  # no transfer allocated per submission
    assert len(model.received) == 6 + 24
    assert shim.counters()["live_transfers"] == 8


def test_waiting_for_a_tag_never_issued_is_an_invalid_parameter(usb: UsbTransport) -> None:
    tag = usb.submit_bulk_out(0x02, b"x")
    for bad in (0, -1, tag + 1):
        with pytest.raises(errors.UsbInvalidParamError, match=f"tag {bad}"):
            usb.wait(bad)
    usb.wait(tag)


def test_failed_submit_of_a_temporary_memoryview_is_gc_safe(usb: UsbTransport, model: EchoModel) -> None:
    def fail_once() -> None:
        model.faults.append("submit_fail")
        with pytest.raises(errors.UsbIoError) as info:  # info -> traceback -> this frame: a reference cycle
            usb.submit_bulk_out(0x02, memoryview(bytearray(range(64)))[8:])
        assert "submit async bulk OUT 0x02 (56 bytes)" in str(info.value)

    for _ in range(3):
        fail_once()
        gc.collect()  # the cycle holds the memoryview; no cffi export may still be attached to it
    usb.wait(usb.submit_bulk_out(0x02, memoryview(bytearray(b"ok"))))
    assert model.received == [b"ok"]


def test_loading_a_library_that_is_not_libusb_fails_clearly() -> None:
    script = textwrap.dedent(
        """
        import ctypes.util
        from speck.usbgpu import errors, helper
        try:
            helper.load_libusb("/nonexistent/libusb-1.0.so")
        except errors.LibusbLoadError as exc:
            print("missing:", exc)
        try:
            helper.load_libusb(ctypes.util.find_library("c"))
        except errors.LibusbLoadError as exc:
            print("not libusb:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert "missing: load libusb into the async helper failed: dlopen(/nonexistent/libusb-1.0.so) failed" in out.stdout
    assert "not libusb:" in out.stdout and "has no symbol libusb_alloc_transfer" in out.stdout


def test_an_interrupted_wait_returns_to_python_then_resumes(
    usb: UsbTransport, model: EchoModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A signal that interrupts libusb's event loop (LIBUSB_ERROR_INTERRUPTED, here from the model) returns the wait
    to Python at once - where Ctrl-C raises KeyboardInterrupt instead of waiting out the transfer timeout - and any
    other signal resumes the wait."""
    real = model.wait
    interrupted = [0]

    def wait(transfer_ids: Any, timeout_ms: int) -> Any:
        if interrupted[0] < 3:
            interrupted[0] += 1
            raise ModelError(-10)  # what poll() failing with EINTR gives libusb_handle_events
        return real(transfer_ids, timeout_ms)

    monkeypatch.setattr(model, "wait", wait)
    tag = usb.submit_bulk_out(0x02, b"abc")
    usb.wait(tag)
    assert interrupted[0] == 3 and usb._pool.interrupted_waits == 3
    assert model.received == [b"abc"]
