"""Datasets: MNIST and Fashion-MNIST from IDX files, CIFAR-10 from its binary tarball (`cifar`, at the end).

Files are looked up, in order, in `$SPECK_DATASETS/<name>`, `~/.cache/speck/datasets/<name>` and (Fashion-MNIST
only) `/usr/share/datasets/fashion-mnist`, where Debian's `dataset-fashion-mnist` package installs the full 60k/10k
set. Missing files are downloaded from the official mirrors into the cache when the machine is online, with a
progress bar. Truncated or corrupt files are detected from the IDX magic number and the sizes the header promises,
and reported with their path."""

from __future__ import annotations

import math
import pathlib
import struct
import tarfile
import urllib.error
import urllib.request
import zlib
from typing import Any

import numpy as np

from speck.tensor.errors import DatasetError as DatasetError
from speck.tensor.errors import TensorValueError
from speck.tensor.pyutils import atomic_file, gunzip_bounded
from speck.tensor.settings import DATASETS, MAX_DECOMPRESSED_BYTES
from speck.tensor.tensor import Tensor

FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
MIRRORS = {
    "mnist": ["https://storage.googleapis.com/cvdf-datasets/mnist/", "https://ossci-datasets.s3.amazonaws.com/mnist/"],
    "fashion-mnist": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"],
}
# IDX element types (the third byte of the magic number) -> numpy dtype (IDX data is big-endian)
IDX_TYPES: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def parse_idx(data: bytes, path: str = "<bytes>") -> np.ndarray:
    """Parse an IDX file's bytes (already decompressed) into an array, checking the magic and the promised size."""
    if len(data) < 4:
        raise DatasetError(f"{path}: too short to be an IDX file ({len(data)} bytes); delete it and retry")
    zero, dtype_code, ndim = struct.unpack(">HBB", data[:4])
    if zero != 0 or dtype_code not in IDX_TYPES or not 0 < ndim <= 64:  # (numpy holds at most 64 dims)
        raise DatasetError(
            f"{path}: not an IDX file (magic {data[:4].hex()}; expected 0000 then a type byte in "
            f"{sorted(hex(k) for k in IDX_TYPES)} and a dimension count of 1..64); delete it and retry"
        )
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(f"{path}: truncated IDX header ({len(data)} of {header} bytes); delete it and retry")
    shape = struct.unpack(f">{ndim}I", data[4:header])
    dt = np.dtype(IDX_TYPES[dtype_code])
    expected = header + math.prod(shape) * dt.itemsize  # (exact: numpy's int64 product wraps for huge dims)
    if len(data) != expected:
        what = "truncated" if len(data) < expected else "longer than its header says"
        raise DatasetError(
            f"{path}: IDX file {what}: header promises shape {shape} ({expected} bytes), file has {len(data)} bytes; "
            "delete it and retry"
        )
    return np.frombuffer(data, dtype=dt, offset=header).reshape(shape).astype(dt.newbyteorder("="))


def read_idx(path: pathlib.Path) -> np.ndarray:
    """Read an IDX file, gzip-compressed or not."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        try:  # (bounded: gzip.decompress took a bomb whole, and a corrupt stream was a bare zlib.error)
            raw = gunzip_bounded(raw, str(path))
        except TensorValueError as e:
            raise DatasetError(f"corrupt gzip data or too large: {e}; delete it and retry") from e
    return parse_idx(raw, str(path))


def search_dirs(name: str) -> list[pathlib.Path]:
    """Where files of dataset `name` are looked for, in order."""
    dirs = []
    if env := str(DATASETS.value):
        dirs.append(pathlib.Path(env) / name)
    dirs.append(pathlib.Path.home() / ".cache" / "speck" / "datasets" / name)
    if name == "fashion-mnist":
        dirs.append(pathlib.Path("/usr/share/datasets/fashion-mnist"))
    return dirs


def _find(name: str, fname: str) -> pathlib.Path | None:
    for d in search_dirs(name):
        for cand in (d / fname, d / (fname + ".gz")):
            if cand.is_file():
                return cand
    return None


def _download(name: str, fname: str) -> pathlib.Path:
    dest_dir = search_dirs(name)[1] if not DATASETS.value else search_dirs(name)[0]
    dest_dir.mkdir(parents=True, exist_ok=True)
    dest = dest_dir / (fname + ".gz")
    errors = []
    for base in MIRRORS[name]:
        url = base + fname + ".gz"
        try:
            _fetch(url, dest)
            return dest
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            errors.append(f"{url}: {e}")
    tried = "\n  ".join(str(d) for d in search_dirs(name))
    raise DatasetError(
        f"{name} file {fname} not found in:\n  {tried}\nand the download failed:\n  " + "\n  ".join(errors) +
        ("\nOn Debian, `apt-get install dataset-fashion-mnist` installs Fashion-MNIST locally." if
         name == "fashion-mnist" else "\nPut the IDX files in one of the folders above.")
    )  # fmt: skip


def _fetch(url: str, dest: pathlib.Path) -> None:
    """Download url to dest with a progress bar, atomically (a partial download never looks complete)."""
    from tqdm import tqdm

    with urllib.request.urlopen(url, timeout=30) as r:
        total = int(r.headers.get("Content-Length", 0)) or None
        with atomic_file(dest, f"downloading {url}") as f, tqdm(total=total, unit="B", unit_scale=True,
                                                                desc=dest.name) as bar:  # fmt: skip
            while chunk := r.read(1 << 16):
                f.write(chunk)
                bar.update(len(chunk))


def load_arrays(name: str = "mnist") -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, Y_train, X_test, Y_test) as numpy arrays: images uint8 (N, 1, 28, 28), labels int32 (N,)."""
    if name not in MIRRORS:
        raise DatasetError(f"unknown dataset {name!r}; expected one of {sorted(MIRRORS)}")
    arrays: list[np.ndarray] = []
    for fname in FILES:
        path = _find(name, fname) or _download(name, fname)
        arr = read_idx(path)
        expected_ndim = 3 if "images" in fname else 1
        if arr.ndim != expected_ndim:
            raise DatasetError(f"{path}: expected a {expected_ndim}-d IDX array, found shape {arr.shape}")
        arrays.append(arr.reshape(-1, 1, *arr.shape[1:]) if expected_ndim == 3 else arr.astype(np.int32))
    xtr, ytr, xte, yte = arrays
    for x, y, split in ((xtr, ytr, "train"), (xte, yte, "test")):
        if len(x) != len(y):
            raise DatasetError(f"{name} {split}: {len(x)} images but {len(y)} labels")
    return xtr, ytr, xte, yte


