"""speck.usbgpu copy benchmark on the simulator's default model (USB 3.2 Gen 2, 10 Gbit/s link).

Copies 64 MB in and out with the pipelined G3 copy-in and the serial G0 reference, through the real transport,
fake libusb and C helper. Throughput is simulated (virtual clock) MB/s; host CPU is measured with the thread CPU
clock. The driver's own CPU is measured by replaying: every transport call of the simulated run is recorded with its
result, then the same copies run again against a transport that returns the recorded results, so the driver does
exactly the same work with nothing (no libusb, no fake libusb, no model) behind it.
The tensor-level row loads a safetensors file of the same size to the `USB:SIM` tensor device (speck.tensor:
safe_load streams disk -> pinned staging -> VRAM with G3) and compares it, in the same run on the same simulated
bridge, with one raw G3 copy-in of the file's data section (interleaved rounds, medians).
The compute rows dispatch a real gfx1100 kernel (out = x * a + b over 4096 floats, 128 waves; LLVM via speck.codegen's
AMDGPU compiler) through PM4 on the simulated compute queue: one dispatch per doorbell against the same dispatches
batched in one indirect buffer (one doorbell), interleaved rounds, medians. Simulated time covers the whole path (USB
transfers for kernargs, ring and doorbell, the modelled GPU time, the fence); the GPU's own time per dispatch is
read from RELEASE_MEM timestamps; emulated wave-instructions per second is the shader-core emulator's host speed.
The tensor compute rows run speck.tensor on the `USB:SIM` device (kernels from the AMD backend, speck.hcq.amd over the
driver): eager kernels per second, a jitted training step of the main job's model (each replay one indirect buffer
and one doorbell) with its simulated time, emulated instructions and host wall time, and a 64 MB tensor copied in,
computed on and copied out.
Run: python3 bench/usbgpu.py [--size N] [--repeat R] [--dispatches K] [--train-model M] [--train-batch B]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from speck.usbgpu.api import UsbGpu
from speck.usbgpu.gpu import GpuOptions
from speck.usbgpu.sim.device import SimDevice

TRANSPORT_CALLS = ("control_in", "control_out", "bulk_out", "bulk_in", "submit_bulk_out", "wait")


class Recorder:
    """Forwards to the real transport and logs what every call returned."""

    def __init__(self, usb: Any) -> None:
        self.usb = usb
        self.log: list[tuple[str, Any]] = []
        for name in TRANSPORT_CALLS:
            setattr(self, name, self._forward(name))

    def _forward(self, name: str) -> Callable[..., Any]:
        fn = getattr(self.usb, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            self.log.append((name, result))
            return result

        return call

    def close(self) -> None:
        self.usb.close()


class Replayer:
    """Answers every call with the recorded result: a transport that costs (almost) nothing."""

    def __init__(self, log: list[tuple[str, Any]]) -> None:
        self.log = log
        self.pos = 0
        for name in TRANSPORT_CALLS:
            setattr(self, name, self._answer(name))

    def _answer(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            recorded, result = self.log[self.pos]
            assert recorded == name, f"replay diverged at call {self.pos}: {name} vs recorded {recorded}"
            self.pos += 1
            return result

        return call

    def close(self) -> None:
        pass


@dataclass
class Run:
    mb_per_s: float
    control_per_mb: float
    total_ms_per_mb: float  # host CPU of the whole simulated run: driver + transport + fake libusb + model
    model_ms_per_mb: float
    driver_ms_per_mb: float = 0.0  # host CPU of the driver alone (replayed against recorded device answers)


def bench_mode(mode: str, nbytes: int, repeat: int, data: bytes) -> tuple[Run, Run, bool, tuple[float, float]]:
    """Simulated runs (throughput, control transfers, total CPU), then replays of the same runs (driver CPU).
    Also returns the SDMA dwords per copy-in streamed over 0xF0 before any payload and those uploaded through a
    bounce buffer instead."""
    from speck.usbgpu.transport import UsbTransport

    mb = nbytes / 1e6
    dev = SimDevice()
    options = GpuOptions.from_env(mode, firmware=dev.firmware_files())
    recorder = Recorder(UsbTransport.open(sim=[dev]))
    gpu = UsbGpu(recorder, options, [dev])  # type: ignore[arg-type]
    buf = gpu.alloc(nbytes)
    out = bytearray(nbytes)
    gpu.copyin(buf, data[:4096])  # one-time bounce-buffer init is not part of the steady state
    first_ring, first_upload = gpu.copy_stats.ring_dwords, gpu.copy_stats.uploaded_dwords
    ops = {"in": lambda g: g.copyin(buf, data), "out": lambda g: g.copyout(out, buf)}
    runs: dict[str, list[Run]] = {"in": [], "out": []}
    for kind in ("in", "out"):
        for _ in range(repeat):
            ctrl0, v0, cpu0, model0 = dev.stats["control_transfers"], dev.now_ns, time.thread_time(), dev.model_cpu_s
            ops[kind](gpu)
            cpu, virtual = time.thread_time() - cpu0, (dev.now_ns - v0) / 1e9
            runs[kind].append(
                Run(
                    mb / virtual,
                    (dev.stats["control_transfers"] - ctrl0) / mb,
                    cpu * 1e3 / mb,
                    (dev.model_cpu_s - model0) * 1e3 / mb,
                )
            )
    ok = out == data and not dev.violations
    ring_dwords = (gpu.copy_stats.ring_dwords - first_ring) / repeat
    uploaded = (gpu.copy_stats.uploaded_dwords - first_upload) / repeat
    gpu.close()
    # Replay: the driver makes exactly the same calls and gets exactly the same answers, with no device behind.
    replay = UsbGpu(Replayer(recorder.log), options)  # type: ignore[arg-type]
    rbuf = replay.alloc(nbytes)
    rout = bytearray(nbytes)
    replay.copyin(rbuf, data[:4096])
    rops = {"in": lambda g: g.copyin(rbuf, data), "out": lambda g: g.copyout(rout, rbuf)}
    for kind in ("in", "out"):
        for run in runs[kind]:
            cpu0 = time.thread_time()
            rops[kind](replay)
            run.driver_ms_per_mb = (time.thread_time() - cpu0) * 1e3 / mb
    fields = Run.__dataclass_fields__
    med = {k: Run(**{f: statistics.median(getattr(r, f) for r in v) for f in fields}) for k, v in runs.items()}
    return med["in"], med["out"], ok, (ring_dwords, uploaded)


@dataclass
class TensorLoad:
    raw_mb_per_s: float  # one G3 copy-in of the data section (virtual time)
    load_mb_per_s: float  # safe_load(path, device="USB:SIM") of the file (virtual time)
    raw_wall_s: float  # host wall time of the same two (the simulator runs in this process: noisy, CPU-bound)
    load_wall_s: float
    copyins: float  # G3 copy-ins one load made
    ok: bool


def bench_tensor_load(nbytes: int, repeat: int) -> TensorLoad:
    """safe_load of an `nbytes` safetensors file (8 float32 tensors) to USB:SIM vs a raw copy-in of its bytes."""
    import tempfile

    import numpy as np

    from speck.tensor import Device, Tensor
    from speck.tensor.nn.state import safe_load, safe_save

    rng = np.random.default_rng(0)
    per = nbytes // 8 // 4
    arrays = {f"layer{i}.weight": rng.standard_normal(per, dtype=np.float32) for i in range(8)}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "weights.safetensors")
        safe_save({k: Tensor(v) for k, v in arrays.items()}, path)
        data = b"".join(a.tobytes() for a in arrays.values())  # the data section, as the file holds it
        dev = Device["USB:SIM"]
        gpu, sim = dev.gpu, dev.gpu.sim
        buf = gpu.alloc(len(data))
        gpu.copyin(buf, data[:4096])  # one-time bounce-buffer init, as in the raw rows
        raw: list[tuple[float, float]] = []
        load: list[tuple[float, float]] = []
        copyins: list[int] = []
        ok = True
        for _ in range(repeat):  # interleaved, so host noise hits both alike
            v0, t0 = sim.now_ns, time.perf_counter()
            gpu.copyin(buf, data)
            raw.append(((sim.now_ns - v0) / 1e9, time.perf_counter() - t0))
            c0, v0, t0 = gpu.copy_stats.copyins, sim.now_ns, time.perf_counter()
            loaded = safe_load(path, device="USB:SIM")
            load.append(((sim.now_ns - v0) / 1e9, time.perf_counter() - t0))
            copyins.append(gpu.copy_stats.copyins - c0)
            ok = ok and all(np.array_equal(loaded[k].numpy(), v) for k, v in arrays.items())
            del loaded
        gpu.free(buf)
        ok = ok and not sim.violations
    mb = len(data) / 1e6
    med = statistics.median
    return TensorLoad(mb / med(v for v, _ in raw), mb / med(v for v, _ in load), med(w for _, w in raw),
                      med(w for _, w in load), med(copyins), ok)  # fmt: skip


@dataclass
class Compute:
    dispatch_us: float  # simulated time per dispatch, submit to signal, host side included
    gpu_us: float  # GPU time per dispatch between RELEASE_MEM timestamps around the dispatches
    wall_ms: float  # host wall time per dispatch (the emulator runs in this process)
    instr_per_s: float  # emulated wave-instructions per host second
    doorbells: float  # compute doorbells per round


def bench_compute(dispatches: int, repeat: int) -> tuple[Compute, Compute, bool]:
    """K dispatches of one kernel per round: each submitted to the ring on its own, or all in one IB batch."""
    import struct

    import numpy as np

    from speck.codegen.compiler.amdgpu import AMDGPUCompiler
    from speck.usbgpu.amd import pm4
    from speck.usbgpu.sim.kernels import AXPB
    from speck.usbgpu.sim.loader import load_kernel

    n, a, b = 4096, np.float32(1.5), np.float32(-0.25)
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        code = load_kernel(gpu, AMDGPUCompiler().compile(AXPB), "axpb")
        x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        src, dst, stamps = gpu.alloc(x.nbytes), gpu.alloc(x.nbytes), gpu.alloc(16)
        gpu.copyin(src, x.tobytes())
        launch = gpu.launch_packets(code, (n // 64,), (64,), struct.pack("<QQffI", dst.va, src.va, a, b, n))
        rounds: dict[str, list[Compute]] = {"ring": [], "batch": []}
        for _ in range(repeat):
            for how in rounds:  # interleaved, so host noise hits both alike
                work = [launch] * dispatches
                d0, v0, t0, i0 = dev.stats["doorbells"], dev.now_ns, time.perf_counter(), dev.gpu.cp.instructions
                if how == "ring":
                    gpu.submit(pm4.timestamp(stamps.va))
                    for packets in work:
                        gpu.submit(packets)
                    value = gpu.submit(pm4.timestamp(stamps.va + 8))
                else:
                    value = gpu.submit(
                        pm4.timestamp(stamps.va) + sum(work, []) + pm4.timestamp(stamps.va + 8), batch=True
                    )
                gpu.wait(value)
                wall, virtual = time.perf_counter() - t0, (dev.now_ns - v0) / 1e3
                t = struct.unpack("<QQ", bytes(dev.read_vram(stamps.va, 16)))
                rounds[how].append(
                    Compute(
                        virtual / dispatches,
                        (t[1] - t[0]) * pm4.TIMESTAMP_NS / 1e3 / dispatches,
                        wall * 1e3 / dispatches,
                        (dev.gpu.cp.instructions - i0) / wall,
                        dev.stats["doorbells"] - d0,
                    )
                )
        out = bytearray(x.nbytes)
        gpu.copyout(out, dst)
        ok = np.array_equal(np.frombuffer(out, np.float32), x * a + b) and not dev.violations
    fields = Compute.__dataclass_fields__
    med = {k: Compute(**{f: statistics.median(getattr(r, f) for r in v) for f in fields}) for k, v in rounds.items()}
    return med["ring"], med["batch"], ok


@dataclass
class EndToEnd:
    copyin_ms: float  # simulated
    compute_ms: float  # simulated: dispatch submitted to its signal
    copyout_ms: float  # simulated
    gpu_us: float  # the dispatch's own GPU time (RELEASE_MEM timestamps)
    wall_s: float  # host wall time of the three
    instructions: int  # emulated wave-instructions
    ok: bool


def bench_end_to_end(nbytes: int) -> EndToEnd:
    """A float32 tensor of `nbytes`: G3 copy-in, out = x * a + b on the GPU (one dispatch), copy-out. Simulated
    time is deterministic, so one run is shown."""
    import struct

    import numpy as np

    from speck.codegen.compiler.amdgpu import AMDGPUCompiler
    from speck.usbgpu.amd import pm4
    from speck.usbgpu.sim.kernels import AXPB
    from speck.usbgpu.sim.loader import load_kernel

    n = nbytes // 4 // 64 * 64
    a, b = np.float32(1.5), np.float32(-0.25)
    x = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    dev = SimDevice()
    with UsbGpu.open(sim=dev) as gpu:
        code = load_kernel(gpu, AMDGPUCompiler().compile(AXPB), "axpb")
        src, dst, stamps = gpu.alloc(x.nbytes), gpu.alloc(x.nbytes), gpu.alloc(16)
        gpu.copyin(src, x[:1024].tobytes())  # one-time bounce-buffer init, as in the copy rows
        launch = gpu.launch_packets(code, (n // 64,), (64,), struct.pack("<QQffI", dst.va, src.va, a, b, n))
        out = bytearray(x.nbytes)
        t0, v0 = time.perf_counter(), dev.now_ns
        gpu.copyin(src, x)
        v1 = dev.now_ns
        gpu.wait(gpu.submit(pm4.timestamp(stamps.va) + launch + pm4.timestamp(stamps.va + 8)))
        v2 = dev.now_ns
        gpu.copyout(out, dst)
        v3, wall = dev.now_ns, time.perf_counter() - t0
        t = struct.unpack("<QQ", bytes(dev.read_vram(stamps.va, 16)))
        ok = np.array_equal(np.frombuffer(out, np.float32), x * a + b) and not dev.violations
        instructions = dev.gpu.cp.last_dispatch.instructions
    gpu_us = (t[1] - t[0]) * pm4.TIMESTAMP_NS / 1e3
    return EndToEnd((v1 - v0) / 1e6, (v2 - v1) / 1e6, (v3 - v2) / 1e6, gpu_us, wall, instructions, ok)


@dataclass
class TensorCompute:
    kernels_per_s_sim: float  # eager kernels per simulated second (launch, kernargs, doorbell, signal; host side too)
    kernels_per_s_wall: float  # the same per host second (tensor frontend + driver + emulator)
    step_sim_ms: float  # one replayed training step, simulated
    step_wall_s: float
    step_instructions: int
    step_dispatches: int
    step_doorbells: float
    e2e_ms: tuple[float, float, float]  # simulated copy-in, compute, copy-out of the big tensor
    e2e_wall_s: float
    ok: bool


def _sim_ns(dev: Any) -> int:
    return int(dev.gpu.sim.now_ns)


def bench_tensor_compute(nbytes: int, model: str, batch: int, steps: int) -> TensorCompute:
    """speck.tensor on USB:SIM: eager kernels, a jitted Adam step of `model` on `batch` images (the last of `steps`
    replays measured), and a float32 tensor of `nbytes` through copy-in, x * 1.5 - 0.25, copy-out."""
    import numpy as np

    from speck.tensor import Device, Tensor, TinyJit
    from speck.tensor.examples.train import MODELS
    from speck.tensor.nn.optim import Adam
    from speck.tensor.nn.state import get_parameters

    name = "USB:SIM"
    dev: Any = Device[name]
    cp, stats = dev.gpu.sim.gpu.cp, dev.gpu._engine_compute().stats
    # eager kernels: 32 elementwise kernels in a row on a small tensor (programs cached after the first)
    t = Tensor(np.ones(256, np.float32)).to(name).realize()
    (t + 1).realize()
    v0, w0 = _sim_ns(dev), time.perf_counter()
    for i in range(32):
        t = (t * 1.0001 + i).realize()
    dev.synchronize()
    eager_sim, eager_wall = (_sim_ns(dev) - v0) / 1e9, time.perf_counter() - w0
    # a training step under TinyJit
    Tensor.manual_seed(0)
    net = MODELS[model]()
    params = get_parameters(net)
    for p in params:
        p.replace(p.to(name)).realize()
    opt = Adam(params, lr=1e-3)
    rng = np.random.default_rng(0)
    x = Tensor(rng.random((batch, 1, 28, 28), dtype=np.float32)).to(name).realize()
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32)).to(name).realize()

    @TinyJit
    def step(x: Tensor, y: Tensor) -> Tensor:
        with Tensor.train():
            opt.zero_grad()
            loss = net(x).sparse_categorical_crossentropy(y)
            loss.backward()
            opt.step()
        return loss.realize()

    losses = []
    for i in range(steps):
        if i == steps - 1:
            v0, w0, i0, d0, b0 = _sim_ns(dev), time.perf_counter(), cp.instructions, stats["dispatches"], \
                stats["submissions"]  # fmt: skip
        losses.append(step(x, y).item())
    step_sim, step_wall = (_sim_ns(dev) - v0) / 1e6, time.perf_counter() - w0
    step_instr, step_disp, step_bells = cp.instructions - i0, stats["dispatches"] - d0, stats["submissions"] - b0
    # end to end
    n = nbytes // 4
    big = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    w0, v0 = time.perf_counter(), _sim_ns(dev)
    u = Tensor(big).to(name).realize()
    v1 = _sim_ns(dev)
    r = (u * 1.5 - 0.25).realize()
    dev.synchronize()
    v2 = _sim_ns(dev)
    out = r.numpy()
    v3, e2e_wall = _sim_ns(dev), time.perf_counter() - w0
    # (the kernel may fuse the multiply-add: within one rounding of numpy's two-step result)
    ok = bool(np.allclose(out, big * np.float32(1.5) - np.float32(0.25), rtol=1e-6, atol=1e-6))
    ok = ok and all(np.isfinite(losses))
    ok = ok and losses[-1] < losses[0] and not dev.gpu.sim.violations
    return TensorCompute(32 / eager_sim, 32 / eager_wall, step_sim, step_wall, step_instr, step_disp,
                         step_bells, ((v1 - v0) / 1e6, (v2 - v1) / 1e6, (v3 - v2) / 1e6), e2e_wall, ok)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", type=int, default=64_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--dispatches", type=int, default=16)
    parser.add_argument("--train-model", default="small-cnn", help="model of the training-step row (cnn: minutes)")
    parser.add_argument("--train-batch", type=int, default=32)
    parser.add_argument("--only-tensor", action="store_true", help="only the tensor compute rows")
    args = parser.parse_args()
    if args.only_tensor:
        print_tensor_compute(args)
        return
    data = os.urandom(args.size)
    link = SimDevice().timing.link_bytes_per_s / 1e6
    results = {mode: bench_mode(mode, args.size, args.repeat, data) for mode in ("g3", "g0")}

    print(
        f"speck.usbgpu simulated copies of {args.size / 1e6:.0f} MB, link model {link:.0f} MB/s payload, "
        f"median of {args.repeat}"
    )
    header = f"{'op':<12}{'MB/s':>9}{'of link':>9}{'ctrl/MB':>9}{'driver ms/MB':>14}{'all ms/MB':>11}{'model':>9}  ok"
    print(header)
    print("-" * len(header))
    for mode, (cin, cout, ok, _) in results.items():
        for name, r in ((f"{mode} copyin", cin), (f"{mode} copyout", cout)):
            print(
                f"{name:<12}{r.mb_per_s:9.1f}{r.mb_per_s / link:9.1%}{r.control_per_mb:9.2f}"
                f"{r.driver_ms_per_mb:14.3f}{r.total_ms_per_mb:11.3f}{r.model_ms_per_mb:9.3f}  {'yes' if ok else 'NO'}"
            )
    g3, g0, (dwords, uploaded) = results["g3"][0], results["g0"][0], results["g3"][3]
    # The ring build's 0xF0 part (a short batch whole, an uploaded batch's boot batch) is a mode-1 stream at the
    # firmware's per-dword cost; during it EP 0x02 carries no payload. Show how much of the copy-in it takes and the
    # efficiency of the rest.
    ring_s = dwords * SimDevice().timing.f0_write_ns_per_dword / 1e9
    total_s = args.size / 1e6 / g3.mb_per_s
    print()
    print(
        f"G3 ring build         {dwords:.0f} dwords over 0xF0 = {ring_s * 1e3:.1f} ms of {total_s * 1e3:.1f} ms "
        f"({uploaded:.0f} uploaded through a bounce buffer); "
        f"payload phase at {args.size / 1e6 / (total_s - ring_s) / link:.1%} of the link"
    )
    print(f"G3 copyin / link      {g3.mb_per_s / link:6.1%}   (target >= 85%)")
    print(f"G3 copyin / G0 copyin {g3.mb_per_s / g0.mb_per_s:6.2f}x  (target >= 2.5x)")
    print(f"G3 driver CPU         {g3.driver_ms_per_mb:6.3f} ms/MB (target <= 0.25)")
    print("driver = host CPU of the driver replayed against the recorded device answers (no transport, no model);")
    print("all = host CPU of the simulated run (driver + python-libusb1 + C helper + fake libusb + shim + model).")
    t = bench_tensor_load(args.size, args.repeat)
    print()
    print(f"tensor-level: safe_load of a {args.size / 1e6:.0f} MB safetensors file (8 tensors) to USB:SIM, "
          f"median of {args.repeat}, interleaved with a raw G3 copy-in of the same bytes")  # fmt: skip
    print(f"{'op':<26}{'MB/s':>9}{'host wall s':>13}  ok")
    print(f"{'raw G3 copyin':<26}{t.raw_mb_per_s:9.1f}{t.raw_wall_s:13.2f}")
    print(f"{'safe_load(device=USB)':<26}{t.load_mb_per_s:9.1f}{t.load_wall_s:13.2f}  {'yes' if t.ok else 'NO'}")
    print(f"safe_load / raw copyin   {t.load_mb_per_s / t.raw_mb_per_s:6.3f}x  (target >= 0.95x; simulated time; "
          f"{t.copyins:.0f} G3 copy-ins of <= 16 MiB staged chunks)")  # fmt: skip
    # next, while the tensor-level USB:SIM device is the simulated bus the rows above used (the raw rows below put
    # bridges of their own on the bus, and the tensor device's would be gone)
    print_tensor_compute(args)
    ring, batch, ok = bench_compute(args.dispatches, args.repeat)
    print()
    print(f"compute: {args.dispatches} dispatches of a gfx1100 kernel (4096 floats, 128 waves) per round through PM4, "
          f"median of {args.repeat}, interleaved")  # fmt: skip
    print(f"{'op':<22}{'sim us/disp':>12}{'GPU us/disp':>12}{'disp/s (sim)':>13}{'wall ms/disp':>13}"
          f"{'wave-instr/s':>13}{'doorbells':>10}  ok")  # fmt: skip
    for name, c in (("one per doorbell", ring), ("IB batch", batch)):
        print(f"{name:<22}{c.dispatch_us:12.1f}{c.gpu_us:12.2f}{1e6 / c.dispatch_us:13.0f}{c.wall_ms:13.1f}"
              f"{c.instr_per_s:13.0f}{c.doorbells:10.0f}  {'yes' if ok else 'NO'}")  # fmt: skip
    print(f"IB batch / one per doorbell: {ring.dispatch_us / batch.dispatch_us:.2f}x dispatches per simulated second")
    e = bench_end_to_end(args.size)
    total = e.copyin_ms + e.compute_ms + e.copyout_ms
    print()
    print(
        f"end to end: a {args.size / 1e6:.0f} MB float32 tensor copied in, x * 1.5 - 0.25 on the GPU (one "
        f"dispatch, {e.instructions} wave-instructions), copied out; simulated ms, deterministic: one run"
    )
    print(f"{'copyin':>10}{'compute':>10}{'GPU us':>9}{'copyout':>10}{'total':>10}{'MB/s':>9}{'host wall s':>13}  ok")
    print(f"{e.copyin_ms:10.1f}{e.compute_ms:10.2f}{e.gpu_us:9.1f}{e.copyout_ms:10.1f}{total:10.1f}"
          f"{args.size / 1e3 / total:9.1f}{e.wall_s:13.1f}  {'yes' if e.ok else 'NO'}")  # fmt: skip


def print_tensor_compute(args: Any) -> None:
    tc = bench_tensor_compute(args.size, args.train_model, args.train_batch, steps=3)
    print()
    print("tensor compute on USB:SIM (speck.tensor -> AMD backend -> speck.hcq.amd -> PM4 -> RDNA3 emulator)")
    print(f"eager kernels/s          {tc.kernels_per_s_sim:9.0f} simulated   {tc.kernels_per_s_wall:7.1f} host wall")
    print(f"training step ({args.train_model}, batch {args.train_batch}, Adam, TinyJit replay): "
          f"{tc.step_sim_ms:.1f} ms simulated, {tc.step_dispatches} dispatches, {tc.step_doorbells:.0f} doorbell(s), "
          f"{tc.step_instructions} wave-instructions, {tc.step_wall_s:.1f} s host wall "
          f"({tc.step_instructions / tc.step_wall_s:.0f} emulated wave-instructions/s)")  # fmt: skip
    cin, comp, cout = tc.e2e_ms
    total = cin + comp + cout
    print(f"end to end (tensor): {args.size / 1e6:.0f} MB copyin {cin:.1f} ms, x * 1.5 - 0.25 {comp:.1f} ms, copyout "
          f"{cout:.1f} ms: {total:.1f} ms simulated ({args.size / 1e3 / total:.1f} MB/s), {tc.e2e_wall_s:.1f} s host "
          f"wall  {'ok' if tc.ok else 'NOT OK'}")  # fmt: skip


if __name__ == "__main__":
    main()
