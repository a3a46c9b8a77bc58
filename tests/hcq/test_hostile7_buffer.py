"""Host memory handed to Buffer.copyin/copyout: a numpy array of Python objects took the buffer's bytes over its
object pointers (the process died with SIGSEGV at the array's next use) and gave its pointers as data the other
way; an empty array with a 0 in a multi-dim shape was memoryview.cast's raw TypeError. Now an HCQTypeError, and
empty memory of any shape is empty. The object case runs in a child process: before the fix it crashed it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from speck.hcq import Buffer
from speck.hcq.errors import CopySizeError, HCQTypeError

CHILD = textwrap.dedent("""
    import numpy as np
    from speck.hcq import Buffer
    from speck.hcq.errors import HCQTypeError
    b = Buffer("CPU", 4, np.float32).copyin(np.arange(4, dtype=np.float32))
    for dtype in (object, [("a", "i4"), ("b", "O")]):
        dest = np.zeros(2, dtype=dtype)
        for call in (lambda: b.copyout(dest), lambda: b.copyin(dest)):
            try:
                call()
                print("accepted")
            except HCQTypeError as e:
                print("refused", "Python objects" in str(e))
        print(repr(dest.tolist()))  # (the next use of a clobbered array: a crash)
    print(b.numpy().tolist())
""")


def test_host_memory_of_python_objects_is_refused_both_ways() -> None:
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = ["refused True", "refused True", "[0, 0]", "refused True", "refused True", "[(0, 0), (0, 0)]"]
    assert proc.stdout.splitlines() == [*want, "[0.0, 1.0, 2.0, 3.0]"]


@pytest.mark.parametrize("shape", [(0,), (2, 0), (0, 3, 4)])
def test_empty_host_memory_of_any_shape_copies_nothing(shape: tuple[int, ...]) -> None:
    e = Buffer("CPU", 0, np.float32)
    e.copyin(np.zeros(shape, np.float32))
    out = np.zeros(shape, np.int16)
    assert e.copyout(out).nbytes == 0
    b = Buffer("CPU", 4, np.float32).copyin(np.arange(4, dtype=np.float32))
    with pytest.raises(CopySizeError, match="16 bytes but the other side has 0"):
        b.copyout(np.zeros(shape, np.float32))
    np.testing.assert_array_equal(b.numpy(), np.arange(4, dtype=np.float32))


def test_plain_arrays_of_any_dtype_still_copy_their_bytes() -> None:
    for a in (np.arange(6, dtype=np.int16).reshape(2, 3), np.array([1.5, -2.0], np.float64), np.array([True, False])):
        b = Buffer("CPU", a.nbytes, np.uint8).copyin(a)
        out = np.empty_like(a)
        b.copyout(out)
        assert out.tobytes() == a.tobytes()
    with pytest.raises(HCQTypeError, match="expected host memory"):
        Buffer("CPU", 1, np.uint8).copyin("x")
