"""models.product: scoring's product on torch's or numpy's kernel, the same scores up to float32
rounding, the same top-k lists up to near-ties (checked against a float64 reference)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from models import product, stream_topk
from models.batch import row_ids, sparse_rows, user_slice
from models.registry import build


@pytest.fixture
def pinned(monkeypatch):
    def pin(kernel: str) -> None:
        monkeypatch.setenv(product.KERNEL_ENV, kernel)
    return pin


def operands(n=3000, d=48, b=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, d, generator=g), torch.randn(n, d, generator=g) * 0.1,
            torch.randn(n, generator=g) * 0.01)


def test_torch_kernel_is_f_linear_bit_for_bit(pinned):
    pinned("torch")
    h, w, bias = operands()
    assert torch.equal(product.linear(h, w, bias), F.linear(h, w, bias))
    assert torch.equal(product.product(h, w.T), h @ w.T)


def test_numpy_kernel_is_the_product_up_to_float32_rounding(pinned):
    pinned("numpy")
    h, w, bias = operands()
    got = product.linear(h, w, bias)
    exact = h.double() @ w.double().T + bias.double()
    # a float32 dot product of d terms: |error| <= d eps sum |h_j w_j| (plus the bias's rounding)
    bound = h.shape[1] * torch.finfo(torch.float32).eps * (h.double().abs() @ w.double().abs().T)
    assert got.dtype == torch.float32 and got.shape == (37, 3000)
    assert ((got.double() - exact).abs() <= bound + 1e-7).all()
    # a strided operand (a column slice) goes through numpy's views, not a wrong layout
    assert torch.allclose(product.product(h[:, ::2], w.T[::2]), h[:, ::2] @ w.T[::2], atol=1e-5)


def test_autograd_keeps_torch_kernel_and_its_gradient(pinned):
    pinned("numpy")
    h, w, bias = operands()
    w.requires_grad_(True)
    out = product.linear(h, w, bias)
    assert out.grad_fn is not None  # numpy's kernel would have cut the graph
    out.sum().backward()
    assert torch.allclose(w.grad, h.sum(0).expand_as(w))


def test_choice_small_shapes_torch_and_a_bad_pin_says_the_fix(pinned, monkeypatch):
    h, w, bias = operands(n=100, d=16)
    assert product.kernel_for(h, w.T, bias) == "torch"  # under MIN_CHOSEN weights: unmeasured
    pinned("mkl")
    with pytest.raises(ValueError, match="NCE_KERNEL='mkl': use one of torch, numpy or auto"):
        product.kernel_for(h, w.T, bias)


def test_auto_measures_once_per_shape_and_keeps_its_choice(monkeypatch):
    monkeypatch.delenv(product.KERNEL_ENV, raising=False)
    monkeypatch.setattr(product, "_chosen", {})
    calls = []
    monkeypatch.setattr(product, "choose", lambda a, b, bias: calls.append(b.shape) or "numpy")
    h, w, bias = operands(n=1 << 15, d=32)  # 1M weights: chosen by measurement
    for _ in range(3):
        product.linear(h, w, bias)
    assert calls == [(32, 1 << 15)]
    assert product.chosen() == {(1 << 15, 32, torch.get_num_threads()): "numpy"}


def test_a_slice_of_a_large_product_is_timed_at_the_slices_shape(monkeypatch):
    """stream_topk's tiles: a 640-column slice is small, but the product it is a slice of is not,
    so the choice is measured (on the slice, as it will run), and kept per slice shape."""
    monkeypatch.delenv(product.KERNEL_ENV, raising=False)
    monkeypatch.setattr(product, "_chosen", {})
    calls = []
    monkeypatch.setattr(product, "choose", lambda a, b, bias: calls.append(b.shape) or "numpy")
    h, w, bias = operands(n=40_000, d=32)
    tile = w.T[:, :640]
    assert product.kernel_of(h, tile, bias[:640]) is product._torch  # alone: too small to time
    assert product.kernel_of(h, tile, bias[:640], total=40_000 * 32) is product._numpy
    assert calls == [(32, 640)]


@pytest.mark.parametrize("numpy_cost, want", [(80.0, "numpy"), (95.0, "torch")])
def test_choose_prefers_numpy_only_by_the_margin(monkeypatch, numpy_cost, want):
    """A fake clock: each kernel's product advances it by a fixed cost; numpy's is chosen at
    80% of torch's time, not at 95% (within MARGIN: the choice must not flip on noise)."""
    h, w, bias = operands()
    now, costs = [0.0], {"torch": 100.0, "numpy": numpy_cost}

    def kernel(name):
        def run(a, b, bias):
            now[0] += costs[name]
        return run

    monkeypatch.setattr(product.time, "perf_counter", lambda: now[0])
    monkeypatch.setattr(product, "_torch", kernel("torch"))
    monkeypatch.setattr(product, "_numpy", kernel("numpy"))
    assert product.choose(h, w.T, bias) == want


