"""CI runs exactly the README's test command, and that command installs both C compilers the C backend is tested
with (noxfile's C_COMPILERS): a change to one side that is not made to the other fails here."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _command(text: str) -> str:
    m = re.search(r"^(apt-get update .*nox -s tests[^\n]*?docs)", text, re.M)
    assert m is not None, "no `apt-get update ... nox -s tests ... docs` line"
    return m.group(1)


def test_readme_and_ci_run_the_same_command_and_install_both_compilers() -> None:
    readme = _command((ROOT / "README.md").read_text())
    ci = _command((ROOT / ".ci" / "run").read_text())
    assert readme == ci
    installed = re.search(r"apt-get install -y -qq ([^&]*)&&", readme)
    assert installed is not None
    nox = (ROOT / "noxfile.py").read_text()
    m = re.search(r"^C_COMPILERS = \(([^)]*)\)", nox, re.M)
    assert m is not None, "noxfile.py has no C_COMPILERS"
    compilers = re.findall(r'"([^"]+)"', m.group(1))
    assert set(compilers) == {"gcc", "clang"}
    # gcc comes with Debian's python3 build dependencies; clang must be asked for
    assert "clang" in installed.group(1).split()
