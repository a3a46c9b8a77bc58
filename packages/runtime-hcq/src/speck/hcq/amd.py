"""An AMD GPU (RDNA3) as an hcq device, over an abstract link to the card.

speck.hcq does not know how the card is reached: a device kind that has one (speck.tensor's USB device, through
speck.usbgpu) gives an object with the `AmdLink` methods - VRAM allocation and copies, code upload, the PM4 of one
dispatch, submission (one batch = one indirect buffer and one doorbell) and the compute timeline's wait. On it this
module builds:

- `AMDProgram`: an HSA code object (speck.codegen's AMD backend) parsed by speck.hcq.hsaco, its image uploaded once
  per program; each launch writes its kernarg segment (the buffers' GPU addresses, then the variables as int32, at
  the offsets the object's metadata gives) and dispatches `global_size` workgroups of the kernel's workgroup size;
- `AMDGraph`: the runner's device graph - a batch of launches whose argument table is rewritten between runs and
  whose replay is one submission (one INDIRECT_BUFFER, one doorbell) and one wait;
- `AMDDevice`: the DeviceBase with backend "AMD" (gfx1100), host_visible False, its allocator over the link.

A launch does not wait for the GPU: the compute queue runs in order, copies on the link wait for the compute work
issued before them, and `synchronize` waits for the last submission (raising the link's fault or hang error)."""

from __future__ import annotations

import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

from speck.hcq.allocator import DEFAULT_OPTIONS, Allocator, BufferOptions
from speck.hcq.device import DeviceBase
from speck.hcq.errors import HCQError, HCQValueError, ProgramArgumentError
from speck.hcq.hsaco import Kernel, parse_code_object
from speck.hcq.program import Program

if TYPE_CHECKING:
    from speck.hcq.buffer import Buffer

_PTR = struct.Struct("<Q")


@dataclass(frozen=True)
class AmdKernel:
    """What a dispatch needs from one kernel of an uploaded code object: the GPU address of its first instruction,
    its descriptor's COMPUTE_PGM_RSRC1/2/3, the user SGPRs it enables (register order), its LDS and scratch bytes,
    its kernarg segment size, its workgroup size and its name."""

    entry: int
    rsrc1: int
    rsrc2: int
    rsrc3: int
    user_sgprs: tuple[str, ...]
    group_segment_size: int
    private_segment_size: int
    kernarg_size: int
    name: str
    dynamic_stack: bool
    wave32: bool


class AmdLink(Protocol):
    """The card, as the AMD device uses it. Handles returned by `alloc` are opaque to hcq except through `address`.
    `launch_packets` returns the PM4 of one dispatch (its kernarg segment staged on the card); `submit` queues
    packets and a signal of the returned compute timeline value (batch: in one indirect buffer behind one doorbell);
    `wait` returns once the timeline reached a value, raising the link's named error for a faulted or hung queue;
    `reset_queue` restarts a stopped compute queue (the work it dropped counts as done); `owns` says whether a handle
    is one of the card session the link reaches now (a link reopened on a new session disowns the old one's)."""

    def alloc(self, nbytes: int) -> Any: ...
    def free(self, handle: Any) -> None: ...
    def address(self, handle: Any) -> int: ...
    def copyin(self, handle: Any, offset: int, src: memoryview) -> None: ...
    def copyout(self, dest: memoryview, handle: Any, offset: int) -> None: ...
    def upload(self, image: bytes) -> Any: ...
    def launch_packets(self, kernel: AmdKernel, grid: Sequence[int], block: Sequence[int], kernargs: bytes) -> Any: ...
    def submit(self, packets: Any, batch: bool) -> int: ...
    def wait(self, value: int) -> None: ...
    def completed(self) -> int: ...
    def reset_queue(self) -> None: ...
    def heap_bytes(self) -> int: ...
    def owns(self, handle: Any) -> bool: ...


