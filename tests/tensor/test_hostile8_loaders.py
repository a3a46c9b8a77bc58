"""A stored zip member (a torch .pth storage, a zip_extract member) is a lazy slice of the file: nothing read at load
time. Its payload damaged after the file was written read back as the damaged bytes, silently (zipfile's reader
refuses such a member: 'Bad CRC-32'). Now the member's CRC-32 is checked by the first read that covers all of it
(CorruptFileError naming the member and both sums); bytes already in memory are checked at once (ArchiveError)."""

from __future__ import annotations

import io
import pathlib
import tarfile
import types
import zipfile

import numpy as np
import pytest

import test_hostile7_loaders as h7
from speck.hcq.errors import CorruptFileError
from speck.tensor import Tensor
from speck.tensor.errors import ArchiveError
from speck.tensor.nn.state import safe_load, safe_load_metadata, safe_save, tar_extract, torch_load, zip_extract

ARRAYS, _pth, _zip = h7.ARRAYS, h7._pth, h7._zip
fake_torch = h7.fake_torch  # (the fixture: torch's names for the pickler)
PAYLOAD = bytes(range(256)) * 4


def _damaged(raw: bytes, payload: bytes) -> bytes:
    """raw with one byte in the middle of the stored member `payload` flipped (the headers left as they are)."""
    at = raw.index(payload) + len(payload) // 2
    return raw[:at] + bytes([raw[at] ^ 0x40]) + raw[at + 1 :]


def test_a_damaged_stored_member_in_a_file_raises_when_read_and_the_others_read_exactly(tmp_path: pathlib.Path) -> None:
    raw = _damaged(_zip([("good", b"hello zip"), ("bad", PAYLOAD), ("tail", b"\x00\x01")]), PAYLOAD)
    p = tmp_path / "damaged.zip"
    p.write_bytes(raw)
    with zipfile.ZipFile(p) as zf, pytest.raises(zipfile.BadZipFile, match="CRC"):  # the stdlib reader refuses it
        zf.read("bad")
    members = zip_extract(p)  # lazy: nothing of the payloads read yet
    assert members["good"].numpy().tobytes() == b"hello zip"
    assert members["tail"].numpy().tobytes() == b"\x00\x01"
    with pytest.raises(CorruptFileError, match=r"zip member 'bad' of .*damaged\.zip.* CRC-32 0x[0-9a-f]{8}, but the "
                                               r"file records 0x[0-9a-f]{8}.*again"):  # fmt: skip
        members["bad"].numpy()
    with pytest.raises(CorruptFileError):  # every read, not only the first
        (members["bad"].to("CPU") + 1).numpy()


