"""Scoring's product and its top-k in one pass, for a model whose scores are a product of
factors (``Recommender.score_factors``): the exact lists of ``recommend``'s product-then-``top_k``
path, without writing every score to memory and reading it back. Two paths, in one C source
compiled for this CPU at first use (``models.native``):

- **fused** (AVX-512 CPUs): the scores are computed in vector registers, a micro-tile of 32 users
  times 12 items at a time (24 accumulators of 16 floats, the users' vectors loaded, each item's
  weight broadcast), and compared there with each user's running threshold, the (k + 1)-th
  largest score so far, kept as the root of a min-heap of the row's k + 1 best; a score that
  passes is checked against the user's excluded items and offered to the heap. No score is
  written to memory. The items go in chunks whose weights stay in L2 while every block of users
  passes over them. Why not a BLAS: on the AMD EPYC 26/2 (Zen 5) MKL takes a generic path and
  OpenBLAS, where a host pins it to its Haswell kernels, runs AVX2 at half of AVX-512's width;
  the tiles below ran at 0.35 of one core's measured peak there (0.60 unpinned), this kernel at
  0.70 at the Yahoo shape (width 200) and 0.84 at width 1000. Threads: one slice of whole blocks
  of users per torch thread, on OpenMP (built with ``-fopenmp``, the library shares the libgomp
  torch loaded, so torch's idle threads are the ones that run it instead of spinning beside it).
- **tiles** (any CPU): a tile of ``TILE_SCORES`` floats (all the block's users times
  ``tile_items`` items, about L2's size) by the product's usual BLAS kernel (``models.product``),
  then a C loop walks each row of the tile once: its excluded items set to -inf, then every
  score compared 16 at a time (AVX-512; 8 with AVX2) with the row's running threshold, as above.
  After the first tiles almost nothing passes; what it costs beside the product is mostly
  reading the tile back.

Which runs: ``NCE_SCORE_TOPK`` pins one (``fused``, ``tiles``; ``native``: either, failing where
the C does not build; ``torch``: the product-then-``top_k`` path). Under ``auto`` (the default)
the tiles run where the CPU has no AVX-512 or ``NCE_KERNEL`` pins a BLAS (runs repeating bit for
bit across processes); otherwise the first call of each (items, width, threads) in a process
times both on its own operands and keeps the fused kernel unless the tiles are ``P.MARGIN``
faster. Without a C compiler the torch path is kept (``available`` says why).

Exactness: the heap holds the k + 1 largest of the scores the kernel computed, exactly. If they
are finite and strictly decreasing, the top k are unique, items and order, and equal
``torch.topk``'s on those scores. A row where that fails (a tie among its k + 1 best, fewer than
k + 1 scores above -inf, a NaN, which the compare lets through and ``torch.topk`` ranks first)
is scored again whole by the BLAS (the tiles' kernel, or torch's after the fused kernel) and
ranked by ``torch.topk``, as before: ties are broken as they always were. Those rows are
recomputed together in a block of at least ``MIN_GEMM_ROWS`` rows, because a GEMM of fewer rows
takes another path with other rounding (MKL below 16 rows on the Xeon 6/207, OpenBLAS at 1).

Are the scores the unfused product's? Bit for bit where the operands multiply exactly (the
tests: small integers times multiples of a power of two, so every order of summation gives the
same floats; tests/models/test_stream_topk.py). Otherwise each kernel rounds in its own order:
the fused kernel sums each score over the width in order, one FMA at a time, then adds the bias
(a row's scores do not depend on the other rows of its block); a BLAS blocks the sum. OpenBLAS's
AVX-512 kernels (SkylakeX) give a tile the whole product's bits; its Haswell kernels (which some
hosts pin) and MKL at width 1000 differ by an ulp at some tiles' edges. So a list can differ
from the unfused path's only where two scores are within float32's rounding of each other
(tests/models/test_product.py checks every path's lists against float64 scores);
benchmarks/scoring_exact.py measures it on trained models."""

from __future__ import annotations

import ctypes
import functools
import os
import threading

import torch

from models import native
from models import product as P
from models.batch import row_ids