class LinkAllocator(Allocator):
    """VRAM through the link: an allocation is the link's handle; the host never maps it (copies only)."""

    def __init__(self, device: str, link: AmdLink) -> None:
        super().__init__(device, limit=link.heap_bytes())
        self.link = link

    def _alloc(self, nbytes: int, options: BufferOptions) -> Any:
        return self.link.alloc(nbytes)  # MemoryError when it does not fit: the base class retries, then reports

    def free(self, opaque: Any, nbytes: int, options: BufferOptions = DEFAULT_OPTIONS) -> None:
        if options.lru and not self.link.owns(opaque):  # a handle of a session the link left: never reused
            options = options._replace(lru=False)
        super().free(opaque, nbytes, options)

    def _free(self, opaque: Any, nbytes: int, options: BufferOptions) -> None:
        self.link.free(opaque)

    def address(self, opaque: Any) -> int:
        return self.link.address(opaque)

    def copyin(self, opaque: Any, offset: int, src: memoryview) -> None:
        self.link.copyin(opaque, offset, src)

    def copyout(self, dest: memoryview, opaque: Any, offset: int) -> None:
        self.link.copyout(dest, opaque, offset)


def _kernarg_layout(k: Kernel) -> tuple[list[int], list[tuple[int, int]]]:
    """(offsets of the pointer arguments, (offset, size) of the integer arguments) in the kernarg segment, from the
    code object's metadata; hidden arguments are left zero."""
    ptrs = [a.offset for a in k.args if a.value_kind == "global_buffer"]
    vals = [(a.offset, a.size) for a in k.args if a.value_kind == "by_value"]
    return ptrs, vals


class AMDProgram(Program):
    """A kernel of an HSA code object, uploaded to the device's VRAM once (the image stays there while the program
    lives). Its raw arguments are the buffers' GPU addresses then the variables' values; a launch packs them into the
    kernarg segment and dispatches."""

    device: AMDDevice

    def __init__(self, device: AMDDevice, name: str, lib: bytes, **spec: Any) -> None:
        super().__init__(device, name, lib, **spec)
        co = parse_code_object(lib, name=name)
        if co.arch != device.arch:
            raise HCQError(f"program {name!r} is compiled for {co.arch}, but {device.name} is a {device.arch}")
        k = co.kernel(name)
        kd = k.descriptor
        self.kernel_info = k
        self.ptr_offsets, self.val_offsets = _kernarg_layout(k)
        self.kernarg_size = max(kd.kernarg_size, k.kernarg_segment_size)
        local = getattr(spec.get("spec"), "local_size", None) or k.reqd_workgroup_size or (1, 1, 1)
        self.local_size = tuple(int(x) for x in (*local, 1, 1, 1)[:3])
        self._co_image, self._code_address = co.image, k.code_address
        self._image = device.link.upload(co.image)
        self._generation = device.generation  # the link session the image was uploaded to
        self.code = AmdKernel(
            entry=device.link.address(self._image) + k.code_address,
            rsrc1=kd.compute_pgm_rsrc1,
            rsrc2=kd.compute_pgm_rsrc2,
            rsrc3=kd.compute_pgm_rsrc3,
            user_sgprs=tuple(s for s, _ in kd.user_sgprs()),
            group_segment_size=kd.group_segment_fixed_size,
            private_segment_size=kd.private_segment_fixed_size,
            kernarg_size=self.kernarg_size,
            name=name,
            dynamic_stack=kd.uses_dynamic_stack,
            wave32=kd.wavefront_size32,
        )

    def kernargs(self, words: Sequence[int]) -> bytes:
        """The kernarg segment for raw arguments (buffer addresses, then variable values)."""
        np_, nv = len(self.ptr_offsets), len(self.val_offsets)
        if len(words) != np_ + nv:
            raise ProgramArgumentError(
                f"program {self.name!r} takes {np_} buffers and {nv} variables, got {len(words)} argument words"
            )
        seg = bytearray(self.kernarg_size)
        for off, w in zip(self.ptr_offsets, words):
            _PTR.pack_into(seg, off, w & 0xFFFFFFFFFFFFFFFF)
        for (off, size), w in zip(self.val_offsets, words[np_:]):
            seg[off : off + size] = (w & ((1 << (8 * size)) - 1)).to_bytes(size, "little")  # two's complement
        return bytes(seg)

    def packets(self, words: Sequence[int], global_size: Sequence[int]) -> Any:
        """One dispatch's PM4 (kernargs staged on the card) for raw arguments over `global_size` workgroups."""
        grid = tuple(int(g) for g in (*global_size, 1, 1, 1)[:3])
        if 0 in grid:
            return None  # an empty launch runs nothing (a workgroup count of 0 is not a dispatch)
        if self._generation != self.device.generation:  # the device was reopened: its VRAM lost the image
            self._upload_again()
        return self.device.link.launch_packets(self.code, grid, self.local_size, self.kernargs(words))

    def _upload_again(self) -> None:
        link = self.device.link
        self._image = link.upload(self._co_image)
        self._generation = self.device.generation
        self.code = replace(self.code, entry=link.address(self._image) + self._code_address)

    def launch(self, args: tuple[Any, ...], global_size: tuple[int, ...], threads: int | None) -> None:
        """Submit one dispatch (the engine calls this); the GPU runs it in queue order, after the copies into the
        device queued before it."""
        copies = self.device.engines.get("copy")
        if copies is not None and copies.timeline.mem[0] < copies.submitted:
            # a copy in that another thread's copy kept the copy engine busy for was queued, and may still be to
            # run; this kernel may read what it writes (the GPU orders nothing after the host's copy engine): wait
            # for it, or the kernel reads zeros or an old buffer's bytes. (A copy with the engine idle ran inline.)
            copies.timeline.wait(copies.submitted)
        pk = self.packets(args, global_size)
        if pk is not None:
            self.device.submitted = self.device.link.submit(pk, False)

    def __del__(self) -> None:
        try:
            self.device.retire(self._image)
        except Exception:  # interpreter shutdown, a closed link: its VRAM went with it
            pass


