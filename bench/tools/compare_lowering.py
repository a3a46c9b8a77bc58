"""Check that two checkouts of speck generate the same code for the main job's first training step: runs
bench/lowering_profile.py --dump under each checkout's packages (fresh compile caches) and compares the rendered
source of every kernel, in order. Exits 1 on any difference, naming the first differing kernel.

Run: python3 bench/tools/compare_lowering.py BEFORE_ROOT [AFTER_ROOT (default: this checkout)] [--model cnn]
     [--device D]"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # bench/, where lowering_profile.py is
PACKAGES = ("uop", "codegen", "runtime-hcq", "tensor", "usbgpu")


def dump(root: str, model: str, device: str, out: str) -> list[tuple[str, str]]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(f"{root}/packages/{p}/src" for p in PACKAGES))
    cmd = [sys.executable, os.path.join(HERE, "lowering_profile.py"), "--model", model, "--dump", out]
    if device:
        cmd += ["--device", device]
    print(subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout.splitlines()[0])
    kernels: list[tuple[str, str]] = []
    for block in open(out).read().split("=== ")[1:]:
        name, _, src = block.partition("\n")
        kernels.append((name, src))
    return kernels


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before")
    ap.add_argument("after", nargs="?", default=os.path.dirname(HERE))
    ap.add_argument("--model", default="cnn")
    ap.add_argument("--device", default="")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        before = dump(a.before, a.model, a.device, os.path.join(d, "before.txt"))
        after = dump(a.after, a.model, a.device, os.path.join(d, "after.txt"))
    if len(before) != len(after):
        sys.exit(f"kernel count differs: {len(before)} before, {len(after)} after")
    for i, ((nb, sb), (na, sa)) in enumerate(zip(before, after)):
        if nb != na or sb != sa:
            sys.exit(f"kernel {i} differs: {nb} before, {na} after")
    print(f"{len(after)} kernels: identical rendered source")


if __name__ == "__main__":
    main()
