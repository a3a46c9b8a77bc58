"""Calling a kernel with more arguments than ctypes allows (1024: a cat of 1100 tensors reads 1100 buffers).

A 90-byte x86-64 System V trampoline `call_words(fn, words, n)` loads words[0..5] into the six integer argument
registers, pushes words[6..n-1] as stack arguments (keeping the 16-byte alignment the ABI requires at the call) and
calls fn. Kernel arguments are all integer-class (buffer pointers, int32 values in 64-bit slots), so an array of
int64 words is the whole call."""

from __future__ import annotations

import ctypes
import threading
from typing import Any

from speck.hcq.errors import HCQTypeError
from speck.hcq.memory import PROT_EXEC, PROT_READ, CodeMemory

CTYPES_MAX_ARGS = 1024  # ctypes refuses CFUNCTYPE prototypes with more arguments

# fmt: off
_CODE = bytes([
    0x55,                          # push rbp
    0x48, 0x89, 0xE5,              # mov rbp, rsp
    0x53,                          # push rbx
    0x41, 0x54,                    # push r12            (rsp is 16-byte aligned here)
    0x48, 0x89, 0xFB,              # mov rbx, rdi        fn
    0x49, 0x89, 0xF4,              # mov r12, rsi        words
    0x48, 0x89, 0xD1,              # mov rcx, rdx        n
    0x48, 0x83, 0xE9, 0x06,        # sub rcx, 6          stack words
    0x7E, 0x14,                    # jle regs
    0xF6, 0xC1, 0x01,              # test cl, 1
    0x74, 0x04,                    # jz push_loop
    0x48, 0x83, 0xEC, 0x08,        # sub rsp, 8          odd count: pad so rsp is aligned at the call
    # push_loop: words[rcx + 5] for rcx = k .. 1 (last stack argument first)
    0x49, 0x8B, 0x44, 0xCC, 0x28,  # mov rax, [r12 + rcx*8 + 40]
    0x50,                          # push rax
    0x48, 0xFF, 0xC9,              # dec rcx
    0x75, 0xF5,                    # jnz push_loop
    # regs:
    0x49, 0x8B, 0x3C, 0x24,        # mov rdi, [r12]
    0x49, 0x8B, 0x74, 0x24, 0x08,  # mov rsi, [r12 + 8]
    0x49, 0x8B, 0x54, 0x24, 0x10,  # mov rdx, [r12 + 16]
    0x49, 0x8B, 0x4C, 0x24, 0x18,  # mov rcx, [r12 + 24]
    0x4D, 0x8B, 0x44, 0x24, 0x20,  # mov r8, [r12 + 32]
    0x4D, 0x8B, 0x4C, 0x24, 0x28,  # mov r9, [r12 + 40]
    0x31, 0xC0,                    # xor eax, eax        no vector registers used (variadic callees read al)
    0xFF, 0xD3,                    # call rbx
    0x48, 0x8D, 0x65, 0xF0,        # lea rsp, [rbp - 16]
    0x41, 0x5C,                    # pop r12
    0x5B,                          # pop rbx
    0x5D,                          # pop rbp
    0xC3,                          # ret
])
# fmt: on

_PROTO = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)
_lock = threading.Lock()
_loaded: tuple[CodeMemory, Any] | None = None


def _trampoline() -> Any:
    global _loaded
    if _loaded is None:
        with _lock:
            if _loaded is None:
                mem = CodeMemory(len(_CODE))
                mem.write(0, _CODE)
                mem.seal([(0, mem.size, PROT_READ | PROT_EXEC)])
                _loaded = (mem, _PROTO(mem.addr))
    return _loaded[1]


class WordCall:
    """A callable like a ctypes function of `nargs` integer-class arguments, for any `nargs`: it packs the call's
    arguments into an int64 array (at least six words, the registers' share) and runs the trampoline."""

    __slots__ = ("address", "nargs", "_call")

    def __init__(self, address: int, nargs: int) -> None:
        self.address, self.nargs, self._call = address, nargs, _trampoline()

    def __call__(self, *args: Any) -> None:
        if len(args) != self.nargs:
            raise HCQTypeError(f"kernel call at {self.address:#x} takes {self.nargs} arguments, got {len(args)}")
        words = (ctypes.c_int64 * max(len(args), 6))(*[_word(a) for a in args])
        self._call(self.address, words, len(args))


def _word(a: Any) -> int:
    v = a.value if isinstance(a, (ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64)) else a
    v = 0 if v is None else int(v)
    return v - (1 << 64) if v >= 1 << 63 else v  # pointers above 2**63 as the same 64 bits in an int64


__all__ = ["CTYPES_MAX_ARGS", "WordCall"]
