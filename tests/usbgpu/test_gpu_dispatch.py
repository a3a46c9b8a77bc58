"""Real gfx1100 kernels through the whole stack: LLVM-compiled code objects uploaded over the simulated USB link, the
driver's PM4 (SET_SH_REG from the kernel descriptor's fields, DISPATCH_DIRECT, RELEASE_MEM) on the compute ring, the
command processor handing the COMPUTE_* state to the RDNA3 emulator against the driver's page tables, results read
back with copyout. Faults, hangs and illegal instructions stop the queue with a named error; a reset recovers."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rdna3_corpus import NP, cases, special_floats
from rdna3_llvm import asm_kernel, assemble, compile_ir, kernel
from speck.usbgpu.amd import pm4
from speck.usbgpu.api import UsbGpu
from speck.usbgpu.errors import GpuFault, GpuHang
from speck.usbgpu.sim.config import SimTiming
from speck.usbgpu.sim.device import SimDevice
from speck.usbgpu.sim.kernels import AXPB, OOB, SPIN
from speck.usbgpu.sim.loader import load_kernel

# a 2-D grid: out[y * width + x] = (workgroup y, workgroup x, thread y, thread x) packed in bytes
GRID2D = kernel(
    "grid2d",
    "ptr addrspace(1) %out, i32 %width, i32 %bx, i32 %by",
    """  %tx = call i32 @llvm.amdgcn.workitem.id.x()
  %ty = call i32 @llvm.amdgcn.workitem.id.y()
  %gx = call i32 @llvm.amdgcn.workgroup.id.x()
  %gy = call i32 @llvm.amdgcn.workgroup.id.y()
  %x0 = mul i32 %gx, %bx
  %x = add i32 %x0, %tx
  %y0 = mul i32 %gy, %by
  %y = add i32 %y0, %ty
  %row = mul i32 %y, %width
  %i = add i32 %row, %x
  %a = shl i32 %gy, 24
  %b = shl i32 %gx, 16
  %c = shl i32 %ty, 8
  %ab = or i32 %a, %b
  %abc = or i32 %ab, %c
  %v = or i32 %abc, %tx
  %p = getelementptr i32, ptr addrspace(1) %out, i32 %i
  store i32 %v, ptr addrspace(1) %p
  ret void""",
)

# out[tid] = acc after `iterations` steps of acc = acc * 1664525 + (tid ^ k): a loop whose trip count the kernarg sets
COUNT = kernel(
    "count",
    "ptr addrspace(1) %out, i32 %iterations",
    """entry:
  %tid = call i32 @llvm.amdgcn.workitem.id.x()
  br label %loop
loop:
  %k = phi i32 [0, %entry], [%k1, %loop]
  %acc = phi i32 [0, %entry], [%acc1, %loop]
  %t = xor i32 %k, %tid
  %m = mul i32 %acc, 1664525
  %acc1 = add i32 %m, %t
  %k1 = add i32 %k, 1
  %more = icmp ult i32 %k1, %iterations
  br i1 %more, label %loop, label %exit
