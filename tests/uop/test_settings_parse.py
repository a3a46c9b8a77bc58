"""Environment values a setting can't take are SettingErrors naming the setting, what it takes and what was found:
at import (ContextVar), at each use (a live setting) and through an older spelling (`also`); never a bare
ValueError from deep inside, never a silent fallback to the default."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.uop.errors import SettingError, SettingTypeError
from speck.uop.helpers import Context, ContextVar, getenv, parse_setting
from speck.uop.settings import LiveVar, declare


@pytest.mark.parametrize(("raw", "default"), [("abc", 0), ("2x", 0), ("1.5", 0), ("", 0), ("x", 1.0), ("nan", 1.0)])
def test_a_value_of_the_wrong_type_names_the_setting_and_what_it_takes(raw: str, default: object) -> None:
    with pytest.raises(SettingError) as ei:
        parse_setting("SOME_SETTING", raw, default)
    msg = str(ei.value)
    assert f"SOME_SETTING={raw!r}" in msg
    assert ("an integer" if isinstance(default, int) else "a number") in msg
    assert isinstance(ei.value, ValueError)


@given(st.integers(-(2**70), 2**70))
def test_ints_and_floats_parse_as_python_does(n: int) -> None:
    assert parse_setting("K", str(n), 0) == n
    assert parse_setting("K", f" {n} ", 0) == n
    assert parse_setting("K", str(n), 0.0) == float(n)
    assert parse_setting("K", str(n), "") == str(n)


def test_a_live_setting_raises_the_same_error_when_read(monkeypatch: pytest.MonkeyPatch) -> None:
    var = LiveVar("SPECK_TEST_LIVE_PARSE", 5)
    try:
        monkeypatch.setenv("SPECK_TEST_LIVE_PARSE", "7")
        assert var.value == 7
        monkeypatch.setenv("SPECK_TEST_LIVE_PARSE", "seven")
        with pytest.raises(SettingError, match="SPECK_TEST_LIVE_PARSE='seven' is not an int"):
            _ = var.value
    finally:
        ContextVar._registry.pop("SPECK_TEST_LIVE_PARSE", None)


def test_an_older_spelling_raises_naming_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    from speck.uop.settings import TABLE

    monkeypatch.delenv("SPECK_TEST_NEW_NAME", raising=False)
    monkeypatch.setenv("SPECK_TEST_OLD_NAME", "lots")
    try:
        with pytest.raises(SettingError, match="SPECK_TEST_OLD_NAME='lots' is not an int"):
            declare("SPECK_TEST_NEW_NAME", 3, "tests", (), "a test setting", also="SPECK_TEST_OLD_NAME")
    finally:
        TABLE.pop("SPECK_TEST_NEW_NAME", None)
        ContextVar._registry.pop("SPECK_TEST_NEW_NAME", None)


@pytest.mark.parametrize(("raw", "want"), [("0", False), ("1", True), (" TRUE ", True), ("off", False), ("no", False)])
def test_getenv_of_a_bool_default_reads_the_flags_spelling(monkeypatch: pytest.MonkeyPatch, raw: str,
                                                          want: bool) -> None:  # fmt: skip
    monkeypatch.setenv("SPECK_TEST_FLAG_" + raw.strip(), raw)
    assert getenv("SPECK_TEST_FLAG_" + raw.strip(), False) is want  # (bool("0") was True)
    assert getenv("SPECK_TEST_FLAG_" + raw.strip(), not want) is want


@pytest.mark.parametrize("raw", ["2", "", "maybe", "0.0"])
def test_getenv_of_a_bool_default_refuses_what_is_no_flag(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("SPECK_TEST_BADFLAG", raw)
    with pytest.raises(SettingError, match=r"SPECK_TEST_BADFLAG=.* is not a flag: .* takes 1 or 0"):
        getenv("SPECK_TEST_BADFLAG", False)


@pytest.mark.parametrize(("key", "default"), [(3, 0), (None, 0), (b"K", 0), ("K", None), ("K", [1]), ("K", {})])
def test_getenv_of_a_key_or_default_of_the_wrong_kind_is_a_setting_type_error(key: object, default: object) -> None:
    with pytest.raises(SettingTypeError, match="getenv"):
        getenv(key, default)  # type: ignore[arg-type]
    assert getenv("SPECK_TEST_SURELY_UNSET", 7) == 7 and getenv("SPECK_TEST_SURELY_UNSET", "") == ""


def test_context_refuses_nan_for_a_float_setting_as_the_environment_does() -> None:
    cv = ContextVar("SPECK_TEST_TIMEOUT_F", 5.0)
    with pytest.raises(SettingError, match=r"Context\(SPECK_TEST_TIMEOUT_F=nan\): .* takes a number"):
        Context(SPECK_TEST_TIMEOUT_F=float("nan")).__enter__()
    assert cv.value == 5.0
    with Context(SPECK_TEST_TIMEOUT_F=float("inf")):
        assert cv.value == float("inf")
    with Context(SPECK_TEST_TIMEOUT_F=2):
        assert cv.value == 2
