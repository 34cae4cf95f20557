"""Scoring's product and its top-k in one pass over cache-sized tiles, for a model whose scores are
a product of factors (``Recommender.score_factors``): the exact lists of ``recommend``'s
product-then-``top_k`` path, without writing every score to memory and reading it back.

The users' scores are computed a tile of items at a time (``TILE_SCORES`` floats, about L2's
size: all the block's users times ``tile_items`` items) by the product's usual kernel
(``models.product``), and a C loop (compiled for this CPU, ``models.native``) walks each row of
the tile once: its excluded items set to -inf, then every score compared 16 at a time (AVX-512;
8 with AVX2) with the row's running threshold, the (k + 1)-th largest score so far, kept as the
root of a min-heap of the row's k + 1 best. After the first tiles almost nothing passes, so the
top-k costs about one vector compare per 16 scores where ``models.topk.top_k`` costs a maximum
pass, two rankings and a gather over a block that has left the cache. What it still costs, ~20
us a user of one core at the Yahoo shape (a sixth of the product), is mostly reading the tile
back: the tile's GEMM leaves little of it in L2. A buffer of 4 (k + 1) candidates with
quickselect, in place of the heap's ~400 sift-downs a user, measured the same (151-156 us a user
both) and was not kept; smaller tiles or fewer rows per GEMM were slower (MKL's rate falls below
~300 rows). The measured rates are benchmarks/results/score_throughput.md's.

Exactness: the heap holds the k + 1 largest of the scores the tiles' products wrote, exactly.
If they are finite and strictly decreasing, the top k are unique, items and order, and equal
``torch.topk``'s (the argument of ``models.topk``). A row where that fails (a tie among its
k + 1 best, fewer than k + 1 scores above -inf, a NaN, which the compare lets through and
``torch.topk`` ranks first) is scored again whole and ranked by ``torch.topk``, as before: ties
are broken as they always were. Those rows are recomputed together in a block of at least
``MIN_GEMM_ROWS`` rows, because a GEMM of fewer rows takes another path with other rounding (MKL
below 16 rows on the Xeon 6/207, OpenBLAS at 1).

Are the tiles' scores the whole product's? That is the library's and the CPU's: OpenBLAS's
AVX-512 kernels (SkylakeX, its choice on a Zen 4 and a Zen 5) gave them bit for bit at every
width tried; its Haswell kernels (``OPENBLAS_CORETYPE=Haswell``, which some hosts set) did not,
on a Zen 5: columns at its blocks' edges differ by an ulp; MKL's are at width 200 but not at
width 1000, where about 2% of the scores of a 640-column tile differ from the whole product's by
one unit in the last place. So a list can differ from the unfused path's only where two scores
are within that rounding; on the Gowalla NCE-AutoRec of width 1000 (MKL), 3,000 users, every
list was the same and 10 of 150,000 values differed by 6e-8. The tests check the fused path bit
for bit on operands every kernel multiplies exactly (tests/models/test_stream_topk.py).

``NCE_SCORE_TOPK=torch`` keeps the product-then-``top_k`` path; without a C compiler it is kept
anyway (``available`` says why)."""

from __future__ import annotations

import ctypes
import functools
import os

import torch

from models import native
from models import product as P
from models.batch import row_ids

ENV = "NCE_SCORE_TOPK"
TILE_SCORES = 1 << 18      # floats of scores per tile: 1 MiB, inside a core's L2
MIN_TILE_ITEMS = 256       # a GEMM of fewer columns per call loses more than the cache gains
MIN_GEMM_ROWS = 16         # the fewest rows a recomputed block has (see the module's doc)
MIN_ITEMS = 4096           # smaller catalogues: the scores fit the cache, nothing to gain