ENV = "NCE_SCORE_TOPK"
TILE_SCORES = 1 << 18      # floats of scores per tile: 1 MiB, inside a core's L2
MIN_TILE_ITEMS = 256       # a GEMM of fewer columns per call loses more than the cache gains
MIN_GEMM_ROWS = 16         # the fewest rows a recomputed block has (see the module's doc)
MIN_ITEMS = 4096           # smaller catalogues: the scores fit the cache, nothing to gain
CHUNK_BYTES = 1 << 19      # the fused kernel's weights per pass: half of a 1 MiB L2
PATHS = ("auto", "fused", "tiles", "native", "torch")  # NCE_SCORE_TOPK's values

_paths: dict[tuple, str] = {}   # path_for's measured choices
_rows: dict = {}                # item_rows' one kept copy
_rows_lock = threading.Lock()

SOURCE = r"""
#include <stdint.h>
#include <stdlib.h>
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

/* The fused kernel: scores computed a micro-tile at a time in vector registers and offered to
   the heaps from there, so no score is written to memory (AVX-512 only: fused_lanes() says). */
#if defined(__AVX512F__)
#define UV 2            /* user vectors per micro-tile: 32 users, 16 floats each */
#define UB (16 * UV)
#define MI 12           /* items per micro-tile: 24 accumulators + 2 user vectors + 1 broadcast */
int64_t fused_lanes(void) { return 16; }
int64_t fused_users(void) { return UB; }
int64_t fused_items(void) { return MI; }

/* rows users a (row stride lda) times n items w (n x d, row stride ldw) plus bias (n or NULL);
   each row's scores offered to its heap as in stream_topk (exclusions checked only for the
   scores that pass, walking ex_pos forward: each row meets its items in ascending order).
   pack: UB * d floats per block of UB rows, 64-byte aligned (the users transposed, k-major).
   chunk: items per pass over every block of rows, a multiple of MI whose weights stay in L2. */
static void fused_rows(const float *a, int64_t rows, int64_t d, int64_t lda,
                       const float *w, int64_t n, int64_t ldw, const float *bias,
                       const int64_t *ex_items, int64_t *ex_pos, const int64_t *ex_end,
                       float *heap_v, int64_t *heap_i, int64_t hn, uint8_t *nan,
                       float *pack, int64_t chunk)
{
    int64_t blocks = (rows + UB - 1) / UB;
    for (int64_t b = 0; b < blocks; b++) {
        int64_t u0 = b * UB, nu = rows - u0 < UB ? rows - u0 : UB;
        float *pa = pack + b * UB * d;
        for (int64_t k = 0; k < d; k++)
            for (int64_t u = 0; u < UB; u++) pa[k * UB + u] = u < nu ? a[(u0 + u) * lda + k] : 0.0f;
    }
    for (int64_t c0 = 0; c0 < n; c0 += chunk) {
        int64_t c1 = c0 + chunk < n ? c0 + chunk : n;
        for (int64_t b = 0; b < blocks; b++) {
            int64_t u0 = b * UB, nu = rows - u0 < UB ? rows - u0 : UB;
            const float *pa = pack + b * UB * d;
            __mmask16 valid[UV];   /* a block's padding users are never offered */
            float thr[UB] __attribute__((aligned(64)));  /* the heaps' roots, +inf for padding */
            for (int v = 0; v < UV; v++) {
                int64_t m = nu - 16 * v;
                valid[v] = m >= 16 ? 0xFFFF : m <= 0 ? 0 : (__mmask16)((1u << m) - 1);
            }
            for (int64_t u = 0; u < UB; u++) thr[u] = u < nu ? heap_v[(u0 + u) * hn] : INFINITY;
            for (int64_t j0 = c0; j0 < c1; j0 += MI) {
                /* the last micro-tile of the catalogue ends at n: it starts MI before n (n >= MI)
                   and skips the items already offered */
                int64_t jb = j0 + MI <= n ? j0 : n - MI, skip = j0 - jb;
                const float *wr = w + jb * ldw;
                __m512 acc[MI][UV];
#pragma GCC unroll 16
                for (int i = 0; i < MI; i++)
#pragma GCC unroll 4
                    for (int v = 0; v < UV; v++) acc[i][v] = _mm512_setzero_ps();
                for (int64_t k = 0; k < d; k++) {
                    if ((k & 15) == 0) {  /* the next micro-tile's weights, a line ahead: 3-4%
                                             faster at the Yahoo shape (a prefetch past the end
                                             of w is harmless: it never faults) */
#pragma GCC unroll 16
                        for (int i = 0; i < MI; i++)
                            _mm_prefetch((const char *)(wr + (MI + i) * ldw + k), _MM_HINT_T0);
                    }
                    __m512 av[UV];
#pragma GCC unroll 4
                    for (int v = 0; v < UV; v++) av[v] = _mm512_load_ps(pa + k * UB + 16 * v);
#pragma GCC unroll 16
                    for (int i = 0; i < MI; i++) {
                        __m512 x = _mm512_set1_ps(wr[i * ldw + k]);
#pragma GCC unroll 4
                        for (int v = 0; v < UV; v++) acc[i][v] = _mm512_fmadd_ps(av[v], x, acc[i][v]);
                    }
                }
#pragma GCC unroll 16
                for (int i = 0; i < MI; i++) {
                    if (i < skip) continue;
                    uint64_t m = 0;
                    __m512 s[UV];
#pragma GCC unroll 4
                    for (int v = 0; v < UV; v++) {  /* the product, then the bias: BLAS's order */
                        s[v] = bias ? _mm512_add_ps(acc[i][v], _mm512_set1_ps(bias[jb + i]))
                                    : acc[i][v];
                        m |= (uint64_t)_mm512_mask_cmp_ps_mask(
                            valid[v], s[v], _mm512_load_ps(thr + 16 * v), _CMP_NLE_UQ) << (16 * v);
                    }
                    if (!m) continue;
                    float sv[UB] __attribute__((aligned(64)));
#pragma GCC unroll 4
                    for (int v = 0; v < UV; v++) _mm512_store_ps(sv + 16 * v, s[v]);
                    int64_t j = jb + i;
                    while (m) {
                        int u = __builtin_ctzll(m);
                        m &= m - 1;
                        int64_t r = u0 + u, e = ex_pos[r];
                        while (e < ex_end[r] && ex_items[e] < j) e++;
                        ex_pos[r] = e;
                        if (e < ex_end[r] && ex_items[e] == j) continue;  /* left out */
                        float *v = heap_v + r * hn;
                        offer(sv[u], j, v, heap_i + r * hn, hn, nan + r);
                        thr[u] = v[0];
                    }
                }
            }
        }
    }
}

/* fused_rows over slices of whole blocks of rows, one per thread. The threads are OpenMP's:
   built with -fopenmp this library uses the libgomp torch has loaded (same soname), whose
   threads would otherwise spin after torch's last parallel op beside threads of our own and
   take their cores (measured: 2 Python threads right after a torch op 255 GFLOP/s on 2 cores,
   these 360). Returns 0, or
   -1 where a pack buffer could not be allocated. */
int64_t fused_topk(const float *a, int64_t rows, int64_t d, int64_t lda,
                   const float *w, int64_t n, int64_t ldw, const float *bias,
                   const int64_t *ex_items, int64_t *ex_pos, const int64_t *ex_end,
                   float *heap_v, int64_t *heap_i, int64_t hn, uint8_t *nan,
                   int64_t chunk, int64_t threads)
{
    int64_t blocks = (rows + UB - 1) / UB;
    if (threads < 1) threads = 1;
    if (threads > blocks) threads = blocks;
    int64_t per = (blocks + threads - 1) / threads * UB, failed = 0;
#pragma omp parallel for schedule(static, 1) num_threads(threads) if (threads > 1) \
        reduction(|: failed)
    for (int64_t t = 0; t < threads; t++) {
        int64_t lo = t * per, hi = lo + per < rows ? lo + per : rows;
        if (lo >= hi) continue;
        float *pack = aligned_alloc(64, (size_t)((hi - lo + UB - 1) / UB * UB * d * 4 + 64));
        if (!pack) { failed = 1; continue; }
        fused_rows(a + lo * lda, hi - lo, d, lda, w, n, ldw, bias, ex_items, ex_pos + lo,
                   ex_end + lo, heap_v + lo * hn, heap_i + lo * hn, hn, nan + lo, pack, chunk);
        free(pack);
    }
    return failed ? -1 : 0;
}
#else
int64_t fused_lanes(void) { return 0; }
int64_t fused_users(void) { return 0; }
int64_t fused_items(void) { return 0; }
int64_t fused_topk(void) { return -1; }
#endif
"""

