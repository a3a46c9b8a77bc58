"""The default CPU heuristic: vectorize the contiguous inner output dimension to fill a vector register (or, when
the output has none, unroll the contiguous inner reduce dimension), and make sure the outermost GLOBAL range the
CPU ABI slices across workers is not a tiny one.

For renderers whose vectors are CPU registers (`Renderer.register_blocking`: LLVM, C, x86), matmul-like reductions (an
output axis contiguous in the store and in every load that varies along it, plus another output axis some load does
not vary along) are register-blocked instead: the row axis
is upcast by up to ROW_BLOCK and the contiguous column axis by up to two vector registers, so each reduce step loads
a few broadcast scalars and two vectors and updates ROW_BLOCK x 2 vector accumulators. The column blocks' loop then
goes outermost (it is what the CPU workers split) so one column stripe of the reused input stays in cache while every
row block walks it (with a batch axis both inputs follow, the batches stay outermost and the column blocks go just
outside the row blocks). A column axis some load reaches through j//s and j%s (speck.tensor's column-stripe-major
copy of a large matmul's right operand) counts as contiguous when splitting off the column block makes it so. A long
row axis with no power-of-two factor gets a block of one row. Reductions whose loads are strided along the contiguous
output axis but contiguous along the reduce axis (row sums, softmax's max/sum, a @ b.T) UNROLL the reduce by a vector
and UPCAST a few outputs instead of gathering lane by lane; vectors of 3, 5 or 6 lanes are chosen only for renderers
that declare `odd_vector_widths`. Loop order follows reuse: a small outermost axis the streamed operand does not need
gives way to a big one it does (Winograd's transforms walk images, not window positions, outermost), and column
blocks go outside row blocks. Elementwise copies between layouts upcast the axis their input reads contiguously
before the stored one (a transposing tile). Other renderers keep the plain heuristic unchanged."""

from __future__ import annotations

from typing import TYPE_CHECKING

from speck.codegen.opt.gpu_heuristic import gpu_optimizations
from speck.codegen.opt.kernel_opts import (
    Opt,
    OptOps,
    const_size,
    output_axes,
    reduce_axes,
)
from speck.codegen.opt.kernel_opts import (
    pow2_amount as _pow2_amount,
)
from speck.codegen.opt.kernel_opts import (
    stride as _stride,
)
from speck.codegen.opt.kernel_opts import (
    unmasked_index as _index_of,
)
from speck.uop import AxisType, GroupOp, Ops, PtrDType, UOp, dtypes, graph_rewrite
from speck.uop.symbolic import conjuncts, symbolic

if TYPE_CHECKING:
    from speck.codegen.renderer import Renderer


ROW_BLOCK = 4  # rows of the register block: 4 rows x 2 vectors = 8 accumulators of the 16 AVX2 registers
MIN_OUTER_BLOCKS = 8  # column blocks needed before their loop goes outermost (enough work for 2+ worker threads)
MIN_ODD_ROWS = 64  # an odd row axis at least this long gets a block of one row rather than no blocking
MIN_SCATTER_REDUCE = 64  # reduce steps per output that make a lane-by-lane store of the vector axis negligible
MIN_BATCH_AXIS = 64  # an output axis this long that follows the streamed operand goes outermost (_batch_outermost)
MIN_LONG_REDUCE = 256  # reduce steps per output from which a 2-vector register block takes 8 rows (AVX-512)


def _depends(idx: UOp, r: UOp) -> bool:
    return r in idx.toposort()


