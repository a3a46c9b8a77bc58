"""Import-time check that the installed sibling packages are new enough for this speck-tensor (CONVENTIONS.md 3)."""

from __future__ import annotations

from importlib import metadata

from speck.tensor._version import __version__
from speck.tensor.errors import TensorImportError

# the floors declared in pyproject.toml, by distribution name
SIBLING_FLOORS: dict[str, str] = {"speck-uop": "0.1", "speck-codegen": "0.1", "speck-runtime-hcq": "0.1"}


def _parse(v: str) -> tuple[int, ...]:
    out = []
    for part in v.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


def too_old(installed: str, floor: str) -> bool:
    """True when version `installed` is below `floor` (numeric dotted comparison; pre-release tags ignored)."""
    a, b = _parse(installed), _parse(floor)
    n = max(len(a), len(b))
    return a + (0,) * (n - len(a)) < b + (0,) * (n - len(b))


def check_sibling_versions(floors: dict[str, str] | None = None) -> None:
    """Raise ImportError naming the package, both versions and the upgrade command when a sibling is too old.
    A sibling without distribution metadata (a source checkout on sys.path) is not checked."""
    for dist, floor in (floors or SIBLING_FLOORS).items():
        try:
            have = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        if too_old(have, floor):
            raise TensorImportError(
                f"speck-tensor {__version__} needs {dist}>={floor}, but {dist} {have} is installed; "
                f"upgrade it: pip install -U '{dist}>={floor}'"
            )