def mnist(fashion: bool = False, device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """MNIST (or Fashion-MNIST) as realized tensors: X uint8 (N, 1, 28, 28), Y int32 (N,)."""
    arrays = load_arrays("fashion-mnist" if fashion else "mnist")
    kw: dict[str, Any] = {} if device is None else {"device": device}
    return tuple(Tensor(a, **kw).realize() for a in arrays)  # type: ignore[return-value]


# CIFAR-10's binary distribution: 5 training batches and a test batch of records (1 label byte, then 3x32x32 pixel
# bytes, channel-major), read straight from the tarball (no pickled Python objects involved)
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
CIFAR_TAR = "cifar-10-binary.tar.gz"
CIFAR_RECORD = 1 + 3 * 32 * 32
CIFAR_BATCHES = (*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin")


def read_cifar_tar(path: pathlib.Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(X_train, Y_train, X_test, Y_test) from CIFAR-10's binary tarball: images uint8 (N, 3, 32, 32), labels int32."""
    try:
        with tarfile.open(path, "r:gz") as tar:
            members = {pathlib.PurePosixPath(m.name).name: m for m in tar.getmembers() if m.isfile()}
            parts: list[np.ndarray] = []
            for fname in CIFAR_BATCHES:
                if fname not in members:
                    raise DatasetError(f"{path}: no {fname} in the archive (is it {CIFAR_TAR}?); delete it and retry")
                m = members[fname]
                if m.size > (ceiling := int(MAX_DECOMPRESSED_BYTES.value)):  # (checked before it is read into memory)
                    raise DatasetError(f"{path}: {fname} claims {m.size} bytes, more than MAX_DECOMPRESSED_BYTES="
                                       f"{ceiling}; delete it and retry")  # fmt: skip
                f = tar.extractfile(m)
                raw = f.read() if f is not None else b""
                if not raw or len(raw) % CIFAR_RECORD:
                    raise DatasetError(
                        f"{path}: {fname} has {len(raw)} bytes, not a whole number of {CIFAR_RECORD}-byte records; "
                        "delete it and retry"
                    )
                parts.append(np.frombuffer(raw, np.uint8).reshape(-1, CIFAR_RECORD))
            # to the end of the gzip stream, where its CRC is checked (tarfile stops after the last member: a flipped
            # byte in a stored deflate block read as a changed pixel)
            while tar.fileobj is not None and tar.fileobj.read(1 << 20):
                pass
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:  # (zlib.error: a corrupt deflate stream)
        raise DatasetError(f"{path}: not a readable gzip tarball ({e}); delete it and retry") from e
    train, test = np.concatenate(parts[:5]), parts[5]
    return (train[:, 1:].reshape(-1, 3, 32, 32).copy(), train[:, 0].astype(np.int32),
            test[:, 1:].reshape(-1, 3, 32, 32).copy(), test[:, 0].astype(np.int32))  # fmt: skip


def cifar(device: str | None = None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """CIFAR-10 as realized tensors: X uint8 (N, 3, 32, 32), Y int32 (N,) (50000 train, 10000 test images). The
    tarball is looked up like MNIST's files (folder `cifar-10`) and downloaded into the cache when missing."""
    path = next((d / CIFAR_TAR for d in search_dirs("cifar-10") if (d / CIFAR_TAR).is_file()), None)
    if path is None:
        dirs = search_dirs("cifar-10")
        dest = dirs[0] if DATASETS.value else dirs[1]
        dest.mkdir(parents=True, exist_ok=True)
        path = dest / CIFAR_TAR
        try:
            _fetch(CIFAR_URL, path)
        except (urllib.error.URLError, OSError, TimeoutError) as e:
            tried = "\n  ".join(str(d) for d in dirs)
            raise DatasetError(f"{CIFAR_TAR} not found in:\n  {tried}\nand downloading {CIFAR_URL} failed: {e}") from e
    kw: dict[str, Any] = {} if device is None else {"device": device}
    return tuple(Tensor(a, **kw).realize() for a in read_cifar_tar(path))  # type: ignore[return-value]
