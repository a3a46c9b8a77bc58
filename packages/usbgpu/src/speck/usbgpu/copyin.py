"""Copy-in (G3 pipelined, G0 serial) and copy-out through the bridge's SRAM bounce buffers (PROTOCOL.md 4).

G3, per copy-in: plan 240 KiB chunks of two 120 KiB parts, each part followed by a 512 B sentinel sector; build the
whole SDMA batch (per part: POLL EQ on the sentinel, COPY; per chunk: the first-part and full-chunk flags, each a
4-dword FENCE; one timeline FENCE at the end), put it in the ring (a short batch: one 0xF0 stream and one doorbell; a
long one: uploaded through a bounce buffer, see below); then stream the chunks through two 256 KiB bounce buffers,
arming each chunk before its data (0xF2 for the first two, then the 0xF4 fence-gated arm) and waiting for the last
chunk's full flag at the end.

Beyond the reference design (see the package README for the reasoning):

* Gate on the full chunk when it matters. 0xF4 (or the E4 gate) lets chunk c+1 into the buffer of chunk c-1 once
  c-1's *first* part is copied. The first 120 KiB of chunk c+1 only overwrite c-1's first part, so they are sent at
  once; the rest would overwrite c-1's second part, so unless the 0xF4 reply already shows c-1's full flag it is
  sent only after an E4 poll sees that flag. On the default model the reply usually shows only the first-part flag
  and the poll completes while chunk c is still on the wire, so the link does not idle.
* Zero-copy wire. Payload goes to libusb straight from the caller's buffer; only the 2 KiB around each sentinel are
  staged (four transfers per full chunk, all whole 1 KiB packets, one arm). `zero_copy=False` stages the whole
  wire image into one transfer per chunk as the reference does.
* A short ring. The ring build is a 0xF0 stream at the firmware's ~1 us per dword, during which no payload moves,
  so every dword counts: the fence flags are 4-dword FENCE packets (32-bit values, compared modulo 2**32) instead
  of 6-dword 64-bit WRITEs, and the timeline advances once per copy-in (nothing waits on a chunk's timeline value:
  the host gates on the flags, later GPU work on the whole copy-in). 34 dwords per full chunk instead of 42.
* An uploaded ring. A batch of UPLOAD_MIN_DWORDS or more does not go over 0xF0 at all: a 3-packet boot batch does
  (POLL on a sentinel in bounce buffer 1, COPY from there into the ring right behind itself, FENCE of the buffer's
  full flag), the batch itself goes out as one armed bulk OUT at link speed, and a second doorbell publishes it once
  the flag shows it copied (the engine fetches ring dwords only up to the published write pointer). A 64 MB
  copy-in streams 17 dwords over 0xF0 instead of 8871 (9.8 ms in which no payload moved).
* No OUT arm ends on a 256 KiB window boundary (the bridge may corrupt that arm's last sector, PROTOCOL.md 1.6):
  G0 chunks are 496 KiB and a wire image that would end on a boundary gets one more (zero) sector.
* Stale data never equals a sentinel. The host tracks every SRAM sector-start dword that could look like a
  sentinel (top byte 0x51: left by copy-out, G0, or user data of earlier chunks) and skips sequence values that
  would collide at the exact offset the GPU polls. This replaces the reference's "improbable" with "never".
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass

from speck.usbgpu.amd.sdma import FUNC_EQ, FUNC_GE, copy_linear, fence, poll_regmem, write32
from speck.usbgpu.amd.tables import SDMA
from speck.usbgpu.bridge import EP_OUT, SECTOR, SLOT, Bridge, Transport, ends_on_window, f4_reached
from speck.usbgpu.errors import F4BailError, GpuFault, GpuFenceTimeout, GpuHang, UsbTimeoutError
from speck.usbgpu.gpu import CQ_PCIE, SQ_PCIE, SRAM_PCIE, SYS_VA, GpuContext

BUF_SIZE = 0x40000  # one G3 bounce buffer (16 slots)
CP_SIZE = BUF_SIZE - 0x4000  # chunk payload: the last slot carries the sentinels
PART = 0x1E000  # 120 KiB
SPLIT = PART + SECTOR  # wire bytes below this only overwrite the previous chunk's first part and its sentinel
ZC_ALIGN = 1024  # SuperSpeed max packet: transfer boundaries inside one arm stay on whole packets
ZC_MIN = 0x1000  # smaller payload runs are staged rather than sent as their own transfer
BUFFER_SLOTS = (0, 16)
SENTINEL_TAG = 0x51000000
F4_ATTEMPTS = 3
MAX_WIRE = CP_SIZE + 2 * SECTOR  # a full chunk's wire image: the most of a bounce buffer any copy-in writes
G0_CHUNK = 0x80000 - SLOT  # 496 KiB: a G0 wire image never fills the SRAM up to a window boundary
COPYOUT_CHUNK = BUF_SIZE
BULK_TIMEOUT_MS = 10000
# One G3 ring build covers at most this many chunks (1536 x 136 B of packets = 204 KiB: an uploaded batch fits one
# bounce buffer, see _upload_batch); larger copy-ins run as several G3 passes, each with its own ring build.
MAX_G3_PASS = 1536 * CP_SIZE
# A batch of at least this many dwords is uploaded through a bounce buffer (a bulk OUT at link speed and an SDMA
# copy into the ring) rather than streamed over 0xF0 at ~1.1 us a dword: the upload's extra round trips (a small
# 0xF0 boot batch and its doorbell, an arm, a flag read, a second doorbell) cost about as much as ~430 dwords
# (on the default model both ways take 4.1 ms for 12 chunks; at 32 chunks the upload saves 0.7 ms).
UPLOAD_MIN_DWORDS = 448
UPLOAD_BUFFER = 1  # the bounce buffer an uploaded batch passes through (chunk 1 overwrites it once it is copied)
MAX_CHUNK_DWORDS = 34  # SDMA dwords of one chunk (a full one; a short chunk has fewer)
SECTOR_DWORDS = SECTOR // 4
_PACKET_DWORDS = {SDMA.OP_POLL_REGMEM: 6, SDMA.OP_COPY: 7, SDMA.OP_FENCE: 4}  # the packets a batch is made of


def _round_up(n: int, m: int) -> int:
    return -(-n // m) * m


def sector_top_bytes(data: memoryview) -> bytes | bytearray:
    """Byte 3 of every 512-byte sector of `data`: the top byte of each sector-start dword.

    bytes/bytearray extended slicing is a tight C loop; a strided memoryview copy is several times slower, so the
    underlying object is used when the view covers it exactly.
    """
    obj = data.obj
    if isinstance(obj, bytes | bytearray) and len(obj) == data.nbytes and data.contiguous:
        return obj[3::SECTOR]
    return data[3::SECTOR].tobytes()


def reached(flag: int, target: int) -> bool:
    """Whether a 32-bit fence counter has reached `target` (modulo 2**32, like the timeline)."""
    return (flag - target) & 0xFFFFFFFF < 0x80000000


def g0_wire_len(size: int) -> int:
    """Bytes G0 sends for a chunk of `size`: whole sectors, plus one more if the arm would end on a window."""
    wire = _round_up(size, SECTOR)
    return wire + SECTOR if ends_on_window(0, wire) else wire


Progress = Callable[[int], None]  # called with the bytes done so far; may raise to abort the copy


def _no_progress(done: int) -> None:
    pass


@dataclass(slots=True)
class Part:
    """One part of a chunk: payload offset/length inside the chunk, offset in the wire image, sentinel value."""

    poff: int
    plen: int
    soff: int
    sentinel: int
    sentinel_off: int  # wire offset of the part's sentinel sector: soff + plen rounded up to a sector


@dataclass(slots=True)
class Chunk:
    """One chunk of a G3 copy-in: source offset, bounce buffer, that buffer's 1-based counter, parts, wire size."""

    index: int
    src_off: int
    length: int
    buffer: int
    counter: int
    parts: list[Part]
    wire_len: int
    # The chunk's wire image as transfers: (wire start, wire end, payload offset) for runs sent zero-copy from the
    # caller's buffer, (wire start, wire end, None) for runs built in the staging buffer (sentinels, padding, edges).
    segments: list[tuple[int, int, int | None]]


