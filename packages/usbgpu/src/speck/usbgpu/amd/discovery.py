"""The IP discovery table (discovery.h): the binary a card keeps in the top of its VRAM listing every IP block, its
version and its register base segments. The driver parses it (`parse`); the simulated card serves one (`build`).

Layout: binary_header (signature, checksum over the rest, table list) -> ip_discovery_header (signature, one
die_info per die) -> per die a die_header and `num_ips` ip entries (ip_v3: hw id, instance, version, then
`num_base_address` 32-bit bases; version 4 may use 64-bit bases). Checksums are 16-bit byte sums.
"""

from __future__ import annotations

from dataclasses import dataclass

from speck.usbgpu.amd.tables import CONST, IP_HWID, STRUCTS
from speck.usbgpu.errors import GpuBringUpError

_BIN = STRUCTS.binary_header
_IPD = STRUCTS.ip_discovery_header
_DIE = STRUCTS.die_header
_IP = STRUCTS.ip_v3
_CHECKSUMMED_FROM = _BIN.offset("binary_checksum") + 2  # the binary checksum covers the bytes after its own field
_HWID_NAMES = {hwid: ip for ip, hwid in IP_HWID.items()}


@dataclass(frozen=True)
class IpBlock:
    """One IP block instance: name (GC, SDMA0, ... as in IP_HWID; HW<id> otherwise), version and base segments."""

    name: str
    hw_id: int
    instance: int
    version: tuple[int, int, int]
    bases: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name} {'.'.join(map(str, self.version))}"


@dataclass(frozen=True)
class Discovery:
    """The parsed table: every IP block of die 0 (speck drives single-die cards)."""

    ips: tuple[IpBlock, ...]

    def find(self, name: str, instance: int = 0) -> IpBlock | None:
        for ip in self.ips:
            if ip.name == name and ip.instance == instance:
                return ip
        return None

    def require(self, name: str, what: str) -> IpBlock:
        ip = self.find(name)
        if ip is None:
            raise GpuBringUpError(
                "IP discovery", f"the card's discovery table has no {name} block, which {what} needs", self.summary()
            )
        return ip

    def bases(self) -> dict[str, tuple[int, ...]]:
        """Register base segments per IP block name (instance 0)."""
        return {ip.name: ip.bases for ip in self.ips if ip.instance == 0}

    def summary(self) -> str:
        return "IP blocks: " + ", ".join(str(ip) for ip in self.ips if ip.instance == 0)


def checksum(data: bytes | bytearray | memoryview) -> int:
    """The 16-bit byte sum discovery.h's tables use."""
    return sum(bytes(data)) & 0xFFFF


def _fail(detail: str) -> GpuBringUpError:
    return GpuBringUpError(
        "IP discovery",
        f"the discovery table read from VRAM is not valid: {detail}",
        "the card's firmware did not publish it (not powered up?) or VRAM is not reachable through BAR0",
    )


def parse(blob: bytes | bytearray | memoryview) -> Discovery:
    """Parse and verify a discovery binary (signatures and checksums as amdgpu_discovery_init checks them)."""
    blob = bytes(blob)
    if len(blob) < _BIN.size:
        raise _fail(f"{len(blob)} bytes is shorter than its header ({_BIN.size})")
    head = _BIN.unpack(blob)
    if head["binary_signature"] != CONST.BINARY_SIGNATURE:
        raise _fail(f"binary signature {head['binary_signature']:#010x}, want {CONST.BINARY_SIGNATURE:#010x}")
    size = head["binary_size"]
    if not _CHECKSUMMED_FROM <= size <= len(blob):
        raise _fail(f"binary size {size} outside [{_CHECKSUMMED_FROM}, {len(blob)}]")
    if checksum(blob[_CHECKSUMMED_FROM:size]) != head["binary_checksum"]:
        raise _fail("binary checksum mismatch")
    info = head["table_list"][CONST.TABLE_IP_DISCOVERY]
    offset = info["offset"]
    if not offset or offset + _IPD.size > size:
        raise _fail(f"IP discovery table at offset {offset} outside the binary")
    ipd = _IPD.unpack(blob, offset)
    if ipd["signature"] != CONST.DISCOVERY_TABLE_SIGNATURE:
        raise _fail(f"IP table signature {ipd['signature']:#010x}, want {CONST.DISCOVERY_TABLE_SIGNATURE:#010x}")
    if offset + ipd["size"] > len(blob) or checksum(blob[offset : offset + ipd["size"]]) != info["checksum"]:
        raise _fail("IP table checksum mismatch")
    if ipd["version"] not in (3, 4):
        raise _fail(f"IP table version {ipd['version']} (speck reads versions 3 and 4, as gfx11 cards have)")
    if ipd["num_dies"] < 1:
        raise _fail("no dies listed")
    wide = ipd["version"] == 4 and ipd["base_addr_64_bit"]
    pos = ipd["die_info"][0]["die_offset"]
    die = _DIE.unpack(blob, pos)
    pos += _DIE.size
    ips: list[IpBlock] = []
    for _ in range(die["num_ips"]):
        if pos + _IP.size > len(blob):
            raise _fail(f"IP entry at {pos} runs past the binary")
        entry = _IP.unpack(blob, pos)
        pos += _IP.size
        n, width = entry["num_base_address"], 8 if wide else 4
        if pos + n * width > len(blob):
            raise _fail(f"base addresses of IP {entry['hw_id']} run past the binary")
        bases = tuple(int.from_bytes(blob[pos + i * width : pos + (i + 1) * width], "little") for i in range(n))
        pos += n * width
        name = _HWID_NAMES.get(entry["hw_id"], f"HW{entry['hw_id']}")
        version = (entry["major"], entry["minor"], entry["revision"])
        ips.append(IpBlock(name, entry["hw_id"], entry["instance_number"], version, bases))
    return Discovery(tuple(ips))


def build(ips: list[IpBlock]) -> bytes:
    """A discovery binary (version 3 IP table, one die) listing `ips`: what a card's firmware leaves in VRAM."""
    body = bytearray(_DIE.pack(die_id=0, num_ips=len(ips)))
    for ip in ips:
        body += _IP.pack(
            hw_id=ip.hw_id,
            instance_number=ip.instance,
            num_base_address=len(ip.bases),
            major=ip.version[0],
            minor=ip.version[1],
            revision=ip.version[2],
        )
        for base in ip.bases:
            body += base.to_bytes(4, "little")
    ipd_offset = _BIN.size
    die_offset = ipd_offset + _IPD.size
    die_info = [{"die_id": 0, "die_offset": die_offset}] + [{"die_id": 0, "die_offset": 0}] * 15
    table = (
        _IPD.pack(
            signature=CONST.DISCOVERY_TABLE_SIGNATURE,
            version=3,
            size=_IPD.size + len(body),
            id=0,
            num_dies=1,
            die_info=die_info,
        )
        + body
    )
    total = ipd_offset + len(table)
    tables = [{"offset": 0, "checksum": 0, "size": 0, "padding": 0} for _ in range(CONST.TABLE_TOTAL_TABLES)]
    tables[CONST.TABLE_IP_DISCOVERY] = {
        "offset": ipd_offset,
        "checksum": checksum(table),
        "size": len(table),
        "padding": 0,
    }
    head = _BIN.pack(
        binary_signature=CONST.BINARY_SIGNATURE, version_major=1, version_minor=0, binary_size=total, table_list=tables
    )
    blob = head + table
    _BIN.pack_into(blob, 0, binary_checksum=checksum(blob[_CHECKSUMMED_FROM:total]))
    return bytes(blob)
