"""The four fp8 formats (OCP e4m3/e5m2 and the fnuz kinds): every bit pattern round-trips through the constant
folder's decode/encode, rounding is to nearest even, overflow saturates, infinities survive only in e5m2, fnuz has
no negative zero; plus tinygrad's dtype groups and finfo."""

from __future__ import annotations

import math
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.uop import dtypes, least_upper_dtype, truncate
from speck.uop.dtype import FP8_FORMATS, from_bits, to_bits


@pytest.mark.parametrize("dt", dtypes.fp8s, ids=lambda d: d.name)
def test_every_bit_pattern_round_trips(dt) -> None:  # type: ignore[no-untyped-def]
    for b in range(256):
        v = from_bits(b, dt)
        if math.isnan(v):
            assert b == FP8_FORMATS[dt].nan_bits or FP8_FORMATS[dt].kind != "fnuz"
            continue
        back = to_bits(v, dt)
        assert back == b or (v == 0 and dt in dtypes.fp8_fnuz), (dt, b, v, back)


MAXES = [(dtypes.fp8e4m3, 448.0), (dtypes.fp8e5m2, 57344.0), (dtypes.fp8e4m3fnuz, 240.0), (dtypes.fp8e5m2fnuz, 57344.0)]


@pytest.mark.parametrize("dt,mx", MAXES, ids=[d.name for d, _ in MAXES])
def test_saturation_and_specials(dt, mx) -> None:  # type: ignore[no-untyped-def]
    finite = [from_bits(b, dt) for b in range(256)]
    assert max(v for v in finite if math.isfinite(v)) == mx
    assert truncate[dt](1e30) == mx and truncate[dt](-1e30) == -mx
    assert math.isnan(truncate[dt](math.nan))
    if dt == dtypes.fp8e5m2:
        assert truncate[dt](math.inf) == math.inf
    else:
        assert math.isnan(truncate[dt](math.inf))
    if dt in dtypes.fp8_fnuz:
        assert math.copysign(1.0, truncate[dt](-0.0)) == 1.0 and to_bits(-1e-30, dt) == 0


def _nearest(x: float, dt) -> float:  # type: ignore[no-untyped-def]
    """Brute force: the representable value nearest x (ties to the even bit pattern), saturating."""
    cands = sorted({from_bits(b, dt) for b in range(256)} - {math.nan}, key=lambda v: (abs(v - x), to_bits(v, dt) & 1))
    cands = [v for v in cands if math.isfinite(v)]
    return cands[0]


@given(st.floats(-300.0, 300.0, allow_nan=False), st.sampled_from(dtypes.fp8s))
def test_round_to_nearest_even(x: float, dt) -> None:  # type: ignore[no-untyped-def]
    assert truncate[dt](x) == _nearest(x, dt) or (truncate[dt](x) == 0 and _nearest(x, dt) == 0)


def test_groups_and_finfo() -> None:
    assert dtypes.fp8s == dtypes.fp8_ocp + dtypes.fp8_fnuz and len(dtypes.fp8s) == 4
    assert dtypes.floats == dtypes.fp8s + (dtypes.half, dtypes.bfloat16, dtypes.float, dtypes.double)
    assert dtypes.ints == dtypes.uints + dtypes.sints and len(dtypes.all) == 17
    assert dtypes.int32s == (dtypes.uint32, dtypes.int32) and dtypes.weaks == (dtypes.weakint, dtypes.weakfloat)
    assert all(dtypes.is_float(d) for d in dtypes.floats) and not dtypes.is_int(dtypes.bool)
    assert dtypes.finfo(dtypes.fp8e4m3fnuz) == (4, 3) and dtypes.finfo(dtypes.bfloat16) == (8, 7)
    with pytest.raises(ValueError):
        dtypes.finfo(dtypes.int8)
    assert dtypes.bool.bitsize == 1 and dtypes.bfloat16.bitsize == 16
    # two fp8 kinds meet at float16; bf16 and half at float32
    assert least_upper_dtype(dtypes.fp8e4m3fnuz, dtypes.fp8e5m2) is dtypes.float16
    assert least_upper_dtype(dtypes.int8, dtypes.fp8e5m2fnuz) is dtypes.fp8e5m2fnuz
    assert least_upper_dtype(dtypes.half, dtypes.bfloat16) is dtypes.float32


def test_unknown_name_is_attribute_error() -> None:
    from speck.uop import to_dtype

    assert to_dtype("HALF") is dtypes.half and to_dtype("Long") is dtypes.int64
    with pytest.raises(AttributeError, match="unknown dtype"):
        to_dtype("float7")


def test_f32_bits_of_bf16_rounding_stay_even() -> None:
    # a float32 exactly halfway between two bfloat16 values rounds to the even one
    half_way = struct.unpack("<f", struct.pack("<I", 0x3F808000))[0]
    assert truncate[dtypes.bfloat16](half_way) == 1.0
