"""speck.tensor.distributed: bucketing and errors in-process; collectives, failures and speck-train --distributed
in real MPI jobs (`mpiexec -n 2` on localhost, marker `mpi`: the tensor-mpi nox session installs speck-tensor[mpi]
and runs them)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from speck.tensor import distributed

HANG_GUARD = 600  # seconds a whole mpiexec run may take before the test gives up on it (a hang, not a slow run)


# ---------------- in-process ----------------
def test_buckets_pack_small_tensors_and_send_big_ones_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "BUCKET_BYTES", 64)
    f = [np.zeros(n, np.float32) for n in (4, 4, 20, 4)]  # 16, 16, 80, 16 bytes
    i = [np.zeros(3, np.int32)]
    buckets = distributed._buckets([f[0], i[0], f[1], f[2], f[3]])
    assert [[v.nbytes for v in b] for b in buckets] == [[80], [16, 16, 16], [12]]
    assert all(len({v.dtype for v in b}) == 1 for b in buckets)
    assert sum(len(b) for b in buckets) == 5


def test_needs_init_and_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(distributed, "_world", None)
    with pytest.raises(distributed.DistributedError, match="not initialized"):
        distributed.rank()
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if mpi4py were not installed
    with pytest.raises(distributed.DistributedError, match=r"pip install 'speck-tensor\[mpi\]'"):
        distributed.init()


# ---------------- MPI jobs ----------------
def _mpiexec() -> str:
    here = pathlib.Path(sys.executable).parent / "mpiexec"
    found = str(here) if here.exists() else shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec: install speck-tensor[mpi] (or run nox -s \"tests(package='tensor-mpi')\")")
    return found


def _run(tmp_path: pathlib.Path, script: str, *args: str, ulfm: bool = False, env: dict[str, str] | None = None,
         n: int = 2) -> subprocess.CompletedProcess[str]:  # fmt: skip
    """Run `script` (a Python program) as an n-rank MPI job on localhost."""
    path = tmp_path / "job.py"
    path.write_text(textwrap.dedent(script))
    e = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1", **(env or {})}
    cmd = [_mpiexec(), "--oversubscribe", *(["--with-ft", "ulfm"] if ulfm else []), "-n", str(n)]
    if "PYTHONPATH" in e:
        cmd += ["-x", "PYTHONPATH"]
    cmd += [sys.executable, str(path), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=HANG_GUARD, env=e, cwd=tmp_path)


def _records(out: str) -> dict[int, dict[str, object]]:
    recs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return {int(r["rank"]): r for r in recs}  # type: ignore[call-overload]


@pytest.mark.mpi
def test_collectives_across_two_ranks(tmp_path: pathlib.Path) -> None:
    res = _run(
        tmp_path,
        """
        import json
        import numpy as np
        from speck.tensor import Tensor, TinyJit, distributed as D
        D.init()
        r, n = D.rank(), D.world_size()
        small = [Tensor(np.arange(6, dtype=np.float32).reshape(2, 3) * (r + 1)), Tensor(np.full(5, r + 2, np.int32))]
        big = Tensor(np.full(1 << 21, r + 0.5, np.float32))  # 8 MiB: sent alone, reduced in place
        D.allreduce_([*small, big])
        mean = Tensor(np.full(3, 10.0 * r, np.float32))
        D.allreduce_([mean], op="mean")
        w = Tensor(np.full(4, 100.0 + r, np.float32)).realize()
        D.broadcast_([w], root=1)

        @TinyJit
        def step(x):
            g = (x * 2).realize()
            D.allreduce_([g], op="mean")
            return g + 1

        jit = [step(Tensor(np.full(2, float(r + i), np.float32)).realize()).tolist() for i in range(4)]
        print(json.dumps({"rank": r, "size": n, "small": [t.tolist() for t in small], "big": float(big.numpy()[7]),
                          "big_all": bool((big.numpy() == big.numpy()[0]).all()), "mean": mean.tolist(),
                          "w": w.tolist(), "jit": jit}))
    """,
    )
    assert res.returncode == 0, res.stderr
    recs = _records(res.stdout)
    assert sorted(recs) == [0, 1]
    base = np.arange(6, dtype=np.float32).reshape(2, 3)
    for rec in recs.values():
        assert rec["size"] == 2
        np.testing.assert_array_equal(rec["small"][0], base * 1 + base * 2)  # type: ignore[index]
        assert rec["small"][1] == [5] * 5  # type: ignore[index]
        assert rec["big"] == 2.0 and rec["big_all"]
        assert rec["mean"] == [5.0] * 3 and rec["w"] == [101.0] * 4
        # calls 3 and 4 are TinyJit replays of the recorded allreduce: mean of 2(r+i) over r is 2i+1, plus 1
        assert rec["jit"] == [[2.0 * i + 2] * 2 for i in range(4)]


_LOSE_RANK_1 = """
    import os, signal, sys
    import numpy as np
    from speck.tensor import Tensor, distributed as D
    D.init(timeout=float(sys.argv[2]))
    t = Tensor(np.ones(1000, np.float32))
    D.allreduce_([t])  # both ranks alive
    if D.rank() == 1:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    try:
        D.allreduce_([t])
    except D.DistributedError as e:
        print(f"rank {D.rank()} error: {e}", flush=True)
        D.abort(3)
    print(f"rank {D.rank()} finished without an error", flush=True)
"""


@pytest.mark.mpi
def test_a_killed_rank_is_named_by_the_others(tmp_path: pathlib.Path) -> None:
    res = _run(tmp_path, _LOSE_RANK_1, "SIGKILL", "120", ulfm=True)
    assert res.returncode != 0
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("rank 0 error")), None)
    assert line is not None, (res.stdout, res.stderr)
    assert "lost rank 1 (pid" in line and "failed" in line


@pytest.mark.mpi
def test_an_unresponsive_rank_times_out_with_its_name(tmp_path: pathlib.Path) -> None:
    res = _run(tmp_path, _LOSE_RANK_1, "SIGSTOP", "3")
    assert res.returncode != 0
    line = next((ln for ln in res.stdout.splitlines() if ln.startswith("rank 0 error")), None)
    assert line is not None, (res.stdout, res.stderr)
    assert "did not complete within 3 s" in line and "rank 1 (pid" in line and "is stopped" in line


@pytest.mark.mpi
def test_speck_train_distributed_matches_one_process(tmp_path: pathlib.Path) -> None:
    args = ["--model", "mlp", "--steps", "30", "--batch", "64", "--train-subset", "2000", "--test-subset", "500",
            "--quiet", "--out", str(tmp_path / "w.safetensors")]  # fmt: skip
    one = subprocess.run([sys.executable, "-m", "speck.tensor.examples.train", *args], capture_output=True,
                         text=True, timeout=HANG_GUARD, cwd=tmp_path)  # fmt: skip
    assert one.returncode == 0, one.stderr
    two = _run(tmp_path, "import runpy; runpy.run_module('speck.tensor.examples.train', run_name='__main__')",
               *args, "--distributed")  # fmt: skip
    assert two.returncode == 0, two.stderr
    acc = [ln for ln in two.stdout.splitlines() if ln.startswith("test accuracy")]
    assert len(acc) == 1 and "over 2 MPI ranks" in acc[0]  # rank 0 alone evaluates and prints
    ref = next(ln for ln in one.stdout.splitlines() if ln.startswith("test accuracy"))
    assert acc[0].split("%")[0] == ref.split("%")[0]  # the same batches, the same updates: the same accuracy
    assert (tmp_path / "w.safetensors").exists()
