"""Stopping a running CPU kernel: Ctrl-C (SIGINT -> KeyboardInterrupt) or a timeout's signal handler (SIGALRM, as
pytest-timeout's signal method installs) ends a long launch after the current piece of its range, on one thread or
split across workers, and the device runs the next kernel correctly. Each case runs in a subprocess that starts a
kernel needing many minutes and gets the signal once it is running."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import sys
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import signal, sys, time
    import numpy as np
    from speck.hcq import Buffer, Device
    from hcq_kernels import ADD_IR

    # each row spins 50M volatile stores (tens of ms); 200000 rows take hours
    SPIN_IR = '''
    define void @spin(ptr noalias %o, i32 %s, i32 %e) {
    entry:
      %c0 = icmp slt i32 %s, %e
      br i1 %c0, label %row, label %exit
    row:
      %i = phi i32 [%s, %entry], [%ni, %done]
      %p = getelementptr i32, ptr %o, i32 %i
      br label %inner
    inner:
      %j = phi i32 [0, %row], [%nj, %inner]
      store volatile i32 %j, ptr %p
      %nj = add i32 %j, 1
      %cj = icmp slt i32 %nj, 50000000
      br i1 %cj, label %inner, label %done
    done:
      %ni = add i32 %i, 1
      %ci = icmp slt i32 %ni, %e
      br i1 %ci, label %row, label %exit
    exit:
      ret void
    }
    '''
    threads, how = int(sys.argv[1]), sys.argv[2]
    dev = Device["CPU"]
    spin = dev.runtime("spin", dev.compiler.compile(SPIN_IR))
    add = dev.runtime("add", dev.compiler.compile(ADD_IR))
    rows = 200000
    out = Buffer("CPU", rows, np.int32)
    if how == "alarm":
        def on_alarm(signum, frame):
            raise TimeoutError("the test's time is up")
        signal.signal(signal.SIGALRM, on_alarm)
        signal.alarm(1)
    print("started", flush=True)
    t0 = time.perf_counter()
    try:
        spin(out, global_size=(rows, 1, 1), threads=threads, wait=True)
        print("completed", flush=True)
    except (KeyboardInterrupt, TimeoutError) as e:
        print(f"stopped {type(e).__name__} after {time.perf_counter() - t0:.2f} s", flush=True)
    a = np.arange(1000, dtype=np.float32)
    A, O = Buffer("CPU", 1000, np.float32).copyin(a), Buffer("CPU", 1000, np.float32)
    add(O, A, A, global_size=(1000, 1, 1), threads=threads, wait=True)
    print("usable", bool(np.array_equal(O.numpy(), a + a)), flush=True)
    """
)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("how", ["sigint", "alarm"])
def test_a_long_kernel_stops_on_a_signal_and_the_device_stays_usable(threads: int, how: str,
                                                                      tmp_path: pathlib.Path) -> None:  # fmt: skip
    script = tmp_path / "spin.py"
    script.write_text(SCRIPT)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pathlib.Path(__file__).parent), env.get("PYTHONPATH", "")])
    env["SPECK_CACHE_DIR"] = str(tmp_path / "cache")
    proc = subprocess.Popen([sys.executable, str(script), str(threads), how], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)  # fmt: skip
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert first.strip() == "started", first + proc.stderr.read() if proc.stderr else first
        if how == "sigint":
            import time

            time.sleep(1.0)  # let the kernel get going
            proc.send_signal(signal.SIGINT)
        # the kernel alone would run for hours: finishing at all shows it was stopped
        out, err = proc.communicate(timeout=300)
    finally:
        proc.kill()
    lines = [first.strip(), *out.splitlines()]
    expected = "KeyboardInterrupt" if how == "sigint" else "TimeoutError"
    assert any(line.startswith(f"stopped {expected}") for line in lines), (lines, err)
    assert "usable True" in lines, (lines, err)