SOURCE = r"""
#include <stdint.h>
#include <math.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* restore the min-heap (v, ix) of n entries after its root was replaced */
static void sift_down(float *v, int64_t *ix, int64_t n) {
    int64_t i = 0, xi = ix[0];
    float x = v[0];
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && v[c + 1] < v[c]) c++;
        if (!(v[c] < x)) break;
        v[i] = v[c]; ix[i] = ix[c]; i = c;
    }
    v[i] = x; ix[i] = xi;
}

/* a score the vector compare let through: above the root, or NaN (then only noted) */
static inline void offer(float y, int64_t j, float *v, int64_t *ix, int64_t n, uint8_t *nan) {
    if (y != y) { *nan = 1; return; }
    if (y > v[0]) { v[0] = y; ix[0] = j; sift_down(v, ix, n); }
}

/* One tile: rows x cols scores (row stride ld) of items lo .. lo + cols - 1. Each row's
   excluded items (ex_items[ex_pos[r] .. ex_end[r]), ascending) inside the tile are set to -inf
   first, ex_pos advancing past them; then every score above the row's heap root enters its
   min-heap of n (value, item). */
void stream_topk(float *s, int64_t rows, int64_t cols, int64_t ld, int64_t lo,
                 const int64_t *ex_items, int64_t *ex_pos, const int64_t *ex_end,
                 float *heap_v, int64_t *heap_i, int64_t n, uint8_t *nan)
{
    for (int64_t r = 0; r < rows; r++) {
        float *row = s + r * ld, *v = heap_v + r * n;
        int64_t *ix = heap_i + r * n, e = ex_pos[r];
        for (; e < ex_end[r] && ex_items[e] < lo + cols; e++) row[ex_items[e] - lo] = -INFINITY;
        ex_pos[r] = e;
        int64_t j = 0;
#if defined(__AVX512F__)
        for (; j + 16 <= cols; j += 16) {
            __mmask16 m = _mm512_cmp_ps_mask(_mm512_loadu_ps(row + j), _mm512_set1_ps(v[0]),
                                             _CMP_NLE_UQ);  /* above the root, or NaN */
            while (m) {
                int b = __builtin_ctz(m);
                m &= m - 1;
                offer(row[j + b], lo + j + b, v, ix, n, nan + r);
            }
        }
#elif defined(__AVX2__)
        for (; j + 8 <= cols; j += 8) {
            int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(row + j),
                                                     _mm256_set1_ps(v[0]), _CMP_NLE_UQ));
            while (m) {
                int b = __builtin_ctz(m);
                m &= m - 1;
                offer(row[j + b], lo + j + b, v, ix, n, nan + r);
            }
        }
#endif
        for (; j < cols; j++) offer(row[j], lo + j, v, ix, n, nan + r);
    }
}
"""

_P, _I = ctypes.c_void_p, ctypes.c_int64
SIGNATURES = {"stream_topk": (None, (_P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _I, _P))}


@functools.cache
def library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled kernel, how it was built) or (None, why not), once per process."""
    path, how = native.build("stream_topk", SOURCE)
    if path is None:
        return None, how
    try:
        return native.load(path, SIGNATURES), how
    except OSError as e:  # e.g. a cache folder mounted noexec
        return None, f"{path} did not load: {e}"


def available() -> tuple[bool, str]:
    """Whether ``recommend`` streams its top-k here, and why (not)."""
    pinned = os.environ.get(ENV, "auto")
    if pinned not in ("auto", "native", "torch"):
        raise ValueError(f"{ENV}={pinned!r}: use auto (the native kernel where it builds), "
                         "native (the same, failing where it does not) or torch")
    if pinned == "torch":
        return False, f"{ENV}=torch"
    lib, how = library()
    if lib is None and pinned == "native":
        raise RuntimeError(f"{ENV}=native, but the streaming top-k cannot be built: {how}. "
                           f"Install a C compiler (cc), or unset {ENV} to fall back to torch")
    return lib is not None, how


def applies(a: torch.Tensor, b: torch.Tensor, k: int) -> bool:
    """Whether ``top_k`` takes the product of ``a`` (B, d) and ``b`` (d, n): float32 on a CPU,
    a large catalogue, 0 < k < n."""
    n = b.shape[1]
    return (a.device.type == b.device.type == "cpu" and a.dtype == b.dtype == torch.float32
            and n >= MIN_ITEMS and 0 < k < n and available()[0])


def tile_items(rows: int) -> int:
    """Items per tile for ``rows`` users: ``TILE_SCORES`` floats, at least ``MIN_TILE_ITEMS``, a
    multiple of 64 (whole cache lines and vector registers)."""
    return max(MIN_TILE_ITEMS, (TILE_SCORES // max(rows, 1)) // 64 * 64)


def _ptr(t: torch.Tensor, offset: int = 0) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr() + offset * t.element_size())


def exclusions(items: torch.Tensor, offsets: torch.Tensor, rows: int, n_items: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(items ascending within each row, each row's start, each row's end) of a (items,
    offsets) batch of ``rows`` rows, int64 contiguous, as the C loop walks them."""
    ends = torch.cat([offsets[1:], torch.tensor([len(items)])]).long() if len(offsets) else \
        torch.zeros(rows, dtype=torch.long)
    starts = offsets.long() if len(offsets) else torch.zeros(rows, dtype=torch.long)
    keyed = torch.sort(row_ids(starts, len(items)) * n_items + items.long()).values
    return (keyed % n_items).contiguous(), starts.contiguous().clone(), ends.contiguous()


