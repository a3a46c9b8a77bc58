"""Tensor.from_url: a DISK tensor over the downloaded (cached) file; served locally (file:// and a loopback
http.server in a thread), never from the internet."""

from __future__ import annotations

import gzip
import http.server
import pathlib
import threading
from collections.abc import Iterator

import numpy as np
import pytest

from speck.tensor import Context, Tensor, dtypes
from speck.tensor.errors import FetchError, TensorValueError
from speck.tensor.pyutils import fetch

RNG = np.random.default_rng(2)


@pytest.fixture
def cache(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("SPECK_CACHE_DIR", str(root))
    return root


class _Server:
    """A loopback HTTP server in a daemon thread serving `files` (path -> bytes), counting the GETs."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files, self.gets = files, 0
        self.announce: dict[str, int] = {}  # path -> a Content-Length larger than the body (a dropped connection)
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                owner.gets += 1
                body = owner.files.get(self.path)
                if body is None:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(owner.announce.get(self.path, len(body))))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server({})
    yield s
    s.close()


def test_from_url_http_downloads_into_the_cache_once(cache: pathlib.Path, server: _Server) -> None:
    data = RNG.integers(0, 256, 1000, dtype=np.uint8)
    server.files["/blob.bin"] = data.tobytes()
    t = Tensor.from_url(server.base + "/blob.bin")
    assert str(t.device).startswith("DISK:") and t.dtype == dtypes.uint8 and t.shape == (1000,)
    assert str(cache) in str(t.device)  # the file lives in the download cache
    np.testing.assert_array_equal(t.to("CPU").numpy(), data)
    t2 = Tensor.from_url(server.base + "/blob.bin")
    np.testing.assert_array_equal(t2.to("CPU").numpy(), data)
    assert server.gets == 1  # the second call read the cache


def test_from_url_gunzip_and_dtype(cache: pathlib.Path, server: _Server) -> None:
    vals = RNG.standard_normal(64).astype(np.float32)
    server.files["/w.gz"] = gzip.compress(vals.tobytes())
    t = Tensor.from_url(server.base + "/w.gz", gunzip=True, dtype=dtypes.float32)
    assert t.shape == (64,) and t.dtype == dtypes.float32
    np.testing.assert_array_equal(t.to("CPU").numpy(), vals)


def test_from_url_file_url(tmp_path: pathlib.Path, cache: pathlib.Path) -> None:
    data = RNG.integers(0, 256, 77, dtype=np.uint8)
    f = tmp_path / "local.bin"
    f.write_bytes(data.tobytes())
    t = Tensor.from_url(f"file://{f}")
    assert str(t.device).startswith("DISK:")
    np.testing.assert_array_equal(t[10:20].to("CPU").numpy(), data[10:20])
    gz = tmp_path / "local.bin.gz"
    gz.write_bytes(gzip.compress(data.tobytes()))
    tg = Tensor.from_url(f"file://{gz}", gunzip=True)
    np.testing.assert_array_equal(tg.to("CPU").numpy(), data)


def test_from_url_errors(tmp_path: pathlib.Path, cache: pathlib.Path, server: _Server) -> None:
    with pytest.raises(ConnectionError, match="missing"):
        Tensor.from_url(server.base + "/missing")
    bad = tmp_path / "bad.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(ValueError, match="gzip"):
        Tensor.from_url(f"file://{bad}", gunzip=True)
    with pytest.raises(FileNotFoundError, match="nothere"):
        Tensor.from_url(f"file://{tmp_path}/nothere.gz", gunzip=True)


# ---------------- hostile round 4: gzip bodies and cache writes ----------------
BODY = RNG.integers(0, 256, 3000, dtype=np.uint8).tobytes()
BAD_GZIP: dict[str, tuple[bytes, str]] = {
    "bomb": (gzip.compress(b"\0" * 200_000), "MAX_DECOMPRESSED_BYTES"),
    "truncated": (gzip.compress(BODY)[:-12], "truncated"),
    "not_gzip": (b"plain text, no gzip", "not valid gzip"),
    "empty": (b"", "truncated"),
    "garbage_after_a_member": (gzip.compress(BODY) + b"garbage!", "not valid gzip"),
}


@pytest.mark.parametrize("case", sorted(BAD_GZIP))
@pytest.mark.parametrize("via", ["http", "file"])
def test_a_bad_or_huge_gzip_body_is_a_value_error_and_leaves_nothing(
    case: str, via: str, tmp_path: pathlib.Path, cache: pathlib.Path, server: _Server
) -> None:

    data, words = BAD_GZIP[case]
    server.files["/x.gz"] = data
    (tmp_path / "x.gz").write_bytes(data)
    url = server.base + "/x.gz" if via == "http" else f"file://{tmp_path}/x.gz"
    with Context(MAX_DECOMPRESSED_BYTES=100_000), pytest.raises(ValueError, match=words):
        Tensor.from_url(url, gunzip=True)
    assert not any(p.is_file() for p in cache.rglob("*")), list(cache.rglob("*"))


@pytest.mark.parametrize("via", ["http", "file"])
def test_gzip_members_and_zero_padding_decompress_like_gzip(
    via: str, tmp_path: pathlib.Path, cache: pathlib.Path, server: _Server
) -> None:
    data = gzip.compress(BODY[:1000]) + gzip.compress(BODY[1000:]) + b"\0" * 16
    server.files["/m.gz"] = data
    (tmp_path / "m.gz").write_bytes(data)
    url = server.base + "/m.gz" if via == "http" else f"file://{tmp_path}/m.gz"
    assert Tensor.from_url(url, gunzip=True).to("CPU").numpy().tobytes() == gzip.decompress(data) == BODY


def test_a_download_into_an_unwritable_cache_is_a_save_error_leaving_no_temp_file(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, server: _Server
) -> None:
    from speck.tensor.errors import SaveError

    root = tmp_path / "cache"
    root.mkdir()
    (root / "downloads").write_text("a file where the downloads directory belongs")
    monkeypatch.setenv("SPECK_CACHE_DIR", str(root))
    server.files["/b"] = BODY
    with pytest.raises(SaveError, match="can't write"):
        Tensor.from_url(server.base + "/b")
    assert sorted(p.name for p in root.iterdir()) == ["downloads"]


def test_fetch_streams_a_multi_chunk_body_exactly(cache: pathlib.Path, server: _Server) -> None:
    data = RNG.integers(0, 256, 3 * (1 << 20) + 12345, dtype=np.uint8).tobytes()  # several 1 MiB chunks and a tail
    server.files["/big.bin"] = data
    assert fetch(server.base + "/big.bin").read_bytes() == data


def test_fetch_of_a_truncated_body_is_an_error_and_caches_nothing(cache: pathlib.Path, server: _Server) -> None:
    server.files["/cut.bin"] = b"x" * 100
    server.announce["/cut.bin"] = 5000
    with pytest.raises(FetchError, match="sent 100 of the 5000 bytes"):
        fetch(server.base + "/cut.bin")
    downloads = cache / "downloads"
    assert not downloads.exists() or list(downloads.iterdir()) == []  # no partial file, no temporary left
    del server.announce["/cut.bin"]
    assert fetch(server.base + "/cut.bin").read_bytes() == b"x" * 100  # a good response afterwards is fetched


def test_fetch_gunzip_download_larger_than_the_cap_is_refused(cache: pathlib.Path, server: _Server) -> None:
    from speck.tensor import Context

    server.files["/noise.gz"] = RNG.integers(0, 256, 4096, dtype=np.uint8).tobytes()  # incompressible, 4 KiB
    with Context(MAX_DECOMPRESSED_BYTES=1024), pytest.raises(TensorValueError, match="MAX_DECOMPRESSED_BYTES"):
        fetch(server.base + "/noise.gz", gunzip=True)
