"""Ctrl-C while a tensor computes on USB:SIM: the KeyboardInterrupt reaches the top as itself from inside the
emulated kernel (the emulator, the command processor, the simulated link and the hcq runner keep nothing of it),
and an uncaught one ends the process as Python does (killed by SIGINT, status 130 in a shell, with a
KeyboardInterrupt traceback).

The child installs Python's default SIGINT handler itself; a thread sends SIGINT once the emulator has run a known
number of wave-instructions of the matmul kernel, as a Ctrl-C would, so the assertion counts emulated instructions,
not seconds."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

CHILD = r"""
import importlib, json, os, signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)
from speck.tensor import Tensor

emulator = importlib.import_module("speck.usbgpu.sim.rdna3.dispatch")
seen = {"signal_at": None, "executed": 0}
plain_init = emulator._Scheduler.__init__
armed, fire = threading.Event(), threading.Event()
threading.Thread(target=lambda: fire.wait() and os.kill(os.getpid(), signal.SIGINT), daemon=True).start()


def init(self, launch, budget, trace=None):
    def count(inst, w):
        seen["executed"] = self.executed
        if armed.is_set() and seen["signal_at"] is None and self.executed >= 20_000:
            seen["signal_at"] = self.executed
            fire.set()  # the waiting thread sends SIGINT, as Ctrl-C would: from outside the emulator

    plain_init(self, launch, budget, count)


emulator._Scheduler.__init__ = init
a = Tensor.ones(512, 512).contiguous().to("USB:SIM").realize()
armed.set()
try:
    (a @ a).sum().numpy()
finally:
    print(json.dumps(seen), flush=True)
"""


def test_ctrl_c_during_a_usb_sim_matmul_ends_the_process_with_keyboard_interrupt() -> None:
    # the timeout only guards against a lost interrupt (the matmul alone would take minutes of emulation)
    run = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    # an uncaught KeyboardInterrupt ends Python by SIGINT itself (a shell reports that as status 130)
    assert run.returncode == -signal.SIGINT, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    last = max(i for i, line in enumerate(lines) if line.startswith("KeyboardInterrupt"))
    assert lines[last] == "KeyboardInterrupt", run.stderr[-3000:]  # raised as itself, not as another error's cause
    # followed only by its note: the device must be reopened (Device[...].reopen()) before it is used again
    assert all(line.startswith("speck.tensor: ") for line in lines[last + 1 :]), run.stderr[-3000:]
    assert "Device['USB:SIM'].reopen()" in run.stderr, run.stderr[-3000:]
    assert "During handling" not in run.stderr and "direct cause" not in run.stderr, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["signal_at"] is not None, seen
    # the thread's signal reaches the main thread within a Python switch interval: a few hundred emulated
    # instructions at most, far fewer than the kernel still had to run
    assert seen["executed"] - seen["signal_at"] < 20_000, seen


CAUGHT = r"""
import importlib, json, signal, sys
import numpy as np
signal.signal(signal.SIGINT, signal.default_int_handler)
from speck.tensor import Device, Tensor
from speck.hcq.errors import DeviceUnavailableError

emulator = importlib.import_module("speck.usbgpu.sim.rdna3.dispatch")
plain_init = emulator._Scheduler.__init__
seen = {"signal_at": None, "armed": False}


def init(self, launch, budget, trace=None):
    def count(inst, w):
        if seen["armed"] and seen["signal_at"] is None and self.executed >= 2000:
            seen["signal_at"] = self.executed
            signal.raise_signal(signal.SIGINT)  # as Ctrl-C's handler would, on the main thread

    plain_init(self, launch, budget, count)


emulator._Scheduler.__init__ = init
rng = np.random.default_rng(0)
x = rng.standard_normal((48, 48)).astype(np.float32)
kept = Tensor(x).to("USB:SIM").realize()
mode = sys.argv[1]
big_np = np.arange(2 << 20, dtype=np.float32)  # 8 MB: a copy of many bulk transfers
big = Tensor(big_np).to("USB:SIM").realize() if mode == "copyout" else None
out = {}
try:
    if mode == "dispatch":  # from inside the emulated kernel
        seen["armed"] = True
        (kept @ kept).sum().numpy()
    else:  # 2 ms of simulated time into the copy (the simulator's clock runs while the bus moves data)
        sim = Device["USB:SIM"].gpu.sim
        sim.clock.at(sim.now_ns + 2e6, lambda: signal.raise_signal(signal.SIGINT))
        for _ in range(100):
            if big is None:
                Tensor(big_np).to("USB:SIM").realize()
            else:
                big.numpy()
    out["raised"] = None