def test_an_intact_member_is_checked_once_and_reads_as_zipfile_reads_it(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "fine.zip"
    p.write_bytes(_zip([("a", PAYLOAD), ("b", b"xyz")]))
    members = zip_extract(p)
    with zipfile.ZipFile(p) as zf:
        for name, t in members.items():
            assert t.numpy().tobytes() == zf.read(name)
            assert t[3:].numpy().tobytes() == zf.read(name)[3:]


def test_a_damaged_member_of_bytes_in_memory_is_an_archive_error_at_once() -> None:
    raw = _damaged(_zip([("a", b"fine"), ("bad", PAYLOAD)]), PAYLOAD)
    with pytest.raises(ArchiveError, match=r"zip member 'bad'.*CRC-32.*corrupt"):
        zip_extract(Tensor(np.frombuffer(raw, np.uint8).copy()))


def test_a_torch_checkpoint_with_a_damaged_storage_raises_when_the_tensor_is_read(
    tmp_path: pathlib.Path, fake_torch: types.SimpleNamespace
) -> None:
    arrays = {"f32": ARRAYS["f32"], "i16": ARRAYS["i16"]}
    raw = _pth(fake_torch, arrays, b"little", "<")
    p = tmp_path / "model.pth"
    p.write_bytes(_damaged(raw, arrays["f32"].tobytes()))
    state = torch_load(p)
    np.testing.assert_array_equal(state["i16"].numpy(), arrays["i16"])
    with pytest.raises(CorruptFileError, match=r"archive/data/0"):
        state["f32"].numpy()
    q = tmp_path / "intact.pth"
    q.write_bytes(raw)
    for k, v in torch_load(q).items():
        np.testing.assert_array_equal(v.numpy(), arrays[k])


def test_a_member_whose_crc_is_recorded_as_0_is_not_checked(tmp_path: pathlib.Path) -> None:
    # torch.save under torch.serialization.set_crc32_options(False) writes 0 for every member: such files load
    raw = bytearray(_zip([("a", PAYLOAD)]))
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as zf:
        info = zf.getinfo("a")
    for at in (info.header_offset + 14, raw.index(b"PK\x01\x02") + 16):  # local header's CRC, the directory's
        raw[at : at + 4] = bytes(4)
    p = tmp_path / "nocrc.zip"
    p.write_bytes(bytes(raw))
    assert zip_extract(p)["a"].numpy().tobytes() == PAYLOAD


def test_a_zip_inside_a_tar_checks_its_member_at_its_place_in_the_file(tmp_path: pathlib.Path) -> None:
    for damaged in (False, True):
        raw = _zip([("m", PAYLOAD), ("n", b"ok")])
        raw = _damaged(raw, PAYLOAD) if damaged else raw
        p = tmp_path / f"outer{damaged}.tar"
        with tarfile.open(p, "w") as tf:
            for name, data in (("pad.bin", b"x" * 1001), ("inner.zip", raw)):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        members = zip_extract(tar_extract(p)["inner.zip"])
        assert members["n"].numpy().tobytes() == b"ok"
        if damaged:
            with pytest.raises(CorruptFileError, match="zip member 'm'"):
                members["m"].numpy()
        else:
            assert members["m"].numpy().tobytes() == PAYLOAD


@pytest.mark.parametrize("device", [None, "CPU"])
def test_safe_load_of_a_disk_tensor_reads_its_bytes_after_a_save_over_its_path(
    tmp_path: pathlib.Path, device: str | None
) -> None:
    # safe_load(DISK tensor) read the file by path again: after a save replaced it, the tensor's own bytes said 0..7
    # and safe_load of it gave the new file's -1s
    p = tmp_path / "w.safetensors"
    a, h = np.arange(8, dtype=np.float32), np.ones(3, np.float16)
    safe_save({"w": Tensor(a), "h": Tensor(h)}, p)
    t = Tensor(p)
    held = t.numpy().tobytes()  # (maps the file)
    safe_save({"w": Tensor(np.full(8, -1, np.float32)), "h": Tensor(np.zeros(3, np.float16))}, p)
    assert t.numpy().tobytes() == held
    got = safe_load(t, device=device)
    np.testing.assert_array_equal(got["w"].numpy(), a)
    np.testing.assert_array_equal(got["h"].numpy(), h)
    np.testing.assert_array_equal(safe_load(Tensor(p), device=device)["w"].numpy(), np.full(8, -1, np.float32))


def test_safe_load_metadata_of_a_disk_tensor_reads_its_bytes_after_a_save_over_its_path(tmp_path: pathlib.Path) -> None:
    p = tmp_path / "m.safetensors"
    safe_save({"w": Tensor(np.arange(4, dtype=np.float32))}, p, metadata={"v": "old"})
    t = Tensor(p)
    t.numpy()  # (maps the file)
    safe_save({"w": Tensor(np.arange(4, dtype=np.float32))}, p, metadata={"v": "new!"})
    file, start, header = safe_load_metadata(t)
    assert header["__metadata__"] == {"v": "old"}
    assert file.numpy()[start:].view(np.float32).tolist() == [0, 1, 2, 3]