@dataclass
class _Cmd:
    prog: AMDProgram | None  # None: a copy of `nbytes` bytes (words: destination, source address)
    grid: tuple[int, ...]
    start: int  # first word of its arguments in the table
    nwords: int
    nbytes: int = 0


# A copy inside a graph is a kernel (the compute queue runs it in order with the others, behind the same doorbell):
# one element of `{t}` per work-item, 256 work-items per workgroup, n elements.
COPY_BLOCK = 256
_COPY_IR = """; kernel {name}
define amdgpu_kernel void @{name}(ptr addrspace(1) noalias %dst, ptr addrspace(1) noalias readonly %src, i32 %n) #0 \
!reqd_work_group_size !0 {{
entry:
  %l = call i32 @llvm.amdgcn.workitem.id.x()
  %g = call i32 @llvm.amdgcn.workgroup.id.x()
  %b = mul i32 %g, {block}
  %i = add i32 %b, %l
  %in = icmp ult i32 %i, %n
  br i1 %in, label %copy, label %done
copy:
  %ps = getelementptr {t}, ptr addrspace(1) %src, i32 %i
  %v = load {t}, ptr addrspace(1) %ps, align {a}
  %pd = getelementptr {t}, ptr addrspace(1) %dst, i32 %i
  store {t} %v, ptr addrspace(1) %pd, align {a}
  br label %done
done:
  ret void
}}

declare i32 @llvm.amdgcn.workitem.id.x()
declare i32 @llvm.amdgcn.workgroup.id.x()
attributes #0 = {{ nounwind "amdgpu-flat-work-group-size"="1,{block}" "uniform-work-group-size"="true" \
"amdgpu-no-implicitarg-ptr" "amdgpu-no-dispatch-ptr" "amdgpu-no-queue-ptr" "amdgpu-no-dispatch-id" \
"amdgpu-no-lds-kernel-id" "amdgpu-no-hostcall-ptr" "amdgpu-no-heap-ptr" "amdgpu-no-multigrid-sync-arg" \
"amdgpu-no-default-queue" "amdgpu-no-completion-action" "amdgpu-no-workgroup-id-y" "amdgpu-no-workgroup-id-z" \
"amdgpu-no-workitem-id-y" "amdgpu-no-workitem-id-z" }}
!0 = !{{i32 {block}, i32 1, i32 1}}
!llvm.module.flags = !{{!1}}
!1 = !{{i32 1, !"amdhsa_code_object_version", i32 500}}
""".replace("\\\n", "")


