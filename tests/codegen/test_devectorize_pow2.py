"""Renderers whose vector types need a power-of-two lane count (C's vector_size) get odd-width vectors split."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from speck.codegen import ClangRenderer, LLVMRenderer
from speck.codegen.lower.devectorize import Devectorizer


@given(n=st.integers(1, 64), w=st.sampled_from([1, 2, 4, 8, 16]))
def test_chunks_cover_every_lane_once_in_pow2_pieces(n: int, w: int) -> None:
    d = Devectorizer(ClangRenderer())
    chunks = d.chunks(n, w)
    assert [lane for c in chunks for lane in c] == list(range(n))
    assert all(len(c) <= w and len(c) & (len(c) - 1) == 0 for c in chunks)
    assert d.fits(n, w) == (n <= w and n & (n - 1) == 0)


def test_renderers_declare_their_vector_widths() -> None:
    assert ClangRenderer().pow2_vectors and not LLVMRenderer().pow2_vectors
    assert Devectorizer(LLVMRenderer()).chunks(5, 8) == [(0, 1, 2, 3, 4)]
    assert Devectorizer(ClangRenderer()).chunks(5, 8) == [(0, 1, 2, 3), (4,)]
