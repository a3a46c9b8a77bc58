"""Ctrl-C in the simulator: SIGINT arriving while a simulated operation runs - which means inside a model callback,
where the simulated transfer spends its time - raises KeyboardInterrupt from that operation at once, as itself; it is
never kept for a later, unrelated error, and the device works again after reopening.

Each case runs in a child process that installs Python's default SIGINT handler itself (whatever disposition it
inherited), and raises SIGINT from an event of the simulator's clock, so the interrupt lands at a known virtual time;
during a dispatch (the shader-core emulator runs while virtual time stands still) a thread sends it, as Ctrl-C would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rdna3_llvm import compile_ir
from speck.usbgpu.sim.kernels import SPIN

CHILD = r"""
import json, os, signal, struct, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)
from speck.usbgpu.amd import pm4
from speck.usbgpu.amd.tables import PM4
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.sim import shim
from speck.usbgpu.sim.device import SimDevice

case = sys.argv[1]
dev = SimDevice()
gpu = UsbGpu.open(sim=dev)
buf = gpu.alloc(8 << 20)
when = dev.now_ns + 2e6  # 2 ms of virtual time into the operation
if case == "right after a completion":
    # The interrupt lands in the callback just after it handed a finished transfer to libusb, so the libusb call
    # itself succeeds: the interrupt must still be raised by that call, not kept for a later error.
    real = shim.lib

    class Lib:
        armed = False

        def __getattr__(self, name):
            return getattr(real, name)

        def fakeusb_complete(self, *args):
            real.fakeusb_complete(*args)
            if Lib.armed:
                Lib.armed = False
                raise KeyboardInterrupt

    shim.lib = Lib()
    dev.clock.at(when, lambda: setattr(Lib, "armed", True))
elif case == "dispatch":
    # A kernel that spins for ever (its budget is hours of emulation): virtual time stands still while the
    # emulator runs, so the signal comes from a thread after a second of real time, as a Ctrl-C would.
    from speck.usbgpu.sim.loader import load_kernel

    with open(sys.argv[2], "rb") as f:  # the spinning kernel's code object, compiled by the parent
        spin = load_kernel(gpu, f.read(), "spin")

    def interrupt():
        global when
        when = dev.now_ns
        os.kill(os.getpid(), signal.SIGINT)

    threading.Timer(1.0, interrupt).start()
else:
    dev.clock.at(when, lambda: signal.raise_signal(signal.SIGINT))
out = {"case": case}
try:
    if case == "dispatch":
        gpu.dispatch(spin, (1,), (32,), struct.pack("<Q", buf.va), wait=True, timeout=3600.0)
    elif case == "compute wait":  # the queue waits on memory nobody writes: the host polls for a long time
        value = gpu.submit(pm4.wait_reg_mem(buf.va, 1, PM4.WAIT_FUNCTION_EQ))
        gpu.wait(value, timeout=3600.0)
    elif case == "copyin":  # the pipelined copy-in: async bulk transfers through the C helper
        for _ in range(100):
            gpu.copyin(buf, bytes(8 << 20))
    else:  # copy-out: synchronous bulk IN, control transfers
        for _ in range(100):
            gpu.copyout(bytearray(8 << 20), buf)
    out["raised"] = None
except KeyboardInterrupt as exc:
    out["raised"] = "KeyboardInterrupt"
    out["late_ns"] = dev.now_ns - when  # virtual time the model ran on after the signal
    out["cause"] = repr(exc.__cause__)
except BaseException as exc:
    out["raised"] = f"{type(exc).__name__}: {exc}"
out["dispatches"] = dev.gpu.cp.dispatches_run  # dispatches that ran to their end
out["stored"] = [repr(shim.take_exception()), repr(getattr(shim, "take_interrupt", lambda: None)())]
if case == "right after a completion":
    shim.lib = real
gpu.close()
with UsbGpu.open(sim=dev) as again:  # the device is usable again after reopening
    b = again.alloc(4096)
    again.copyin(b, b"z" * 4096)
    back = bytearray(4096)
    again.copyout(back, b)
    out["reopened"] = bytes(back) == b"z" * 4096
