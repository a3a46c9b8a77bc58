"""The USB GPU as a tensor device (speck.tensor.usb over speck.usbgpu), against the simulator: registration through
speck.hcq's plugin hook and the `speck.devices` entry point, tensors stored in (simulated) VRAM and copied with G3,
timeline ordering, streamed safe_load / load_state_dict, and kernels computed on the emulated GPU.

Every test runs with SPECK_USB_SIM=2 (two simulated bridges: USB and USB:1; USB:SIM is USB). What is claimed to be
in VRAM is read back behind the driver's back from the simulator's memory, not only through a round trip."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import tomllib
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from speck.hcq import Buffer, HWQueue, Signal
from speck.hcq.errors import DeviceNotFoundError, HCQError
from speck.hcq.registry import _KINDS, canonicalize, known_devices
from speck.tensor import Device, GlobalCounters, Tensor, dtypes
from speck.tensor.device import is_dtype_supported
from speck.tensor.nn.state import load_state_dict, safe_load, safe_save
from speck.tensor.realize import get_buffer
from speck.tensor.schedule import base_buffer
from speck.tensor.usb import UsbDevice

ROOT = pathlib.Path(__file__).resolve().parents[2]
SRC_PATH = os.pathsep.join(
    str(ROOT / "packages" / p / "src") for p in ("uop", "codegen", "runtime-hcq", "tensor", "usbgpu")
)
NP_DTYPES = [np.float32, np.float16, np.float64, np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16,
             np.uint32, np.uint64, np.bool_]  # fmt: skip
pytestmark = pytest.mark.usefixtures("two_simulated_bridges")


@pytest.fixture(autouse=True)
def _no_protocol_violations() -> Iterator[None]:
    yield
    for name in ("USB", "USB:1"):
        if name in Device.opened:
            dev = Device[name]
            assert isinstance(dev, UsbDevice) and dev.gpu.sim is not None
            assert dev.gpu.sim.violations == [], dev.gpu.sim.violations


def usb(name: str = "USB") -> UsbDevice:
    dev = Device[name]
    assert isinstance(dev, UsbDevice)
    return dev


def vram_bytes(t: Tensor) -> bytes:
    """The bytes of realized tensor t's buffer as they sit in the simulated VRAM."""
    bb = base_buffer(t.uop)
    assert bb is not None
    hb = get_buffer(bb)
    dev = hb.dev
    assert isinstance(dev, UsbDevice) and dev.gpu.sim is not None
    return dev.gpu.sim.read_vram(hb.opaque.va + hb.offset, hb.nbytes)


def arrays(dtype: type) -> st.SearchStrategy[np.ndarray]:
    # (at least 1-d: a 0-d array makes a device-less constant, which .to() leaves where it is - TENSOR_API 0.2)
    return hnp.arrays(dtype, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=6))


# ---------------- registration ----------------
def test_usb_is_a_registered_device_kind_with_its_forms() -> None:
    assert {"USB", "USB:<n>", "USB:SIM"} <= set(known_devices())
    assert canonicalize("usb") == "USB" and canonicalize("usb:0") == "USB" and canonicalize("USB:1") == "USB:1"
    assert canonicalize("usb:sim") == "USB"  # SPECK_USB_SIM puts the simulated bridges on the bus: USB is one
    with pytest.raises(DeviceNotFoundError, match=r"USB names are written USB or USB:<n> or USB:SIM"):
        canonicalize("USB:fast")


