"""Reading members out of the kernel source tarball (tarfile; nothing is extracted) and the installed package's
version."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tarfile
from collections.abc import Iterable

from amdgen.headers import AMD, PACKAGE


def read_members(source: pathlib.Path, wanted: Iterable[str]) -> tuple[dict[str, bytes], str]:
    """The wanted members (paths below drivers/gpu/drm/amd/) and the kernel version from the top Makefile."""
    wanted = set(wanted)
    found: dict[str, bytes] = {}
    version = ""
    with tarfile.open(source) as tar:
        for member in tar:
            name = member.name.split("/", 1)[1] if "/" in member.name else member.name
            if name == "Makefile":
                fobj = tar.extractfile(member)
                assert fobj is not None
                head = fobj.read(400).decode()
                parts = [re.search(rf"^{k} = (\S+)", head, re.M) for k in ("VERSION", "PATCHLEVEL", "SUBLEVEL")]
                version = ".".join(p.group(1) for p in parts if p)
            if name.startswith(AMD) and name[len(AMD) :] in wanted:
                fobj = tar.extractfile(member)
                assert fobj is not None
                found[name[len(AMD) :]] = fobj.read()
                if len(found) == len(wanted) and version:
                    break
    missing = sorted(wanted - set(found))
    if missing:
        sys.exit(f"{source}: members not found: {', '.join(missing)}")
    return found, version


def debian_version() -> str:
    try:
        out = subprocess.run(["dpkg-query", "-W", "-f=${Version}", PACKAGE], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (dpkg-query unavailable)"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "unknown (package not installed)"
