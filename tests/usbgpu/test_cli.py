"""`python -m speck.usbgpu info|bench` against the simulator."""

from __future__ import annotations

import sys

import pytest

from speck.usbgpu import __main__ as cli
from speck.usbgpu.__main__ import main
from speck.usbgpu.api import UsbGpu


def test_info_reports_identity_link_gpu_and_bars(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SPECK_USB_SIM", "1")
    with UsbGpu.open():  # bring the environment's simulated device up; info itself never does
        pass
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert "add1:0001" in out and "custom v0.1" in out and "(simulated)" in out
    assert "LTSSM 0x78 (up)" in out and "1002:744c" in out
    assert "BAR0" in out and "BAR2" in out and "BAR5" in out


def test_bench_validates_and_prints_mb_per_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--sim", "--size", "700001"]) == 0
    captured = capsys.readouterr()
    out = captured.out
    assert "copyin" in out and "copyout" in out and "MB/s (simulated)" in out and "validate  ok" in out
    assert "%" not in captured.err  # no progress bar for small copies


def test_bad_size_is_rejected() -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--sim", "--size", "0"])


def test_env_selects_the_simulator(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECK_USB_SIM", "1")
    assert main(["bench", "--size", "5000"]) == 0
    assert "MB/s (simulated)" in capsys.readouterr().out


@pytest.mark.parametrize("with_tqdm", [True, False])
def test_copies_over_the_threshold_draw_a_progress_bar(
    with_tqdm: bool, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    size = 600_000
    monkeypatch.setattr(cli, "PROGRESS_BAR_BYTES", size - 1)  # stands in for 64 MB
    if not with_tqdm:
        monkeypatch.setitem(sys.modules, "tqdm", None)  # `import tqdm` now fails: the plain fallback
    assert main(["bench", "--sim", "--size", str(size)]) == 0
    err = capsys.readouterr().err
    assert "copyin" in err and "copyout" in err and "100%" in err
    if with_tqdm:
        assert "B/s" in err or "it/s" in err  # tqdm's rate column
    monkeypatch.setattr(cli, "PROGRESS_BAR_BYTES", size)  # exactly the threshold: no bar
    assert main(["bench", "--sim", "--size", str(size)]) == 0
    assert "copyin" not in capsys.readouterr().err


def test_ctrl_c_during_a_bench_copy_exits_130_and_says_the_device_is_usable_after_a_reopen(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def interrupting_bar(total: int, desc: str):  # type: ignore[no-untyped-def]
        from contextlib import nullcontext

        def callback(done: int, all_bytes: int) -> None:
            if done < all_bytes:
                raise KeyboardInterrupt

        return nullcontext(callback)

    monkeypatch.setattr(cli, "progress_bar", interrupting_bar)
    assert main(["bench", "--sim", "--size", "800000"]) == 130
    err = capsys.readouterr().err
    assert "interrupted" in err and "fully usable after that reopen" in err
    monkeypatch.undo()
    assert main(["bench", "--sim", "--size", "800000"]) == 0  # the next run works