def test_entry_point_declared_in_pyproject_registers_usb_through_hcq(monkeypatch: pytest.MonkeyPatch) -> None:
    """The `speck.devices` entry point speck-tensor declares is what an installed speck.hcq loads to learn USB."""
    from importlib.metadata import EntryPoint

    import speck.hcq.registry as hcq_device

    meta = tomllib.loads((ROOT / "packages/tensor/pyproject.toml").read_text())["project"]
    value = meta["entry-points"]["speck.devices"]["usb"]
    assert value == "speck.tensor.usb:register"
    ep = EntryPoint("usb", value, "speck.devices")
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [ep] if group == "speck.devices" else [])
    monkeypatch.delitem(_KINDS, "USB")  # monkeypatch puts the original kind back afterwards
    monkeypatch.setattr(hcq_device, "_entry_points_loaded", False)
    assert "USB" not in hcq_device._KINDS
    assert "USB:SIM" in known_devices()  # listing the kinds loads the entry points
    assert hcq_device._KINDS["USB"].open.__module__ == "speck.tensor.usb"


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k != "SPECK_USB_SIM"} | {"PYTHONPATH": SRC_PATH} | env
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full, timeout=600)


def test_hcq_and_tensor_import_no_usbgpu_until_a_usb_device_opens() -> None:
    code = (
        "import sys\n"
        "import speck.hcq\nfrom speck.hcq.registry import known_devices\nknown_devices()\n"
        "assert 'speck.usbgpu' not in sys.modules, 'speck.hcq imported the driver'\n"
        "from speck.tensor import Tensor\nassert 'USB:SIM' in known_devices()\n"
        "assert 'speck.usbgpu' not in sys.modules, 'registering USB imported the driver'\n"
        # listing what opens does not open USB (that would bind the real libusb and shut out the simulator)
        "from speck.hcq import Device, canonicalize\n"
        "assert not any(d.startswith('USB') for d in Device.get_available_devices())\n"
        "assert 'speck.usbgpu' not in sys.modules, 'get_available_devices opened USB'\n"
        "assert canonicalize('USB:SIM') == 'USB:SIM'\n"  # no SPECK_USB_SIM here
        "print(Tensor([1, 2, 3], device='USB:SIM').numpy().tolist())\n"
        "assert 'speck.usbgpu' in sys.modules\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[1, 2, 3]"


def test_without_speck_usbgpu_there_is_no_usb_device() -> None:
    code = (
        "import sys, importlib.abc\n"
        "class Hide(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'speck.usbgpu' or name.startswith('speck.usbgpu.'):\n"
        "            raise ModuleNotFoundError(name)\n"
        "sys.meta_path.insert(0, Hide())\n"
        "from speck.tensor import Tensor\nfrom speck.hcq.registry import known_devices\n"
        "from speck.hcq.errors import DeviceNotFoundError\n"
        "assert not any(f.startswith('USB') for f in known_devices()), known_devices()\n"
        "try:\n    Tensor([1], device='USB')\nexcept DeviceNotFoundError as e:\n    print('refused:', e)\n"
    )
    r = _run(code)
    assert r.returncode == 0, r.stderr
    assert "refused: unknown device 'USB'" in r.stdout and "CPU" in r.stdout


def test_usb_without_hardware_or_simulator_says_how_to_simulate() -> None:
    r = _run(
        "from speck.tensor import Tensor\nfrom speck.hcq.errors import DeviceUnavailableError\n"
        "try:\n    Tensor([1], device='USB')\nexcept DeviceUnavailableError as e:\n    print(e)\n"
    )
    assert r.returncode == 0, r.stderr
    assert "cannot open USB" in r.stdout and "USB:SIM" in r.stdout and "SPECK_USB_SIM" in r.stdout


def test_dev_usb_plus_amd_makes_the_usb_gpu_the_default_device() -> None:
    r = _run(
        "from speck.tensor import Device, Tensor\nt = Tensor([1.0, 2.0]) + 1\n"
        "print(Device.DEFAULT, t.device, t.numpy().tolist())\n",
        DEV="USB:SIM+AMD",
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["USB:SIM", "USB:SIM", "[2.0,", "3.0]"]


def test_on_an_unverified_card_opening_usb_names_the_bring_up_opt_in() -> None:
    """What a user with a real card sees today: the bring-up safety gate, before anything is written to the GPU (in
    a process of its own: a bus with that board replaces this process's simulated bridges)."""
    r = _run(
        "from speck.tensor.usb import open_usb\nfrom speck.usbgpu.api import UsbGpu\n"
        "from speck.usbgpu.sim import HARDWARE_LIKE_SUBSYSTEM\nfrom speck.usbgpu.sim.device import SimDevice\n"
        "board = SimDevice(gpu_subsystem=HARDWARE_LIKE_SUBSYSTEM)  # looks like a real board to the driver\n"
        "real_open = UsbGpu.open\n"
        "UsbGpu.open = classmethod(lambda cls, index=0, sim=None, **kw: real_open(index, sim=board))\n"
        "try:\n    open_usb('USB')\nexcept Exception as e:\n    print(type(e).__name__, e)\n"
        "assert board.stats['mmio_writes'] == 0 and board.gpu.regs.writes == 0\n"
        "real_open(0, sim=board).close()  # the refused session was closed: the bridge opens again\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("DeviceUnavailableError cannot open USB: GpuBringUpUnverified: opening USB failed: GPU")
    assert "SPECK_USBGPU_UNVERIFIED=1" in r.stdout and "1002:744c" in r.stdout


# ---------------- storage and copies ----------------
@given(data=st.sampled_from(NP_DTYPES).flatmap(arrays))
def test_to_usb_places_the_bytes_in_vram_and_back_matches_numpy(data: np.ndarray) -> None:
    t = Tensor(data).to("USB").realize()
    assert t.device == "USB" and t.shape == data.shape
    if data.size:
        assert vram_bytes(t) == np.ascontiguousarray(data).tobytes()
    np.testing.assert_array_equal(t.numpy(), data)
    back = t.to("CPU")
    assert back.device == "CPU"
    np.testing.assert_array_equal(back.numpy(), data)
    np.testing.assert_array_equal(Tensor(data, device="USB").numpy(), data)


def test_usb_tensor_views_copy_only_their_range() -> None:
    a = np.arange(60, dtype=np.int32).reshape(6, 10)
    t = Tensor(a).to("USB").realize()
    np.testing.assert_array_equal(t[2:5].numpy(), a[2:5])
    np.testing.assert_array_equal(t[1:3].to("CPU").numpy(), a[1:3])
    np.testing.assert_array_equal(t.reshape(3, 20)[2].numpy(), a.reshape(3, 20)[2])


def test_cpu_kernels_and_usb_copies_in_one_schedule() -> None:
    """Compute stays on the CPU: a schedule of CPU kernels feeding a copy to USB (and back) runs, in order."""
    a = np.random.default_rng(7).standard_normal((5, 6)).astype(np.float32)
    t = ((Tensor(a) * 2).T + 1).to("USB").realize()
    expected = (a * 2).T + 1
    assert vram_bytes(t) == np.ascontiguousarray(expected).tobytes()
    np.testing.assert_allclose((t.to("CPU") - 1).numpy(), expected - 1, rtol=1e-6)


def test_copies_between_two_bridges() -> None:
    a = np.random.default_rng(1).standard_normal((33, 17)).astype(np.float32)
    t0 = Tensor(a).to("USB").realize()
    t1 = t0.to("USB:1").realize()
    assert t1.device == "USB:1" and usb("USB").gpu.sim is not usb("USB:1").gpu.sim
    assert vram_bytes(t1) == a.tobytes()
    np.testing.assert_array_equal(t1.to("CPU").numpy(), a)


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int64, dtypes.uint8, dtypes.float16])
def test_empty_on_usb_then_assign(dtype: dtypes) -> None:  # type: ignore[valid-type]
    rng = np.random.default_rng(2)
    npdt = np.dtype(dtype.fmt)
    e = Tensor.empty(4, 5, device="USB", dtype=dtype)
    assert e.device == "USB" and e.shape == (4, 5) and e.numpy().shape == (4, 5) and e.numpy().dtype == npdt
    first = (rng.standard_normal((4, 5)) * 50).astype(npdt)
    GlobalCounters.reset()
    with pytest.raises(RuntimeError, match="device mismatch"):  # USB computes: another device's value is moved first
        e.assign(Tensor(first))
    e.assign(Tensor(first).to("USB")).realize()  # one copy from the CPU (assign is lazy: realize runs it)
    assert GlobalCounters.copy_count == 1
    assert vram_bytes(e) == first.tobytes()
    np.testing.assert_array_equal(e.numpy(), first)
    second = (first[::-1] + 1).astype(npdt)
    e.assign(second)  # from host data
    np.testing.assert_array_equal(e.numpy(), second)
    e.assign(second.tolist())
    np.testing.assert_array_equal(e.numpy(), second)
    with pytest.raises(RuntimeError, match="shape"):
        e.assign(Tensor(np.zeros((5, 4), npdt)).to("USB"))


# ---------------- ordering ----------------
def test_copy_queue_waits_on_signals_and_advances_its_timeline() -> None:
    dev = usb()
    src = np.arange(4096, dtype=np.uint8) ^ 0x5A
    host = Buffer("CPU", src.size, np.uint8).copyin(src)
    vbuf = Buffer("USB", src.size, np.uint8).copyin(np.zeros(src.size, np.uint8))
    engine = dev.engines["copy"]
    gate = Signal(0, name="test-gate")
    before = engine.timeline.value
    HWQueue("copy").wait(gate, 1).copy(vbuf, host, src.size).submit(dev)
    assert engine.timeline.value == before  # held by the wait: nothing moved yet
    assert dev.gpu.sim.read_vram(vbuf.opaque.va, src.size) == bytes(src.size)
    gate.set(1)
    dev.synchronize()
    assert engine.timeline.value == before + 1
    assert dev.gpu.sim.read_vram(vbuf.opaque.va, src.size) == src.tobytes()


def test_transfer_waits_for_the_work_producing_its_source() -> None:
    """A copy to USB is queued behind the other device's pending work: a CPU queue still waiting to fill the source
    holds the G3 copy-in back until it has run."""
    dev = usb()
    cpu = Device["CPU"]
    final = np.random.default_rng(3).integers(0, 255, 8192, dtype=np.uint8)
    filler = Buffer("CPU", final.size, np.uint8).copyin(final)
    src = Buffer("CPU", final.size, np.uint8).copyin(np.zeros(final.size, np.uint8))
    dest = Buffer("USB", final.size, np.uint8).copyin(np.full(final.size, 7, np.uint8))
    gate = Signal(0, name="cpu-gate")
    HWQueue("compute").wait(gate, 1).copy(src, filler, final.size).submit(cpu)
    dev.transfer(dest, src)
    assert dev.gpu.sim.read_vram(dest.opaque.va, final.size) == bytes([7]) * final.size
    gate.set(1)
    dev.synchronize()
    assert dev.gpu.sim.read_vram(dest.opaque.va, final.size) == final.tobytes()
    out = np.zeros(final.size, np.uint8)
    dest.copyout(out)
    np.testing.assert_array_equal(out, final)


# ---------------- compute on USB ----------------
def dispatches(dev: UsbDevice) -> int:
    """Dispatches the driver programmed on the compute queue (PM4 DISPATCH_DIRECT) so far."""
    return int(dev.gpu._engine_compute().stats["dispatches"])


def test_the_done_when_example_computes_on_the_emulated_gpu() -> None:
    dev = usb()
    cp = dev.gpu.sim.gpu.cp  # the simulated command processor: what it ran in the RDNA3 emulator
    before, ran, instructions = dispatches(dev), cp.dispatches_run, cp.instructions
    out = (Tensor([1.0, 2.0]).to("USB:SIM") + 1).numpy()
    np.testing.assert_array_equal(out, np.array([2.0, 3.0], np.float32))
    assert dispatches(dev) == before + 1  # one kernel, dispatched through PM4 over the simulated link
    assert cp.dispatches_run == ran + 1 and cp.instructions > instructions


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t + 1,
        lambda t: t.sum(0) * 2,
        lambda t: t.exp(),
        lambda t: t.T.contiguous(),
        lambda t: t.reshape(4, 3),
        lambda t: t[1:, ::2],
        lambda t: t.max(1),
    ],
    ids=["add", "sum", "exp", "transpose", "reshape", "slice", "max"],
)
def test_compute_on_usb_matches_cpu_and_runs_on_the_gpu(make) -> None:  # type: ignore[no-untyped-def]
    dev = usb()
    a = np.arange(12, dtype=np.float32).reshape(3, 4) / 7
    before = dispatches(dev)
    got = make(Tensor(a).to("USB")).realize()
    assert got.device == "USB"
    np.testing.assert_allclose(got.numpy(), make(Tensor(a)).numpy(), rtol=1e-6, atol=1e-6)
    assert dispatches(dev) > before


