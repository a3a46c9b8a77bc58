"""`python -m speck.usbgpu info|bench` against the simulator."""

from __future__ import annotations

import pytest

from speck.usbgpu.__main__ import main


def test_info_reports_identity_link_and_bars(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", "--sim"]) == 0
    out = capsys.readouterr().out
    assert "add1:0001" in out and "custom v0.1" in out and "(simulated)" in out
    assert "LTSSM 0x78 (up)" in out and "1002:744c" in out
    assert "BAR0" in out and "BAR2" in out and "BAR5" in out


def test_bench_validates_and_prints_mb_per_s(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "--sim", "--size", "700001"]) == 0
    out = capsys.readouterr().out
    assert "copyin" in out and "copyout" in out and "MB/s (simulated)" in out and "validate  ok" in out


def test_bad_size_is_rejected() -> None:
    with pytest.raises(SystemExit):
        main(["bench", "--sim", "--size", "0"])


def test_env_selects_the_simulator(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SPECK_USB_SIM", "1")
    assert main(["bench", "--size", "5000"]) == 0
    assert "MB/s (simulated)" in capsys.readouterr().out
