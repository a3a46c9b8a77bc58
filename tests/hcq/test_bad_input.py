"""Bad input to programs is refused before anything runs, naming what was expected and what was found."""

from __future__ import annotations

import numpy as np
import pytest

from hcq_kernels import ADD_IR, SCALE_IR
from speck.hcq import Buffer, Device, HCQError, ProgramArgumentError
from speck.hcq.cpu import CPUProgram
from speck.hcq.errors import HCQTypeError, HCQValueError

N = 64


@pytest.fixture(scope="module")
def add_checked() -> CPUProgram:
    dev = Device["CPU"]
    bufs = [(0, np.float32, N, "out"), (1, np.float32, N, "in"), (2, np.float32, N, "in")]
    return dev.runtime("add", dev.compiler.compile(ADD_IR), buffers=bufs, vars=[], global_size=(N, 1, 1))


def buffers() -> tuple[Buffer, Buffer, Buffer]:
    O = Buffer("CPU", N, np.float32).copyin(np.full(N, 5, np.float32))
    A = Buffer("CPU", N, np.float32).copyin(np.arange(N, dtype=np.float32))
    return O, A, A


def assert_untouched(O: Buffer) -> None:
    np.testing.assert_array_equal(O.numpy(), np.full(N, 5, np.float32))


def test_correct_call_runs(add_checked: CPUProgram) -> None:
    O, A, B = buffers()
    add_checked(O, A, B, wait=True)
    np.testing.assert_array_equal(O.numpy(), 2 * np.arange(N, dtype=np.float32))


def test_wrong_buffer_count(add_checked: CPUProgram) -> None:
    O, A, _ = buffers()
    with pytest.raises(ProgramArgumentError, match="'add' takes 3 buffers, got 2"):
        add_checked(O, A, wait=True)
    assert_untouched(O)


def test_too_small_buffer(add_checked: CPUProgram) -> None:
    O, A, _ = buffers()
    small = Buffer("CPU", N - 1, np.float32)
    with pytest.raises(ProgramArgumentError, match="buffer 2 must hold at least 64 elements, got 63"):
        add_checked(O, A, small, wait=True)
    assert_untouched(O)


def test_wrong_dtype(add_checked: CPUProgram) -> None:
    O, A, _ = buffers()
    wrong = Buffer("CPU", N, np.float64)
    with pytest.raises(ProgramArgumentError, match="buffer 1 must hold float32 .itemsize 4., got float64 .itemsize 8."):
        add_checked(O, wrong, A, wait=True)
    assert_untouched(O)


def test_buffer_on_another_device(add_checked: CPUProgram) -> None:
    O, A, _ = buffers()
    elsewhere = Buffer("CPU:1", N, np.float32)
    with pytest.raises(ProgramArgumentError, match="loaded on CPU but buffer 2 .* lives on CPU:1"):
        add_checked(O, A, elsewhere, wait=True)
    assert_untouched(O)


def test_unchecked_program_still_refuses_foreign_buffers() -> None:
    dev = Device["CPU"]
    prog = dev.runtime("add", dev.compiler.compile(ADD_IR))
    O, A, _ = buffers()
    with pytest.raises(ProgramArgumentError, match="lives on NULL"):
        prog(O, A, Buffer("NULL", N, np.float32), global_size=(N, 1, 1))
    with pytest.raises(ProgramArgumentError, match="argument 1 must be a Buffer, got ndarray"):
        prog(O, np.zeros(N, np.float32), A, global_size=(N, 1, 1))  # type: ignore[arg-type]
    assert_untouched(O)


def test_wrong_variable_count_and_range() -> None:
    dev = Device["CPU"]
    prog = dev.runtime(
        "scale",
        dev.compiler.compile(SCALE_IR),
        buffers=[(0, np.float32, N, "out"), (1, np.float32, N, "in")],
        vars=[("k", 0, 10)],
    )
    O, A, _ = buffers()
    with pytest.raises(ProgramArgumentError, match=r"takes 1 variable values \(k\), got 0"):
        prog(O, A, global_size=(N, 1, 1))
    with pytest.raises(ProgramArgumentError, match="must be int32, got 4294967296"):
        prog(O, A, global_size=(N, 1, 1), vals=(2**32,))
    with pytest.raises(ProgramArgumentError, match=r"variable k must be in \[0, 10\], got 11"):
        prog(O, A, global_size=(N, 1, 1), vals=(11,))
    assert_untouched(O)


def test_batch_checks_every_call_before_running_any(add_checked: CPUProgram) -> None:
    O, A, B = buffers()
    with pytest.raises(ProgramArgumentError, match="takes 3 buffers"):
        Device["CPU"].run_batch([(add_checked, [O, A, B], (N, 1, 1)), (add_checked, [O], (N, 1, 1))])
    assert_untouched(O)
    with pytest.raises(HCQError, match="is loaded on CPU"):
        Device["CPU:1"].run_batch([(add_checked, [O, A, B], (N, 1, 1))])


