"""The float32 products of scoring and of the fast loss's training step, on the faster exact
kernel this process has: torch's (MKL in the x86 wheels) or numpy's (OpenBLAS in its wheels).

Why: MKL takes a generic path on AMD CPUs. At the Yahoo shape (44,865 items, width 200, blocks
of 93 users, one thread) ``F.linear`` ran at 36 GFLOP/s where ``numpy.matmul`` ran at 69-77 on
the same AMD EPYC (Zen 3, AVX2) host; on the Intel hosts MKL is the faster one. Training's
products differ again: numpy runs the Gram W'W as a SYRK (half the arithmetic), which MKL's
matmul never does. Which is faster depends on the CPU, the product and the libraries installed,
not on a vendor string, so the first product of each shape in a process times both on its own
operands and keeps numpy's only where it is ``MARGIN`` faster (near-equal kernels keep torch's,
so the choice does not flip between processes on noise). ``NCE_KERNEL=torch|numpy`` pins one
(for runs that must repeat bit for bit across processes); products too small to win anything
(``MIN_CHOSEN`` weights for scoring, ``MIN_MACS`` for ``mm``) always use torch's.

Exactness: both are float32 GEMMs accumulating in float32, so their results differ by rounding
only, and a top-k list can differ only between scores that close (tests/models/test_product.py
checks the lists of both against a float64 reference). Neither gives a row a result that
depends on that row alone: OpenBLAS's rounding changes with the block's number of rows, MKL's
below 7 rows (a GEMV), so ``recommend``'s lists match across blocks up to those near-ties.

Only products outside autograd are routed here: scoring's, validation's, and those inside the fast
loss's own autograd Function (``models.autorec.losses``); a product autograd records is torch's."""

from __future__ import annotations

import functools
import os
import threading
import time

import numpy as np
import torch

KERNEL_ENV = "NCE_KERNEL"
KERNELS = ("torch", "numpy")
MARGIN = 1.15          # numpy's must take under 1 / MARGIN of torch's time to be chosen
MIN_CHOSEN = 1 << 20   # weights (items x width) below which torch's is used unmeasured
MIN_MACS = 1 << 24     # multiply-adds (m x k x n) below which ``mm`` uses torch's unmeasured
TRIES = 3              # timed products of each kernel (the least of each is compared)

_chosen: dict[tuple, str] = {}
_scratch = threading.local()  # each thread's reusable score buffer (``scratch``)


def linear(h: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None
           ) -> torch.Tensor:
    """``F.linear(h, weight, bias)``: h (B, d), weight (n, d) as nn.Linear stores it."""
    return product(h, weight.T, bias)


def product(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
            out: torch.Tensor | None = None) -> torch.Tensor:
    """(B, n) float32 ``a @ b + bias``: a (B, d), b (d, n) (a transposed view is fine), on the
    kernel ``kernel_for`` chose; torch's where numpy's cannot take part (a GPU, autograd, not
    float32, not 2-D). ``out``: a contiguous (B, n) float32 CPU tensor to write it into (e.g.
    ``scratch``), the same bits as without."""
    return kernel_of(a, b, bias)(a, b, bias, out)


def kernel_of(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
              total: int | None = None):
    """The function ``product`` runs for these operands, (a, b, bias, out) -> ``a @ b + bias``:
    ``kernel_for``'s choice, or torch's where numpy's cannot take part. For callers that run one
    kernel over many slices of one product (``models.stream_topk``'s tiles): ``b`` is then a
    slice, timed as it will run, and ``total`` the whole product's weights (items x width), which
    decide whether it is large enough to time at all (``MIN_CHOSEN``)."""
    if not _numpy_can(a, b, bias):
        return _torch
    return _numpy if kernel_for(a, b, bias, total) == "numpy" else _torch


def scratch(rows: int, n: int) -> torch.Tensor:
    """A (rows, n) float32 buffer of this thread's, reused from call to call (grown when asked
    for more), for scores consumed before the next call: ``Recommender.recommend``'s blocks.

    Why: a fresh block of scores above glibc's largest mmap threshold (32 MiB) is mapped anew by
    every allocation and pays a page fault per 4 KiB on first write, so blocks stayed at 16 MiB
    (93 users at 44,865 items), where the GEMM is least efficient. Reused, the blocks can grow:
    374 users ran scoring's product, mask and top-k in 274 us a user where 93 fresh ones took
    359-412 (AMD Zen 4, one thread, numpy's OpenBLAS)."""
    size = rows * n
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < size:
        buf = _scratch.buf = torch.empty(size)
    return buf[:size].view(rows, n)


