"""A bad environment value for a setting stops `import speck.tensor` with a SettingError naming the setting and what
it takes (speck.tensor declares JIT; DEBUG comes from the layers below). In tests/tensor: the child imports
speck.tensor, which the uop package's own test session does not install."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(("env", "needle"), [("DEBUG=abc", "DEBUG='abc' is not an int"), ("JIT=2x", "JIT='2x'")])
def test_importing_with_a_bad_value_raises_a_setting_error(env: str, needle: str) -> None:
    key, _, value = env.partition("=")
    proc = subprocess.run([sys.executable, "-c", "import speck.tensor"], capture_output=True, text=True,
                          env={**os.environ, key: value}, timeout=300)  # fmt: skip
    assert proc.returncode != 0
    assert "SettingError" in proc.stderr and needle in proc.stderr and "takes an integer" in proc.stderr


def test_an_unknown_dev_in_the_environment_fails_the_first_tensor_with_it() -> None:
    code = "from speck.tensor import Tensor\nTensor([1]) + 1"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DEV": "FOO"})  # fmt: skip
    assert proc.returncode != 0 and "DEV=FOO" in proc.stderr and "DeviceNotFoundError" in proc.stderr
