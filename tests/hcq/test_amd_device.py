"""speck.hcq.amd without a card: an AMDDevice over a recording link (the AmdLink protocol) shows what the device
asks of the link - code objects uploaded once per program, kernarg segments laid out from the code object's
metadata (buffer addresses, then variables), one launch per exec, a graph replayed as one batch submission whose
argument table is rebound between runs, copies within VRAM as copy kernels. Running the kernels is the simulator's
job (tests/integration/test_usb_compute.py)."""

from __future__ import annotations

import itertools
import struct
from collections.abc import Sequence
from typing import Any

import pytest

from speck.codegen.compiler.amdgpu import AMDGPUCompiler
from speck.hcq import Buffer, runner
from speck.hcq.amd import AMDDevice, AmdKernel, AMDProgram
from speck.hcq.errors import HCQError
from speck.hcq.registry import _KINDS, Device, DeviceKind, numbered

# out[i] = in[i] * k + n, one work-item per element: two pointers and two integers in the kernarg segment
SRC = """
define amdgpu_kernel void @axk(ptr addrspace(1) %out, ptr addrspace(1) %in, i32 %k, i64 %n) {
  %i = call i32 @llvm.amdgcn.workitem.id.x()
  %pi = getelementptr i32, ptr addrspace(1) %in, i32 %i
  %v = load i32, ptr addrspace(1) %pi
  %m = mul i32 %v, %k
  %n32 = trunc i64 %n to i32
  %r = add i32 %m, %n32
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %i
  store i32 %r, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
"""

# out[i] = in[i] + 1: a kernel without variables (a graph fixes its values, so a plan with variables runs call by call)
INC = """
define amdgpu_kernel void @inc(ptr addrspace(1) %out, ptr addrspace(1) %in) {
  %i = call i32 @llvm.amdgcn.workitem.id.x()
  %pi = getelementptr i32, ptr addrspace(1) %in, i32 %i
  %v = load i32, ptr addrspace(1) %pi
  %r = add i32 %v, 1
  %po = getelementptr i32, ptr addrspace(1) %out, i32 %i
  store i32 %r, ptr addrspace(1) %po
  ret void
}
declare i32 @llvm.amdgcn.workitem.id.x()
"""


class Handle:
    def __init__(self, va: int, size: int) -> None:
        self.va, self.size = va, size


