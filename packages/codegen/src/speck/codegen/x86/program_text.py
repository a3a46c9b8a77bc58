"""The x86 backend's source text: a linear program (KERNEL_CONTRACT.md section 2) written out one UOp per line.

X86Renderer.render writes it on the lowering thread (cheap: a line per UOp) and X86Compiler.compile reads it back and
runs the backend (legalize -> select -> allocate -> encode -> ELF), wherever the compile runs: in this process or in a
speck.codegen CompilePool worker. So ProgramSpec.src is this text, as it is LLVM IR for the LLVM backend, and the
machine code listing is what `X86Compiler.disassemble(lib)` shows.

Layout: a header `# speck x86 program <name>: <n> uops, fp_contract=<0|1>`, then per UOp (in program order)
`<index>\\t<op>\\t<dtype>\\t<source indices, comma separated>\\t<arg>\\t<tag>`; dtypes as their repr
(`dtypes.float32.vec(8)`, `dtypes.float32.ptr(size=16, addrspace=AddrSpace.REG)`), arg and tag as JSON with tuples as
arrays and the few non-JSON values tagged: `{"enum": "AxisType.GLOBAL"}`, `{"dtype": "..."}`,
`{"KernelInfo": {...}}`, `{"Opt": [op, axis, arg]}`. Reading it back rebuilds the very same UOps (hash-consed),
so the object does not depend on where the compile ran."""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import operator
import re
from collections.abc import Callable
from typing import Any

from speck.codegen.errors import CodegenValueError, CompileError, X86UnsupportedError
from speck.codegen.kernel_info import KernelInfo, kernel_name
from speck.codegen.opt.kernel_opts import Opt, OptOps
from speck.uop import AddrSpace, AxisType, DType, Ops, UOp, dtypes

_HEAD = re.compile(r"^# speck x86 program (\w+): (\d+) uops, fp_contract=([01])$")
_ENUMS: dict[str, type[enum.Enum]] = {"AxisType": AxisType, "AddrSpace": AddrSpace, "OptOps": OptOps, "Ops": Ops}
_OPS = {op.name: op for op in Ops}


# ---------------------------------------------------------------------------------------------------------------------
# writing


def dump_program(uops: list[UOp], fp_contract: bool) -> str:
    """The source text of a linear program (see the module docstring). Raises X86UnsupportedError (so the backend
    registry takes the fallback backend for this kernel) for an arg it has no spelling for."""
    pos: dict[UOp, str] = {}
    lines = [f"# speck x86 program {kernel_name(uops[-1]) if uops else 'kernel'}: {len(uops)} uops, "
             f"fp_contract={int(fp_contract)}"]  # fmt: skip
    dtype_text, op_name = _DTYPE_TEXT, _OP_NAME
    for i, u in enumerate(uops):
        n = pos[u] = str(i)
        dt = dtype_text.get(u.dtype)
        if dt is None:
            dt = dtype_text[u.dtype] = repr(u.dtype)
        arg = u.arg
        # most args are None or a plain int (ALU ops, CONST, PARAM) or float (CONST): spelled inline, the rest (and
        # tags) through _arg_text
        if arg is None:
            a = "null"
        elif type(arg) is int:
            a = str(arg)
        elif type(arg) is float and math.isfinite(arg):
            a = repr(arg)  # (json's spelling of a finite float)
        else:
            a = _arg_text(arg, u)
        tag = "null" if u.tag is None else _arg_text(u.tag, u)
        lines.append(f"{n}\t{op_name[u.op]}\t{dt}\t{','.join(map(pos.__getitem__, u.src))}\t{a}\t{tag}")
    return "\n".join(lines)


_OP_NAME = {op: op.name for op in Ops}
_DTYPE_TEXT: dict[DType, str] = {}  # DTypes are interned: spell each once
_ARG_TEXT: dict[tuple[type, Any], str] = {}  # (type, arg) -> text, for args equal only when spelled alike
_ARG_TEXT_LIMIT = 1 << 16


def _arg_text(arg: Any, u: UOp) -> str:
    """The JSON of an arg or tag, remembered for tuples of ints, strs and enums (GEP lanes, RANGE args, tags); never
    for floats (0.0 == -0.0 but they spell differently) or bools (True == 1)."""
    t = type(arg)
    cacheable = t is tuple and all(type(x) is int or type(x) is str or isinstance(x, enum.Enum) for x in arg)
    if not cacheable:
        return _json(arg, u)
    key = (t, arg)
    a = _ARG_TEXT.get(key)
    if a is None:
        a = _json(arg, u)
        if len(_ARG_TEXT) < _ARG_TEXT_LIMIT:
            _ARG_TEXT[key] = a
    return a


def _json(value: Any, u: UOp) -> str:
    return json.dumps(_encode(value, u), separators=(",", ":"))


