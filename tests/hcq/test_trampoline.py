"""The many-argument call path: WordCall passes words in registers and on the stack in System V order (the kernel
that needs it, with more buffers than ctypes can pass, is tested in tests/tensor/test_many_buffers.py)."""

from __future__ import annotations

import ctypes

import pytest

from speck.hcq.trampoline import WordCall

_libc = ctypes.CDLL(None)


@pytest.mark.parametrize("k", range(0, 9))  # 3 + k words: registers only, then odd and even stack counts
def test_words_reach_the_callee_in_order(k: int) -> None:
    buf = ctypes.create_string_buffer(256)
    fmt = b" ".join([b"%ld"] * k) + b"|"
    vals = [(-1) ** i * (1000 + 37 * i) for i in range(k)]
    call = WordCall(ctypes.cast(_libc.snprintf, ctypes.c_void_p).value or 0, 3 + k)
    call(ctypes.addressof(buf), 256, ctypes.cast(ctypes.c_char_p(fmt), ctypes.c_void_p).value, *vals)
    assert buf.value.decode() == " ".join(str(v) for v in vals) + "|"


def test_wrong_argument_count_is_refused() -> None:
    call = WordCall(ctypes.cast(_libc.snprintf, ctypes.c_void_p).value or 0, 4)
    with pytest.raises(TypeError, match="takes 4 arguments, got 3"):
        call(0, 0, 0)