exit:
  %p = getelementptr i32, ptr addrspace(1) %out, i32 %tid
  store i32 %acc1, ptr addrspace(1) %p
  ret void""",
)


def axpb_args(out: int, src: int, a: float, b: float, n: int) -> bytes:
    return struct.pack("<QQffI", out, src, a, b, n)


@contextlib.contextmanager
def open_gpu() -> Iterator[tuple[UsbGpu, SimDevice]]:
    # a small instruction budget so a runaway kernel is declared hung after little emulation
    dev = SimDevice(timing=SimTiming(dispatch_max_instructions=20_000))
    with UsbGpu.open(sim=dev) as gpu:
        yield gpu, dev
    assert dev.violations == []


@pytest.fixture
def session() -> Iterator[tuple[UsbGpu, SimDevice]]:
    with open_gpu() as s:
        yield s


@pytest.fixture
def gpu(session: tuple[UsbGpu, SimDevice]) -> UsbGpu:
    return session[0]


def read_back(gpu: UsbGpu, buf: object, n: int, dtype: type) -> np.ndarray:
    out = bytearray(n * np.dtype(dtype).itemsize)
    gpu.copyout(out, buf)  # type: ignore[arg-type]
    return np.frombuffer(out, dtype=dtype)


@settings(max_examples=8, deadline=None)
@given(
    n=st.integers(1, 300),
    a=st.floats(-4, 4, width=32),
    b=st.floats(-4, 4, width=32),
    seed=st.integers(0, 2**32 - 1),
)
def test_a_compiled_kernel_runs_through_pm4_and_copyout_reads_its_results(
    n: int, a: float, b: float, seed: int
) -> None:
    with open_gpu() as (gpu, _):
        axpb_round_trip(gpu, n, a, b, seed)


def axpb_round_trip(gpu: UsbGpu, n: int, a: float, b: float, seed: int) -> None:
    code = load_kernel(gpu, compile_ir(AXPB), "axpb")
    x = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    src, dst = gpu.alloc(4 * n), gpu.alloc(4 * (n + 64))
    gpu.copyin(src, x.tobytes())
    gpu.copyin(dst, bytes(4 * (n + 64)))
    gpu.dispatch(code, grid=(-(-n // 64),), block=(64,), kernargs=axpb_args(dst.va, src.va, a, b, n))
    y = read_back(gpu, dst, n + 64, np.float32)
    expect = x * np.float32(a) + np.float32(b)  # two roundings, as the kernel's fmul + fadd (no contraction)
    assert np.array_equal(y[:n].view(np.uint32), expect.view(np.uint32))
    assert not y[n:].any()  # threads past n wrote nothing


def test_workgroup_and_thread_ids_of_a_2d_grid(gpu: UsbGpu) -> None:
    grid, block = (3, 2), (8, 4)
    width, height = grid[0] * block[0], grid[1] * block[1]
    code = load_kernel(gpu, compile_ir(GRID2D), "grid2d")
    out = gpu.alloc(4 * width * height)
    gpu.dispatch(code, grid=grid, block=block, kernargs=struct.pack("<QIII", out.va, width, *block))
    y, x = np.mgrid[0:height, 0:width]
    expect = (y // block[1]) << 24 | (x // block[0]) << 16 | (y % block[1]) << 8 | (x % block[0])
    assert np.array_equal(read_back(gpu, out, width * height, np.uint32).reshape(height, width), expect)


# one of each kind from the emulator's corpus: float/int division, f64, f16/bf16 and casts, divergent control flow,
# LDS with barriers across waves, scratch
CORPUS = ["fdiv_f32", "fdiv_f64", "sdiv_i64", "fptrunc_f32_f16", "fma_f16", "fadd_bf16", "loop_divergent",
          "if_else_gated", "lds_reverse", "lds_tree_sum", "scratch_array"]  # fmt: skip


@pytest.mark.parametrize("name", CORPUS)
def test_corpus_kernels_through_the_compute_queue_match_numpy(gpu: UsbGpu, name: str) -> None:
    c = next(c for c in cases() if c.name == name)
    assert c.ulp == 0
    rng = np.random.default_rng(7)
    gen = c.inputs or special_floats
    a, b = (np.asarray(gen(rng, c.n, t)).astype(NP[t]) for t in (c.a, c.b))
    out_dt = np.dtype(NP[c.out])
    code = load_kernel(gpu, compile_ir(c.ir, c.true16), c.name)
    ba, bb, bo = gpu.alloc(a.nbytes), gpu.alloc(b.nbytes), gpu.alloc(c.n * out_dt.itemsize)
    gpu.copyin(ba, a.tobytes())
    gpu.copyin(bb, b.tobytes())
    gpu.dispatch(code, (-(-c.n // c.block),), (c.block,), struct.pack("<QQQi", bo.va, ba.va, bb.va, c.n))
    got, want = read_back(gpu, bo, c.n, out_dt), np.asarray(c.ref(a, b)).astype(out_dt)
    same = got.view(f"u{out_dt.itemsize}") == want.view(f"u{out_dt.itemsize}")
    if np.issubdtype(out_dt, np.floating):
        same |= np.isnan(got) & np.isnan(want)
    assert same.all(), f"{name}: lanes {np.nonzero(~same)[0][:8]} got {got[~same][:8]} want {want[~same][:8]}"


def test_a_batch_of_dispatches_is_one_doorbell_and_runs_in_order(session: tuple[UsbGpu, SimDevice]) -> None:
    gpu, dev = session
    code = load_kernel(gpu, compile_ir(AXPB), "axpb")
    n = 128
    x = np.linspace(-1, 1, n, dtype=np.float32)
    a, b = gpu.alloc(4 * n), gpu.alloc(4 * n)
    gpu.copyin(a, x.tobytes())
    packets: list[int] = []
    for k in range(3):  # a -> b -> a -> b, each step reads what the previous one wrote
        src, dst = (a, b) if k % 2 == 0 else (b, a)
        packets += gpu.launch_packets(code, (n // 64,), (64,), axpb_args(dst.va, src.va, 2.0, 1.0, n))
    before = dev.stats["doorbells"]
    value = gpu.submit(packets, batch=True)
    assert dev.stats["doorbells"] == before + 1
    gpu.wait(value)
    expect = x
    for _ in range(3):
        expect = expect * np.float32(2) + np.float32(1)
    assert np.array_equal(read_back(gpu, b, n, np.float32), expect)


def test_modelled_dispatch_time_is_deterministic_and_grows_with_the_work() -> None:
    def elapsed_ns(iterations: int) -> tuple[int, int]:
        dev = SimDevice()
        with UsbGpu.open(sim=dev) as gpu:
            code = load_kernel(gpu, compile_ir(COUNT), "count")
            out, stamps = gpu.alloc(4 * 32), gpu.alloc(16)
            launch = gpu.launch_packets(code, (1,), (32,), struct.pack("<QI", out.va, iterations))
            gpu.wait(gpu.submit(pm4.timestamp(stamps.va) + launch + pm4.timestamp(stamps.va + 8)))
            tid, expect = np.arange(32, dtype=np.uint32), np.zeros(32, dtype=np.uint32)
            for k in range(iterations):
                expect = expect * np.uint32(1664525) + (tid ^ np.uint32(k))
            assert np.array_equal(read_back(gpu, out, 32, np.uint32), expect)
            t0, t1 = struct.unpack("<QQ", read_back(gpu, stamps, 16, np.uint8).tobytes())
            timing = dev.gpu.timing
            stats = dev.gpu.cp.last_dispatch
            return (t1 - t0) * pm4.TIMESTAMP_NS, stats.cycles(timing.cycle_costs) / timing.gpu_clock_hz * 1e9

    short, short_model = elapsed_ns(10)
    assert elapsed_ns(10) == (short, short_model)  # the same work takes the same virtual time
    long, long_model = elapsed_ns(2000)
    assert long_model > 100 * short_model
    # one wave: the extra time is the extra instructions' cycles, to the timestamps' resolution
    assert abs((long - short) - (long_model - short_model)) <= 2 * pm4.TIMESTAMP_NS


def test_a_memory_bound_dispatch_takes_its_traffic_at_the_vram_bandwidth() -> None:
    timing = SimTiming(vram_bytes_per_s=1e9)  # slow memory: the dispatch is bound by its traffic (64 KiB each way)
    dev = SimDevice(timing=timing)
    with UsbGpu.open(sim=dev) as gpu:
        n = 16384
        code = load_kernel(gpu, compile_ir(AXPB), "axpb")
        src, dst, stamps = gpu.alloc(4 * n), gpu.alloc(4 * n), gpu.alloc(16)
        launch = gpu.launch_packets(code, (n // 64,), (64,), axpb_args(dst.va, src.va, 1, 0, n))
        gpu.wait(gpu.submit(pm4.timestamp(stamps.va) + launch + pm4.timestamp(stamps.va + 8)))
        t0, t1 = struct.unpack("<QQ", read_back(gpu, stamps, 16, np.uint8).tobytes())
        stats = dev.gpu.cp.last_dispatch
        assert stats.bytes_written == 4 * n and stats.bytes_read >= 4 * n  # + each wave's kernarg loads
        memory_ns = (stats.bytes_read + stats.bytes_written) / timing.vram_bytes_per_s * 1e9
        assert memory_ns > stats.cycles(timing.cycle_costs) / timing.simds / timing.gpu_clock_hz * 1e9
        # timestamp to timestamp: the dispatch (launch overhead + its traffic) and the packets around it
        assert memory_ns + timing.dispatch_overhead_ns <= (t1 - t0) * pm4.TIMESTAMP_NS <= memory_ns + 10_000


def test_a_read_outside_every_mapping_is_a_page_fault_naming_address_and_queue(gpu: UsbGpu) -> None:
    code = load_kernel(gpu, compile_ir(OOB), "oob")
    src, dst = gpu.alloc(4096), gpu.alloc(4096)
    off = 1 << 36  # elements: 256 GiB past `src`, outside VRAM and every mapping
    with pytest.raises(GpuFault) as info:
        gpu.dispatch(code, (1,), (32,), struct.pack("<QQQ", dst.va, src.va, off), wait=True)
    record = info.value.record
    assert record.access == "read" and record.address == src.va + 4 * off
    assert record.queue.startswith("compute me1") and "page fault" in str(info.value)
    assert gpu.queue_status().faulted
    gpu.reset_queue()
    x = np.arange(1024, dtype=np.float32)
    gpu.copyin(src, x.tobytes())
    gpu.dispatch(code, (1,), (32,), struct.pack("<QQQ", dst.va, src.va, 5))
    assert np.array_equal(read_back(gpu, dst, 32, np.float32), x[5:37])


def test_an_illegal_instruction_faults_the_queue_with_its_pc(gpu: UsbGpu) -> None:
    code = load_kernel(gpu, assemble(asm_kernel("  v_cubeid_f32 v0, v1, v2, v3")), "k")
    with pytest.raises(GpuFault) as info:
        gpu.dispatch(code, (1,), (32,), struct.pack("<Q", 0), wait=True)
    record = info.value.record
    # what the SQ interrupt tells the driver: the kind and the wave's pc (the kernel's first instruction) ...
    assert record.kind == "shader illegal instruction" and f"pc {code.entry:#x}" in record.detail
    # ... and what the simulator adds: the emulator's own account, naming the instruction
    assert "simulator: illegal instruction" in record.detail and "v_cubeid_f32" in record.detail
    gpu.reset_queue()
    assert not gpu.queue_status().faults


def test_s_trap_faults_the_queue_and_the_next_copy_names_the_fault(gpu: UsbGpu) -> None:
    code = load_kernel(gpu, assemble(asm_kernel("  s_trap 2")), "k")
    buf = gpu.alloc(4096)
    gpu.dispatch(code, (1,), (32,), struct.pack("<Q", 0))  # not waited for: the copy after it waits on the GPU
    with pytest.raises(GpuFault, match="s_trap 2"):
        gpu.copyout(bytearray(4096), buf)


def test_a_kernel_that_never_ends_is_a_hang_within_the_timeout_and_reset_recovers(
    session: tuple[UsbGpu, SimDevice],
) -> None:
    gpu, dev = session
    spin = load_kernel(gpu, compile_ir(SPIN), "spin")
    flag = gpu.alloc(4096)
    gpu.copyin(flag, bytes(4096))
    start = dev.now_ns
    with pytest.raises(GpuHang) as info:
        gpu.dispatch(spin, (1,), (32,), struct.pack("<Q", flag.va), wait=True, timeout=0.5)
    assert info.value.queue.startswith("compute me1") and "no signal" in info.value.status
    assert "simulator: dispatch hung" in info.value.status  # the emulator ran out of its instruction budget
    assert dev.now_ns - start < 2e9  # reported within the 0.5 s timeout plus polling, in GPU/virtual time
    assert gpu.queue_status().hung
    gpu.reset_queue()
    code = load_kernel(gpu, compile_ir(AXPB), "axpb")
    x = np.ones(64, dtype=np.float32)
    gpu.copyin(flag, x.tobytes())
    out = gpu.alloc(256)
    gpu.dispatch(code, (1,), (64,), axpb_args(out.va, flag.va, 3.0, 0.5, 64))
    assert np.array_equal(read_back(gpu, out, 64, np.float32), x * 3 + 0.5)