def test_no_cpu_fallback_even_with_the_numpy_evaluator_on(monkeypatch: pytest.MonkeyPatch) -> None:
    from speck.tensor import realize

    monkeypatch.setattr(realize.NUMPY_FALLBACK, "value", 1)
    dev = usb()
    t = Tensor(np.ones(8, np.float32)).to("USB").realize()
    before = dispatches(dev)
    np.testing.assert_array_equal((t * 3).numpy(), np.full(8, 3, np.float32))
    np.testing.assert_array_equal(Tensor.zeros(4, device="USB").numpy(), np.zeros(4, np.float32))  # a fill kernel
    assert dispatches(dev) == before + 2


def test_usb_reports_the_amd_backend_capabilities() -> None:
    assert is_dtype_supported(dtypes.float32, "USB") and usb().runs_kernels and not usb().host_visible
    assert usb().renderer.arch == "gfx1100" and not usb().renderer.registers_are_cpu


# ---------------- safetensors and state dicts ----------------
def _weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(4)
    return {
        "emb": rng.standard_normal((300, 257)).astype(np.float32),  # 308 KB
        "ids": rng.integers(-(2**40), 2**40, 1001, dtype=np.int64),
        "mask": rng.integers(0, 2, 513).astype(np.bool_),
        "half": rng.standard_normal((7, 33)).astype(np.float16),
        "scale": np.array(3.5, dtype=np.float32),
        "none": np.zeros((0, 4), dtype=np.float32),
        "bytes": rng.integers(0, 255, 77_777, dtype=np.uint8),
    }