class RecordingLink:
    """The AmdLink protocol over a dict of bytearrays: records uploads, launches and submissions."""

    def __init__(self) -> None:
        self.next_va = 1 << 20
        self.mem: dict[int, bytearray] = {}
        self.uploads: list[int] = []
        self.launches: list[tuple[AmdKernel, tuple[int, ...], tuple[int, ...], bytes]] = []
        self.submits: list[tuple[list[int], bool]] = []
        self.value = 0
        self.resets = 0
        self.session = 0  # a reopened card (speck.tensor's USB reopen) is a new session: older handles are disowned

    def heap_bytes(self) -> int:
        return 1 << 30

    def owns(self, handle: Handle) -> bool:
        return getattr(handle, "owner", None) == self.session

    def alloc(self, nbytes: int) -> Handle:
        h = Handle(self.next_va, nbytes)
        h.owner = self.session  # type: ignore[attr-defined]
        self.next_va += -(-max(nbytes, 1) // 4096) * 4096
        self.mem[h.va] = bytearray(nbytes)
        return h

    def free(self, handle: Handle) -> None:
        self.mem.pop(handle.va)

    def address(self, handle: Handle) -> int:
        return handle.va

    def copyin(self, handle: Handle, offset: int, src: memoryview) -> None:
        self.mem[handle.va][offset : offset + src.nbytes] = bytes(src)

    def copyout(self, dest: memoryview, handle: Handle, offset: int) -> None:
        dest[:] = self.mem[handle.va][offset : offset + dest.nbytes]

    def upload(self, image: bytes) -> Handle:
        h = self.alloc(len(image))
        self.uploads.append(h.va)
        return h

    def launch_packets(self, kernel: AmdKernel, grid: Sequence[int], block: Sequence[int], kernargs: bytes) -> Any:
        self.launches.append((kernel, tuple(grid), tuple(block), kernargs))
        return [len(self.launches)]

    def submit(self, packets: Any, batch: bool) -> int:
        self.submits.append((list(packets), batch))
        self.value += 1
        return self.value

    def wait(self, value: int) -> None:
        assert value <= self.value

    def completed(self) -> int:
        return self.value

    def reset_queue(self) -> None:
        self.resets += 1


_made = itertools.count(1)


@pytest.fixture
def dev(monkeypatch: pytest.MonkeyPatch) -> AMDDevice:
    """A fresh AMDTEST:<n> device over a recording link, registered for the test (Buffers find it by name)."""
    monkeypatch.setitem(_KINDS, "AMDTEST", _KINDS.get("AMDTEST") or DeviceKind(
        "AMDTEST", lambda name: AMDDevice(name, RecordingLink()), numbered, ("AMDTEST:<n>",), False))  # fmt: skip
    d = Device[f"AMDTEST:{next(_made)}"]
    assert isinstance(d, AMDDevice)
    return d


def link(d: AMDDevice) -> RecordingLink:
    assert isinstance(d.link, RecordingLink)
    return d.link


def test_a_program_is_uploaded_once_and_each_launch_writes_its_kernargs(dev: AMDDevice) -> None:
    prog = dev.runtime("axk", AMDGPUCompiler().compile(SRC))
    assert isinstance(prog, AMDProgram) and len(link(dev).uploads) == 1
    assert prog.code.entry == link(dev).uploads[0] + prog.kernel_info.code_address and prog.code.entry % 256 == 0
    out, src = Buffer(dev.name, 8, "int32").allocate(), Buffer(dev.name, 8, "int32").allocate()
    for k in (3, -5):
        prog(out, src, global_size=(1, 1, 1), vals=(k, 2**40 + 7))
    assert len(link(dev).uploads) == 1 and [s[1] for s in link(dev).submits] == [False, False]
    (_, grid, _, args0), (_, _, _, args1) = link(dev).launches
    assert grid == (1, 1, 1) and len(args0) >= 32
    assert struct.unpack_from("<QQi4xq", args0) == (out.ptr, src.ptr, 3, 2**40 + 7)  # by the metadata's offsets
    assert struct.unpack_from("<QQi4xq", args1)[2] == -5


def test_a_graph_is_one_batch_submission_and_rebinds_its_buffers(dev: AMDDevice) -> None:
    prog = dev.runtime("inc", AMDGPUCompiler().compile(INC))
    bufs = [Buffer(dev.name, 8, "int32").allocate() for _ in range(4)]
    calls: list[runner.Call] = [
        runner.Exec(prog, (0, 1), (), (1, 1, 1)),
        runner.Copy(2, 0, 0, 32),
        runner.Exec(prog, (3, 2), (), (1, 1, 1)),
    ]
    plan = runner.Plan(calls, 4, replayed=True)
    runner.run(plan, bufs)
    assert plan.single is not None  # kernels and the copy within VRAM: one graph
    assert link(dev).submits[-1][1] is True and len(link(dev).submits[-1][0]) == 3
    n = len(link(dev).submits)
    other = [Buffer(dev.name, 8, "int32").allocate() for _ in range(4)]
    runner.run(plan, other)  # rebound: the next replay's kernargs name the new buffers
    assert len(link(dev).submits) == n + 1 and link(dev).submits[-1][1] is True
    launches = link(dev).launches[-3:]
    assert struct.unpack_from("<QQ", launches[0][3]) == (other[0].ptr, other[1].ptr)
    copy_kernel = launches[1][0]
    assert copy_kernel.name == "speck_copy_b32" and struct.unpack_from("<QQi", launches[1][3]) == (
        other[2].ptr, other[0].ptr, 8)  # fmt: skip
    assert struct.unpack_from("<QQ", launches[2][3]) == (other[3].ptr, other[2].ptr)


def test_reset_restarts_the_queue_and_wrong_objects_are_refused(dev: AMDDevice) -> None:
    dev.reset()
    assert link(dev).resets == 1
    with pytest.raises(HCQError, match="HSA code object|AMDGPU|ELF"):
        dev.runtime("axk", b"\x7fELF not a code object")


def test_relinked_uploads_programs_again_and_refuses_old_graphs_and_handles(dev: AMDDevice) -> None:
    """After the link reaches a new session (a reopened card), programs upload their image again at the next launch,
    a graph built before refuses to replay (its table holds the old session's addresses), and no allocation is
    ever served a handle of the old session from the allocator's cache of freed buffers."""
    prog = dev.runtime("inc", AMDGPUCompiler().compile(INC))
    bufs = [Buffer(dev.name, 8, "int32").allocate() for _ in range(4)]
    plan = runner.Plan([runner.Exec(prog, (0, 1), (), (1, 1, 1)), runner.Exec(prog, (2, 3), (), (1, 1, 1))], 4,
                       replayed=True)  # fmt: skip
    runner.run(plan, bufs)
    assert plan.single is not None
    cached = Buffer(dev.name, 8, "int32").allocate()
    cached.deallocate()  # kept in the allocator's cache for the next 32-byte allocation
    alive = Buffer(dev.name, 8, "int32").allocate()  # (served from that cache)
    link(dev).session += 1
    dev.relinked()
    fresh = [Buffer(dev.name, 8, "int32").allocate() for _ in range(4)]
    assert all(link(dev).owns(b.opaque) for b in fresh)
    alive.deallocate()  # an old session's handle freed after the reopen: not cached for reuse either
    assert link(dev).owns(Buffer(dev.name, 8, "int32").allocate().opaque)
    with pytest.raises(HCQError, match="was built before .* was reopened"):
        runner.run(plan, fresh)
    uploads = len(link(dev).uploads)
    runner.run(runner.Plan([runner.Exec(prog, (0, 1), (), (1, 1, 1))], 2), fresh[:2])
    assert len(link(dev).uploads) == uploads + 1
    assert link(dev).launches[-1][0].entry == link(dev).uploads[-1] + prog.kernel_info.code_address
