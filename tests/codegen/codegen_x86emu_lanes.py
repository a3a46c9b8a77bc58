"""Lane-moving vector instructions (broadcasts, shuffles, permutes, 128/256-bit lane inserts and extracts, packs,
widening and narrowing moves) and the AVX-512 opmask instructions of the x86-64 emulator; registered into
codegen_x86emu_ops.RULES. The operand model (loaders/storers with EVEX masking) is codegen_x86emu_vec's."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from codegen_x86emu_ops import MASK, Decoded, Gpr, Imm, KReg, Machine, Mem, Run, VecReg, rule
from codegen_x86emu_vec import FLT, SINT, U8, UINT, fix_nan, kbits, lanes, operands, to_bits, vdst, vec_width, vsrc

# ---------------------------------------------------------------------------------------------------------------------
# broadcasts, shuffles, permutes, lane inserts/extracts, packs


@rule("vbroadcastss", "vbroadcastsd", "vpbroadcastb", "vpbroadcastw", "vpbroadcastd", "vpbroadcastq")
def _broadcast(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    es = {"b": 1, "w": 2, "d": 4, "q": 8, "ss": 4, "sd": 8}[d.mn[len("vpbroadcast"):] if d.mn.startswith("vp")
                                                             else d.mn[-2:]]  # fmt: skip
    w = vec_width(d, dst)
    st = vdst(d, dst, w, es)
    if isinstance(src, Gpr):
        get = src.get

        def elem_gpr(m: Machine) -> np.ndarray:
            return np.frombuffer((get(m) & MASK[es]).to_bytes(es, "little"), U8)

        elem = elem_gpr
    else:
        ld = vsrc(d, src, es, es)

        def elem_vec(m: Machine) -> np.ndarray:
            return ld(m, None)[:es]

        elem = elem_vec

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        st(m, np.tile(elem(m), w // es), kb)

    return run


def _chunk(mn: str) -> tuple[int, int]:
    """(chunk bytes, element bytes) of vinsert/vextract/vbroadcast lane forms: ...128, ...32x4, ...64x4, ..."""
    if mn.endswith("128"):
        return 16, 4
    es, count = (int(x) for x in mn[-4:].lstrip("fi").split("x")) if "x" in mn[-4:] else (32, 4)
    return es // 8 * count, es // 8


@rule("vinsertf128", "vinserti128", "vinsertf32x4", "vinserti32x4", "vinsertf64x2", "vinserti64x2", "vinsertf32x8",
      "vinserti32x8", "vinsertf64x4", "vinserti64x4")  # fmt: skip
def _insert_lane(d: Decoded) -> Run:
    dst, a, b, imm = operands(d, 4)
    cb, es = _chunk(d.mn)
    w = vec_width(d, dst)
    la, lb, st = vsrc(d, a, w, es), vsrc(d, b, cb, cb), vdst(d, dst, w, es)
    at = (imm.value % (w // cb)) * cb  # type: ignore[union-attr]

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        r = la(m, None)
        r[at : at + cb] = lb(m, None)
        st(m, r, kb)

    return run


@rule("vextractf128", "vextracti128", "vextractf32x4", "vextracti32x4", "vextractf64x2", "vextracti64x2",
      "vextractf32x8", "vextracti32x8", "vextractf64x4", "vextracti64x4")  # fmt: skip
def _extract_lane(d: Decoded) -> Run:
    dst, src, imm = operands(d, 3)
    cb, es = _chunk(d.mn)
    w = vec_width(d, src)
    ld, st = vsrc(d, src, w, es), vdst(d, dst, cb, es)
    at = (imm.value % (w // cb)) * cb  # type: ignore[union-attr]

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        st(m, ld(m, None)[at : at + cb], kb)

    return run


@rule("vbroadcastf128", "vbroadcasti128", "vbroadcastf32x4", "vbroadcasti32x4", "vbroadcastf32x8",
      "vbroadcasti32x8", "vbroadcastf64x4", "vbroadcasti64x4")  # fmt: skip
def _broadcast_lane(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    cb, es = _chunk(d.mn)
    w = vec_width(d, dst)
    ld, st = vsrc(d, src, cb, cb), vdst(d, dst, w, es)

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        st(m, np.tile(ld(m, None), w // cb), kb)

    return run


def _per_lane(d: Decoded, es: int, nsrc: int,
              pick: Callable[[list[np.ndarray], np.ndarray | None], np.ndarray], imm_last: bool) -> Run:  # fmt: skip
    """A shuffle computed per 128-bit lane: `pick(sources as (lanes, elements-per-lane) arrays, control)`."""
    ops = operands(d, nsrc + 1 + imm_last)
    dst = ops[0]
    w = vec_width(d, dst)
    loads = [vsrc(d, o, w, es) for o in ops[1 : 1 + nsrc]]
    st, dt, per = vdst(d, dst, w, es), UINT[es], 16 // es
    imm = ops[-1].value if imm_last else None  # type: ignore[union-attr]

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        xs = [ld(m, kb if i == nsrc - 1 else None).view(dt).reshape(-1, per) for i, ld in enumerate(loads)]
        st(m, np.ascontiguousarray(pick(xs, imm)).reshape(-1).view(U8), kb)

    return run


def _imm_idx(imm: int, per: int, bits: int) -> np.ndarray:
    return np.array([(imm >> (bits * i)) & ((1 << bits) - 1) for i in range(per)])


@rule("vpermilps", "vpermilpd", "vpshufd")
def _permil(d: Decoded) -> Run:
    es = 8 if d.mn == "vpermilpd" else 4
    per = 16 // es
    if isinstance(d.ops[-1], Imm):
        return _per_lane(d, es, 1, lambda xs, imm: xs[0][:, _imm_idx(imm, per, 2 if es == 4 else 1)], True)  # type: ignore[arg-type]

    def by_vector(xs: list[np.ndarray], _: np.ndarray | None) -> np.ndarray:
        sel = (xs[1] & 3) if es == 4 else ((xs[1] >> 1) & 1)  # vpermilpd's control is bit 1 of each qword
        return np.take_along_axis(xs[0], sel.astype(np.intp), axis=1)

    return _per_lane(d, es, 2, by_vector, False)


@rule("vshufps")
def _shufps(d: Decoded) -> Run:
    def pick(xs: list[np.ndarray], imm: np.ndarray | None) -> np.ndarray:
        i = _imm_idx(int(imm), 4, 2)  # type: ignore[arg-type]
        return np.stack([xs[0][:, i[0]], xs[0][:, i[1]], xs[1][:, i[2]], xs[1][:, i[3]]], axis=1)

    return _per_lane(d, 4, 2, pick, True)


@rule("vunpcklps", "vunpckhps", "vunpcklpd", "vunpckhpd")
def _unpack(d: Decoded) -> Run:
    es = 4 if d.mn.endswith("ps") else 8
    half = 8 // es
    hi = "unpckh" in d.mn

    def pick(xs: list[np.ndarray], _: np.ndarray | None) -> np.ndarray:
        a, b = (x[:, half:] if hi else x[:, :half] for x in xs)
        return np.stack([a, b], axis=2).reshape(a.shape[0], -1)

    return _per_lane(d, es, 2, pick, False)


@rule("vmovshdup", "vmovsldup")
def _dup(d: Decoded) -> Run:
    idx = np.array([1, 1, 3, 3] if d.mn == "vmovshdup" else [0, 0, 2, 2])
    return _per_lane(d, 4, 1, lambda xs, _: xs[0][:, idx], False)


@rule("vhaddps", "vhaddpd")
def _hadd(d: Decoded) -> Run:
    es = 4 if d.mn.endswith("ps") else 8
    dt = FLT[es]

    def pick(xs: list[np.ndarray], _: np.ndarray | None) -> np.ndarray:
        a, b = (x.view(dt) for x in xs)
        with np.errstate(all="ignore"):
            sa, sb = a[:, 0::2] + a[:, 1::2], b[:, 0::2] + b[:, 1::2]
        return np.concatenate([fix_nan(sa, a[:, 0::2], a[:, 1::2]), fix_nan(sb, b[:, 0::2], b[:, 1::2])],
                              axis=1).view(UINT[es])  # fmt: skip

    return _per_lane(d, es, 2, pick, False)


@rule("vmovhlps", "vmovlhps")
def _movhl(d: Decoded) -> Run:
    dst, a, b = operands(d, 3)
    la, lb, st = vsrc(d, a, 16, 16), vsrc(d, b, 16, 16), vdst(d, dst, 16, 16)
    hl = d.mn == "vmovhlps"

    def run(m: Machine) -> None:
        x, y = la(m, None), lb(m, None)
        st(m, np.concatenate([y[8:], x[8:]]) if hl else np.concatenate([x[:8], y[:8]]), None)

    return run


@rule("vinsertps")
def _insertps(d: Decoded) -> Run:
    dst, a, b, imm = operands(d, 4)
    v = imm.value  # type: ignore[union-attr]
    la, lb, st = vsrc(d, a, 16, 16), vsrc(d, b, 16 if isinstance(b, VecReg) else 4, 4), vdst(d, dst, 16, 16)
    s = (v >> 6) & 3 if isinstance(b, VecReg) else 0
    t, zmask = (v >> 4) & 3, v & 15

    def run(m: Machine) -> None:
        r = la(m, None).view(np.uint32).copy()
        r[t] = lb(m, None).view(np.uint32)[s]
        r[[i for i in range(4) if zmask >> i & 1]] = 0
        st(m, r.view(U8), None)

    return run


@rule("vextractps", "vpextrd", "vpextrq")
def _extract_elem(d: Decoded) -> Run:
    dst, src, imm = operands(d, 3)
    es = 8 if d.mn == "vpextrq" else 4
    if not isinstance(src, VecReg) or not isinstance(dst, (Gpr, Mem)):
        raise d.fail(f"unsupported {d.mn} form")
    i = imm.value % (16 // es)  # type: ignore[union-attr]
    put = dst.set if isinstance(dst, Gpr) else Mem(dst.base, dst.index, dst.scale, dst.disp, es, dst.rip, False).set

    def run(m: Machine) -> None:
        put(m, int.from_bytes(m.vec[src.num, i * es : (i + 1) * es].tobytes(), "little"))

    return run


@rule("vpinsrd", "vpinsrq", "vpinsrb", "vpinsrw")
def _insert_elem(d: Decoded) -> Run:
    dst, a, src, imm = operands(d, 4)
    es = {"b": 1, "w": 2, "d": 4, "q": 8}[d.mn[-1]]
    if not isinstance(src, (Gpr, Mem)):
        raise d.fail(f"unsupported {d.mn} form")
    i = imm.value % (16 // es)  # type: ignore[union-attr]
    la, st = vsrc(d, a, 16, 16), vdst(d, dst, 16, 16)
    get = src.get if isinstance(src, Gpr) else Mem(src.base, src.index, src.scale, src.disp, es, src.rip, False).get

    def run(m: Machine) -> None:
        r = la(m, None)
        r[i * es : (i + 1) * es] = np.frombuffer((get(m) & MASK[es]).to_bytes(es, "little"), U8)
        st(m, r, None)

    return run


@rule("vpermps", "vpermd", "vpermpd", "vpermq")
def _perm(d: Decoded) -> Run:
    """vpermps dst, idx, table (full-width cross-lane); vpermpd/vpermq with an imm8 pick within each 256 bits."""
    es = 8 if d.mn in ("vpermpd", "vpermq") else 4
    ops = operands(d, 3)
    dst = ops[0]
    w = vec_width(d, dst)
    n, dt = w // es, UINT[es]
    st = vdst(d, dst, w, es)
    if isinstance(ops[2], Imm):
        ld = vsrc(d, ops[1], w, es)
        sel = np.array([(i // 4) * 4 + ((ops[2].value >> (2 * (i % 4))) & 3) for i in range(n)])

        def run_imm(m: Machine) -> None:
            kb = kbits(m, d)
            st(m, ld(m, kb).view(dt)[sel].view(U8), kb)

        return run_imm
    li, lt = vsrc(d, ops[1], w, es), vsrc(d, ops[2], w, es)

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        st(m, lt(m, kb).view(dt)[li(m, None).view(dt) % n].view(U8), kb)

    return run


@rule("vpermt2ps", "vpermt2d", "vpermt2pd", "vpermt2q", "vpermi2ps", "vpermi2d", "vpermi2pd", "vpermi2q")
def _perm2(d: Decoded) -> Run:
    """Two-table permutes: t2 = dst(table 1), idx, table 2; i2 = dst(indices), table 1, table 2. Index bit log2(n)
    picks the table; masked-off lanes keep the destination (indices for i2, table 1 for t2)."""
    dst, a, b = operands(d, 3)
    es = 8 if d.mn.endswith(("pd", "q")) else 4
    w = vec_width(d, dst)
    n, dt = w // es, UINT[es]
    ld, la, lb, st = vsrc(d, dst, w, es), vsrc(d, a, w, es), vsrc(d, b, w, es), vdst(d, dst, w, es)
    t2 = "permt2" in d.mn

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        x0, x1, x2 = ld(m, None).view(dt), la(m, None).view(dt), lb(m, kb).view(dt)
        idx, t1, tb2 = (x1, x0, x2) if t2 else (x0, x1, x2)
        i = (idx % (2 * n)).astype(np.intp)
        st(m, np.where(i >= n, tb2[i % n], t1[i % n]).view(U8), kb)

    return run


def _saturate(x: np.ndarray, dt: np.dtype) -> np.ndarray:
    info = np.iinfo(dt)
    return np.clip(x, info.min, info.max).astype(dt)


@rule("vpackssdw", "vpacksswb", "vpackusdw", "vpackuswb")
def _pack(d: Decoded) -> Run:
    es = 4 if d.mn.endswith("dw") else 2
    out = {("ss", 4): SINT[2], ("ss", 2): SINT[1], ("us", 4): UINT[2], ("us", 2): UINT[1]}[(d.mn[5:7], es)]

    def pick(xs: list[np.ndarray], _: np.ndarray | None) -> np.ndarray:
        a, b = (_saturate(x.view(SINT[es]).astype(np.int64), out) for x in xs)
        return np.concatenate([a, b], axis=1).view(UINT[es])

    return _per_lane(d, es, 2, pick, False)


@rule(*(f"vpmov{s}x{a}{b}" for s in "sz" for a, b in ("bw", "bd", "bq", "wd", "wq", "dq")))
def _extend(d: Decoded) -> Run:
    sz = {"b": 1, "w": 2, "d": 4, "q": 8}
    ses, des, signed = sz[d.mn[-2]], sz[d.mn[-1]], d.mn[5] == "s"
    dst, src = operands(d, 2)
    w = vec_width(d, dst)
    ld, st = vsrc(d, src, w * ses // des, ses), vdst(d, dst, w, des)

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        st(m, ld(m, None).view((SINT if signed else UINT)[ses]).astype((SINT if signed else UINT)[des]).view(U8), kb)

    return run


@rule(*(f"vpmov{s}{a}{b}" for s in ("", "s", "us") for a, b in ("db", "dw", "qd", "qb", "qw", "wb")))
def _narrow(d: Decoded) -> Run:
    """EVEX down-converts: truncate, or saturate signed (s) / unsigned (us); the destination is w*des/ses bytes."""
    sz = {"b": 1, "w": 2, "d": 4, "q": 8}
    ses, des, kind = sz[d.mn[-2]], sz[d.mn[-1]], d.mn[5:-2]
    dst, src = operands(d, 2)
    if not isinstance(src, VecReg):
        raise d.fail(f"{d.mn} reads a vector register")
    w = src.size
    ow = w * des // ses
    ld = vsrc(d, src, w, ses)
    st = vdst(d, dst, max(ow, 16) if isinstance(dst, VecReg) else ow, des)

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        x = ld(m, None)
        if kind == "us":
            r = _saturate(x.view(UINT[ses]).astype(np.uint64), UINT[des]).view(U8)
        elif kind == "s":
            r = _saturate(x.view(SINT[ses]).astype(np.int64), SINT[des]).view(U8)
        else:
            r = x.view(UINT[ses]).astype(UINT[des]).view(U8)
        if isinstance(dst, VecReg) and ow < 16:
            r = np.concatenate([r, np.zeros(16 - ow, U8)])
        st(m, r, kb)

    return run


@rule("vpternlogd", "vpternlogq")
def _ternlog(d: Decoded) -> Run:
    """Bit i of the result is imm8[(dst_i << 2) | (src1_i << 1) | src2_i]."""
    dst, a, b, imm = operands(d, 4)
    es = 4 if d.mn.endswith("d") else 8
    w = vec_width(d, dst)
    l0, la, lb, st = vsrc(d, dst, w, es), vsrc(d, a, w, es), vsrc(d, b, w, es), vdst(d, dst, w, es)
    v = imm.value  # type: ignore[union-attr]

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        x, y, z = l0(m, None), la(m, None), lb(m, kb)
        r = np.zeros(w, U8)
        for t in range(8):
            if v >> t & 1:
                r |= (x if t & 4 else ~x) & (y if t & 2 else ~y) & (z if t & 1 else ~z)
        st(m, r, kb)

    return run


@rule("vptest")
def _ptest(d: Decoded) -> Run:
    a, b = operands(d, 2)
    w = vec_width(d, a)
    la, lb = vsrc(d, a, w, 8), vsrc(d, b, w, 8)

    def run(m: Machine) -> None:
        x, y = la(m, None), lb(m, None)
        m.zf, m.cf = not (x & y).any(), not (~x & y).any()
        m.of = m.sf = m.pf = False

    return run


# ---------------------------------------------------------------------------------------------------------------------
# opmask registers


K_WIDTH = {"b": 8, "w": 16, "d": 32, "q": 64}


def _kget(d: Decoded, o: object, bits: int) -> Callable[[Machine], int]:
    if isinstance(o, KReg):
        n = o.num
        return lambda m: m.k[n] & ((1 << bits) - 1)
    if isinstance(o, (Gpr, Mem)):
        get = o.get if isinstance(o, Gpr) else Mem(o.base, o.index, o.scale, o.disp, bits // 8, o.rip, False).get
        return lambda m: get(m) & ((1 << bits) - 1)
    raise d.fail("expected an opmask, GPR or memory operand")


@rule(*(f"kmov{s}" for s in K_WIDTH))
def _kmov(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    bits = K_WIDTH[d.mn[-1]]
    get = _kget(d, src, bits)
    if isinstance(dst, KReg):
        n = dst.num

        def run_k(m: Machine) -> None:
            m.k[n] = get(m)  # zero-extended

        return run_k
    if isinstance(dst, Gpr):
        return lambda m: dst.set(m, get(m))  # a 32/64-bit GPR destination: zero-extended
    if isinstance(dst, Mem):
        put = Mem(dst.base, dst.index, dst.scale, dst.disp, max(bits // 8, 1), dst.rip, False).set
        return lambda m: put(m, get(m))
    raise d.fail(f"unsupported {d.mn} form")


_KLOGIC: dict[str, Callable[[int, int], int]] = {
    "kand": lambda a, b: a & b, "kandn": lambda a, b: ~a & b, "kor": lambda a, b: a | b,
    "kxor": lambda a, b: a ^ b, "kxnor": lambda a, b: ~(a ^ b),
}  # fmt: skip


@rule(*(f"{op}{s}" for op in _KLOGIC for s in K_WIDTH))
def _klogic(d: Decoded) -> Run:
    dst, a, b = operands(d, 3)
    bits = K_WIDTH[d.mn[-1]]
    fn, ga, gb = _KLOGIC[d.mn[:-1]], _kget(d, a, bits), _kget(d, b, bits)
    if not isinstance(dst, KReg):
        raise d.fail(f"{d.mn} writes an opmask")
    n, mask = dst.num, (1 << bits) - 1

    def run(m: Machine) -> None:
        m.k[n] = fn(ga(m), gb(m)) & mask

    return run


@rule(*(f"knot{s}" for s in K_WIDTH), *(f"kshift{lr}{s}" for lr in "lr" for s in K_WIDTH))
def _kunary(d: Decoded) -> Run:
    ops = operands(d, 2 if d.mn.startswith("knot") else 3)
    dst, src = ops[:2]
    bits = K_WIDTH[d.mn[-1]]
    get, mask = _kget(d, src, bits), (1 << bits) - 1
    if not isinstance(dst, KReg):
        raise d.fail(f"{d.mn} writes an opmask")
    n = dst.num
    if d.mn.startswith("knot"):
        fn: Callable[[int], int] = lambda v: ~v
    else:
        c = ops[2].value  # type: ignore[union-attr]
        fn = (lambda v: v << c) if d.mn.startswith("kshiftl") else (lambda v: v >> c)

    def run(m: Machine) -> None:
        m.k[n] = fn(get(m)) & mask if not (len(ops) == 3 and ops[2].value >= bits) else 0  # type: ignore[union-attr]

    return run


@rule(*(f"kortest{s}" for s in K_WIDTH), *(f"ktest{s}" for s in K_WIDTH))
def _ktest(d: Decoded) -> Run:
    a, b = operands(d, 2)
    bits = K_WIDTH[d.mn[-1]]
    ga, gb, mask, ortest = _kget(d, a, bits), _kget(d, b, bits), (1 << bits) - 1, d.mn.startswith("kortest")

    def run(m: Machine) -> None:
        x, y = ga(m), gb(m)
        if ortest:
            m.zf, m.cf = (x | y) == 0, (x | y) == mask
        else:
            m.zf, m.cf = (x & y) == 0, (~x & y & mask) == 0
        m.of = m.sf = m.pf = False

    return run


@rule("vpmovm2d", "vpmovm2q", "vpmovm2b", "vpmovm2w")
def _mask_to_vec(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    es = {"b": 1, "w": 2, "d": 4, "q": 8}[d.mn[-1]]
    if not isinstance(src, KReg):
        raise d.fail(f"{d.mn} reads an opmask")
    w = vec_width(d, dst)
    st, dt = vdst(d, dst, w, es), UINT[es]

    def run(m: Machine) -> None:
        st(m, np.where(lanes(m.k[src.num], w // es), dt.type(MASK[es]), dt.type(0)).view(U8), None)

    return run


@rule("vpmovd2m", "vpmovq2m", "vpmovb2m", "vpmovw2m")
def _vec_to_mask(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    es = {"b": 1, "w": 2, "d": 4, "q": 8}[d.mn[-3]]
    if not isinstance(dst, KReg) or not isinstance(src, VecReg):
        raise d.fail(f"unsupported {d.mn} form")

    def run(m: Machine) -> None:
        m.k[dst.num] = to_bits(m.vec[src.num, : src.size].view(SINT[es]) < 0)

    return run


@rule("vptestmd", "vptestmq", "vptestnmd", "vptestnmq")
def _ptestm(d: Decoded) -> Run:
    """k = (src1 & src2) != 0 per lane (vptestnm: == 0), ANDed with the write mask."""
    dst, a, b = operands(d, 3)
    es = 4 if d.mn.endswith("d") else 8
    if not isinstance(dst, KReg):
        raise d.fail(f"{d.mn} writes an opmask")
    w = vec_width(d, a)
    la, lb, dt, neg = vsrc(d, a, w, es), vsrc(d, b, w, es), UINT[es], "nm" in d.mn

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        nz = (la(m, None).view(dt) & lb(m, kb).view(dt)) != 0
        m.k[dst.num] = to_bits(~nz if neg else nz) & (kb if kb is not None else MASK[8])

    return run


@rule("vgatherdps", "vpgatherdd", "vgatherdpd", "vpgatherdq")
def _gather(d: Decoded) -> Run:
    """Gathers with dword indices: lane i = [base + index_i*scale + disp] for the enabled lanes (VEX: the sign bit
    of the mask register's lane; EVEX: the {k} bit), the other lanes keep the destination; the mask (register or
    k) is cleared afterwards (SDM VGATHERDPS: a completed gather leaves an all-zero mask)."""
    ops = operands(d, 2, 3)
    dst, src = ops[0], ops[1]
    vmask = ops[2] if len(ops) == 3 else None
    if not isinstance(dst, VecReg) or not isinstance(src, Mem) or src.vindex is None:
        raise d.fail(f"{d.mn} takes a vector destination and a vector-indexed (VSIB) memory operand")
    if (vmask is None) == (d.mask == 0) or (vmask is not None and not isinstance(vmask, VecReg)):
        raise d.fail(f"{d.mn} needs exactly one of a vector mask operand (VEX) or an opmask {{k}} (EVEX)")
    es = 4 if d.mn.endswith(("ps", "dd")) else 8
    w, vi, scale = dst.size, src.vindex, src.scale
    n = w // es

    def run(m: Machine) -> None:
        base = (m.gpr[src.base] if src.base is not None else 0) + src.disp
        idx = m.vec[vi, : 4 * n].view(np.int32)
        if vmask is not None:
            enabled = m.vec[vmask.num, :w].view(SINT[es]) < 0
        else:
            enabled = lanes(m.k[d.mask], n)
        r = m.vec[dst.num, :w].copy()
        for i in np.flatnonzero(enabled):
            r[i * es : (i + 1) * es] = m.mem.read((base + int(idx[i]) * scale) & 0xFFFF_FFFF_FFFF_FFFF, es)
        m.vec[dst.num, :w] = r
        m.vec[dst.num, w:] = 0
        if vmask is not None:
            m.vec[vmask.num] = 0
        else:
            m.k[d.mask] = 0

    return run


@rule("vpshufb")
def _pshufb(d: Decoded) -> Run:
    """Per 128-bit lane: byte i = src[lane][ctl_i & 15], or 0 when bit 7 of ctl_i is set."""

    def pick(xs: list[np.ndarray], _: np.ndarray | None) -> np.ndarray:
        src, ctl = xs
        return np.where(ctl & 0x80, 0, np.take_along_axis(src, (ctl & 15).astype(np.intp), axis=1)).astype(np.uint8)

    return _per_lane(d, 1, 2, pick, False)


@rule("vpblendvb")
def _pblendvb(d: Decoded) -> Run:
    dst, a, b, sel = operands(d, 4)
    w = vec_width(d, dst)
    la, lb, ls, st = vsrc(d, a, w, 1), vsrc(d, b, w, 1), vsrc(d, sel, w, 1), vdst(d, dst, w, 1)

    def run(m: Machine) -> None:
        st(m, np.where(ls(m, None) & 0x80, lb(m, None), la(m, None)).astype(np.uint8), None)

    return run


@rule("vpmovmskb")
def _pmovmskb(d: Decoded) -> Run:
    dst, src = operands(d, 2)
    if not isinstance(dst, Gpr) or not isinstance(src, VecReg):
        raise d.fail("vpmovmskb takes a GPR destination and a vector register")

    def run(m: Machine) -> None:
        dst.set(m, to_bits(m.vec[src.num, : src.size] >= 0x80))

    return run


@rule("vcvtph2ps", "vcvtps2ph")
def _half(d: Decoded) -> Run:
    """F16C conversions: half -> float exactly; float -> half rounded to nearest-even (imm8 bit 2 = MXCSR's mode,
    also nearest here; the directed modes are refused)."""
    ops = operands(d, 2 if d.mn == "vcvtph2ps" else 3)
    if d.mn == "vcvtph2ps":
        dst, src = ops
        w = vec_width(d, dst)
        ld, st = vsrc(d, src, w // 2, 2), vdst(d, dst, w, 4)

        def run_up(m: Machine) -> None:
            kb = kbits(m, d)
            st(m, ld(m, None).view(np.float16).astype(np.float32).view(U8), kb)

        return run_up
    dst, src, imm = ops
    if not isinstance(imm, Imm) or not (imm.value & 4 or imm.value & 3 == 0):
        raise d.fail("vcvtps2ph with a directed rounding mode is not supported")
    w = vec_width(d, src)
    ld = vsrc(d, src, w, 4)
    st = vdst(d, dst, max(w // 2, 16) if isinstance(dst, VecReg) else w // 2, 2)

    def run_down(m: Machine) -> None:
        kb = kbits(m, d)
        r = ld(m, None).view(np.float32).astype(np.float16).view(U8)
        if isinstance(dst, VecReg) and r.size < 16:
            r = np.concatenate([r, np.zeros(16 - r.size, U8)])
        st(m, r, kb)

    return run_down


@rule("vscatterdps", "vpscatterdd", "vscatterdpd", "vpscatterdq")
def _scatter(d: Decoded) -> Run:
    """[base + index_i*scale + disp] = src lane i for the {k}-enabled lanes, lowest lane first (a later lane wins an
    overlap); k is cleared afterwards. Masked-off lanes are never addressed."""
    dst, src = operands(d, 2)
    if not isinstance(dst, Mem) or dst.vindex is None or not isinstance(src, VecReg) or not d.mask:
        raise d.fail(f"{d.mn} takes a vector-indexed (VSIB) memory destination with an opmask and a vector source")
    es = 4 if d.mn.endswith(("ps", "dd")) else 8
    n, vi = src.size // es, dst.vindex

    def run(m: Machine) -> None:
        base = (m.gpr[dst.base] if dst.base is not None else 0) + dst.disp
        idx, data = m.vec[vi, : 4 * n].view(np.int32), m.vec[src.num, : src.size].copy()
        for i in np.flatnonzero(lanes(m.k[d.mask], n)):
            m.mem.write((base + int(idx[i]) * dst.scale) & 0xFFFF_FFFF_FFFF_FFFF, data[i * es : (i + 1) * es])
        m.k[d.mask] = 0

    return run


@rule("vshuff32x4", "vshuff64x2", "vshufi32x4", "vshufi64x2")
def _shuffle_128(d: Decoded) -> Run:
    """Whole 128-bit lanes: the low half of the destination's lanes from src1, the high half from src2, each picked
    by an imm8 field (2 bits per lane at zmm, 1 bit at ymm)."""
    dst, a, b, imm = operands(d, 4)
    es = 4 if "32x4" in d.mn else 8
    w = vec_width(d, dst)
    nl = w // 16
    bits = 2 if nl == 4 else 1
    v = imm.value  # type: ignore[union-attr]
    picks = [(v >> (bits * i)) & ((1 << bits) - 1) for i in range(nl)]
    la, lb, st = vsrc(d, a, w, es), vsrc(d, b, w, es), vdst(d, dst, w, es)

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        x, y = la(m, None).reshape(nl, 16), lb(m, kb).reshape(nl, 16)
        st(m, np.concatenate([(x if i < nl // 2 else y)[p] for i, p in enumerate(picks)]), kb)

    return run


@rule("valignd", "valignq")
def _align(d: Decoded) -> Run:
    """Elements imm .. imm+n-1 of the 2n-element concatenation src1:src2 (src2 the low half)."""
    dst, a, b, imm = operands(d, 4)
    es = 4 if d.mn == "valignd" else 8
    w = vec_width(d, dst)
    n = w // es
    shift = imm.value % n  # type: ignore[union-attr]
    la, lb, st, dt = vsrc(d, a, w, es), vsrc(d, b, w, es), vdst(d, dst, w, es), UINT[es]

    def run(m: Machine) -> None:
        kb = kbits(m, d)
        both = np.concatenate([lb(m, kb).view(dt), la(m, None).view(dt)])
        st(m, both[shift : shift + n].view(U8), kb)

    return run
