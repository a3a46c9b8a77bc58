"""UsbTransport against EchoModel through the real path: usb1 (ctypes) and the C helper over the fake libusb."""

from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.usbgpu import errors, transport
from speck.usbgpu.sim import shim
from speck.usbgpu.transport import UsbTransport
from test_transport_echo_model import EchoModel, ModelBug

HERE = Path(__file__).parent


@pytest.fixture
def model() -> EchoModel:
    return EchoModel()


@pytest.fixture
def usb(model: EchoModel) -> Iterator[UsbTransport]:
    t = UsbTransport.open(sim=[model])
    yield t
    t.close()


def usb_model_serial(usb: UsbTransport) -> str:
    """The serial of the model the transport opened (EchoModels number theirs)."""
    (model,) = [m for m in shim.installed_models() if f"usb:{m.bus}-{m.address}" == usb.name]
    return model.serial


def _resources_released() -> dict[str, int]:
    counts = shim.counters()
    return {k: counts[k] for k in ("inflight_transfers", "live_transfers", "open_handles", "live_contexts")}


NOTHING_LIVE = {"inflight_transfers": 0, "live_transfers": 0, "open_handles": 0, "live_contexts": 0}


# ---- opening ----
def test_open_detaches_resets_then_configures_in_documented_order(usb: UsbTransport, model: EchoModel) -> None:
    assert model.log == [("detach", 0), ("reset",), ("set_configuration", 1), ("set_alt", 0, 0)]
    assert (usb.vid, usb.pid, usb.product, usb.name) == (0xADD1, 0x0001, "custom v0.1", "usb:3-7")


def test_open_without_kernel_driver_skips_detach_and_reset() -> None:
    m = EchoModel(kernel_driver=False, vid=0x3801, product="AS2462 bridge", bus=1, address=2)
    with UsbTransport.open(sim=[m]) as t:
        assert m.log == [("set_configuration", 1), ("set_alt", 0, 0)]
        assert (t.vid, t.product, t.name) == (0x3801, "AS2462 bridge", "usb:1-2")


def test_index_selects_among_usable_devices_only() -> None:
    stock = EchoModel(product="ASM2464 USB3.2 bridge", address=1)
    first, second = EchoModel(address=2), EchoModel(vid=0x3801, address=3)
    with UsbTransport.open(index=1, sim=[stock, second, first]) as t:
        # the 0xADD1 list is searched before 0x3801, and the stock-firmware device is skipped
        assert t.name == "usb:3-3"
    assert _resources_released() == NOTHING_LIVE


def test_reopening_the_same_model_keeps_it_and_a_second_claim_is_busy(model: EchoModel) -> None:
    first = UsbTransport.open(sim=[model])
    first.bulk_out(0x02, b"one")
    log_length = len(model.log)
    with pytest.raises(errors.DeviceInUseError, match="already open in this process") as info:
        UsbTransport.open(sim=[model])  # the first transport still holds the device
    assert isinstance(info.value, errors.UsbBusyError)
    assert len(model.log) == log_length  # the refused open never reached the device
    first.bulk_out(0x02, b"two")  # and is unaffected by the failed open
    first.close()
    with UsbTransport.open(sim=[model]) as again:
        again.bulk_out(0x02, b"three")
    assert model.received == [b"one", b"two", b"three"]
    other = EchoModel()
    stale = UsbTransport.open(sim=[model])
    with UsbTransport.open(sim=[other]):  # different models replace the bus
        with pytest.raises(errors.UsbNoDeviceError, match=r"simulated bus usb:3-\d+ was on was replaced by an open"):
            stale.bulk_out(0x02, b"gone")  # the message says why, not just "disconnected"
    stale.close()
    assert _resources_released() == NOTHING_LIVE


def test_discovery_failure_lists_every_candidate_and_how_to_simulate() -> None:
    stock = EchoModel(product="ASM2464 USB3.2 bridge", address=9)
    with pytest.raises(errors.UsbDeviceNotFound) as info:
        UsbTransport.open(sim=[stock])
    text = str(info.value)
    assert "add1:0001 at usb:3-9: product string 'ASM2464 USB3.2 bridge' does not start with 'custom'" in text
    assert "3801:0001: no device with this VID:PID" in text
    assert "SPECK_USB_SIM=1" in text
    assert len(info.value.candidates) == 2
    assert _resources_released() == NOTHING_LIVE


