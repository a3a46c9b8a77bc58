"""The main job on the simulated USB GPU: `speck-train --device USB:SIM` (Adam under TinyJit, every kernel of the
step dispatched through PM4 and run in the RDNA3 emulator, each replay one doorbell) trains like the same run on the
CPU. The emulator runs about a million wave-instructions per second, so the CI variant is short: the small CNN, 4
steps of 16. The classic CNN at batch 32 (`speck-train --device USB:SIM --steps 20 --batch 32`) costs about 236M
wave-instructions per step, 4-5 minutes of emulation on a 2-core machine: 3 steps gave the CPU's losses to 4 digits
(2.9586 at step 0, 1.8339 at step 2); 20 steps take over an hour there."""

from __future__ import annotations

import os
import pathlib
import re

import pytest

from speck.tensor import Device
from speck.tensor.examples import train
from speck.tensor.usb import UsbDevice

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("two_simulated_bridges")]
FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")
ARGS = ["--model", "small-cnn", "--steps", "4", "--batch", "16", "--test-subset", "24", "--out", "", "--seed", "0",
        "--schedule", "constant", "--quiet"]  # fmt: skip
LOSS = re.compile(r"train loss ([0-9.]+) at step 0, ([0-9.]+) at step 3")


def _run(capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[float, float, float]:
    acc = train.main([*ARGS, *extra])
    out = capsys.readouterr().out
    m = LOSS.search(out)
    assert m is not None, out
    return float(m.group(1)), float(m.group(2)), acc


# CI installs Debian's dataset-fashion-mnist (the README test command does), so there this test always runs
@pytest.mark.skipif(not FASHION.is_dir() and not os.environ.get("CI"), reason="dataset-fashion-mnist not installed")
def test_speck_train_on_usb_sim_matches_cpu(capsys: pytest.CaptureFixture[str]) -> None:
    dev = Device["USB:SIM"]
    assert isinstance(dev, UsbDevice)
    stats = dict(dev.gpu._engine_compute().stats)
    usb = _run(capsys, "--device", "USB:SIM")
    after = dev.gpu._engine_compute().stats
    cpu = _run(capsys, "--device", "CPU")
    assert usb[0] == pytest.approx(cpu[0], rel=1e-4) and usb[1] == pytest.approx(cpu[1], rel=1e-3), (usb, cpu)
    assert abs(usb[2] - cpu[2]) <= 1 / 24  # at most one of the 24 test images classified differently
    assert after["dispatches"] - stats["dispatches"] > 100 and after["batches"] - stats["batches"] >= 2  # replays