def copy_source(width: int) -> tuple[str, str]:
    """(kernel name, LLVM IR) of the graph's copy kernel moving `width`-byte elements (1 or 4)."""
    t = {1: "i8", 4: "i32"}[width]
    name = f"speck_copy_b{8 * width}"
    return name, _COPY_IR.format(name=name, t=t, a=width, block=COPY_BLOCK)


class AMDGraph:
    """A batch of launches on one AMD device (speck.hcq.runner's graph interface): `args` is the argument table (a
    list of 64-bit words: every command's buffer addresses then variables), rewritten in place between runs; a replay
    writes each command's kernarg segment, puts every dispatch into one indirect buffer behind one doorbell, and
    waits for its signal. Copies between buffers of the device join the graph as copy kernels (`device_copies`)."""

    device_copies = True  # the runner may put copies within the device's memory into the graph

    def __init__(self, device: AMDDevice, name: str = "graph") -> None:
        self.device, self.name = device, name
        self.generation = device.generation  # its argument table holds addresses of this link session's VRAM
        self.cmds: list[_Cmd] = []
        self.args: list[int] = []

    @staticmethod
    def supports(prog: Any, nargs: int) -> bool:
        return isinstance(prog, AMDProgram)

    def add_exec(self, prog: AMDProgram, bufs: Sequence[Buffer], global_size: Sequence[int] | None = None,
                 vals: Sequence[int] = (), threads: int | None = None) -> int:  # fmt: skip
        if prog.device is not self.device:
            raise HCQError(f"program {prog.name!r} is loaded on {prog.device.name}, not on {self.device.name}")
        prog.check_args(bufs, vals)
        gs = tuple(global_size) if global_size is not None else prog.launch_dims(vals)
        words = [b.ptr for b in bufs] + [int(v) for v in vals]
        self.cmds.append(_Cmd(prog, gs, len(self.args), len(words)))
        self.args.extend(words)
        return len(self.cmds) - 1

    def add_copy(self, dest: int, src: int, nbytes: int) -> int:
        """Append a copy of `nbytes` bytes between two addresses of this device's memory (a copy kernel)."""
        if nbytes < 0 or nbytes >= 2**31:
            raise HCQValueError(f"a graph copy moves 0 to 2**31-1 bytes, got {nbytes}")
        self.cmds.append(_Cmd(None, (), len(self.args), 2, nbytes))
        self.args.extend((int(dest), int(src)))
        return len(self.cmds) - 1

    def arg_index(self, cmd: int, j: int) -> int:
        return self.cmds[cmd].start + j

    def prepare(self) -> None:
        if not self.cmds:
            raise HCQError("an empty AMD graph")

    def replay(self) -> None:
        """Submit every launch as one batch and wait for it."""
        dev, args = self.device, self.args
        if self.generation != dev.generation:
            raise HCQError(
                f"{self.name} was built before {dev.name} was reopened: the buffers its argument table points at "
                "were lost with the old session; capture it again (TinyJit.reset(), then call the function)"
            )
        packets: list[int] = []
        for c in self.cmds:
            words = args[c.start : c.start + c.nwords]
            if c.prog is None:
                pk = self._copy_packets(words[0], words[1], c.nbytes)
            else:
                pk = c.prog.packets(words, c.grid)
            if pk is not None:
                packets += pk
        dev.synchronize_if_busy()  # (eager launches submitted through the engine go first: the queue is in order)
        if packets:
            dev.submitted = dev.link.submit(packets, True)
        dev.graph_runs += 1
        dev.wait_idle()

    def _copy_packets(self, dest: int, src: int, nbytes: int) -> Any:
        return self.device.copy_packets(dest, src, nbytes)  # (bound addresses may change between runs: chosen each)

    def run(self) -> float:
        t0 = time.perf_counter()
        self.replay()
        return time.perf_counter() - t0

    def __len__(self) -> int:
        return len(self.cmds)

    def __repr__(self) -> str:
        return f"<AMDGraph {self.name} on {self.device.name}: {len(self.cmds)} launches>"