print(json.dumps(out))
"""


@pytest.mark.parametrize("case", ["compute wait", "copyin", "copyout", "right after a completion", "dispatch"])
def test_ctrl_c_inside_the_simulator_raises_keyboard_interrupt_at_once(case: str, tmp_path: Path) -> None:
    spin = tmp_path / "spin.co"
    spin.write_bytes(compile_ir(SPIN))
    # the timeout only guards against a hang (a lost interrupt would poll for an hour of GPU time)
    run = subprocess.run([sys.executable, "-c", CHILD, case, str(spin)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["raised"] == "KeyboardInterrupt", out
    assert out["late_ns"] < 1e6, out  # the simulation stopped within 1 ms of virtual time of the signal
    assert out["cause"] == "None", out  # raised as itself, not as the cause of a libusb error
    assert out["stored"] == ["None", "None"], out  # nothing kept to resurface later
    assert out["reopened"], out
    assert out["dispatches"] == 0, out  # the spinning dispatch was stopped, not run out


AT_INSTRUCTION = r"""
import json, signal, struct, sys
signal.signal(signal.SIGINT, signal.default_int_handler)
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.sim import shim
from speck.usbgpu.sim.device import SimDevice
from speck.usbgpu.sim.loader import load_kernel
import importlib
emulator = importlib.import_module("speck.usbgpu.sim.rdna3.dispatch")  # the module (the package exports its function)

at = int(sys.argv[2])
seen = {"signal_at": None, "sched": None}
plain_init = emulator._Scheduler.__init__


def init(self, launch, budget, trace=None):
    # every non-branch instruction the emulator retires passes this trace: SIGINT is raised (as the kernel's
    # delivery would, on the main thread) once `at` wave-instructions have run, and the count kept
    def count(inst, w):
        if seen["signal_at"] is None and self.executed >= at:
            seen["signal_at"] = self.executed
            signal.raise_signal(signal.SIGINT)

    plain_init(self, launch, budget, count)
    seen["sched"] = self


emulator._Scheduler.__init__ = init
dev = SimDevice()
gpu = UsbGpu.open(sim=dev)
buf = gpu.alloc(4096)
with open(sys.argv[1], "rb") as f:
    spin = load_kernel(gpu, f.read(), "spin")
out = {}
try:
    gpu.dispatch(spin, (1,), (32,), struct.pack("<Q", buf.va), wait=True, timeout=3600.0)
    out["raised"] = None
except KeyboardInterrupt as exc:
    out["raised"] = "KeyboardInterrupt"
    out["cause"] = repr(exc.__cause__)
out["signal_at"] = seen["signal_at"]
out["executed"] = seen["sched"].executed  # wave-instructions the emulator ran in all
out["dispatches"] = dev.gpu.cp.dispatches_run
out["stored"] = [repr(shim.take_exception()), repr(shim.take_interrupt())]
gpu.close()
emulator._Scheduler.__init__ = plain_init
with UsbGpu.open(sim=dev) as again:
    b = again.alloc(4096)
    again.copyin(b, b"q" * 4096)
    back = bytearray(4096)
    again.copyout(back, b)
    out["reopened"] = bytes(back) == b"q" * 4096
print(json.dumps(out))
"""


@pytest.mark.parametrize("at", [1, 20_000])
def test_ctrl_c_stops_a_dispatch_within_a_few_emulated_instructions(at: int, tmp_path: Path) -> None:
    """SIGINT raised at a known point of a dispatch that would spin for ever stops the emulator at that point: the
    KeyboardInterrupt leaves the dispatch within one instruction of the group (32 wave-instructions), as itself,
    nothing is kept for later, and the device works after reopening."""
    spin = tmp_path / "spin.co"
    spin.write_bytes(compile_ir(SPIN))
    run = subprocess.run(
        [sys.executable, "-c", AT_INSTRUCTION, str(spin), str(at)], capture_output=True, text=True, timeout=600
    )  # the timeout only guards against a lost interrupt (the kernel's budget is hours of emulation)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["raised"] == "KeyboardInterrupt", out
    assert out["signal_at"] is not None and out["signal_at"] >= at, out
    assert out["executed"] - out["signal_at"] <= 32, out  # stopped within one instruction of the wave group
    assert out["cause"] == "None", out
    assert out["stored"] == ["None", "None"], out
    assert out["dispatches"] == 0, out
    assert out["reopened"], out