def _encode(v: Any, u: UOp) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, tuple):
        return [_encode(x, u) for x in v]
    if isinstance(v, DType):
        return {"dtype": repr(v)}
    if isinstance(v, Opt):
        return {"Opt": v.to_json()}
    if isinstance(v, KernelInfo):
        return {"KernelInfo": {f.name: _encode(getattr(v, f.name), u) for f in dataclasses.fields(v)}}
    if isinstance(v, enum.Enum) and _ENUMS.get(type(v).__name__) is type(v):
        return {"enum": f"{type(v).__name__}.{v.name}"}
    why = f"x86 backend: {u.op.name} carries a {type(v).__name__} arg ({v!r}) that its source text has no spelling for"
    raise X86UnsupportedError(why + "; add it to speck.codegen.x86.program_text", u.op, u.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# reading


def load_program(src: str) -> tuple[list[UOp], bool]:
    """(the linear program, fp_contract) of a source text; CompileError naming the line when it is not one."""
    lines = src.split("\n")
    m = _HEAD.match(lines[0]) if lines else None
    if m is None:
        raise CompileError("x86", "expected an x86 program starting with '# speck x86 program <name>: <n> uops, "
                           "fp_contract=<0|1>'; render the kernel with speck.codegen.x86.X86Renderer", src)  # fmt: skip
    count = int(m.group(2))
    if len(lines) != count + 1:
        raise CompileError("x86", f"the header says {count} uops but {len(lines) - 1} lines follow; the program "
                           "text was edited or truncated", src)  # fmt: skip
    uops: list[UOp] = []
    append, dtype_of, arg_of, ops, picks = uops.append, _DTYPE_OF, _ARG_OF, _OPS, _PICKS
    for n, ln in enumerate(lines[1:], 2):  # (line numbers of the text, its header being line 1)
        try:
            i, op, dt, srcs, arg, tag = ln.split("\t")
            if int(i) != n - 2:
                raise CodegenValueError(f"expected UOp {n - 2}, found {i}")
            dtype = dtype_of.get(dt)
            if dtype is None:
                dtype = dtype_of[dt] = _parse_dtype(dt)
            if arg == "null":
                value = None
            elif (value := arg_of.get(arg, _MISSING)) is _MISSING:
                value = _decode(json.loads(arg))
                if len(arg_of) < _ARG_TEXT_LIMIT:
                    arg_of[arg] = value
            if not srcs:
                src_t: tuple[UOp, ...] = ()
            else:  # (a source not yet read: IndexError)
                pick = picks.get(srcs)
                if pick is None:
                    pick = _sources_picker(srcs)
                    if len(picks) < _ARG_TEXT_LIMIT:
                        picks[srcs] = pick
                src_t = pick(uops)
            append(UOp(ops[op], dtype, src_t, value, None if tag == "null" else _decode(json.loads(tag))))
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise CompileError("x86", f"line {n} of the x86 program is not a UOp ({type(e).__name__}: {e}): "
                               f"{ln[:200]!r}", src) from e  # fmt: skip
    return uops, m.group(3) == "1"


_MISSING = object()
_DTYPE_OF: dict[str, DType] = {}
# the sources field ("3,17") -> a function taking those UOps out of the list read so far (operator.itemgetter: C,
# no split or int() per source); the same fields recur in every kernel
_PICKS: dict[str, Callable[[list[UOp]], tuple[UOp, ...]]] = {}
_ARG_OF: dict[str, Any] = {}  # text -> value is a function: safe to remember (values are immutable)
_DTYPE_STEP = re.compile(r"\.(vec|ptr)\(([^)]*)\)")
_PTR_ARGS = re.compile(r"^(?:size=(-?\d+), )?addrspace=AddrSpace\.(\w+)$")


def _sources_picker(srcs: str) -> Callable[[list[UOp]], tuple[UOp, ...]]:
    """The function picking a sources field's UOps (ValueError for a field that is not comma-separated indices)."""
    if "-" in srcs:
        raise CodegenValueError(f"negative source index in {srcs!r}")
    idx = [int(k) for k in srcs.split(",")]
    if len(idx) == 1:
        k = idx[0]
        return lambda uops: (uops[k],)
    return operator.itemgetter(*idx)


def _parse_dtype(text: str) -> DType:
    """A dtype from its repr: `dtypes.<name>` then `.vec(n)` / `.ptr(size=n, addrspace=AddrSpace.X)` steps."""
    m = re.match(r"^dtypes\.(\w+)", text)
    if m is None:
        raise CodegenValueError(f"not a dtype: {text!r}")
    dt: DType = getattr(dtypes, m.group(1))
    if not isinstance(dt, DType):
        raise CodegenValueError(f"not a dtype: {text!r}")
    end = m.end()
    for step in _DTYPE_STEP.finditer(text, end):
        if step.start() != end:
            break
        end = step.end()
        if step.group(1) == "vec":
            dt = dt.vec(int(step.group(2)))
        else:
            p = _PTR_ARGS.match(step.group(2))
            if p is None:
                raise CodegenValueError(f"not a pointer dtype: {text!r}")
            dt = dt.ptr(int(p.group(1)) if p.group(1) else -1, AddrSpace[p.group(2)])
    if end != len(text):
        raise CodegenValueError(f"not a dtype: {text!r}")
    return dt


def _decode(v: Any) -> Any:
    if isinstance(v, list):
        return tuple(_decode(x) for x in v)
    if not isinstance(v, dict):
        return v
    (kind, body), *rest = v.items()
    if rest:
        raise CodegenValueError(f"a tagged value has one key, found {list(v)}")
    if kind == "enum":
        cls, _, name = body.partition(".")
        return _ENUMS[cls][name]
    if kind == "dtype":
        return _parse_dtype(body)
    if kind == "Opt":
        op, axis, arg = body
        return Opt(OptOps[op], axis, arg)
    if kind == "KernelInfo":
        return KernelInfo(**{k: _decode(x) for k, x in body.items()})
    raise CodegenValueError(f"unknown tagged value {kind!r}")


__all__ = ["dump_program", "load_program"]
