"""The machine's physical arithmetic peak, measured: a C loop of independent fused multiply-adds in
vector registers, compiled here for this CPU (``cc -O2 -march=native``), timed in one-thread
processes side by side. No library's kernel can beat it, so a stage's product rate over it says
how much of the machine a kernel leaves unused (what a vendor-dispatching BLAS withholds from an
AMD CPU, for one).

    fp32   CHAINS accumulators x LANES floats (16 with AVX-512, 8 with AVX2), acc = acc * x + y:
           2 FLOP per lane per instruction; CHAINS (16) exceeds FMA latency x FMA ports of every
           x86 core made, so each port issues every cycle
    bf16   AVX512_BF16's dot product (vdpbf16ps) where the CPU has it: 32 bf16 pairs summed into
           16 fp32 lanes, 64 FLOP per instruction. It is what a bf16 product without AMX can
           reach; AMX tiles (amx_bf16) are faster again and are measured by the bf16 matmul of
           floors.py, through oneDNN, not here.

Without a C compiler the peak is recorded as unmeasured, with the reason; nothing else depends on
it. The kernels' arithmetic is checked in tests/benchmarks/test_peak.py on a few iterations."""

from __future__ import annotations

import ctypes

from models import native

CHAINS = 16
SOURCE = r"""
#include <stdint.h>
#if defined(__AVX512F__)
#define LANES 16
#elif defined(__AVX__)
#define LANES 8
#else
#define LANES 4
#endif
#define CHAINS @CHAINS@
typedef float vf __attribute__((vector_size(LANES * 4)));

/* CHAINS independent recurrences acc = acc * x + y; the sum is returned so that nothing is
   optimised away (without -ffast-math the compiler may not reassociate them) */
double fma_fp32(int64_t iters, float x, float y) {
    vf acc[CHAINS], vx, vy;
    for (int j = 0; j < LANES; j++) { vx[j] = x; vy[j] = y; }
    for (int c = 0; c < CHAINS; c++) for (int j = 0; j < LANES; j++) acc[c][j] = (float)c;
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * vx + vy;
    }
    double s = 0;
    for (int c = 0; c < CHAINS; c++) for (int j = 0; j < LANES; j++) s += acc[c][j];
    return s;
}
int fma_lanes(void) { return LANES; }

#if defined(__AVX512BF16__)
#include <immintrin.h>
/* every accumulator lane gains a.b summed over its pair of bf16s: 2 a b per instruction */
double dp_bf16(int64_t iters, float a, float b) {
    __m512 acc[CHAINS];
    __m512bh va = _mm512_cvtne2ps_pbh(_mm512_set1_ps(a), _mm512_set1_ps(a));
    __m512bh vb = _mm512_cvtne2ps_pbh(_mm512_set1_ps(b), _mm512_set1_ps(b));
    for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_setzero_ps();
    for (int64_t i = 0; i < iters; i++) {
#pragma GCC unroll 16
        for (int c = 0; c < CHAINS; c++) acc[c] = _mm512_dpbf16_ps(acc[c], va, vb);
    }
    double s = 0;
    for (int c = 0; c < CHAINS; c++) s += _mm512_reduce_add_ps(acc[c]);
    return s;
}
int has_bf16(void) { return 1; }
#else
double dp_bf16(int64_t iters, float a, float b) { (void)iters; (void)a; (void)b; return 0; }
int has_bf16(void) { return 0; }
#endif
""".replace("@CHAINS@", str(CHAINS))
def compiler() -> str | None:
    return native.compiler()


def build(folder: str | None = None) -> tuple[str | None, str]:
    """(path of the compiled library, the command) or (None, why not): ``models.native.build``,
    once per source, flags and CPU (in ``folder`` where given, else its cache folder)."""
    path, how = native.build("peak", SOURCE, folder)
    return path, (how if path else f"{how}: the peak is not measured")


def load(path: str):
    sig = (ctypes.c_double, (ctypes.c_int64, ctypes.c_float, ctypes.c_float))
    return native.load(path, {"fma_fp32": sig, "dp_bf16": sig})


def flop_per_iteration(lib, kind: str) -> int:
    """FLOPs one iteration of ``kind``'s loop does: CHAINS instructions of 2 x LANES (fp32 FMA)
    or 2 x 32 (a bf16 dot product of 32 pairs into 16 lanes)."""
    return CHAINS * (2 * lib.fma_lanes() if kind == "fp32" else 2 * 32)


def kernel(path: str, kind: str, iters: int = 2_000_000):
    """A floors.py kernel: one call runs ``iters`` iterations and returns the FLOPs done."""
    lib = load(path)
    if kind == "bf16" and not lib.has_bf16():
        raise ValueError("this CPU (or compiler) has no AVX512_BF16")
    fn = lib.fma_fp32 if kind == "fp32" else lib.dp_bf16
    flop = float(flop_per_iteration(lib, kind) * iters)

    def run() -> float:
        fn(iters, 1.0, 0.5 if kind == "fp32" else 1.0)
        return flop
    return run


def has_bf16(path: str) -> bool:
    return bool(load(path).has_bf16())
