"""speck.usbgpu.sim.rdna3: an emulator of the RDNA3 (gfx1100, wave32) shader core that runs real machine code.

It decodes the code LLVM emits for amdgcn-amd-amdhsa gfx11 (SOP1/SOP2/SOPK/SOPC/SOPP, SMEM, VOP1/VOP2/VOPC/VOP3/
VOP3SD/VOP3P/VOPD, DS, FLAT/GLOBAL/SCRATCH, literal constants) and executes it with the semantics of AMD's RDNA3
Instruction Set Architecture reference, lanes as numpy vectors. Needs numpy (`pip install speck-usbgpu[sim]`).

Interfaces
----------
- ``run(code_object, kernel, grid, block, kernargs, memory, *, max_instructions=None) -> Stats``: parse an HSA
  code object (ELF64 EM_AMDGPU), find ``<kernel>.kd``, lay out the kernarg segment and a dispatch packet, fill the
  user SGPRs the descriptor enables, and run ``grid`` workgroups (x, y, z) of ``block`` threads.
- ``dispatch(packet: DispatchPacket, memory, *, max_instructions=None, max_group_waves=1024) -> Stats``: what the
  command processor starts after SET_SH_REG + DISPATCH_DIRECT: COMPUTE_PGM_LO/HI (the code is fetched through
  `memory`), COMPUTE_PGM_RSRC1/2/3, COMPUTE_USER_DATA_0..15, COMPUTE_NUM_THREAD_X/Y/Z, the dispatch dimensions and
  COMPUTE_DISPATCH_INITIATOR (wave32 only; dimensions in workgroups, or threads with USE_THREAD_DIMENSIONS).
- ``ShaderMemory`` (typing.Protocol): ``gather(addresses, size)``, ``scatter(addresses, data)`` (N lanes at 64-bit
  addresses, uint8 arrays of shape (N, size)) and ``read(address, size)`` / ``write(address, data)``. ``FlatMemory``
  implements it for tests: buffers mapped at addresses with unmapped gaps between them, so an overrun faults.
- ``Stats``: workgroups, waves, wave-instructions executed in all and ``by_mnemonic`` / ``by_kind`` (salu, valu,
  trans, smem, vmem, lds, branch, wait, barrier, end, nop), bytes read and written, LDS bytes; ``cycles(cost)`` folds a
  per-kind (or per-mnemonic) cost table into a cycle estimate.
- ``disassemble(code, base)``, ``disassemble_kernel(code_object, kernel)``; ``coverage()`` (mnemonics implemented,
  per encoding) and ``coverage_of(mnemonics)`` (implemented / seen for a corpus).

Errors (speck.usbgpu.errors): EmulationError (an instruction or encoding not implemented, named by mnemonic or raw
words, with the kernel and pc), ShaderMemoryFault (address, size, space and the nearest mapping: the hardware's page
fault), ShaderHazardError (a register read while a load into it is outstanding: no s_waitcnt), ShaderTrap (s_trap),
ShaderHang (more wave-instructions than max_instructions), CodeObjectError (a corrupt or foreign code object); all
but the last are ShaderErrors carrying `kernel`, `pc` and `mnemonic`.

What is modelled and how: see floats.py (rounding, NaNs, denormals, transcendentals), wave.py (register files, EXEC,
outstanding loads and s_waitcnt), dispatch.py (initial state, lockstep wave groups, barriers) and vmem.py (address
spaces, LDS, scratch).
"""

from speck.usbgpu.sim.rdna3.coverage import coverage, coverage_of
from speck.usbgpu.sim.rdna3.decode import disassemble, disassemble_kernel
from speck.usbgpu.sim.rdna3.dispatch import DispatchPacket, Stats, dispatch, run
from speck.usbgpu.sim.rdna3.memory import FlatMemory, ShaderMemory

__all__ = [
    "DispatchPacket",
    "FlatMemory",
    "ShaderMemory",
    "Stats",
    "coverage",
    "coverage_of",
    "disassemble",
    "disassemble_kernel",
    "dispatch",
    "run",
]