def test_discovery_failure_on_an_empty_bus_and_too_large_index() -> None:
    with pytest.raises(errors.UsbDeviceNotFound, match="add1:0001: no device with this VID:PID"):
        UsbTransport.open(sim=[])
    with pytest.raises(errors.UsbDeviceNotFound, match="only 1 usable device.*index 1"):
        UsbTransport.open(index=1, sim=[EchoModel()])
    assert _resources_released() == NOTHING_LIVE


def test_environment_switch_without_default_simulator_explains(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPECK_USB_SIM", "1")
    try:
        from speck.usbgpu.sim.device import SimDevice  # noqa: F401
    except ImportError:
        with pytest.raises(errors.LibusbLoadError, match="SimDevice"):
            UsbTransport.open()
    else:
        with UsbTransport.open() as t:
            assert t.simulated and t.product.startswith("custom")


def test_asking_for_the_real_libusb_after_the_simulator_is_a_clear_error(usb: UsbTransport) -> None:
    with pytest.raises(errors.UsbLibraryConflict, match="already uses the sim libusb"):
        transport._load_libusb("real", "/nonexistent/libusb-1.0.so")


def test_python_libusb1_sees_the_model_descriptors_through_the_fake_libusb(usb: UsbTransport) -> None:
    handle = usb._handle
    device = handle.getDevice()
    assert (device.getVendorID(), device.getProductID(), device.getbcdUSB()) == (0xADD1, 0x0001, 0x0320)
    assert (handle.getManufacturer(), handle.getSerialNumber()) == ("tiny", usb_model_serial(usb))
    assert handle.getConfiguration() == 1
    [config] = list(device)
    [interface] = list(config)
    alt0, alt1 = list(interface)
    assert [(e.getAddress(), e.getMaxPacketSize(), e.getAttributes()) for e in alt0] == [
        (0x81, 1024, 2),
        (0x02, 1024, 2),
    ]
    assert (alt0.getClass(), alt0.getSubClass(), alt0.getProtocol()) == (0xFF, 0xFF, 0xFF)
    assert [e.getAddress() for e in alt1] == [0x81, 0x02, 0x83, 0x04]
    # the SuperSpeed companion (bMaxBurst 15, 2**5 streams on alt 1) is kept as the endpoint's extra bytes
    assert bytes(list(alt0)[1].getExtra()[0]) == bytes([6, 0x30, 15, 0, 0, 0])
    assert bytes(list(alt1)[0].getExtra()[0]) == bytes([6, 0x30, 15, 5, 0, 0])
    assert device.getMaxPacketSize(0x02) == 1024


def test_clear_halt_reaches_the_device(usb: UsbTransport, model: EchoModel) -> None:
    usb.clear_halt(0x02)
    assert model.log[-1] == ("clear_halt", 0x02)


# ---- control transfers ----
@given(data=st.binary(max_size=255), value=st.integers(0, 0xFFFF), length=st.integers(0, 255))
def test_control_out_then_in_round_trips(data: bytes, value: int, length: int) -> None:
    with UsbTransport.open(sim=[EchoModel()]) as t:
        t.control_out(0x10, value, 0, data)
        assert t.control_in(0x10, 0, 0, len(data)) == data
        assert t.control_in(0x11, value, 0, length) == bytes((value + i) & 0xFF for i in range(length))
        assert t.stats.control_transfers == 3
        assert t.stats.control_out_bytes == len(data)
        assert t.stats.control_in_bytes == len(data) + length


def test_control_in_short_reply_is_an_error(usb: UsbTransport) -> None:
    usb.control_out(0x10, 0, 0, b"abc")
    with pytest.raises(errors.TransferShortError, match=r"3/8 bytes"):
        usb.control_in(0x10, 0, 0, 8)


def test_unsupported_control_request_is_a_named_pipe_error(usb: UsbTransport) -> None:
    with pytest.raises(errors.UsbPipeError) as info:
        usb.control_in(0x99, 0, 0, 4)
    assert "control IN 0x99" in str(info.value) and "LIBUSB_ERROR_PIPE" in str(info.value)


# ---- sync bulk ----
@given(chunks=st.lists(st.binary(min_size=1, max_size=3000), min_size=1, max_size=5))
def test_sync_bulk_out_is_echoed_to_bulk_in(chunks: list[bytes]) -> None:
    m = EchoModel()
    with UsbTransport.open(sim=[m]) as t:
        for c in chunks:
            t.bulk_out(0x02, memoryview(c))
        total = b"".join(chunks)
        assert t.bulk_in(0x81, len(total) + 10) == total
        assert m.received == chunks
        assert t.stats.bulk_out_bytes == len(total) and t.stats.bulk_in_bytes == len(total)


@pytest.mark.parametrize(
    ("fault", "expected"),
    [
        ("timeout", errors.UsbTimeoutError),
        ("stall", errors.UsbPipeError),
        ("error", errors.UsbIoError),
        ("overflow", errors.UsbOverflowError),
        ("short", errors.TransferShortError),
        ("submit_fail", errors.UsbIoError),
    ],
)
def test_sync_bulk_faults_become_named_errors(usb: UsbTransport, model: EchoModel, fault: str, expected: type) -> None:
    model.faults.append(fault)  # type: ignore[arg-type]
    with pytest.raises(expected) as info:
        usb.bulk_out(0x02, b"z" * 512, timeout_ms=50)
    assert "bulk OUT 0x02 (512 bytes)" in str(info.value)
    usb.bulk_out(0x02, b"next")  # sync errors are not sticky
    assert model.received[-1] == b"next"


# ---- async bulk ----
@given(
    sizes=st.lists(st.integers(0, 5000), min_size=1, max_size=12),
    order_seed=st.integers(0, 2**16),
)
def test_async_submissions_land_in_order_whatever_order_they_are_waited(sizes: list[int], order_seed: int) -> None:
    m = EchoModel()
    payloads = [bytes([i & 0xFF]) * n for i, n in enumerate(sizes)]
    with UsbTransport.open(sim=[m]) as t:
        tags = [t.submit_bulk_out(0x02, p) for p in payloads]
        assert tags == sorted(tags) and len(set(tags)) == len(tags)
        wait_order = tags[:]
        random.Random(order_seed).shuffle(wait_order)
        for tag in wait_order:
            t.wait(tag)
            assert t.is_done(tag)
        assert m.received == payloads
        assert t.inflight == 0
        assert t.stats.async_submits == len(sizes) and t.stats.bulk_out_bytes == sum(sizes)
    assert shim.counters()["null_context_event_calls"] == 0  # the helper always pumps its own context


def test_waiting_a_later_tag_completes_the_earlier_ones(usb: UsbTransport, model: EchoModel) -> None:
    tags = [usb.submit_bulk_out(0x02, bytes([i]) * 100) for i in range(4)]
    assert not any(usb.is_done(t) for t in tags)
    usb.wait(tags[2])
    assert [usb.is_done(t) for t in tags] == [True, True, True, False]
    assert model.received == [bytes([i]) * 100 for i in range(3)]
    usb.wait(tags[3])


def test_async_buffer_stays_locked_while_in_flight(usb: UsbTransport) -> None:
    buf = bytearray(b"q" * 4096)
    tag = usb.submit_bulk_out(0x02, buf)
    with pytest.raises(BufferError):
        buf.extend(b"more")  # the helper still points at this memory
    usb.wait(tag)
    buf.extend(b"more")  # released once the tag is known complete


@pytest.mark.parametrize(
    ("fault", "expected", "status_name"),
    [
        ("error", errors.TransferFailedError, "LIBUSB_TRANSFER_ERROR"),
        ("timeout", errors.TransferTimedOutError, "LIBUSB_TRANSFER_TIMED_OUT"),
        ("stall", errors.TransferStallError, "LIBUSB_TRANSFER_STALL"),
        ("overflow", errors.TransferOverflowError, "LIBUSB_TRANSFER_OVERFLOW"),
        ("short", errors.TransferShortError, "short completion"),
    ],
)
def test_async_failure_is_latched_reported_at_next_wait_and_sticky(
    usb: UsbTransport, model: EchoModel, fault: str, expected: type, status_name: str
) -> None:
    model.faults.extend([None, fault, None])  # type: ignore[list-item]
    tags = [usb.submit_bulk_out(0x02, b"d" * 1024, timeout_ms=200) for _ in range(3)]
    usb.wait(tags[0])  # completed before the failure: fine
    with pytest.raises(expected) as first:
        usb.wait(tags[2])
    assert first.value.tag == tags[1]
    assert status_name in str(first.value) and "latched" in str(first.value)
    assert f"tag {tags[1]}" in str(first.value)
    for tag in (tags[2], tags[0]):  # sticky: every later wait reports the same failure
        with pytest.raises(expected) as again:
            usb.wait(tag)
        assert again.value.tag == tags[1]
    later = usb.submit_bulk_out(0x02, b"after")  # submitting still works; waiting does not
    with pytest.raises(expected):
        usb.wait(later)


FAULT_CLASSES = {
    "error": errors.TransferFailedError,
    "timeout": errors.TransferTimedOutError,
    "stall": errors.TransferStallError,
    "overflow": errors.TransferOverflowError,
    "short": errors.TransferShortError,
}


@given(
    sizes=st.lists(st.integers(1, 3000), min_size=1, max_size=10),
    fault=st.sampled_from(sorted(FAULT_CLASSES)),
    position=st.integers(0, 9),
)
def test_the_first_async_failure_is_reported_by_every_wait_from_its_tag_on(
    sizes: list[int], fault: str, position: int
) -> None:
    position %= len(sizes)
    m = EchoModel()
    m.faults.extend([None] * position + [fault])  # type: ignore[list-item]
    payloads = [bytes([i]) * n for i, n in enumerate(sizes)]
    with UsbTransport.open(sim=[m]) as t:
        tags = [t.submit_bulk_out(0x02, p, timeout_ms=100) for p in payloads]
        for i, tag in enumerate(tags):
            if i < position:
                t.wait(tag)  # completed before the failure
            else:
                with pytest.raises(FAULT_CLASSES[fault]) as info:
                    t.wait(tag)
                assert info.value.tag == tags[position]
        landed = [p for i, p in enumerate(payloads) if i != position]
        if fault == "short":
            landed.insert(position, payloads[position][: len(payloads[position]) // 2])
        assert m.received == landed  # the failure does not stop or reorder the transfers behind it


def test_async_submit_failure_raises_without_latching(usb: UsbTransport, model: EchoModel) -> None:
    model.faults.append("submit_fail")
    with pytest.raises(errors.UsbIoError, match="submit async bulk OUT 0x02"):
        usb.submit_bulk_out(0x02, b"x" * 10)
    usb.wait(usb.submit_bulk_out(0x02, b"fine"))
    assert model.received == [b"fine"]


def test_wait_gives_up_on_a_transfer_still_in_flight_without_latching() -> None:
    m = EchoModel(bytes_per_ms=1.0)  # 1 byte per virtual ms: a 5000-byte transfer takes 5 s of model time
    with UsbTransport.open(sim=[m]) as t:
        tag = t.submit_bulk_out(0x02, b"s" * 5000, timeout_ms=0)
        with pytest.raises(errors.UsbWaitTimeout):
            t.wait(tag, timeout_ms=0)
        assert not t.is_done(tag)
        t.wait(tag, timeout_ms=60_000)  # the model's clock advances with each pump
        assert m.received == [b"s" * 5000]


def test_sync_transfer_the_model_never_ends_times_out_instead_of_hanging() -> None:
    class Forgetful(EchoModel):
        """Never completes nor times out anything: a broken model."""

        def _end_time(self, p: object) -> float:
            return float("inf")

    with UsbTransport.open(sim=[Forgetful()]) as t, pytest.raises(errors.UsbTimeoutError, match="bulk OUT 0x02"):
        t.bulk_out(0x02, b"x", timeout_ms=50)


def test_model_exception_surfaces_as_itself(usb: UsbTransport, model: EchoModel) -> None:
    model.faults.append("raise")
    with pytest.raises(ModelBug, match="data before arm"):
        usb.submit_bulk_out(0x02, b"x")
    model.faults.append("raise")
    with pytest.raises(ModelBug):
        usb.control_out(0x10, 0, 0, b"y")


# ---- disconnect ----
def test_disconnect_mid_async_raises_no_device_at_wait_and_after(usb: UsbTransport, model: EchoModel) -> None:
    tags = [usb.submit_bulk_out(0x02, b"p" * 2048) for _ in range(3)]
    model.disconnect()
    with pytest.raises(errors.TransferNoDeviceError) as info:
        usb.wait(tags[-1])
    assert isinstance(info.value, errors.UsbNoDeviceError)  # one except clause catches both kinds
    with pytest.raises(errors.UsbNoDeviceError):
        usb.control_in(0x11, 0, 0, 4)
    with pytest.raises(errors.UsbNoDeviceError):
        usb.submit_bulk_out(0x02, b"more")
    usb.close()
    assert _resources_released() == NOTHING_LIVE


def test_disconnect_during_sync_transfer(usb: UsbTransport, model: EchoModel) -> None:
    model.faults.append("disconnect")
    usb.bulk_out(0x02, b"last good")  # completes, then the device drops off
    with pytest.raises(errors.UsbNoDeviceError, match="bulk OUT 0x02"):
        usb.bulk_out(0x02, b"lost")


# ---- closing and finalisation ----
def test_close_cancels_in_flight_transfers_and_frees_everything(model: EchoModel) -> None:
    t = UsbTransport.open(sim=[model])
    model.faults.extend(["timeout", "timeout"])
    for _ in range(2):
        t.submit_bulk_out(0x02, b"never" * 100, timeout_ms=0)
    assert t.inflight == 2
    t.close()
    assert [entry[0] for entry in model.log].count("cancel") == 2
    assert _resources_released() == NOTHING_LIVE
    with pytest.raises(errors.UsbClosedError):
        t.bulk_out(0x02, b"x")
    t.close()  # idempotent


def test_finalizer_frees_transfers_before_handle_before_context() -> None:
    seen: list[dict[str, int]] = []

    class Recording(EchoModel):
        def cancel(self, transfer_id: int) -> None:
            seen.append(_resources_released())
            super().cancel(transfer_id)

    m = Recording()
    t = UsbTransport.open(sim=[m])
    m.faults.append("timeout")
    t.submit_bulk_out(0x02, b"pending", timeout_ms=0)
    del t
    gc.collect()
    # while the transfer was being cancelled, its handle and context were still alive
    assert seen and seen[0]["open_handles"] == 1 and seen[0]["live_contexts"] == 1
    assert _resources_released() == NOTHING_LIVE


def test_interpreter_exit_with_transfers_in_flight_tears_down_in_order() -> None:
    script = textwrap.dedent(
        """
        import atexit, sys, weakref
        # registered before any weakref.finalize exists, so it runs after the finalizers (atexit is LIFO)
        assert not weakref.finalize._registered_with_atexit
        atexit.register(lambda: print("after", sorted(shim.counters().items()), flush=True))
        sys.path.insert(0, sys.argv[1])
        from test_transport_echo_model import EchoModel
        from speck.usbgpu.sim import shim
        from speck.usbgpu.transport import UsbTransport

        class Recording(EchoModel):
            def cancel(self, transfer_id):
                c = shim.counters()
                print("cancel", c["open_handles"], c["live_contexts"], flush=True)
                super().cancel(transfer_id)

        m = Recording()
        t = UsbTransport.open(sim=[m])
        m.faults.append("timeout")
        t.submit_bulk_out(0x02, b"pending", timeout_ms=0)
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "SPECK_USB_SIM"}
    out = subprocess.run(
        [sys.executable, "-c", script, str(HERE)], capture_output=True, text=True, env=env, check=False
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "cancel 1 1", out.stdout  # the transfer went first, while handle and context were alive
    counters = dict(eval(lines[1].removeprefix("after ")))
    assert {k: counters[k] for k in NOTHING_LIVE} == NOTHING_LIVE
    assert "Traceback" not in out.stderr and "Exception ignored" not in out.stderr, out.stderr


def _run_fresh(script: str, **env_updates: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("SPECK_USB_SIM", "SPECK_LIBUSB_PATH")}
    env.update(env_updates)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), str(HERE)], capture_output=True, text=True, env=env, check=False
    )


def test_real_libusb_loads_without_a_system_libusb_and_then_excludes_the_simulator() -> None:
    out = _run_fresh(
        """
        import sys
        sys.path.insert(0, sys.argv[1])
        import usb1
        from test_transport_echo_model import EchoModel
        from speck.usbgpu import errors, helper, transport
        path = transport._real_libusb_path()
        transport._load_libusb("real", path)
        assert transport.loaded_libusb() == ("real", path) and helper.loaded_libusb_path() == path
        with usb1.USBContext() as context:  # python-libusb1 works on the library speck.usbgpu chose
            context.getDeviceList(skip_on_error=True)
        try:
            transport.UsbTransport.open(sim=[EchoModel()])
        except errors.UsbLibraryConflict as exc:
            print("conflict:", exc)
        """
    )
    assert out.returncode == 0, out.stderr
    assert "conflict: load the sim libusb" in out.stdout and "already uses the real libusb" in out.stdout


def test_a_bad_libusb_override_is_reported_with_the_path() -> None:
    out = _run_fresh(
        """
        from speck.usbgpu import errors
        from speck.usbgpu.transport import UsbTransport
        try:
            UsbTransport.open()
        except errors.LibusbLoadError as exc:
            print("error:", exc)
        """,
        SPECK_LIBUSB_PATH="/nonexistent/libusb-1.0.so.0",
    )
    assert out.returncode == 0, out.stderr
    assert "error: load the real libusb failed" in out.stdout and "/nonexistent/libusb-1.0.so.0" in out.stdout
