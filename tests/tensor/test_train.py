"""Training smoke tests: the examples/train.py job (Adam under TinyJit, evaluation, safetensors save) learns
Fashion-MNIST from a 6k-image subset in 60 steps, with the classic CNN (the main job's model; about a minute on
2 cores, most of it compiling) and with the 784-128-10 MLP."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from speck.tensor.examples import train
from speck.tensor.nn.datasets import mnist
from speck.tensor.nn.state import get_state_dict, load_state_dict, safe_load

FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")


# CI installs Debian's dataset-fashion-mnist (the README test command does), so there this test always runs
@pytest.mark.slow
@pytest.mark.skipif(not FASHION.is_dir() and not os.environ.get("CI"), reason="dataset-fashion-mnist not installed")
@pytest.mark.parametrize("name,lr", [("cnn", "0.002"), ("mlp", "0.003")])
def test_train_learns_fashion_mnist(name: str, lr: str, tmp_path: pathlib.Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    out = tmp_path / "w.safetensors"
    args = ["--model", name, "--steps", "60", "--batch", "128", "--lr", lr, "--train-subset", "6000",
            "--test-subset", "1000", "--out", str(out), "--seed", "0", "--quiet"]  # fmt: skip
    acc = train.main(args)
    assert acc > 0.75, f"{name}: test accuracy {acc:.3f} after 60 steps; expected > 0.75"
    assert "test accuracy" in capsys.readouterr().out
    # the saved weights are the model's state dict and reproduce its test accuracy
    saved = safe_load(out)
    model = train.MODELS[name]()
    assert set(saved) == set(get_state_dict(model))
    load_state_dict(model, saved)
    _, _, x_test, y_test = mnist(fashion=True)
    pred = model(x_test[:1000].float() * (1 / 255.0) - 0.5).argmax(axis=1).numpy()
    assert (pred == y_test[:1000].numpy()).mean() == pytest.approx(acc)


def test_train_rejects_unknown_model() -> None:
    with pytest.raises(SystemExit):
        train.main(["--model", "resnet"])


@pytest.mark.slow
@pytest.mark.skipif(not FASHION.is_dir() and not os.environ.get("CI"), reason="dataset-fashion-mnist not installed")
def test_console_script_exits_zero_after_training(tmp_path: pathlib.Path) -> None:
    # the installed `speck-train` command (next to this interpreter): a finished run is exit status 0 (a console
    # script's return value is its exit status, so main's accuracy must not become it)
    script = pathlib.Path(sys.executable).parent / "speck-train"
    args = ["--model", "mlp", "--steps", "2", "--batch", "16", "--train-subset", "64", "--test-subset", "500",
            "--out", "", "--quiet"]  # fmt: skip
    done = subprocess.run([str(script), *args], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, f"speck-train exited {done.returncode}: {done.stderr[-2000:]}"
    assert "test accuracy" in done.stdout