def test_missing_function_and_non_bytes() -> None:
    dev = Device["CPU"]
    with pytest.raises(KeyError, match="'nope' is not defined"):
        dev.runtime("nope", dev.compiler.compile(ADD_IR))
    with pytest.raises(ProgramArgumentError, match="expects the compiled object as bytes, got str"):
        dev.runtime("add", ADD_IR)  # type: ignore[arg-type]


@pytest.mark.parametrize("size, err", [(2.5, HCQTypeError), ("4", HCQTypeError), (True, HCQTypeError),
                                       (-1, HCQValueError), (np.int64(-3), HCQValueError)])  # fmt: skip
def test_a_buffer_size_must_be_a_non_negative_int(size: object, err: type[Exception]) -> None:
    with pytest.raises(err, match="buffer size must be"):
        Buffer("CPU", size, np.float32).allocate()  # type: ignore[arg-type]


def test_a_numpy_int_buffer_size_is_an_int() -> None:
    b = Buffer("CPU", np.int64(4), np.float32).allocate()  # type: ignore[arg-type]
    assert type(b.size) is int and b.nbytes == 16


@pytest.mark.parametrize("dtype", [object, np.str_, "U4", "V4", "M8[s]"])
def test_a_buffer_of_a_non_numeric_numpy_dtype_is_refused(dtype: object) -> None:
    # an object buffer's bytes read back as PyObject pointers
    with pytest.raises(HCQTypeError, match="expected a"):
        Buffer("CPU", 4, dtype)


def test_copies_from_or_into_what_is_no_host_memory_are_type_errors() -> None:
    b = Buffer("CPU", 4, np.float32).copyin(np.arange(4, dtype=np.float32))
    with pytest.raises(HCQTypeError, match="expected host memory"):
        b.copyin("abcd")  # type: ignore[arg-type]
    with pytest.raises(HCQTypeError, match="needs writable host memory"):
        b.copyout(bytes(16))
    np.testing.assert_array_equal(b.numpy(), np.arange(4, dtype=np.float32))


# ---------------- the raw allocator (Device[...].allocator, tinygrad's low-level API) ----------------
@pytest.mark.parametrize(("nbytes", "offset", "size"), [(64, 0, 16), (8, 12, 16), (17, 0, 16), (1, 16, 16)])
def test_a_raw_copy_past_the_allocations_end_is_a_copy_size_error(nbytes: int, offset: int, size: int) -> None:
    from speck.hcq.errors import CopySizeError

    al = Device["CPU"].allocator
    m = al.alloc(size)
    al.copyin(m, 0, memoryview(bytes(range(size))))
    with pytest.raises(CopySizeError, match=f"{nbytes} bytes at offset {offset} don't fit the {size}-byte allocation"):
        al.copyin(m, offset, memoryview(bytearray(nbytes)))
    with pytest.raises(CopySizeError, match=f"copy at most {max(size - offset, 0)} bytes from there"):
        al.copyout(memoryview(bytearray(nbytes)), m, offset)
    out = bytearray(size)
    al.copyout(memoryview(out), m, 0)
    assert out == bytes(range(size))  # nothing was written
    al.free(m, size)


@pytest.mark.parametrize("offset", [-1, -4, -16])
def test_a_raw_copy_at_a_negative_offset_is_refused_not_done_from_the_end(offset: int) -> None:
    al = Device["CPU"].allocator
    m = al.alloc(16)
    al.copyin(m, 0, memoryview(bytes(16)))
    with pytest.raises(HCQValueError, match=f"must be >= 0, got {offset}"):
        al.copyin(m, offset, memoryview(b"\xff" * min(-offset, 4)))
    with pytest.raises(HCQValueError, match=f"must be >= 0, got {offset}"):
        al.copyout(memoryview(bytearray(min(-offset, 4))), m, offset)
    out = bytearray(16)
    al.copyout(memoryview(out), m, 0)
    assert out == bytes(16)
    al.free(m, 16)


@pytest.mark.parametrize(("nbytes", "err"), [("a", HCQTypeError), (2.0, HCQTypeError), (True, HCQTypeError),
                                             (None, HCQTypeError), (-5, HCQValueError)])  # fmt: skip
def test_a_raw_alloc_of_a_size_that_is_no_byte_count_is_refused(nbytes: object, err: type[Exception]) -> None:
    al = Device["CPU"].allocator
    with pytest.raises(err, match="size"):
        al.alloc(nbytes)  # type: ignore[arg-type]
    m = al.alloc(np.int64(8))  # type: ignore[arg-type]
    al.copyin(m, 0, memoryview(bytes(8)))
    al.free(m, 8)


def test_a_raw_allocation_freed_twice_is_refused_and_never_handed_out_twice() -> None:
    al = Device["CPU"].allocator
    used = al.mem_used
    m = al.alloc(72)
    al.free(m, 72)
    with pytest.raises(HCQValueError, match="freed twice"):
        al.free(m, 72)
    assert al.mem_used == used  # the accounting is as after one free
    a, b = al.alloc(72), al.alloc(72)
    assert a is not b  # (after the double free both were the same memory)
    al.free(a, 72)
    al.free(b, 72)