def test_safe_load_streams_the_file_into_one_vram_block(tmp_path: pathlib.Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    import speck.tensor.usb as usb_mod

    monkeypatch.setattr(usb_mod, "STAGING_CHUNK", 64 << 10)  # many chunks through the two staging buffers
    weights = _weights()
    path = tmp_path / "w.safetensors"
    safe_save({k: Tensor(v) for k, v in weights.items()}, path)
    dev = usb()
    copyins = dev.gpu.copy_stats.copyins
    loaded = safe_load(path, device="USB")
    data_bytes = sum(v.nbytes for v in weights.values())
    assert dev.gpu.copy_stats.copyins - copyins == -(-data_bytes // (64 << 10))  # one G3 copy-in per chunk
    assert set(loaded) == set(weights)
    bases = {id(get_buffer(base_buffer(t.uop)).base) for t in loaded.values()}  # type: ignore[arg-type]
    assert len(bases) == 1  # one allocation for the file, each tensor a view of it
    for k, v in weights.items():
        assert loaded[k].device == "USB" and loaded[k].shape == v.shape and np.dtype(loaded[k].dtype.fmt) == v.dtype
        if v.size:
            assert vram_bytes(loaded[k]) == v.tobytes()
        np.testing.assert_array_equal(loaded[k].numpy(), v)
        np.testing.assert_array_equal(loaded[k].to("CPU").numpy(), v)


def test_bfloat16_tensors_load_to_usb_as_their_bits(tmp_path: pathlib.Path) -> None:
    bits = np.random.default_rng(5).integers(0, 2**16, 40, dtype=np.uint16)
    path = tmp_path / "bf.safetensors"
    safe_save({"w": Tensor(bits).bitcast(dtypes.bfloat16)}, path)
    w = safe_load(path, device="USB")["w"]
    assert w.dtype == dtypes.bfloat16 and vram_bytes(w) == bits.tobytes()
    np.testing.assert_array_equal(w.to("CPU").bitcast(dtypes.uint16).numpy(), bits)


def test_streaming_a_truncated_range_fails_clearly_and_leaves_the_device_usable(tmp_path: pathlib.Path,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:  # fmt: skip
    import speck.tensor.usb as usb_mod

    monkeypatch.setattr(usb_mod, "STAGING_CHUNK", 4096)
    path = tmp_path / "short.bin"
    path.write_bytes(bytes(range(256)) * 40)  # 10240 bytes
    dest = Buffer("USB", 12288, np.uint8)
    with pytest.raises(HCQError, match=r"short.bin ends at byte 10240, but 12288 bytes were to be read from offset 0"):
        usb().load_file(dest, str(path), 0)
    ok = Buffer("USB", 6000, np.uint8)
    usb().load_file(ok, str(path), 100)
    assert usb().gpu.sim.read_vram(ok.opaque.va, 6000) == path.read_bytes()[100:6100]


class _Model:
    def __init__(self, device: str) -> None:
        self.emb = Tensor.empty(300, 257, device=device)
        self.layers = [{"ids": Tensor.empty(1001, device=device, dtype=dtypes.int64)}]


def test_load_state_dict_into_a_usb_model_from_a_streamed_file(tmp_path: pathlib.Path) -> None:
    w = _weights()
    path = tmp_path / "m.safetensors"
    safe_save({"emb": Tensor(w["emb"]), "layers.0.ids": Tensor(w["ids"])}, path)
    model = _Model("USB")
    state = safe_load(path, device="USB")
    dev = usb()
    copyins = dev.gpu.copy_stats.copyins
    GlobalCounters.reset()
    load_state_dict(model, state)
    assert dev.gpu.copy_stats.copyins == copyins and GlobalCounters.kernel_count == 0  # already in VRAM: no copy
    assert vram_bytes(model.emb) == w["emb"].tobytes()
    np.testing.assert_array_equal(model.layers[0]["ids"].numpy(), w["ids"])


def test_load_state_dict_from_cpu_and_from_disk_tensors(tmp_path: pathlib.Path) -> None:
    w = _weights()
    model = _Model("USB")
    load_state_dict(model, {"emb": Tensor(w["emb"]), "layers.0.ids": Tensor(w["ids"])})
    np.testing.assert_array_equal(model.emb.numpy(), w["emb"])
    # DISK tensors (views of a raw file holding both arrays): each is streamed from the file with pread, never
    # through the DISK device's memory map
    raw = tmp_path / "raw.bin"
    emb2, ids2 = (w["emb"] * 2).astype(np.float32), w["ids"] // 3
    raw.write_bytes(emb2.tobytes() + ids2.tobytes())
    as_f32 = Tensor.empty((emb2.nbytes + ids2.nbytes) // 4, dtype=dtypes.float32, device=f"DISK:{raw}")
    as_i64 = Tensor.empty((emb2.nbytes + ids2.nbytes) // 8, dtype=dtypes.int64, device=f"DISK:{raw}")
    load_state_dict(model, {"emb": as_f32[: emb2.size].reshape(300, 257), "layers.0.ids": as_i64[emb2.nbytes // 8 :]})
    assert vram_bytes(model.emb) == emb2.tobytes()
    np.testing.assert_array_equal(model.layers[0]["ids"].numpy(), ids2)
    for t in (as_f32, as_i64):
        bb = base_buffer(t.uop)
        assert bb is not None and not get_buffer(bb).is_allocated  # the file was never mapped


# ---------------- no full host copy of the file ----------------
_RSS_SCRIPT = """
import sys, numpy as np
from speck.tensor import Device, Tensor
from speck.tensor.nn.state import safe_load
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
path, target = sys.argv[1], sys.argv[2]
sim = Device["USB"].gpu.sim
Tensor(np.zeros(1024, np.float32)).to("USB").realize()  # bring the copy path up first
open("/proc/self/clear_refs", "w").write("5")  # VmHWM := VmRSS
rss0, vram0 = status("VmRSS"), len(sim.vram._pages) << 20
loaded = safe_load(path, device=target)
if target == "CPU":
    loaded = {k: v.to("USB").realize() for k, v in loaded.items()}
vram = (len(sim.vram._pages) << 20) - vram0  # the simulated VRAM lives in this process too
print(status("VmHWM") - rss0 - vram, vram)
"""


@pytest.mark.slow
def test_safe_load_to_usb_never_holds_the_file_in_host_memory(tmp_path: pathlib.Path) -> None:
    """Peak RSS while loading a 128 MiB file, less the simulated VRAM the load fills: streaming needs only its two
    16 MiB staging buffers; loading to the CPU first (the control) holds the whole file, and the measurement sees it."""
    rng = np.random.default_rng(6)
    path = tmp_path / "big.safetensors"
    size = 128 << 20
    safe_save({f"w{i}": Tensor(rng.standard_normal(size // 16, dtype=np.float32)) for i in range(4)}, path)
    extra = {}
    for target in ("USB", "CPU"):
        r = subprocess.run([sys.executable, "-c", _RSS_SCRIPT, str(path), target], capture_output=True, text=True,
                           env=os.environ | {"PYTHONPATH": SRC_PATH, "SPECK_USB_SIM": "1"}, timeout=900)  # fmt: skip
        assert r.returncode == 0, r.stderr
        host, vram = (int(x) for x in r.stdout.split())
        assert vram >= size
        extra[target] = host
    assert extra["USB"] < size // 2, f"streaming held {extra['USB'] >> 20} MiB of host memory beyond VRAM"
    assert extra["CPU"] > size, f"the control should hold the file, measured {extra['CPU'] >> 20} MiB"


# ---------------- a file's bool bytes other than 0/1 ----------------
@pytest.mark.parametrize("how", ["safe_load(device=USB)", "DISK .to(USB)"])
def test_a_files_bool_bytes_other_than_0_1_reach_vram_as_0_1(tmp_path: pathlib.Path, how: str) -> None:
    """A safetensors bool entry holding 2/255 (numpy reads nonzero as True) lands in VRAM as 0/1 bytes, so a copy to
    a CPU backend that loads the byte as it is (CLANG, X86) reads what numpy reads (it counted 2 + 255 + ...)."""
    odd = bytes([2, 0, 255, 1, 0, 128, 1, 7])
    ref = np.frombuffer(odd, bool)
    path = tmp_path / "b.safetensors"
    safe_save({"b": Tensor(np.zeros(len(odd), bool))}, path)
    path.write_bytes(path.read_bytes()[: -len(odd)] + odd)
    t = safe_load(path, device="USB")["b"] if how.startswith("safe_load") else safe_load(path)["b"].to("USB")
    t.realize()
    assert vram_bytes(t) == ref.astype(np.uint8).tobytes()
    for dev in ("CPU:X86", "CPU:CLANG", "CPU", "PYTHON"):
        x = t.to(dev)
        assert x.logical_not().tolist() == (~ref).tolist() and x.sum().item() == int(ref.sum())
    assert t.logical_not().tolist() == (~ref).tolist()
