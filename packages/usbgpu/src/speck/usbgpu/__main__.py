"""Command line: `python -m speck.usbgpu info [--sim]` and `python -m speck.usbgpu bench [--sim] [--size N]`.

`info` only reads (vendor reads of xdata and config space): it never powers the link, configures bridges, sizes
BARs or touches GPU registers, so it is safe on any device in any state. `bench` opens the device for copies.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from speck.usbgpu.api import UsbGpu
from speck.usbgpu.bridge import Bridge
from speck.usbgpu.errors import UsbError
from speck.usbgpu.gpu import VERIFIED_BOARDS

PROGRESS_BAR_BYTES = 64_000_000  # copies larger than this show a progress bar


def cmd_info(args: argparse.Namespace) -> int:
    """Print the bridge identity, the PCIe link state and the GPU as it is currently programmed (reads only)."""
    from speck.usbgpu.transport import UsbTransport

    sim = None
    if args.sim:
        from speck.usbgpu.sim.device import SimDevice

        sim = [SimDevice()]
    with UsbTransport.open(args.index, sim=sim) as usb:
        topo = Bridge(usb).survey()
        print(
            f"device    {usb.name}  {usb.vid:04x}:{usb.pid:04x}  product {usb.product!r}"
            + ("  (simulated)" if usb.simulated else "")
        )
        print(f"link      LTSSM {topo.ltssm:#04x} ({'up' if topo.ltssm == 0x78 else 'down'})")
        if topo.gpu_ids is not None and topo.subsystem is not None:
            vendor, device, sub = topo.gpu_ids & 0xFFFF, topo.gpu_ids >> 16, topo.subsystem
            print(f"gpu       {vendor:04x}:{device:04x} on bus 4, subsystem {sub & 0xFFFF:04x}:{sub >> 16:04x}")
            board = VERIFIED_BOARDS.get((vendor, device, sub))
            print(
                f"board     {board} (bring-up verified: copies supported)"
                if board
                else "board     unverified: bring-up runs only with UsbGpu.open(unverified=True) / "
                "SPECK_USBGPU_UNVERIFIED=1, copies are refused otherwise"
            )
            for index, address in sorted(topo.bars.items()):
                print(f"BAR{index}      {address:#014x}")
            if topo.rebar_size:
                print(f"ReBAR     BAR0 is {topo.rebar_size >> 20} MiB")
        if topo.note:
            print(f"note      {topo.note}")
    return 0


@contextmanager
def progress_bar(total: int, desc: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress callback drawing a bar on stderr for copies over PROGRESS_BAR_BYTES (tqdm if installed, else a
    plain percentage line), or None for smaller copies."""
    if total <= PROGRESS_BAR_BYTES:
        yield None
        return
    try:
        from tqdm import tqdm
    except ImportError:
        shown = [-1]

        def plain(done: int, all_bytes: int) -> None:
            percent = 100 * done // all_bytes
            if percent != shown[0]:
                shown[0] = percent
                print(f"\r{desc}: {percent:3d}% of {all_bytes / 1e6:.0f} MB", end="", file=sys.stderr, flush=True)

        try:
            yield plain
        finally:
            print(file=sys.stderr)
        return
    with tqdm(total=total, desc=desc, unit="B", unit_scale=True) as bar:

        def update(done: int, all_bytes: int) -> None:
            bar.update(done - bar.n)

        yield update


def cmd_bench(args: argparse.Namespace) -> int:
    """Copy `--size` random bytes in and out, validate, and print MB/s (virtual time on the simulator)."""
    with UsbGpu.open(args.index, sim=True if args.sim else None, mode=args.mode) as gpu:
        sim = gpu.sim
        data = os.urandom(args.size)
        buf = gpu.alloc(args.size)
        gpu.copyin(buf, data[: min(args.size, 4096)])  # one-time bounce-buffer init outside the timing

        def timed(fn: Callable[[], None]) -> float:
            start_v, start_w = (sim.now_ns if sim else 0.0), time.perf_counter()
            fn()
            return (sim.now_ns - start_v) / 1e9 if sim else time.perf_counter() - start_w

        out = bytearray(args.size)
        t_in = t_out = float("inf")
        for _ in range(args.repeat):
            with progress_bar(args.size, "copyin") as bar:
                t_in = min(t_in, timed(lambda: gpu.copyin(buf, data, progress=bar)))
        for _ in range(args.repeat):
            with progress_bar(args.size, "copyout") as bar:
                t_out = min(t_out, timed(lambda: gpu.copyout(out, buf, progress=bar)))
        ok = out == data
        clock = "simulated" if sim else "wall-clock"
        mode = gpu.context.options.mode
        print(f"{mode} copyin  {args.size / t_in / 1e6:9.1f} MB/s ({clock})")
        print(f"{mode} copyout {args.size / t_out / 1e6:9.1f} MB/s ({clock})")
        print(f"validate  {'ok' if ok else 'MISMATCH'}")
        return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of `python -m speck.usbgpu`."""
    parser = argparse.ArgumentParser(prog="python -m speck.usbgpu", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (
        ("info", "identity, link, GPU ids and BARs (reads only)"),
        ("bench", "copy-in/copy-out MB/s, validated"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--sim", action="store_true", help="use a new simulated device instead of hardware")
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
    except KeyboardInterrupt as exc:
        notes = getattr(exc, "__notes__", None)
        print(
            "\ninterrupted. "
            + (
                "\n".join(notes)
                if notes
                else "The device was closed; it is usable again after a reopen (the next run opens it afresh)."
            ),
            file=sys.stderr,
        )
        return 130


if __name__ == "__main__":
    sys.exit(main())