_P, _I = ctypes.c_void_p, ctypes.c_int64
SIGNATURES = {"stream_topk": (None, (_P, _I, _I, _I, _I, _P, _P, _P, _P, _P, _I, _P)),
              "fused_topk": (_I, (_P, _I, _I, _I, _P, _I, _I, _P, _P, _P, _P, _P, _P, _I, _P,
                                  _I, _I)),
              "fused_lanes": (_I, ()), "fused_users": (_I, ()), "fused_items": (_I, ())}


@functools.cache
def library() -> tuple[ctypes.CDLL | None, str]:
    """(the compiled kernel, how it was built) or (None, why not), once per process: with
    OpenMP where the compiler has it (the fused kernel's threads), else without (one thread)."""
    path, how = native.build("stream_topk", SOURCE, flags=native.FLAGS + ("-fopenmp",))
    if path is None:
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
    if pinned not in PATHS:
        raise ValueError(f"{ENV}={pinned!r}: use auto (the faster of fused and tiles, measured, "
                         "where the C builds), fused, tiles, native (either, failing where the C "
                         "does not build) or torch")
    if pinned == "torch":
        return False, f"{ENV}=torch"
    lib, how = library()
    if lib is None and pinned != "auto":
        raise RuntimeError(f"{ENV}={pinned}, but the streaming top-k cannot be built: {how}. "
                           f"Install a C compiler (cc), or unset {ENV} to fall back to torch")
    if lib is not None and pinned == "fused" and not lib.fused_lanes():
        raise RuntimeError(f"{ENV}=fused, but this CPU (or compiler) has no AVX-512, which the "
                           f"fused kernel is written for; use {ENV}=tiles or auto")
    return lib is not None, how