except KeyboardInterrupt as exc:
    out["raised"] = "KeyboardInterrupt"
    out["notes"] = getattr(exc, "__notes__", [])
seen["armed"] = False
out["signal_at"] = seen["signal_at"]


def attempt(fn):
    try:
        fn()
        return None
    except DeviceUnavailableError as e:
        return str(e)


out["before_reopen"] = attempt(lambda: (Tensor(x).to("USB:SIM") + 1).numpy())
out["reset"] = attempt(lambda: Device["USB:SIM"].reset())  # a queue reset can't bring a broken session back
Device["USB:SIM"].reopen()
y = rng.standard_normal((48, 48)).astype(np.float32)
t = Tensor(y).to("USB:SIM")
out["add"] = bool(np.allclose((t + 1).numpy(), y + 1))
out["matmul"] = bool(np.allclose((t @ t).numpy(), y @ y, rtol=1e-4, atol=1e-4))
out["reduce"] = bool(np.allclose((t * 2).sum(axis=1).numpy(), (y * 2).sum(axis=1), rtol=1e-4, atol=1e-4))
out["old_read"] = attempt(lambda: kept.numpy())
out["old_in_kernel"] = attempt(lambda: (kept + 1).numpy())
out["after_old"] = bool(np.allclose((t - 3).numpy(), y - 3))  # a refused old tensor leaves the device usable
print(json.dumps(out))
"""


@pytest.mark.parametrize("mode", ["dispatch", "copyin", "copyout"])
def test_a_caught_ctrl_c_on_usb_sim_is_reported_and_reopen_recovers(mode: str) -> None:
    """The child catches the KeyboardInterrupt of a dispatch or copy: the device then refuses work with an error
    naming Device[...].reopen() (never a silent result), reopen() brings it back (new computations match numpy), and
    a tensor stored before the reopen raises when read or used (its VRAM went with the old session)."""
    run = subprocess.run([sys.executable, "-c", CAUGHT, mode], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["raised"] == "KeyboardInterrupt", out
    assert mode != "dispatch" or out["signal_at"] is not None, out
    assert any("Device['USB:SIM'].reopen()" in n for n in out["notes"]), out
    before = out["before_reopen"]
    assert before is not None and "interrupted" in before and "KeyboardInterrupt" in before, out
    assert "Device['USB:SIM'].reopen()" in before, out
    assert out["reset"] is not None and "Device['USB:SIM'].reopen()" in out["reset"], out
    assert out["add"] and out["matmul"] and out["reduce"] and out["after_old"], out
    for key in ("old_read", "old_in_kernel"):
        assert out[key] is not None and "before the device was reopened" in out[key], out


REOPEN = r"""
import json
import numpy as np
from speck.tensor import Device, Tensor, TinyJit
from speck.hcq.errors import DeviceUnavailableError, HCQError

rng = np.random.default_rng(1)
w = rng.standard_normal((16, 16)).astype(np.float32)


@TinyJit
def step(x: Tensor, m: Tensor) -> Tensor:
    return (x @ m + 1).realize()


m = Tensor(w).to("USB:SIM").realize()
for _ in range(3):  # run, capture, replay
    x = rng.standard_normal((4, 16)).astype(np.float32)
    assert np.allclose(step(Tensor(x).to("USB:SIM"), m).numpy(), x @ w + 1, rtol=1e-4, atol=1e-4)
out = {}
Device["USB:SIM"].reopen()  # a healthy device reopens too
x = rng.standard_normal((4, 16)).astype(np.float32)
m2 = Tensor(w).to("USB:SIM").realize()
try:
    step(Tensor(x).to("USB:SIM"), m2).numpy()
    out["replay"] = None
except HCQError as e:
    out["replay"] = f"{type(e).__name__}: {e}"
step.reset()
got = [step(Tensor(x).to("USB:SIM"), m2).numpy() for _ in range(3)]
out["recaptured"] = all(bool(np.allclose(g, x @ w + 1, rtol=1e-4, atol=1e-4)) for g in got)
print(json.dumps(out))
"""


def test_reopen_refuses_a_graph_captured_before_and_recaptures() -> None:
    """A TinyJit captured on USB:SIM before Device[...].reopen() holds addresses of the old session's VRAM: its replay
    raises (naming the reopen and TinyJit.reset) instead of running on foreign memory; after reset it captures again
    and matches numpy."""
    run = subprocess.run([sys.executable, "-c", REOPEN], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["replay"] is not None and "reopen" in out["replay"], out
    assert out["recaptured"], out
