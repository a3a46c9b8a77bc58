"""IDX parsing of the real Fashion-MNIST files (when installed), synthetic IDX round trips, and the errors for
truncated/corrupt files."""

import gzip
import os
import pathlib
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from speck.tensor.nn import datasets
from speck.tensor.nn.datasets import DatasetError, parse_idx, read_idx


def idx_bytes(arr: np.ndarray) -> bytes:
    code = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(np.int32): 0x0C, np.dtype(np.float32): 0x0D}
    header = struct.pack(">HBB", 0, code[arr.dtype], arr.ndim) + struct.pack(f">{arr.ndim}I", *arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.sampled_from([np.uint8, np.int8, np.int32, np.float32]))
def test_idx_round_trip(shape, dt):
    arr = (np.arange(int(np.prod(shape))) % 100 - 50).astype(dt).reshape(shape)
    np.testing.assert_array_equal(parse_idx(idx_bytes(arr)), arr)


def test_truncated_file_names_path_and_sizes(tmp_path: pathlib.Path):
    arr = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(gzip.compress(idx_bytes(arr)[:-10]))
    with pytest.raises(DatasetError, match=r"train-images-idx3-ubyte.gz: IDX file truncated.*\(2, 28, 28\)"):
        read_idx(p)


def test_bad_magic_and_bad_gzip(tmp_path: pathlib.Path):
    p = tmp_path / "x"
    p.write_bytes(b"\x12\x34\x08\x01\x00\x00\x00\x01\x00")
    with pytest.raises(DatasetError, match="not an IDX file"):
        read_idx(p)
    p.write_bytes(b"\x1f\x8b" + b"garbage")
    with pytest.raises(DatasetError, match="corrupt gzip"):
        read_idx(p)


def test_lookup_order_prefers_env(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("SPECK_DATASETS", str(tmp_path))
    d = tmp_path / "mnist"
    d.mkdir()
    imgs = np.arange(3 * 28 * 28, dtype=np.uint8).reshape(3, 28, 28)
    labels = np.array([1, 2, 3], dtype=np.uint8)
    for name, a in zip(datasets.FILES, (imgs, labels, imgs[:2], labels[:2])):
        (d / name).write_bytes(idx_bytes(a))
    xtr, ytr, xte, yte = datasets.load_arrays("mnist")
    assert xtr.shape == (3, 1, 28, 28) and xtr.dtype == np.uint8
    np.testing.assert_array_equal(ytr, [1, 2, 3])
    assert ytr.dtype == np.int32 and xte.shape == (2, 1, 28, 28) and len(yte) == 2


FASHION = pathlib.Path("/usr/share/datasets/fashion-mnist")


# CI installs Debian's dataset-fashion-mnist (the README test command does), so there this test always runs
@pytest.mark.skipif(not FASHION.is_dir() and not os.environ.get("CI"), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_files():
    xtr, ytr, xte, yte = datasets.load_arrays("fashion-mnist")
    assert xtr.shape == (60000, 1, 28, 28) and xte.shape == (10000, 1, 28, 28)
    assert sorted(np.unique(ytr).tolist()) == list(range(10))
    assert xtr.dtype == np.uint8 and 0 < xtr.mean() < 255
