"""Spec verification between pipeline stages (always under SPEC=1, which the tests set): the kernel-level spec for
graphs in flight, `spec_program` for the final linear program. Errors name the stage and the offending node."""

from __future__ import annotations

from speck.codegen.errors import ProgramFormError
from speck.uop import SPEC, UOp


def verify_stage(graph: UOp | list[UOp], stage: str, program: bool = False, force: bool = False) -> None:
    """Check `graph` against the kernel spec (or spec_program when `program`) if SPEC is set (or `force`)."""
    if not (SPEC or force):
        return
    from speck.uop.spec import spec_kernel, spec_program, type_verify  # its matchers load only when specs are checked

    try:
        type_verify(graph, spec_program if program else spec_kernel)
    except RuntimeError as e:
        raise ProgramFormError(f"spec check after stage {stage!r} failed: {e}") from e