def top_k(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
          exclude: tuple[torch.Tensor, torch.Tensor], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.topk`` (largest, sorted) of ``models.product.product(a, b, bias)`` with each row's
    ``exclude`` = (items, offsets) items at -inf: (values, indices), each (B, k). Call only where
    ``applies``."""
    lib = library()[0]
    rows, n = a.shape[0], b.shape[1]
    width = k + 1
    heap_v = torch.full((rows, width), -torch.inf)
    heap_i = torch.full((rows, width), -1, dtype=torch.long)
    nan = torch.zeros(rows, dtype=torch.uint8)
    ex_items, ex_pos, ex_end = exclusions(*exclude, rows, n)
    step = tile_items(rows)
    # one kernel for every tile: chosen (by timing, models.product) at the tile's shape
    run = P.kernel_of(a, b[:, :step], None if bias is None else bias[:step],
                      total=b.shape[0] * n)
    fixed = [_ptr(x) for x in (ex_items, ex_pos, ex_end, heap_v, heap_i)]
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        out = run(a, b[:, lo:hi], None if bias is None else bias[lo:hi],
                  P.scratch(rows, hi - lo))
        lib.stream_topk(_ptr(out), rows, hi - lo, hi - lo, lo, *fixed, width, _ptr(nan))
    values, order = torch.sort(heap_v, dim=1, descending=True)
    indices = heap_i.gather(1, order)
    unique = (torch.isfinite(values).all(dim=1) & (values[:, :-1] > values[:, 1:]).all(dim=1)
              & (nan == 0))
    values, indices = values[:, :k].contiguous(), indices[:, :k].contiguous()
    redo = (~unique).nonzero(as_tuple=True)[0]
    if len(redo):
        values[redo], indices[redo] = rank_whole(run, a, b, bias, exclude, redo, k)
    return values, indices


def rank_whole(run, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
               exclude: tuple[torch.Tensor, torch.Tensor], redo: torch.Tensor, k: int
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """The rows ``redo`` scored whole and ranked by ``torch.topk``, in a block padded to at least
    ``MIN_GEMM_ROWS`` rows (repeats of the first) so the GEMM takes the tiles' path."""
    pad = max(0, MIN_GEMM_ROWS - len(redo))
    picked = torch.cat([redo, redo[:1].expand(pad)]) if pad else redo
    scores = run(a[picked], b, bias, None)[:len(redo)]
    items, offsets = exclude
    if len(items):  # each excluded entry's row among the recomputed ones (-1: not recomputed)
        position = torch.full((a.shape[0],), -1, dtype=torch.long)
        position[redo] = torch.arange(len(redo))
        rows = position[row_ids(offsets, len(items))]
        keep = rows >= 0
        scores[rows[keep], items[keep].long()] = -torch.inf
    top = torch.topk(scores, k, dim=1)
    return top.values, top.indices