def _column_vectors(renderer: Renderer) -> int:
    """Vectors of columns in a matmul's register block: ROW_BLOCK rows of them hold half the vector registers as
    accumulators (2 with AVX2's 16 registers: 4 x 2; 4 with AVX-512's 32: 4 x 4, the 16 accumulators two FMA
    pipes of 4 cycles' latency need to stay busy; a 4 x 1 block of zmm ran at half numpy's speed)."""
    return max(2, renderer.vector_registers // (2 * ROW_BLOCK))


def _split_column_amount(sink: UOp, loads: list[UOp], c: UOp, lanes: int, vectors: int = 2) -> int | None:
    """The largest column block (a power of two, `vectors` vectors down to one) that, split off axis c, makes every
    load that varies along c contiguous along each vector of it, or None. This is for loads c reaches through a
    division and a modulo: matmul's column-stripe-major copy of its right operand is read at
    (j//16)*16*k + r*16 + j%16, which is a plain vector load per stripe once j = 16*jo + ji (a block of 64 columns
    on AVX-512 reads four stripes, one vector load from each)."""
    n = const_size(c)
    if n is None or all(_stride(ix, c) is not None for ix in loads if _depends(ix, c)):
        return None
    nid = 1 + max(a for u in sink.toposort() if u.op is Ops.RANGE for a in u.arg[:-1])
    amt = _pow2_amount(n, vectors * lanes)
    while amt >= lanes:
        # c = outer*amt + hi*lanes + lo: each vector (lo) must be contiguous, the vectors (hi) may lie anywhere
        lo = UOp.range(lanes, nid, AxisType.UPCAST, c.dtype)
        hi = UOp.range(amt // lanes, nid + 1, AxisType.UPCAST, c.dtype)
        outer = UOp.range(n // amt, c.arg[:-1], c.arg[-1], c.dtype)
        at = outer * amt + hi * lanes + lo
        split = [graph_rewrite(ix.substitute({c: at}), symbolic) for ix in loads if _depends(ix, c)]
        if all(_stride(ix, lo) == 1 for ix in split if _depends(ix, lo)):
            return amt
        amt //= 2
    return None


def _register_blocking(sink: UOp, renderer: Renderer, lanes: int) -> list[Opt] | None:
    """Opts that register-block a matmul-like reduction (see the module docstring), or None when it isn't one."""
    if not renderer.register_blocking or lanes < 2 or not reduce_axes(sink):
        return None
    stores = [u for u in sink.toposort() if u.op is Ops.STORE]
    if len(stores) != 1:
        return None
    store_idx = _index_of(stores[0].src[0])
    loads = [_index_of(u.src[0]) for u in sink.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    outs = output_axes(sink)
    glob = [i for i, r in enumerate(outs) if r.arg[-1] is AxisType.GLOBAL and const_size(r) is not None]
    # column axis: contiguous in the store, and every load either ignores it or is contiguous along it
    col = next((i for i in reversed(glob) if _stride(store_idx, outs[i]) == 1), None)
    gated = _gated_axes(sink, outs)
    windowed = len(reduce_axes(sink)) >= 2
    # a plain matmul (two output axes) with columns for MIN_OUTER_BLOCKS wide blocks takes as many column vectors
    # as half the registers hold beside ROW_BLOCK rows (4 x 4 zmm on AVX-512: 256x256 @ 256x512 single-core 520 ->
    # 435 us); convolutions and Winograd's many-axis products keep 2-vector blocks (4 vectors made the CNN step's
    # 38 such kernels ~20% slower), and so do narrow outputs (the MLP's 128-wide ones gained nothing)
    wide = _column_vectors(renderer) * lanes
    plain = len(glob) <= 2 and not windowed and not gated
    ncols = const_size(outs[col]) or 0 if col is not None else 0
    climit = wide if plain and ncols >= MIN_OUTER_BLOCKS * wide else 2 * lanes
    if col is not None and any(_depends(ix, outs[col]) and _stride(ix, outs[col]) != 1 for ix in loads):
        if (split := _split_column_amount(sink, loads, outs[col], lanes, _column_vectors(renderer))) is None:
            return _row_reduce(sink, loads, col, outs[col], lanes, renderer.odd_vector_widths,
                               _mixes_widths(renderer), renderer.vector_registers,
                               renderer.wide_shuffles)  # fmt: skip
        climit = split
    narrow = renderer.odd_vector_widths
    block = _block(glob, outs, loads, col, lanes, climit, gated, narrow) if col is not None else None
    # a convolution (a reduction over channels and a window) vectorizes better over its output channels, read
    # contiguously from channel-last weights, than along an output row whose input loads shift with the window
    # (the transposed convolution of conv2's input gradient: 56 -> 87 GFLOPS)
    if (block is None or windowed) and _reduce_size(sink) >= MIN_SCATTER_REDUCE:
        # a long reduction amortizes a strided store (and strided epilogue loads, read once per output too): any
        # axis the reduction's loads read contiguously (a convolution's output channels over channel-last weights)
        # can be the vector axis
        reds = reduce_axes(sink)
        inner = [ix for ix in loads if any(_depends(ix, r) for r in reds)]
        for alt in reversed(glob):
            a = outs[alt]
            if alt != col and any(_depends(ix, a) for ix in inner) and \
                    all(_stride(ix, a) == 1 for ix in inner if _depends(ix, a)):  # fmt: skip
                if (alt_block := _block(glob, outs, inner, alt, lanes, gated=gated, narrow=narrow)) is not None:
                    block, col = alt_block, alt
                    break
    if block is None or col is None:
        return None
    row, ramt, camt = block
    c = outs[col]
    if gated and ramt == ROW_BLOCK and camt == 2 * lanes and (const_size(c) or 0) % (4 * lanes) == 0:
        # a window over virtual padding, blocked along images: 2 images x 4 vectors of channels beats 4 x 2 (the
        # CNN's three transposed convolutions: 39.6 -> 35.6, 5.2 -> 5.0 and 4.4 -> 4.2 ms); with 32 vector registers
        # (AVX-512) 4 images x 4 vectors fit (conv4's input gradient: 4.57 -> 4.32 ms single-core)
        ramt, camt = ramt if renderer.vector_registers >= 32 else ramt // 2, camt * 2
    if _second_row(glob, outs, loads, col, row) is None:
        ramt = _taller_block(renderer, windowed, gated, ramt, camt, lanes, const_size(outs[row]) or 0,
                             _reduce_size(sink))  # fmt: skip
    # the row upcasts come first so the column lanes are the innermost (contiguous) ones after expansion
    opts = [Opt(OptOps.UPCAST, row, ramt)] if ramt > 1 else []
    if camt <= lanes and ramt == ROW_BLOCK and (row2 := _second_row(glob, outs, loads, col, row)) is not None:
        opts.append(Opt(OptOps.UPCAST, row2, 2))
    elif _wide_window_block(renderer, windowed, gated, ramt, camt, lanes, loads, outs[row]) and \
            (row2 := _second_row(glob, outs, loads, col, row, outermost=True)) is not None:  # fmt: skip
        opts.append(Opt(OptOps.UPCAST, row2, 2))
    opts += [Opt(OptOps.UPCAST, col, camt)]
    if (batch := _batch_outermost(glob, outs, loads, row, col)) is not None:
        opts.append(Opt(OptOps.SWAP, glob[0], batch))
    elif (const_size(c) or 0) // camt >= MIN_OUTER_BLOCKS:
        if len(glob) == 2 and col != glob[0]:
            opts.append(Opt(OptOps.SWAP, glob[0], col))
        elif len(glob) == 3 and glob.index(row) < glob.index(col) and glob[0] not in (row, col):
            # a batch axis both operands follow stays outermost (the workers split batches); within a batch the
            # column blocks still go outside the row blocks. So does an outer axis only the streamed operand
            # follows (Winograd's second transform pass, (p0, p1, N*T*T*C) over q: each 8 x 32 slab of its input
            # then serves both row blocks from L1 rather than being read again from L3 for the second: 3.0 -> 2.2
            # and 3.6 -> 2.7 ms single-core)
            opts.append(Opt(OptOps.SWAP, row, col))
    return opts


def _batch_outermost(glob: list[int], outs: list[UOp], loads: list[UOp], row: int, col: int) -> int | None:
    """A big axis to swap with a small outermost one, or None. Winograd's transforms, (q, p, N, T, T, C) over the
    input's tiles, block rows of p and columns of C; with the small window axis q outermost and p next, the loops
    over N sweep every image once per (q, p block): 16 passes over the whole 13 MB input. The images outermost
    (each image's 74 KB swept while it is in cache) made the CNN's two 8x8 input transforms 4.5 -> 2.9 and 5.5 ->
    2.5 ms single-core. The axis must be one every load the row block reuses (the streamed operand) follows, at
    least MIN_BATCH_AXIS long and 4x the outermost axis."""
    if len(glob) < 4 or glob[0] in (row, col):
        return None
    n0 = const_size(outs[glob[0]]) or 0
    streamed = [ix for ix in loads if not _depends(ix, outs[row])]
    if not streamed:
        return None
    best = None
    for i in glob[1:]:
        n = const_size(outs[i]) or 0
        if i in (row, col) or n < max(MIN_BATCH_AXIS, 4 * n0):
            continue
        if all(_depends(ix, outs[i]) for ix in streamed) and (best is None or n > (const_size(outs[best]) or 0)):
            best = i
    return best


def _renumbered(opts: list[Opt], outs: list[UOp]) -> list[Opt]:
    """`opts` naming output axes by their place in `outs` (the kernel before any opt), renamed to the places the
    axes have when each opt applies: an UPCAST by a whole axis removes it (its outer range has size 1), shifting the
    later axes down (a 2-image block of a batch of 2 left the next opt naming the wrong axis, so none applied); the
    new upcast axes go after every original one and move none. Opts on reduce axes (UNROLL) keep their numbers; an
    opt on an output axis already gone is dropped (a SWAP with a wholly upcast axis has nothing to move)."""
    alive = list(range(len(outs)))
    out: list[Opt] = []
    for o in opts:
        if o.op not in (OptOps.UPCAST, OptOps.SWAP, OptOps.THREAD, OptOps.PADTO) or o.axis is None:
            out.append(o)
            continue
        if o.axis not in alive or (o.op is OptOps.SWAP and o.arg not in alive):
            continue
        arg = alive.index(o.arg) if o.op is OptOps.SWAP and isinstance(o.arg, int) else o.arg
        out.append(Opt(o.op, alive.index(o.axis), arg))
        if o.op is OptOps.UPCAST and const_size(outs[o.axis]) == o.arg:
            alive.remove(o.axis)
    return out


def _gated_axes(sink: UOp, outs: list[UOp]) -> set[UOp]:
    """Output axes that a load's gate ties to a reduction range (`0 <= y + ky < 20`: a window over virtual
    padding). As loop counters they bound the reduction (lower/gated_ranges.py); as register-block lanes each lane
    would need its own gate, a select per load (a transposed convolution blocked along such an axis ran 2x slower)."""
    reds = set(reduce_axes(sink))
    out: set[UOp] = set()
    for u in sink.toposort():
        if u.op is Ops.INDEX and len(u.src) == 2 and u.src[1].op is Ops.WHERE:
            for clause in conjuncts(u.src[1].src[0]):
                rs = {x for x in clause.toposort() if x.op is Ops.RANGE}
                if rs & reds:
                    out |= rs & set(outs)
    return out


def _block(glob: list[int], outs: list[UOp], loads: list[UOp], col: int, lanes: int,
           climit: int | None = None, gated: set[UOp] | None = None,
           narrow: bool = False) -> tuple[int, int, int] | None:  # fmt: skip
    """(row axis, row amount, column amount) of a register block with vector axis col (at most climit columns,
    default 2 vectors), or None: the row is another output axis some load ignores (upcasting it reuses that load
    across rows). Axes in `gated` (see _gated_axes) are rows only when nothing else is."""
    camt = _pow2_amount(const_size(outs[col]) or 1, climit or 2 * lanes)
    rows = list(reversed([i for i in glob if i != col and any(not _depends(ix, outs[i]) for ix in loads)]))
    # `narrow`: a renderer whose vectors may be narrower than a register (odd_vector_widths) blocks a column of 8
    # lanes, half an AVX-512 vector, too (conv1's 24-wide output rows: 2.8 -> 1.1 ms single-core)
    if camt < (min(lanes, 8) if narrow else lanes) or not rows:
        return None
    # the row with the biggest block (the innermost on a tie): ROW_BLOCK rows where they divide it, else up to
    # ROW_BLOCK + 1. A row of 10 or 6 splits by 2 as a power of two, but 5 or 3 rows fill the registers better
    # (conv3's input gradient over 10x10: 7.5 -> 5.6 ms), a 5x5 weight gradient blocks its 5 window columns rather
    # than 4 input channels (-10%), and a 6x6 convolution blocks 4 images rather than 3 columns (-8%)
    # Rows the vector loads ignore come first: each vector loaded then feeds every row (conv1's input row, read
    # along the output row, serves 4 output channels rather than 4 output rows: -20%)
    vec_loads = [ix for ix in loads if _depends(ix, outs[col])]
    best: tuple[int, int, tuple[bool, bool, int]] | None = None
    for row in rows:
        n = const_size(outs[row]) or 1
        ramt = _row_amount(n)
        key = (outs[row] not in (gated or ()), not any(_depends(ix, outs[row]) for ix in vec_loads), ramt)
        if ramt >= 2 and (best is None or key > best[2]):
            best = (row, ramt, key)
    if best is not None:
        return best[0], best[1], camt
    # no such row: a small axis upcast whole still fits the registers
    for row in rows:
        if 2 <= (n := const_size(outs[row]) or 1) <= ROW_BLOCK + 2:
            return row, n, camt
    # a long odd row axis (1001 rows): one row of vectors still beats leaving the kernel unblocked
    for row in rows:
        if (const_size(outs[row]) or 0) >= MIN_ODD_ROWS:
            return row, 1, camt
    return None


def _row_amount(n: int) -> int:
    """Rows of a register block along an axis of n: ROW_BLOCK where it divides n, else the largest divisor up to
    ROW_BLOCK + 1 (1 when there is none)."""
    if n % ROW_BLOCK == 0:
        return ROW_BLOCK
    return max((d for d in range(2, ROW_BLOCK + 2) if n % d == 0), default=1)


def _wide_window_block(renderer: Renderer, windowed: bool, gated: set[UOp], ramt: int, camt: int, lanes: int,
                       loads: list[UOp], row: UOp) -> bool:  # fmt: skip
    """A convolution's ROW_BLOCK x 2-vector block on a target with 32 vector registers (AVX-512) has registers for
    twice the rows, when its rows are window positions one load reads contiguously (a vector of input pixels feeds
    the row block): a second row axis by 2 gives 16 accumulators per pass over the weights (conv2's forward,
    128x32x20x20 over 32x5x5: 25.6 -> 24.0 ms single-core). Not for rows a load reaches with a stride (images:
    the 6x6 forward got 5% slower) nor gated windows (the input gradients: 10% slower)."""
    if renderer.vector_registers < 32 or not windowed or gated or ramt != ROW_BLOCK or camt != 2 * lanes:
        return False
    return any(_stride(ix, row) == 1 for ix in loads if _depends(ix, row))


def _taller_block(renderer: Renderer, windowed: bool, gated: set[UOp], ramt: int, camt: int, lanes: int,
                  nrows: int, nreduce: int = 0) -> int:  # fmt: skip
    """Rows of the register block of a plain matmul whose columns give a single vector (784 = 49 x 16 on
    AVX-512): a ROW_BLOCK x 1 block has 4 accumulators, too few for two FMA pipes; with 32 vector registers the
    rows double while they divide the axis, up to half the registers as accumulators (the MLP's weight gradient,
    128x784 over a batch of 128, single-core: 4 rows 323 us, 8 rows 248 us, 16 rows 224 us). With two vectors of
    columns the rows double too where the reduction is long (at least MIN_LONG_REDUCE steps): each pass over the
    streamed operand then serves twice the rows (Winograd's weight gradients, (64, 32, 32) over 3200 images x
    tiles: 7.4 -> 6.9 ms single-core, (16, 64, 64) over 1152: 1.58 -> 1.35 ms); over a short reduction (the
    forward's 32 channels) the block's stores dominate and 8 rows gain nothing. Convolutions keep their tuned
    blocks."""
    if renderer.vector_registers < 32 or windowed or gated or ramt != ROW_BLOCK:
        return ramt
    if camt == 2 * lanes and nreduce >= MIN_LONG_REDUCE and nrows % (2 * ramt) == 0:
        return 2 * ramt  # (2 vectors x 8 rows: half the registers)
    if camt != lanes:
        return ramt
    while 2 * ramt <= renderer.vector_registers // 2 and nrows % (2 * ramt) == 0:
        ramt *= 2
    return ramt


def _second_row(glob: list[int], outs: list[UOp], loads: list[UOp], col: int, row: int,
                outermost: bool = False) -> int | None:  # fmt: skip
    """With a single vector of columns the block has registers to spare: a second row axis some load ignores, by 2
    (4 x 2 accumulators; conv1's forward blocks 4 output channels x 2 output rows). `outermost`: the outermost such
    axis (a convolution's images rather than its output rows: 24.0 against 24.5 ms for conv2's forward)."""
    for i in glob if outermost else reversed(glob):
        if i in (col, row) or (const_size(outs[i]) or 1) % 2 != 0:
            continue
        if any(not _depends(ix, outs[i]) for ix in loads):
            return i
    return None


def _reduce_size(sink: UOp) -> int:
    n = 1
    for r in reduce_axes(sink):
        n *= const_size(r) or 1
    return n


def _mixes_widths(renderer: Renderer) -> bool:
    """Whether the renderer takes power-of-two vectors narrower than a register beside full ones in one kernel (4
    lanes next to AVX-512's 16): any renderer taking any vector width, and one declaring `mixed_vector_widths`
    (x86, whose selector widens a narrow vector's 16-lane GEP into a zmm)."""
    return renderer.odd_vector_widths or renderer.mixed_vector_widths


def _row_reduce(sink: UOp, loads: list[UOp], col: int, c: UOp, lanes: int, any_width: bool, mixed: bool,
                registers: int = 16, wide_shuffles: bool = True) -> list[Opt] | None:  # fmt: skip
    """A reduction whose loads are strided along the contiguous output axis but contiguous along a reduce axis (row
    sums/maxes, dot products against rows): vector loads along the reduce axis (UNROLL), a few outputs at once
    (UPCAST, so the per-step horizontal combine fills a vector) instead of gathering lane by lane."""
    reds = reduce_axes(sink)
    for j in reversed(range(len(reds))):
        r, n = reds[j], const_size(reds[j])
        if n is None or not any(_stride(ix, r) == 1 for ix in loads):
            continue
        uamt = _pow2_amount(n, lanes)
        # half a vector still beats gathers, and so does a 4-lane one with AVX-512's 16 lanes where the renderer
        # mixes vector widths (a 20-wide image row unrolls by 4: BatchNorm's backward sums over 128x20x20 after a
        # max-pool, 3.1 -> 1.0 ms single-core with LLVM; with x86's selector 261 -> 110 us at 32x32x20x20)
        if uamt < (min(max(lanes // 2, 2), 4) if mixed else max(lanes // 2, 2)):
            if not (any_width and 2 < n <= lanes and _reduce_size(sink) >= MIN_SCATTER_REDUCE):
                return None
            uamt = n  # a short row of a long reduction (a 6x6 feature map) unrolls whole
        nc = const_size(c) or 1
        camt = _pow2_amount(nc, ROW_BLOCK)
        if camt < ROW_BLOCK and any_width:  # 10 classes: blocks of 5
            camt = max(d for d in range(camt, ROW_BLOCK + 2) if nc % d == 0)
        if all(_depends(ix, c) for ix in loads) and any(_depends(ix, r) and _stride(ix, r) != 1 for ix in loads):
            # no load is shared between the columns and some load is read lane by lane along the unrolled axis (a
            # pooled operand at w // 2): upcasting the columns would only multiply those scalar loads (BatchNorm's
            # backward sums after a max-pool: 3.0 -> 1.7 ms); without such loads the columns' separate
            # accumulators still pay for themselves
            camt = 1
        opts = [Opt(OptOps.UPCAST, col, camt)] if camt > 1 else []
        # a second output axis one operand ignores (x @ W.T: W's rows are shared by every row of x) blocks too, so
        # each loaded vector feeds several dot products: 2 x 4 of them per step with 16 vector registers, 4 x 4
        # with AVX-512's 32 (half the registers hold accumulators; Linear forward 0.53 -> 0.40 ms at 128x784x128
        # with 2 x 4, then 239 -> 227 us single-core with 4 x 4 on AVX-512; the CNN's classifier 3x faster)
        outs = output_axes(sink)
        for i in reversed(range(len(outs))):
            r, nr = outs[i], const_size(outs[i])
            if i == col or nr is None or r.arg[-1] is not AxisType.GLOBAL:
                continue
            if any(not _depends(ix, r) for ix in loads) and any(_depends(ix, r) for ix in loads):
                if (ramt := _pow2_amount(nr, _dot_rows(camt, registers, wide_shuffles))) > 1:
                    opts.insert(0, Opt(OptOps.UPCAST, i, ramt))
                break
        return opts + [Opt(OptOps.UNROLL, j, uamt)]
    return None


def _dot_rows(camt: int, registers: int, wide_shuffles: bool) -> int:
    """Rows of x @ W.T's block of dot products beside camt columns: half the registers hold accumulators, at
    least 2 rows. Where lanes combine one at a time (x86) more than 16 registers don't pay (a 4 x 4 block: 346 ->
    658 us) and the 2 rows need registers for their accumulators and each step's loads too (x86's AVX2 code has 13
    to allocate: 2 x 4 spilled three accumulators, 877 us against 460 for 1 x 4)."""
    camt = max(camt, 1)
    if wide_shuffles:  # (LLVM folds the loads into the FMAs)
        return max(2, registers // 2 // camt)
    budget = min(registers, 16)
    return max(2 if 3 * camt + 2 <= budget else 1, budget // 2 // camt)


def _reuse_block(sink: UOp, outs: list[UOp], loads: list[UOp], red: UOp, registers: int = 16) -> list[Opt]:
    """A reduction unrolled by a vector along `red` whose outputs can't be vectorized (a 5-wide store) still gets a
    block of outputs when loads are shared between them: the innermost small output axis (at most ROW_BLOCK + 2)
    whole, where some load along `red` ignores it, and another such axis by 2. conv1's weight gradient: each
    vector of the output gradient feeds the 5 window columns, each vector of the image 2 output channels, 10
    accumulators (6.3 -> 1.4 ms, and no channel-last copy of the gradient is needed). With 32 vector registers
    (AVX-512) the second axis goes by 8 where it divides (4 otherwise): conv1's weight gradient 2.5 -> 2.0 ms
    single-core with 4, 2.2 -> 1.7 ms with 8 (interleaved; 16 was no better than 4)."""
    inner = [ix for ix in loads if _depends(ix, red)]
    glob = [i for i, r in enumerate(outs) if r.arg[-1] is AxisType.GLOBAL and const_size(r) is not None]
    shared = [i for i in reversed(glob) if any(not _depends(ix, outs[i]) for ix in inner)]
    first = next((i for i in shared if 2 <= (const_size(outs[i]) or 0) <= ROW_BLOCK + 2), None)
    if first is None or _reduce_size(sink) < MIN_SCATTER_REDUCE:
        return []
    opts = [Opt(OptOps.UPCAST, first, const_size(outs[first]))]
    # the second axis must be shared by the other operand: it reuses what the first axis doesn't
    second = next((i for i in shared if i != first and (const_size(outs[i]) or 1) % 2 == 0 and
                   {id(ix) for ix in inner if not _depends(ix, outs[i])} !=
                   {id(ix) for ix in inner if not _depends(ix, outs[first])}), None)  # fmt: skip
    if second is not None:
        n = const_size(outs[second]) or 1
        amt = (8 if n % 8 == 0 else 4 if n % 4 == 0 else 2) if registers >= 32 else 2
        opts.insert(0, Opt(OptOps.UPCAST, second, amt))
    return opts


def _transpose_block(sink: UOp, outs: list[UOp], col: int, lanes: int, renderer: Renderer) -> list[Opt]:
    """An elementwise copy between layouts (Winograd's channel-last copies and back: (N, C, H, W) <-> (N, H, W, C))
    stores along `col` but reads some input with a stride along it: upcast alone, each vector lane of the store is
    a scalar load from another cache line. Upcasting first the axis such a load reads contiguously (C, by a vector)
    makes the block a tile of the transpose: its loads (still scalars) are whole runs of channels, each one cache
    line used entirely while it is in L1, and its stores whole vectors (conv2's output copied back to
    (N, C, H, W): 1.97 -> 0.84 ms single-core; upcasting the row first, vector loads and scalar stores, 1.55 ms).
    Only for kernels without a reduction, where the renderer register-blocks (its vectors are CPU registers) and
    shuffles whole registers (`wide_shuffles`, LLVM); x86's selector keeps the plain upcast."""
    if not (renderer.register_blocking and renderer.wide_shuffles) or reduce_axes(sink) or \
            _mostly_scalar(sink, renderer):  # fmt: skip
        return []
    loads = [_index_of(u.src[0]) for u in sink.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
    c = outs[col]
    gathers = [ix for ix in loads if _depends(ix, c) and _stride(ix, c) != 1]
    if not gathers:
        return []
    for j in reversed(range(len(outs))):
        r, n = outs[j], const_size(outs[j])
        if j == col or n is None or r.arg[-1] is not AxisType.GLOBAL:
            continue
        if all(_stride(ix, r) == 1 for ix in gathers) and (amt := _pow2_amount(n, lanes)) >= min(lanes, 8):
            return [Opt(OptOps.UPCAST, j, amt)]
    return []


# ALU ops the pipeline decomposes into many: how many ops of their own dtype each becomes (THREEFRY: ~100 32-bit ops)
DECOMPOSED_OPS = {Ops.THREEFRY: 64}


def _mostly_scalar(sink: UOp, renderer: Renderer) -> bool:
    """Most of the kernel's arithmetic (index math aside) is on dtypes the renderer holds one to a register
    (`max_vec_lanes(dt) == 1`, e.g. x86's integers): upcasting the output would only repeat that scalar code per
    lane, multiplying the live values (a weight initialisation's THREEFRY on x86: 8 interleaved copies of ~100
    integer ops, all spilled). Renderers with vectors of every dtype (LLVM, C) never see this."""
    scalar = vector = 0
    for u in sink.toposort():
        if u.op not in GroupOp.ALU:
            continue
        dt = (u.src[0] if u.op in GroupOp.Comparison else u).dtype
        if dt.is_weak:  # index math (and untyped literals)
            continue
        n = DECOMPOSED_OPS.get(u.op, 1)
        if renderer.max_vec_lanes(dt) > 1:
            vector += n
        else:
            scalar += n
    return scalar > vector


def hand_coded_optimizations(sink: UOp, renderer: Renderer) -> list[Opt]:
    """Opts for a CPU target: register-block matmul-like reductions where the renderer declares
    `register_blocking` (module docstring),
    else UPCAST the innermost contiguous output axis to the vector width of the output dtype, else UNROLL the
    innermost contiguous reduce axis; SWAP a tiny outermost GLOBAL axis with a large one so the worker split has
    something to divide."""
    if renderer.has_local:  # a GPU: workgroups, not CPU vectors and threads
        return gpu_optimizations(sink, renderer)
    opts: list[Opt] = []
    stores = [u for u in sink.toposort() if u.op is Ops.STORE]
    if not stores:
        return opts
    st = stores[0]
    buf_dt = st.src[0].src[0].dtype
    assert isinstance(buf_dt, PtrDType)
    lanes = renderer.max_vec_lanes(buf_dt.base) if not _mostly_scalar(sink, renderer) else 1
    blocked = _register_blocking(sink, renderer, lanes)
    if blocked is not None:
        return _renumbered(blocked, output_axes(sink))
    outs = output_axes(sink)
    store_idx = _index_of(st.src[0])
    transposed = False
    if lanes > 1:
        done = False
        for i in reversed(range(len(outs))):
            r, n = outs[i], const_size(outs[i])
            if n is None or r.arg[-1] is not AxisType.GLOBAL or _stride(store_idx, r) != 1:
                continue
            amt = _pow2_amount(n, lanes)
            if amt > 1:
                # (a 2-lane store gains nothing from a transposing block: 6x6 and 10x10 maps)
                block = _transpose_block(sink, outs, i, lanes, renderer) if amt >= 4 else []
                transposed = bool(block)
                opts += _renumbered(block + [Opt(OptOps.UPCAST, i, amt)], outs)
                done = True
            break
        if not done:
            reds = reduce_axes(sink)
            loads = [u.src[0] for u in sink.toposort() if u.op is Ops.LOAD and u.src[0].op is Ops.INDEX]
            for j in reversed(range(len(reds))):
                r, n = reds[j], const_size(reds[j])
                if n is None or not any(_stride(_index_of(ix), r) == 1 for ix in loads):
                    continue
                amt = _pow2_amount(n, min(lanes, 8))
                if amt > 1:
                    # (the unroll is at most 8 lanes, so with AVX-512's 16 a full unroll is 8 too)
                    if amt == min(lanes, 8) and renderer.odd_vector_widths:
                        opts += _reuse_block(sink, outs, [_index_of(ix) for ix in loads], r,
                                             renderer.vector_registers)  # fmt: skip
                    opts.append(Opt(OptOps.UNROLL, j, amt))
                break
    globals_ = [(i, r) for i, r in enumerate(outs) if r.arg[-1] is AxisType.GLOBAL]
    if len(globals_) >= 2:
        (i0, r0), rest = globals_[0], globals_[1:]
        n0 = const_size(r0)
        big = [(i, r) for i, r in rest if (const_size(r) or 0) >= 32]
        upcast_axes = {o.axis for o in opts if o.op is OptOps.UPCAST}
        if n0 is not None and n0 < 4 and big and big[0][0] not in upcast_axes and not transposed:
            opts.insert(0, Opt(OptOps.SWAP, i0, big[0][0]))
    _ = dtypes
    return opts