def fused_here() -> bool:
    """Whether the fused kernel is built here (a C compiler and AVX-512)."""
    lib = library()[0]
    return lib is not None and lib.fused_lanes() > 0


def applies(a: torch.Tensor, b: torch.Tensor, k: int) -> bool:
    """Whether ``top_k`` takes the product of ``a`` (B, d) and ``b`` (d, n): float32 on a CPU,
    a large catalogue, 0 < k < n."""
    n = b.shape[1]
    return (a.device.type == b.device.type == "cpu" and a.dtype == b.dtype == torch.float32
            and n >= MIN_ITEMS and 0 < k < n and available()[0])


def path_for(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
             exclude: tuple[torch.Tensor, torch.Tensor], k: int) -> str:
    """"fused" or "tiles" for this product: pinned by ``NCE_SCORE_TOPK``; "tiles" where the CPU
    has no AVX-512 or ``NCE_KERNEL`` pins a BLAS (runs that must repeat bit for bit across
    processes keep that BLAS's rounding); else measured once per (items, width, threads) on
    these operands (``choose_path``)."""
    pinned = os.environ.get(ENV, "auto")
    if pinned in ("fused", "tiles"):
        return pinned
    if not fused_here() or P.pinned() is not None:
        return "tiles"
    key = (b.shape[1], b.shape[0], torch.get_num_threads())
    if key not in _paths:
        _paths[key] = choose_path(a, b, bias, exclude, k)
    return _paths[key]


def choose_path(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
                exclude: tuple[torch.Tensor, torch.Tensor], k: int) -> str:
    """"tiles" where its least time (``P.least_times``; the untimed first call also makes the
    tiles' own BLAS choice) is under 1 / ``P.MARGIN`` of the fused kernel's, else "fused":
    near-equal paths keep the fused one, so the choice does not flip between processes on
    noise."""
    best = P.least_times({path: functools.partial(heaps, path, a, b, bias, exclude, k)
                          for path in ("fused", "tiles")})
    return "tiles" if best["tiles"] * P.MARGIN < best["fused"] else "fused"


def chosen_paths() -> dict[tuple, str]:
    """The paths measured so far in this process (reports): (items, width, threads) -> path."""
    return dict(_paths)


def forget_paths() -> None:
    """Measure every shape again at its next call, as a new process would (benchmarks)."""
    _paths.clear()


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
    path = path_for(a, b, bias, exclude, k)
    heap_v, heap_i, nan, run = heaps(path, a, b, bias, exclude, k)
    values, order = torch.sort(heap_v, dim=1, descending=True)
    indices = heap_i.gather(1, order)
    unique = (torch.isfinite(values).all(dim=1) & (values[:, :-1] > values[:, 1:]).all(dim=1)
              & (nan == 0))
    values, indices = values[:, :k].contiguous(), indices[:, :k].contiguous()
    redo = (~unique).nonzero(as_tuple=True)[0]
    if len(redo):  # the fused path's on torch's kernel (``P.on_torch`` says why)
        values[redo], indices[redo] = rank_whole(run or P.on_torch, a, b, bias, exclude, redo, k)
    return values, indices