@dataclass
class CopyStats:
    """Counts the tests and the benchmark look at."""

    copyins: int = 0
    chunks: int = 0
    split_chunks: int = 0  # chunks sent as two transfers because the full flag was not reached yet
    f4_attempts: int = 0
    f4_bails: int = 0
    flag_polls: int = 0
    ring_dwords: int = 0  # SDMA dwords staged by copy-ins over 0xF0 (streamed before any payload moves)
    uploaded_dwords: int = 0  # SDMA dwords of batches uploaded through a bounce buffer instead


class CopyEngine:
    """Owns the bounce buffers, host staging, per-buffer counters, the sentinel sequence and the SRAM shadow."""

    def __init__(self, ctx: GpuContext) -> None:
        self.ctx = ctx
        ctx.require_ready("copies")
        aperture = SYS_VA
        self._sram_va = aperture + SRAM_PCIE  # GPU VA of the bounce SRAM (buffer b at + b * BUF_SIZE)
        self._flags_va = aperture + SQ_PCIE + 0x800  # full0, full1, first0, first1
        self._cq_va = aperture + CQ_PCIE
        self.bridge: Bridge = ctx.bridge
        self.usb: Transport = ctx.usb
        self.stats = CopyStats()
        self.staging = [bytearray(BUF_SIZE), bytearray(BUF_SIZE)]
        self._g3_ready = False
        self._ctr = [0, 0]
        self._seq24 = 0
        self._shadow: dict[int, int] = {}  # SRAM offset -> sector-start dword with top byte 0x51
        self._poll_limit = ctx.options.poll_limit
        self._zero_copy = ctx.options.zero_copy
        self._segment_cache: dict[int, list[tuple[int, int, int | None]]] = {}
        # (signal address, value) of compute work copies must wait for on the GPU (cross-queue), if any
        self.after: Callable[[], tuple[int, int] | None] = lambda: None

    # ------------------------------------------------------------------ SRAM shadow (stale sentinel look-alikes)
    def _shadow_forget(self, start: int, end: int) -> None:
        if self._shadow:
            for off in [o for o in self._shadow if start <= o < end]:
                del self._shadow[off]

    def _shadow_note(self, sram_off: int, data: bytes | bytearray | memoryview) -> None:
        """`data` (sector aligned at SRAM `sram_off`) replaced that SRAM range: record its sentinel look-alikes."""
        self._shadow_forget(sram_off, sram_off + _round_up(len(data), SECTOR))
        self._shadow_note_payload(sram_off, memoryview(data).cast("B"))

    def _shadow_note_payload(self, sram_off: int, data: memoryview) -> None:
        """Record sector-start dwords of `data` (landing at SRAM `sram_off`) whose top byte is the sentinel tag."""
        top = sector_top_bytes(data)
        pos = top.find(SENTINEL_TAG >> 24)
        while pos >= 0:
            off = pos * SECTOR
            self._shadow[sram_off + off] = int.from_bytes(bytes(data[off : off + 4]).ljust(4, b"\0"), "little")
            pos = top.find(SENTINEL_TAG >> 24, pos + 1)

    def _next_sentinel(self, avoid: int | None) -> int:
        while True:
            self._seq24 = (self._seq24 + 1) & 0xFFFFFF
            value = SENTINEL_TAG | self._seq24
            if value != avoid:
                return value

    # ------------------------------------------------------------------ G3
    def buffer_va(self, b: int) -> int:
        """GPU VA of G3 bounce buffer `b` (bridge SRAM through the profile's aperture)."""
        return self._sram_va + b * BUF_SIZE

    def full_flag_va(self, b: int) -> int:
        return self._flags_va + 8 * b

    def first_flag_va(self, b: int) -> int:
        return self._flags_va + 0x10 + 8 * b

    def _init_g3(self) -> None:
        """One-time init: clear the four fence flags, zero both bounce buffers (as far as a wire image reaches, so
        no arm ends on a window boundary) and reset the counters."""
        self.bridge.xdata_write(0xA800, bytes(32))
        zeros = bytes(MAX_WIRE)
        for slot in BUFFER_SLOTS:
            self.bridge.arm_write(MAX_WIRE, slot)
            self.usb.bulk_out(EP_OUT, zeros, BULK_TIMEOUT_MS)
            self._shadow_forget(slot * SLOT, slot * SLOT + MAX_WIRE)
        self._ctr = [0, 0]
        self._g3_ready = True

    @staticmethod
    def _wire_dword(ch: Chunk, data: memoryview, w: int) -> int | None:
        """The sector-start dword chunk `ch` puts at wire offset `w` (None beyond its wire image)."""
        for part in ch.parts:
            if w == part.sentinel_off:
                return part.sentinel
            if part.soff <= w < part.soff + part.plen:
                off = ch.src_off + part.poff + w - part.soff
                return int.from_bytes(bytes(data[off : off + 4]).ljust(4, b"\0"), "little")
        return None

    def _plan(self, data: memoryview) -> list[Chunk]:
        """Split into chunks/parts, assign counters and sentinels, and advance the SRAM shadow past this copy-in.

        A sentinel must differ from whatever the polled SRAM dword holds before the part lands: that is the same
        offset of the previous chunk in the same buffer (this copy-in) or, for the first two chunks, the shadow.
        """
        n = len(data)
        chunks: list[Chunk] = []
        shadow, ctr = self._shadow, self._ctr
        for c, src in enumerate(range(0, n, CP_SIZE)):
            b = c & 1
            ctr[b] += 1
            length = min(CP_SIZE, n - src)
            base = b * BUF_SIZE
            prev = chunks[c - 2] if c >= 2 else None
            parts: list[Part] = []
            soff = 0
            for poff in range(0, length, PART):
                plen = min(PART, length - poff)
                sentinel_off = soff + _round_up(plen, SECTOR)
                stale = shadow.get(base + sentinel_off) if prev is None else self._wire_dword(prev, data, sentinel_off)
                parts.append(Part(poff, plen, soff, self._next_sentinel(stale), sentinel_off))
                soff = sentinel_off + SECTOR
            ch = Chunk(c, src, length, b, ctr[b], parts, soff, [])
            rel = self._segment_cache.get(length)
            if rel is None:
                rel = self._segment_cache[length] = self._segments(ch)
            ch.segments = [(ws, we, None if s is None else src + s) for ws, we, s in rel]
            chunks.append(ch)
        # What the bounce buffers hold once this copy-in is done: per buffer its last chunk, and beyond that chunk's
        # wire the one before it (only the last chunk of a copy-in can be shorter).
        for last in chunks[-2:]:
            base = last.buffer * BUF_SIZE
            older = chunks[last.index - 2] if last.index >= 2 else None
            self._shadow_forget(base, base + max(last.wire_len, older.wire_len if older else 0))
            for writer in (older, last):
                if writer is None:
                    continue
                if writer is last:  # the last chunk overwrote the start of the older one
                    self._shadow_forget(base, base + last.wire_len)
                for part in writer.parts:
                    if writer is older and part.soff + part.plen <= last.wire_len:
                        continue
                    self._shadow_note_payload(base + part.soff, data[writer.src_off + part.poff :][: part.plen])
                    shadow[base + part.sentinel_off] = part.sentinel
        return chunks

    def _ring_batch(self, dest: int, chunks: list[Chunk]) -> list[int]:
        """The copy-in's SDMA batch: wait for earlier GPU work, every chunk's packets, then one timeline FENCE."""
        timeline = self.ctx.timeline
        packets = poll_regmem(timeline.va, timeline.value - 1, FUNC_GE) + self._after_compute()
        templates: dict[int, list[int]] = {}
        for ch in chunks:
            if len(ch.parts) == 2 and ch.length == CP_SIZE:
                # Full chunks all share one packet layout: patch a per-buffer template instead of re-encoding.
                t = templates.get(ch.buffer)
                if t is None:
                    t = templates[ch.buffer] = self._chunk_packets(ch, 0)
                t = t.copy()
                p0, p1 = ch.parts
                d0, d1 = dest + ch.src_off, dest + ch.src_off + PART
                k = ch.counter & 0xFFFFFFFF
                # dword indices (layout of _chunk_packets): part-0 POLL ref 3, COPY dst 11/12, first-flag FENCE
                # value 16; part-1 POLL ref 20, COPY dst 28/29; full-flag FENCE value 33
                t[3], t[11], t[12], t[16] = p0.sentinel, d0 & 0xFFFFFFFF, d0 >> 32, k
                t[20], t[28], t[29], t[33] = p1.sentinel, d1 & 0xFFFFFFFF, d1 >> 32, k
                packets += t
            else:
                packets += self._chunk_packets(ch, dest + ch.src_off)
        packets += fence(timeline.va, timeline.next())
        return packets

    def _after_compute(self) -> list[int]:
        """POLL_REGMEM on the compute timeline: the copy waits on the GPU for every dispatch issued before it."""
        fence = self.after()
        return [] if fence is None else poll_regmem(fence[0], fence[1], FUNC_GE)

    def _chunk_packets(self, ch: Chunk, dest: int) -> list[int]:
        """One chunk's SDMA packets: per part POLL EQ sentinel + COPY (+ first-part flag FENCE), then the full flag."""
        bva = self.buffer_va(ch.buffer)
        packets: list[int] = []
        for i, part in enumerate(ch.parts):
            packets += poll_regmem(bva + part.sentinel_off, part.sentinel, FUNC_EQ)
            packets += copy_linear(bva + part.soff, dest + part.poff, part.plen)
            if i == 0:
                packets += fence(self.first_flag_va(ch.buffer), ch.counter)
        packets += fence(self.full_flag_va(ch.buffer), ch.counter)
        return packets

    @staticmethod
    def _segments(ch: Chunk) -> list[tuple[int, int, int | None]]:
        segs: list[tuple[int, int, int | None]] = []
        pos = 0
        for part in ch.parts:
            zs = _round_up(part.soff, ZC_ALIGN)
            ze = (part.soff + part.plen) // ZC_ALIGN * ZC_ALIGN
            if ze - zs >= ZC_MIN:
                if zs > pos:
                    segs.append((pos, zs, None))
                segs.append((zs, ze, part.poff + zs - part.soff))  # payload offset relative to the chunk
                pos = ze
        if pos < ch.wire_len:
            segs.append((pos, ch.wire_len, None))
        return segs

    def _wire(self, data: memoryview, ch: Chunk) -> list[tuple[int, memoryview]]:
        """The chunk's transfers as (wire end offset, buffer): payload runs zero-copy, the rest staged."""
        stage = self.staging[ch.buffer]
        view = memoryview(stage)
        if not self._zero_copy:  # the reference layout: the whole wire image staged, one transfer
            for part in ch.parts:
                stage[part.soff : part.soff + part.plen] = data[ch.src_off + part.poff :][: part.plen]
                struct.pack_into("<I", stage, part.sentinel_off, part.sentinel)
            return [(ch.wire_len, view[: ch.wire_len])]
        if len(ch.parts) == 2 and ch.length == CP_SIZE and len(ch.segments) == 4:
            # Standard full chunk: [part 0][sentinel 0 + first 512 B of part 1][part 1 body][last 512 B + sentinel 1]
            # (every transfer a whole number of 1 KiB packets). Only the 2 KiB of staged edges are copied; the
            # rest of each sentinel sector is never read by the GPU, so it is not cleared.
            src = ch.src_off
            p0, p1 = ch.parts
            struct.pack_into("<I", stage, p0.sentinel_off, p0.sentinel)
            stage[PART + SECTOR : PART + 2 * SECTOR] = data[src + PART : src + PART + SECTOR]
            stage[2 * PART : 2 * PART + SECTOR] = data[src + 2 * PART - SECTOR : src + 2 * PART]
            struct.pack_into("<I", stage, p1.sentinel_off, p1.sentinel)
            (_, e0, _), (_, e1, _), (_, e2, s2), (_, e3, _) = ch.segments
            return [
                (e0, data[src : src + PART]),
                (e1, view[PART:e1]),
                (e2, data[s2 : src + 2 * PART - SECTOR]),
                (e3, view[e2:e3]),
            ]
        out: list[tuple[int, memoryview]] = []
        for ws, we, payload in ch.segments:
            if payload is not None:
                out.append((we, data[payload : payload + we - ws]))
                continue
            stage[ws:we] = bytes(we - ws)
            for part in ch.parts:
                a, b = max(ws, part.soff), min(we, part.soff + part.plen)
                if a < b:
                    base = ch.src_off + part.poff - part.soff
                    stage[a:b] = data[base + a : base + b]
                if ws <= part.sentinel_off < we:
                    struct.pack_into("<I", stage, part.sentinel_off, part.sentinel)
            out.append((we, view[ws:we]))
        return out

    @staticmethod
    def _split(wire: list[tuple[int, memoryview]]) -> tuple[list[memoryview], list[memoryview]]:
        """Cut a chunk's transfers at wire offset PART (a whole number of packets, and below SPLIT): what may be sent
        once the previous chunk's first part is copied, and what must wait for its full flag."""
        head: list[memoryview] = []
        rest: list[memoryview] = []
        for end, buf in wire:
            start = end - len(buf)
            if end <= PART:
                head.append(buf)
            elif start < PART:
                head.append(buf[: PART - start])
                rest.append(buf[PART - start :])
            else:
                rest.append(buf)
        return head, rest

    def _wait_full(self, b: int, k: int, what: str) -> None:
        """Spin on 24-byte E4 reads until buffer `b`'s full-chunk flag reaches `k`."""
        for _ in range(self._poll_limit):
            self.stats.flag_polls += 1
            full, _first = self.bridge.read_flags(b)
            if reached(full, k):
                return
        full, first = self.bridge.read_flags(b)
        raise GpuFenceTimeout(what, f"USB copyin GPU fence timeout: buffer {b} full={full} first={first}, want {k}", "")

    def _gate(self, ch: Chunk, target: int) -> bool:
        """Arm chunk `ch` once the previous chunk in its buffer (counter `target`) drained its first part.

        Returns whether that chunk's full flag was already reached (then the whole chunk may be sent at once).
        """
        b, slot = ch.buffer, BUFFER_SLOTS[ch.buffer]
        if self.ctx.options.f4gate:
            reply = b""
            for _ in range(F4_ATTEMPTS):
                self.stats.f4_attempts += 1
                reply = self.bridge.arm_fenced(ch.wire_len, slot, b, target)
                if f4_reached(reply, b, target):
                    return (reply[8 * b] - target) & 0xFF < 0x80
                self.stats.f4_bails += 1
            raise F4BailError(
                f"0xF4 arm of chunk {ch.index} into buffer {b}",
                f"0xF4 arm bailed waiting for GPU fence {target & 0xFF} ({F4_ATTEMPTS} attempts)",
                f"flags {reply.hex()}",
            )
        self.bridge.arm_write(ch.wire_len, slot)
        for _ in range(self._poll_limit):
            self.stats.flag_polls += 1
            full, first = self.bridge.read_flags(b)
            if reached(full, target):
                return True
            if reached(first, target):
                return False
        raise GpuFenceTimeout(
            f"E4 fence gate for chunk {ch.index} into buffer {b}",
            f"USB copyin GPU fence timeout: want {target}",
            "",
        )

    # ------------------------------------------------------------------ G3 batch upload
    @staticmethod
    def _upload_space(n: int) -> int:
        """Bytes of bounce buffer an uploaded batch for a copy-in of `n` bytes may fill (its packets, the NOPs that
        keep sentinel look-alikes off sector starts, zero padding), or 0 when the batch is streamed over 0xF0."""
        bound = 12 + MAX_CHUNK_DWORDS * -(-n // CP_SIZE) + 4  # two leading waits, the chunks, the timeline FENCE
        if bound < UPLOAD_MIN_DWORDS:
            return 0
        space = _round_up(4 * (bound + bound // (SECTOR_DWORDS - 1) + 1), SECTOR)
        assert space + SECTOR < BUF_SIZE, "MAX_G3_PASS keeps an uploaded batch inside one bounce buffer"
        return space

    def _reserve_upload(self, space: int) -> tuple[int, int]:
        """Before planning: take the upload's counter in UPLOAD_BUFFER and its sentinel, and record what the buffer
        holds once the batch landed (no look-alike below `space`, the sentinel at `space`), so the sentinels of
        the first chunk in that buffer are chosen against it. Returns (sentinel, counter)."""
        b = UPLOAD_BUFFER
        base = b * BUF_SIZE
        sentinel = self._next_sentinel(self._shadow.get(base + space))
        self._shadow_forget(base, base + space + SECTOR)
        self._shadow[base + space] = sentinel
        self._ctr[b] += 1
        return sentinel, self._ctr[b]

    @staticmethod
    def _sector_safe(batch: list[int]) -> list[int]:
        """`batch` with one-dword NOPs inserted before packets that would put a dword whose top byte is the sentinel
        tag at a sector start: the uploaded image then never looks like a sentinel where a later POLL may look."""
        tag = SENTINEL_TAG >> 24
        if all(w >> 24 != tag for w in batch[::SECTOR_DWORDS]):
            return batch
        out: list[int] = []
        pos = 0
        while pos < len(batch):
            size = _PACKET_DWORDS[batch[pos] & 0xFF]
            packet = batch[pos : pos + size]
            while any(w >> 24 == tag for w in packet[-len(out) % SECTOR_DWORDS :: SECTOR_DWORDS]):
                out.append(0)  # an all-zero dword is a one-dword NOP
            out += packet
            pos += size
        return out

    def _upload_batch(self, batch: list[int], space: int, sentinel: int, counter: int) -> None:
        """Put the copy-in's SDMA batch into the ring without streaming it over 0xF0 (~1.1 us a dword, with no
        payload moving meanwhile: 9.8 ms of a 64 MB copy-in). A boot batch of three packets goes over 0xF0 and is
        kicked: POLL EQ on a sentinel after the image in UPLOAD_BUFFER, COPY of the image into the ring right after
        itself, FENCE of the buffer's full flag. The image goes out as one armed bulk OUT; once the flag shows the
        copy done, the second doorbell publishes the copied packets. The engine fetches ring dwords only up to the
        published write pointer, so what it runs is what the copy wrote."""
        image = self._sector_safe(batch)
        nbytes = 4 * len(image)
        assert nbytes <= space, "_upload_space bounds the image"
        b, ring = UPLOAD_BUFFER, self.ctx.ring
        src = self.buffer_va(b)
        boot_len = 4 * (6 + 7 + 4)
        target = ring.make_room(boot_len + nbytes) + boot_len
        boot = poll_regmem(src + space, sentinel, FUNC_EQ) + copy_linear(src, target, nbytes)
        boot += fence(self.full_flag_va(b), counter)
        ring.stage(boot)
        ring.kick()
        wire = bytearray(space + SECTOR)
        struct.pack_into(f"<{len(image)}I", wire, 0, *image)
        struct.pack_into("<I", wire, space, sentinel)
        self.bridge.arm_write(len(wire), BUFFER_SLOTS[b])
        self.usb.bulk_out(EP_OUT, wire, BULK_TIMEOUT_MS)
        self._wait_full(b, counter, f"the upload of a {len(image)}-dword SDMA batch")
        ring.reserve(nbytes)
        ring.kick()
        self.stats.ring_dwords += len(boot)
        self.stats.uploaded_dwords += len(image)

    def copyin_g3(self, dest: int, data: memoryview, progress: Progress = _no_progress, done: int = 0) -> None:
        """Pipelined copy-in of `data` to GPU VA `dest` (one ring build per pass of <= MAX_G3_PASS bytes).

        `progress(bytes)` is called as chunks land in the bounce buffers and once all of `data` is in VRAM (`done`
        is what earlier passes of the same copy already reported)."""
        if len(data) == 0:
            return
        if len(data) > MAX_G3_PASS:
            for off in range(0, len(data), MAX_G3_PASS):
                self.copyin_g3(dest + off, data[off : off + MAX_G3_PASS], progress, done + off)
            return
        if not self._g3_ready:
            self._init_g3()
        upload = self._upload_space(len(data))
        boot = self._reserve_upload(upload) if upload else None
        chunks = self._plan(data)
        batch = self._ring_batch(dest, chunks)
        # No wait for the previous copy-in: it returned only after its last full flag (or failed, which leaves the
        # session unusable), so the GPU is idle when the doorbell rings.
        if boot is None:
            self.ctx.ring.stage(batch)
            self.ctx.ring.kick()
            self.stats.ring_dwords += len(batch)
        else:
            self._upload_batch(batch, upload, *boot)
        self.stats.copyins += 1
        self.stats.chunks += len(chunks)

        tags: list[list[int]] = [[] for _ in chunks]
        submit = self.usb.submit_bulk_out
        first = chunks[0]
        self.bridge.arm_write(first.wire_len, BUFFER_SLOTS[first.buffer])
        tags[0] = [submit(EP_OUT, buf, BULK_TIMEOUT_MS) for _, buf in self._wire(data, first)]
        if len(chunks) > 1:
            second = chunks[1]
            wire = self._wire(data, second)
            self.bridge.arm_write(second.wire_len, BUFFER_SLOTS[second.buffer])  # latched behind chunk 0
            tags[1] = [submit(EP_OUT, buf, BULK_TIMEOUT_MS) for _, buf in wire]
        for c in range(1, len(chunks)):
            for tag in tags[c - 1]:
                self.usb.wait(tag, BULK_TIMEOUT_MS)
            progress(done + chunks[c - 1].src_off + chunks[c - 1].length)
            if c + 1 >= len(chunks):
                continue
            nxt, prev = chunks[c + 1], chunks[c - 1]
            wire = self._wire(data, nxt)
            full_done = self._gate(nxt, prev.counter)
            if full_done or nxt.wire_len <= SPLIT:
                tags[c + 1] = [submit(EP_OUT, buf, BULK_TIMEOUT_MS) for _, buf in wire]
            else:
                # Only what cannot reach the previous chunk's second part goes now; the rest after its full flag.
                self.stats.split_chunks += 1
                head, rest = self._split(wire)
                tags[c + 1] = [submit(EP_OUT, buf, BULK_TIMEOUT_MS) for buf in head]
                self._wait_full(prev.buffer, prev.counter, f"chunk {prev.index}'s second part")
                tags[c + 1] += [submit(EP_OUT, buf, BULK_TIMEOUT_MS) for buf in rest]
        for tag in tags[-1]:
            self.usb.wait(tag, BULK_TIMEOUT_MS)
        last = chunks[-1]
        self._wait_full(last.buffer, last.counter, f"copy-in of {len(data)} bytes")
        progress(done + len(data))

    # ------------------------------------------------------------------ G0
    def copyin_g0(self, dest: int, data: memoryview, progress: Progress = _no_progress) -> None:
        """Serial copy-in: per 496 KiB chunk wait for the GPU, 0xF2 + sync bulk, then one SDMA copy + doorbell."""
        n = len(data)
        if n == 0:
            return
        timeline, ring = self.ctx.timeline, self.ctx.ring
        previous: int | None = None
        for off in range(0, n, G0_CHUNK):
            size = min(G0_CHUNK, n - off)
            if previous is not None:
                timeline.wait(previous, "G0 copy-in: GPU draining the bounce buffer")
                progress(off)
            wire: bytes | memoryview = data[off : off + size]
            wire_len = g0_wire_len(size)
            if wire_len != size:
                wire = bytes(wire) + bytes(wire_len - size)
            self.bridge.arm_write(wire_len, 0)
            self.usb.bulk_out(EP_OUT, wire, 1000)
            self._shadow_note(0, wire)
            value = timeline.next()
            batch = poll_regmem(timeline.va, value - 1, FUNC_GE) + self._after_compute()
            batch += copy_linear(self._sram_va, dest + off, size)
            batch += fence(timeline.va, value)
            ring.submit(batch)
            previous = value
        self.stats.copyins += 1
        assert previous is not None
        timeline.wait(previous, "G0 copy-in: last chunk")
        progress(n)

    # ------------------------------------------------------------------ copy-out
    def copyout(self, out: memoryview, src: int, progress: Progress = _no_progress) -> None:
        """Copy `len(out)` bytes from GPU VA `src`: per 256 KiB chunk a read arm, an SDMA copy + CQ trigger, bulk IN."""
        n = len(out)
        if n == 0:
            return
        timeline, ring = self.ctx.timeline, self.ctx.ring
        timeline.wait(timeline.value - 1, "copy-out: synchronizing with earlier GPU work")
        for off in range(0, n, COPYOUT_CHUNK):
            size = min(COPYOUT_CHUNK, n - off)
            self.bridge.arm_read(size)
            value = timeline.next()
            batch = poll_regmem(timeline.va, value - 1, FUNC_GE) + self._after_compute()
            batch += copy_linear(src + off, self._sram_va, size)
            batch += write32(self._cq_va + 12, 0)
            batch += fence(timeline.va, value)
            ring.submit(batch)
            try:
                got = self.bridge.bulk_in_exact(_round_up(size, SECTOR), BULK_TIMEOUT_MS, f"copy-out of {size} bytes")
            except UsbTimeoutError as exc:
                # The IN stream starts only when the SDMA copy reaches the CQ trigger: a stuck queue times the
                # transfer out. Name the queue when it reported a fault or hang.
                try:
                    self.ctx.check_queues(f"copy-out of {size} bytes")
                except (GpuFault, GpuHang) as named:
                    raise named from exc
                raise
            out[off : off + size] = memoryview(got)[:size]
            self._shadow_note(0, got)
            progress(off + size)