class AMDDevice(DeviceBase):
    """An RDNA3 GPU reached through `link`: VRAM buffers, programs from the AMD backend (gfx1100), a PM4 compute
    queue whose timeline `synchronize` waits for, graphs of launches replayed with one doorbell."""

    backend_name = "AMD"
    host_visible = False
    graph = AMDGraph

    def __init__(self, name: str, link: AmdLink, allocator: Allocator | None = None) -> None:
        self.link = link
        super().__init__(name, allocator if allocator is not None else LinkAllocator(name, link))
        self.submitted = 0  # the compute timeline value of the last submission
        self.graph_runs = 0
        self.generation = 0  # counts the link's sessions (relinked): programs and graphs of an older one are stale
        self._retired: list[Any] = []  # uploaded images of dropped programs, freed at the next synchronize
        self._copies: dict[int, AMDProgram] = {}

    @property
    def arch(self) -> str:
        return self.renderer.arch  # type: ignore[attr-defined,no-any-return]

    def runtime(self, name: str, lib: bytes, **spec: Any) -> AMDProgram:
        if not isinstance(lib, (bytes, bytearray, memoryview)):
            raise ProgramArgumentError(
                f"{self.name}.runtime({name!r}) expects an HSA code object as bytes, got {type(lib).__name__}"
            )
        return AMDProgram(self, name, bytes(lib), **spec)

    def copy_program(self, width: int) -> AMDProgram:
        """The copy kernel for `width`-byte elements (compiled with the device's compiler, loaded once)."""
        prog = self._copies.get(width)
        if prog is None:
            name, src = copy_source(width)
            prog = self._copies[width] = self.runtime(name, self.compiler.compile(src))
        return prog

    def copy_packets(self, dest: int, src: int, nbytes: int) -> Any:
        """The dispatch copying `nbytes` bytes from VRAM address `src` to `dest` (dwords when all are aligned)."""
        width = 4 if not (dest | src | nbytes) & 3 else 1
        n = nbytes // width
        return self.copy_program(width).packets((dest, src, n), (-(-n // COPY_BLOCK),))

    def copy_in_memory(self, dest: int, src: int, nbytes: int) -> None:
        """Submit a copy between two VRAM addresses (a copy kernel: in order with the kernels, no wait)."""
        pk = self.copy_packets(dest, src, nbytes)
        if pk is not None:
            self.submitted = max(self.submitted, self.link.submit(pk, False))

    def choose_threads(self, prog: Program, bufs: Sequence[Buffer]) -> int | None:
        return 1  # (the runner batches calls a device runs on one "thread": every launch here may join a graph)

    def retire(self, image: Any) -> None:
        self._retired.append(image)

    def relinked(self) -> None:
        """The link now reaches a new session with the card (speck.tensor's USB reopen): what lived in the old one's
        VRAM is gone. Programs upload their image again at their next launch, graphs built before refuse to replay,
        and the allocator's cache of freed allocations (old handles) is dropped."""
        self.generation += 1
        self.submitted = 0
        self._retired.clear()
        self._copies.clear()
        for e in self.engines.values():
            e.error = None
        self.allocator.free_cache()

    def reset(self) -> None:
        """Restart the compute queue after a fault or hang (GpuFault / GpuHang from the link): the work it dropped
        counts as done (its outputs are undefined) and the device takes new work."""
        self.link.reset_queue()
        for e in self.engines.values():
            e.error = None

    def wait_idle(self, timeout: float | None = None) -> None:
        """Wait for the engines, then for the GPU's compute timeline to reach the last submission (GpuFault /
        GpuHang from the link when the queue stopped)."""
        super().wait_idle(timeout)
        if self.submitted:
            self.link.wait(self.submitted)
        if self._retired:
            done, self._retired = self._retired, []
            for img in done:
                self.link.free(img)

    def wait_kernels(self) -> None:
        if self.submitted and self.link.completed() < self.submitted:
            self.link.wait(self.submitted)

    def synchronize_if_busy(self) -> None:
        super().synchronize_if_busy()
        if self.submitted and self.link.completed() < self.submitted:
            self.wait_idle()