def heaps(path: str, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
          exclude: tuple[torch.Tensor, torch.Tensor], k: int) -> tuple:
    """Each row's min-heap of its k + 1 best (values, items), its NaN flags, and the product
    kernel the tiles ran (None for the fused kernel), by ``path``."""
    rows, n = a.shape[0], b.shape[1]
    heap_v = torch.full((rows, k + 1), -torch.inf)
    heap_i = torch.full((rows, k + 1), -1, dtype=torch.long)
    nan = torch.zeros(rows, dtype=torch.uint8)
    ex_items, ex_pos, ex_end = exclusions(*exclude, rows, n)
    state = (ex_items, ex_pos, ex_end, heap_v, heap_i, nan)
    if path == "fused":
        fused(a, b, bias, state)
        return heap_v, heap_i, nan, None
    return heap_v, heap_i, nan, tiles(a, b, bias, state)


def tiles(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, state: tuple):
    """The tiles' path: each tile's product by the BLAS kernel ``models.product`` chose, walked
    by ``stream_topk``. Returns that kernel."""
    lib = library()[0]
    ex_items, ex_pos, ex_end, heap_v, heap_i, nan = state
    rows, n = a.shape[0], b.shape[1]
    step = tile_items(rows)
    # one kernel for every tile: chosen (by timing, models.product) at the tile's shape
    run = P.kernel_of(a, b[:, :step], None if bias is None else bias[:step],
                      total=b.shape[0] * n)
    fixed = [_ptr(x) for x in (ex_items, ex_pos, ex_end, heap_v, heap_i)]
    for lo in range(0, n, step):
        hi = min(lo + step, n)
        out = run(a, b[:, lo:hi], None if bias is None else bias[lo:hi],
                  P.scratch(rows, hi - lo))
        lib.stream_topk(_ptr(out), rows, hi - lo, hi - lo, lo, *fixed, heap_v.shape[1],
                        _ptr(nan))
    return run


def fused(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None, state: tuple) -> None:
    """The fused kernel over ``a``'s rows, on torch's threads (slices of whole blocks of users)."""
    lib = library()[0]
    ex_items, ex_pos, ex_end, heap_v, heap_i, nan = state
    a = a if a.stride(1) == 1 else a.contiguous()
    w = item_rows(b)
    bias = None if bias is None else bias.contiguous()
    (rows, d), n = a.shape, w.shape[0]
    done = lib.fused_topk(_ptr(a), rows, d, a.stride(0), _ptr(w), n, w.stride(0),
                          None if bias is None else _ptr(bias), _ptr(ex_items), _ptr(ex_pos),
                          _ptr(ex_end), _ptr(heap_v), _ptr(heap_i), heap_v.shape[1], _ptr(nan),
                          chunk_items(d, lib.fused_items()), torch.get_num_threads())
    if done != 0:
        raise MemoryError(f"the fused top-k could not allocate its {rows} x {d} pack buffers")


def chunk_items(d: int, micro: int) -> int:
    """Items per pass of the fused kernel over its blocks of users: ``CHUNK_BYTES`` of weights
    (they stay in L2 while every block passes), a multiple of the micro-tile's ``micro`` items."""
    return max(micro, CHUNK_BYTES // (4 * d) // micro * micro)


def item_rows(b: torch.Tensor) -> torch.Tensor:
    """``b`` (d, n) as the (n, d) item rows the fused kernel reads: ``b.T`` where it is a view of
    rows (``nn.Linear``'s weight, item factors), else a row-major copy kept for the next call on
    the same unchanged tensor (NCE-PLRec's (rank, n) regression, say: copied once, not per
    block). The copy's key holds ``b`` itself, so its memory cannot be reused under the key."""
    w = b.T
    if w.stride(1) == 1:
        return w
    key = (b.data_ptr(), tuple(b.shape), b.stride(), b._version)
    with _rows_lock:
        if _rows.get("key") != key:
            _rows.update(key=key, source=b, rows=w.contiguous())
        return _rows["rows"]


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
