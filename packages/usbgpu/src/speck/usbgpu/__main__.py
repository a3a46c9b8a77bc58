"""Command line: `python -m speck.usbgpu info [--sim]` and `python -m speck.usbgpu bench [--sim] [--size N]`."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import UsbError


def _open(args: argparse.Namespace) -> UsbGpu:
    return UsbGpu.open(args.index, sim=True if args.sim else None, mode=getattr(args, "mode", None))


def cmd_info(args: argparse.Namespace) -> int:
    """Print the bridge identity, the PCIe link state and the GPU's BARs."""
    with _open(args) as gpu:
        usb = gpu.transport
        ctx = gpu.context
        print(
            f"device    {getattr(usb, 'name', '?')}  {getattr(usb, 'vid', 0):04x}:{getattr(usb, 'pid', 0):04x}  "
            f"product {getattr(usb, 'product', '?')!r}" + ("  (simulated)" if gpu.sim else "")
        )
        print(f"link      LTSSM {ctx.bridge.ltssm():#04x} ({'up' if ctx.bridge.ltssm() == 0x78 else 'down'})")
        print(f"gpu       {ctx.pcie.vendor:04x}:{ctx.pcie.device:04x} on bus 4")
        for index, bar in sorted(ctx.pcie.bars.items()):
            kind = ("64-bit " if bar.is64 else "32-bit ") + ("prefetchable" if bar.prefetchable else "non-prefetchable")
            print(f"BAR{index}      {bar.address:#014x}  size {bar.size:#x}  {kind}")
        if ctx.pcie.rebar_size:
            print(f"ReBAR     BAR0 resized to {ctx.pcie.rebar_size >> 20} MiB")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """Copy `--size` random bytes in and out, validate, and print MB/s (virtual time on the simulator)."""
    with _open(args) as gpu:
        sim = gpu.sim
        data = os.urandom(args.size)
        buf = gpu.alloc(args.size)
        gpu.copyin(buf, data[: min(args.size, 4096)])  # one-time bounce-buffer init outside the timing

        def timed(fn: object) -> float:
            start_v, start_w = (sim.now_ns if sim else 0.0), time.perf_counter()
            fn()  # type: ignore[operator]
            return (sim.now_ns - start_v) / 1e9 if sim else time.perf_counter() - start_w

        out = bytearray(args.size)
        t_in = min(timed(lambda: gpu.copyin(buf, data)) for _ in range(args.repeat))
        t_out = min(timed(lambda: gpu.copyout(out, buf)) for _ in range(args.repeat))
        ok = out == data
        clock = "simulated" if sim else "wall-clock"
        mode = gpu.context.options.mode
        print(f"{mode} copyin  {args.size / t_in / 1e6:9.1f} MB/s ({clock})")
        print(f"{mode} copyout {args.size / t_out / 1e6:9.1f} MB/s ({clock})")
        print(f"validate  {'ok' if ok else 'MISMATCH'}")
        return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m speck.usbgpu`."""
    parser = argparse.ArgumentParser(prog="python -m speck.usbgpu", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("info", "identity, link and BARs"), ("bench", "copy-in/copy-out MB/s, validated")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--sim", action="store_true", help="use the built-in simulator instead of hardware")
        p.add_argument("--index", type=int, default=0, help="which bridge when several are connected")
        if name == "bench":
            p.add_argument("--size", type=int, default=64_000_000, help="bytes per copy (default 64000000)")
            p.add_argument("--repeat", type=int, default=1, help="repeats (the best is reported)")
            p.add_argument("--mode", choices=("g3", "g0"), default=None, help="copy-in algorithm (default g3)")
    args = parser.parse_args(argv)
    if args.command == "bench" and args.size <= 0:
        parser.error(f"--size must be positive, got {args.size}")
    try:
        return cmd_info(args) if args.command == "info" else cmd_bench(args)
    except UsbError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
