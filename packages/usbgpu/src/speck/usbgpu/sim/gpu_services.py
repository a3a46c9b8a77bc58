"""What the GPU model's engines (command processor, SDMA, PSP, shader memory, the dispatch glue) use of the GPU they
sit in, as Protocols: the engines are written against these, and `speck.usbgpu.sim.gpu.GpuModel`, which builds the
engines, provides them. So the engines never import the model that imports them."""

from __future__ import annotations

from typing import Any, Protocol

from speck.usbgpu.sim.clock import VirtualClock
from speck.usbgpu.sim.config import SimFaults, SimTiming
from speck.usbgpu.sim.ih import InterruptHandler
from speck.usbgpu.sim.memory import BridgeMemory, SparseMemory
from speck.usbgpu.sim.regfile import RegisterFile
from speck.usbgpu.sim.vm import GpuVm, VmFault


class GpuHost(Protocol):
    """What the GPU needs from the rest of the simulator: time, knobs, the bridge's memory over PCIe."""

    clock: VirtualClock
    timing: SimTiming
    faults: SimFaults
    mem: BridgeMemory

    def violation(self, message: str) -> None: ...

    def pending_out_range(self) -> tuple[int, int] | None: ...

    def bus_read(self, pcie: int, n: int) -> bytes: ...

    def bus_write(self, pcie: int, data: bytes) -> None: ...


class FirmwareState(Protocol):
    """The PSP as the engines ask it: whether an engine's firmware was loaded."""

    def missing_for(self, engine: str) -> str: ...


class DispatchLog(Protocol):
    """The command processor as a finished dispatch reports to it."""

    def ran(self, stats: Any) -> None: ...


class GpuServices(Protocol):
    """The GPU as its engines reach it: registers, clock, interrupts, virtual memory, VRAM, the host, and the
    checked accesses and reports that go through the hubs."""

    host: GpuHost
    clock: VirtualClock
    timing: SimTiming
    faults: SimFaults
    regs: RegisterFile
    vm: GpuVm
    vram: SparseMemory
    ih: InterruptHandler

    @property
    def psp(self) -> FirmwareState: ...

    @property
    def cp(self) -> DispatchLog: ...

    def ticks(self) -> int: ...

    def violation(self, message: str) -> None: ...

    def refuse(self, message: str) -> None: ...

    def memory_changed(self, space: str, addr: int, n: int) -> None: ...

    def read_space(self, space: str, addr: int, n: int) -> bytes: ...

    def write_space(self, space: str, addr: int, data: bytes) -> None: ...

    def read(self, vmid: int, va: int, n: int, hub: str = "gc") -> bytes: ...

    def write(self, vmid: int, va: int, data: bytes, hub: str = "gc") -> None: ...

    def write_mc(self, mc: int, data: bytes) -> None: ...

    def report_vm_fault(self, fault: VmFault, client: str) -> None: ...