def test_numpy_kernel_runs_on_torch_threads(pinned):
    from threadpoolctl import threadpool_info
    pinned("numpy")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        h, w, bias = operands()
        product.linear(h, w, bias)
        assert {i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"} == {1}
    finally:
        torch.set_num_threads(before)


def near_tie_only(lists_a, lists_b, exact, tol):
    """Rows of two top-k lists may differ only where the float64 scores they swap are within
    ``tol`` of each other, position by position (what float32 rounding can do); returns the
    number of rows that differ."""
    differ = 0
    for row, (a, b) in enumerate(zip(lists_a.tolist(), lists_b.tolist())):
        if a == b:
            continue
        differ += 1
        for x, y in zip(a, b):
            assert abs(exact[row, x] - exact[row, y]) <= tol[row], (row, x, y)
    return differ


def test_recommend_lists_match_float64_up_to_near_ties(pinned):
    """An AutoRec with a catalogue above MIN_CHOSEN: both kernels' top-50 lists against the
    lists of float64 scores; they may differ from them only by near-ties."""
    items, width, users = 12_000, 96, 150
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain", "n_items": items, "width": width}).eval()
    rng = np.random.default_rng(0)
    rows, offsets = sparse_rows([rng.choice(items, 20, replace=False) for _ in range(users)])
    with torch.no_grad():
        h = model.code(rows, offsets).double()
        head = model.heads["predict"]
        exact = h @ head.weight.double().T + head.bias.double()
        exact[row_ids(offsets, len(rows)), rows] = -torch.inf  # recommend's mask of the inputs
        reference = torch.topk(exact, 50, dim=1).indices
        scale = (h.abs() @ head.weight.double().abs().T).amax(dim=1)
    tol = (width * torch.finfo(torch.float32).eps * 2 * scale).tolist()
    exact = exact.numpy()
    lists = {}
    for kernel in product.KERNELS:
        pinned(kernel)
        lists[kernel] = model.recommend(rows, offsets, 50)[1]
        assert near_tie_only(lists[kernel], reference, exact, tol) <= users // 10
    near_tie_only(lists["torch"], lists["numpy"], exact, tol)
    if stream_topk.fused_here():  # scoring's own fused kernel (AVX-512): the same guarantee
        with pytest.MonkeyPatch.context() as m:
            m.delenv(product.KERNEL_ENV, raising=False)
            m.setenv(stream_topk.ENV, "fused")
            fused = model.recommend(rows, offsets, 50)[1]
        assert near_tie_only(fused, reference, exact, tol) <= users // 10


@pytest.mark.parametrize("kernel", product.KERNELS)
def test_out_writes_the_same_bits_into_the_reused_buffer(pinned, kernel):
    """``product(..., out=scratch(...))`` gives the bits ``product`` gives, with and without a
    bias, and the buffer is reused from call to call (grown only when asked for more)."""
    pinned(kernel)
    h, w, bias = operands()
    for b in (bias, None):
        want = product.product(h, w.T, b)
        got = product.product(h, w.T, b, out=product.scratch(len(h), w.shape[0]))
        assert torch.equal(got, want)
    first = product.scratch(10, 100).data_ptr()
    assert product.scratch(20, 50).data_ptr() == first          # same size: the same memory
    assert product.scratch(5, 7).shape == (5, 7)


def test_each_thread_has_its_own_scratch():
    """A server's threads scoring at once must not share a buffer."""
    import threading
    ptrs = []
    main = product.scratch(64, 64).data_ptr()
    t = threading.Thread(target=lambda: ptrs.append(product.scratch(64, 64).data_ptr()))
    t.start()
    t.join()
    assert ptrs and ptrs[0] != main


@pytest.mark.parametrize("name", ["autorec", "puresvd", "wrmf"])
def test_recommend_of_a_factored_model_equals_its_masked_scores_top_k(name, monkeypatch):
    """A model with ``score_factors`` is scored through the reused buffer in its own blocks:
    the same values and items as ``score`` + the input mask + top_k, block for block."""
    from models.topk import top_k
    items, users = 9000, 60
    torch.manual_seed(0)
    hp = {"lam_units": "plain", "width": 32} if name == "autorec" else {"rank": 16}
    model = build(name, {"n_items": items, **hp}).eval()
    for buf in model.buffers():
        torch.nn.init.normal_(buf)
    rng = np.random.default_rng(1)
    rows, offsets = sparse_rows([rng.choice(items, 15, replace=False) for _ in range(users)])
    monkeypatch.setattr("models.base.FACTOR_BLOCK_SCORES", items * 16)  # blocks of 16 users
    values, top = model.recommend(rows, offsets, 30)
    for lo in range(0, users, 16):
        hi = min(lo + 16, users)
        it, off = user_slice(rows, offsets, lo, hi)
        with torch.no_grad():
            s = model.score(it, off)
        s[row_ids(off, len(it)), it] = -torch.inf
        want = top_k(s, 30)
        assert torch.equal(values[lo:hi], want.values) and torch.equal(top[lo:hi], want.indices)


# -- mm: the fast loss's products ------------------------------------------------------------

@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_mm_numpy_kernel_gram_and_product_up_to_float32_rounding(pinned):
    """numpy's kernel for the Gram W'W (a SYRK: exactly symmetric) and for W M, within the
    float32 dot-product bound of the float64 products, as torch's kernel is."""
    g = torch.Generator().manual_seed(1)
    w, m = torch.randn(700, 40, generator=g), torch.randn(40, 40, generator=g)
    for kernel in product.KERNELS:
        pinned(kernel)
        for a, b in ((w.T, w), (w, m)):
            got = product.mm(a, b)
            exact = a.double() @ b.double()
            bound = a.shape[1] * torch.finfo(torch.float32).eps * (a.double().abs() @ b.double().abs())
            assert got.dtype == torch.float32 and ((got.double() - exact).abs() <= bound).all()
        assert kernel == "torch" or torch.equal(product.mm(w.T, w), product.mm(w.T, w).T)


def test_mm_times_once_per_shape_at_one_thread_and_keeps_torch_otherwise(monkeypatch, one_thread):
    monkeypatch.delenv(product.KERNEL_ENV, raising=False)
    monkeypatch.setattr(product, "_chosen", {})
    calls = []
    monkeypatch.setattr(product, "choose", lambda a, b, bias: calls.append(
        (tuple(a.shape), tuple(b.shape))) or "numpy")
    w = torch.randn(1 << 12, 64)  # 4096 x 64 x 64 = 2^24 multiply-adds: measured
    for _ in range(3):
        product.mm(w.T, w)
    assert calls == [((64, 4096), (4096, 64))]
    key, = product.chosen()
    assert key[0] == "mm" and key[-1] is True  # a Gram: numpy's SYRK
    product.mm(w, torch.randn(64, 64))          # another shape: measured once more
    assert len(calls) == 2
    assert product.mm(w[:100], torch.randn(64, 64)) is not None and len(calls) == 2  # too small
    torch.set_num_threads(2)  # torch's threads spin beside OpenBLAS's: torch's kernel, untimed
    product.mm(torch.randn(1 << 13, 64).T, torch.randn(1 << 13, 64))
    assert len(calls) == 2


def test_the_fast_loss_trains_the_same_on_either_kernel(pinned, one_thread):
    """The fast MSE's value and gradients in float32 through numpy's products (the Gram, h G,
    h'h, W M) equal torch's up to float32 rounding."""
    from models.autorec.losses import linear_mse

    g = torch.Generator().manual_seed(2)
    h = torch.rand(300, 32, generator=g)
    w = (torch.randn(2000, 32, generator=g) * 0.1).requires_grad_(True)
    bias = (torch.randn(2000, generator=g) * 0.01).requires_grad_(True)
    rows = [torch.randperm(2000, generator=g)[:k] for k in torch.randint(1, 30, (300,), generator=g)]
    idx = torch.cat(rows)
    offsets = torch.tensor([0] + [len(r) for r in rows[:-1]]).cumsum(0)
    out = {}
    for kernel in product.KERNELS:
        pinned(kernel)
        hk = h.clone().requires_grad_(True)
        loss, square = linear_mse(hk, w, bias, idx, offsets, with_l2=True)
        got = torch.autograd.grad(loss + 0.3 * square, (hk, w, bias))
        out[kernel] = (loss.item(), square.item(), got)
    assert out["numpy"][0] == pytest.approx(out["torch"][0], rel=1e-4)
    assert out["numpy"][1] == pytest.approx(out["torch"][1], rel=1e-5)
    for a, b in zip(out["numpy"][2], out["torch"][2]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-7)
