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
    last = run.stderr.strip().splitlines()[-1]
    assert last == "KeyboardInterrupt", run.stderr[-3000:]  # raised as itself, not as another error's cause
    assert "During handling" not in run.stderr and "direct cause" not in run.stderr, run.stderr[-3000:]
    seen = json.loads(run.stdout.strip().splitlines()[-1])
    assert seen["signal_at"] is not None, seen
    # the thread's signal reaches the main thread within a Python switch interval: a few hundred emulated
    # instructions at most, far fewer than the kernel still had to run
    assert seen["executed"] - seen["signal_at"] < 20_000, seen