def kernel_for(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None,
               total: int | None = None) -> str:
    """The kernel for ``a @ b`` in this process: pinned by ``NCE_KERNEL``, else chosen once per
    (items, width, threads) by timing both on these operands (``total``: the weights of the
    whole product ``b`` is a slice of, where it is one)."""
    d, n = b.shape
    if pinned() is None and (total or n * d) < MIN_CHOSEN:
        return "torch"
    return pick((n, d, torch.get_num_threads()), a, b, bias)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` of 2-D float32 CPU tensors outside autograd (views fine; ``a`` may be ``b.T``:
    numpy then runs a SYRK), for the fast loss's products (``models.autorec.losses``): on the
    kernel chosen once per (shapes, strides, whether ``a`` is ``b``'s transpose) in a one-thread
    process; torch's where numpy's cannot take part, the product is under ``MIN_MACS``, or torch
    runs more than one thread (unless ``NCE_KERNEL`` pins numpy).

    Why one thread only: numpy's kernels win there (a Yahoo-shape step of NCE-AutoRec at batch
    8,192: 219 ms against torch's 314, AMD Zen 5), but with two threads OpenBLAS's idle threads
    spin beside torch's OpenMP ones between the products (367 ms), and split over two one-thread
    calls the products, twice as fast alone, made the step no faster (201 against 197 ms): libgomp's
    threads spin after each torch op too. DDP ranks and Spark tasks run one thread each."""
    if not _numpy_can(a, b, None):
        return a @ b
    m, k = a.shape
    if pinned() is None and (m * k * b.shape[1] < MIN_MACS or torch.get_num_threads() > 1):
        return a @ b
    key = ("mm", tuple(a.shape), a.stride(), tuple(b.shape), b.stride(), is_gram(a, b))
    return (_numpy if pick(key, a, b, None) == "numpy" else _torch)(a, b, None)


def pinned() -> str | None:
    """The kernel ``NCE_KERNEL`` pins, or None (auto: timed)."""
    value = os.environ.get(KERNEL_ENV, "auto")
    if value in KERNELS:
        return value
    if value != "auto":
        raise ValueError(f"{KERNEL_ENV}={value!r}: use one of {', '.join(KERNELS)} or auto "
                         "(time both on the first product of each shape)")
    return None


def pick(key: tuple, a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> str:
    """The pinned kernel, else the one ``choose`` measured for ``key`` (once per process)."""
    fixed = pinned()
    if fixed is not None:
        return fixed
    if key not in _chosen:
        _chosen[key] = choose(a, b, bias)
    return _chosen[key]


def choose(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> str:
    """"numpy" where its least time over ``TRIES`` products is under 1 / MARGIN of torch's
    (``least_times``), else "torch"."""
    best = least_times({"torch": lambda: _torch(a, b, bias), "numpy": lambda: _numpy(a, b, bias)})
    return "numpy" if best["numpy"] * MARGIN < best["torch"] else "torch"


def least_times(runs: dict) -> dict[str, float]:
    """Each of ``runs`` (name -> a call) timed: its least seconds over ``TRIES`` calls, the runs
    alternated, after one untimed call each (first-touch pages, library dispatch, thread
    set-up). Also ``models.stream_topk``'s choice of path."""
    for run in runs.values():
        run()
    best = dict.fromkeys(runs, float("inf"))
    for _ in range(TRIES):
        for name, run in runs.items():
            t0 = time.perf_counter()
            run()
            best[name] = min(best[name], time.perf_counter() - t0)
    return best


def chosen() -> dict[tuple, str]:
    """The choices made so far in this process (reports): (items, width, threads) -> kernel for
    scoring's products, ("mm", shapes, strides, SYRK) -> kernel for ``mm``'s (one thread)."""
    return dict(_chosen)


def forget_choices() -> None:
    """Time every shape again at its next product, as a new process would (benchmarks)."""
    _chosen.clear()


def _numpy_can(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None) -> bool:
    tensors = (a, b) if bias is None else (a, b, bias)
    return (a.dim() == 2 and b.dim() == 2
            and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)))


def _torch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    # addmm is what F.linear runs for a 2-D input with a bias: the same MKL call, bit for bit
    if out is None:
        return a @ b if bias is None else torch.addmm(bias, a, b)
    return torch.mm(a, b, out=out) if bias is None else torch.addmm(bias, a, b, out=out)


def on_torch(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
             out: torch.Tensor | None = None) -> torch.Tensor:
    """``product`` on torch's kernel whatever was chosen, for callers between OpenMP regions:
    OpenBLAS's own threads spin after a call and take the cores OpenMP's then need (the fused
    top-k's 2-thread rate fell from 14,153 to 5,439 users/s with its tie rows on OpenBLAS)."""
    return _torch(a, b, bias, out)


def _numpy(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None,
           out: torch.Tensor | None = None) -> torch.Tensor:
    limit_blas_threads(torch.get_num_threads())
    # views: no copies in
    result = np.matmul(a.detach().numpy(), b.detach().numpy(),
                       out=None if out is None else out.numpy())
    if bias is not None:
        result += bias.detach().numpy()
    return torch.from_numpy(result) if out is None else out


def is_gram(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` is ``b``'s transpose, a view of the same memory (numpy runs a SYRK)."""
    return a.data_ptr() == b.data_ptr() and a.T.shape == b.shape and a.T.stride() == b.stride()


def limit_blas_threads(threads: int) -> None:
    """numpy's BLAS to the threads torch was given (a Spark task's one core; OpenBLAS would
    otherwise start one thread per core in every task). Set on every product (about 1 us), so
    that whatever else changed them in between (a threadpool_limits block) is undone."""
    for c in blas_controllers():
        c.set_num_threads(threads)


@functools.cache
def blas_controllers() -> list:
    """threadpoolctl's controllers of the BLAS libraries loaded (found once: a scan of them)."""
    from threadpoolctl import ThreadpoolController
    return ThreadpoolController().select(user_api="blas").lib_controllers
