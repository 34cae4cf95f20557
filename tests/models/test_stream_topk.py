"""models.stream_topk: the product and its top-k fused over cache-sized tiles give torch.topk's
values and items on the unfused product (ties, NaN, excluded items and short rows included), and
models.native builds its C once, atomically, or says why it cannot.

The operands are exact in float32 (small integers times multiples of a power of two, every
partial sum under 2**24), so each kernel's scores are the exact ones whatever its blocking, FMA
use or order of summation, on every CPU: the tests check the fused path's logic bit for bit on
torch's and numpy's kernels alike. Whether a kernel's rounded scores of a tile equal its whole
product's is the library's and the CPU's (OpenBLAS 0.3.31 on a Zen 5 takes its Haswell kernels,
whose tiles differ by an ulp at its blocks' edges); benchmarks/scoring_exact.py measures what
that does to trained models' lists."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from models import native, product
from models import stream_topk as S
from models.batch import row_ids, sparse_rows, user_slice
from models.registry import build
from tests.scoring_helpers import exact_codes_and_head

needs_cc = pytest.mark.skipif(S.library()[0] is None, reason="no C compiler here: "
                              "test_without_a_compiler_scoring_keeps_torch covers that case")


needs_fused = pytest.mark.skipif(not S.fused_here(), reason="the fused kernel is written for "
                                 "AVX-512, which this CPU (or compiler) lacks; the tiles are tested")


@pytest.fixture(params=["fused", *product.KERNELS])
def kernel(request, monkeypatch):
    """Each scoring path in turn: the fused kernel (where the CPU has AVX-512), and the tiles on
    each BLAS kernel (torch's MKL, numpy's OpenBLAS), pinned."""
    if request.param == "fused":
        if not S.fused_here():
            pytest.skip("no AVX-512 here: the fused kernel is not built")
        monkeypatch.delenv(product.KERNEL_ENV, raising=False)
        monkeypatch.setenv(S.ENV, "fused")
    else:
        monkeypatch.setenv(product.KERNEL_ENV, request.param)
    return request.param


def operands(rows=70, n=5000, d=24, seed=0):
    """a: integers in [-8, 8]; b and the bias: multiples of 2**-bits in [-1, 1] and [-1/8, 1/8],
    bits as many as keep d * 8 * 2**bits under 2**24: every product, partial sum and score is
    a float32 exactly, in any order of summation."""
    bits = int(np.log2(2**24 / (d * 8 + 1)))
    unit = 2.0 ** -bits
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-8, 9, (rows, d), generator=g).float()
    b = torch.randint(-2**bits, 2**bits + 1, (d, n), generator=g).float() * unit
    bias = torch.randint(-2**(bits - 3), 2**(bits - 3) + 1, (n,), generator=g).float() * unit
    return a, b, bias


def unfused(a, b, bias, exclude, k):
    """What recommend did before: the whole product, the mask, torch.topk."""
    scores = product.product(a, b, bias)
    items, offsets = exclude
    if len(items):
        scores[row_ids(offsets, len(items)), items] = -torch.inf
    return torch.topk(scores, k, dim=1)


def exclusions(rows, n, per, seed=0):
    rng = np.random.default_rng(seed)
    return sparse_rows([rng.choice(n, per, replace=False) for _ in range(rows)])


def test_operands_are_exact_and_a_column_tile_is_the_whole_products_columns(kernel):
    a, b, bias = operands(rows=40, n=6000, d=200)
    whole = product.product(a, b, bias)
    exact = a.double() @ b.double() + bias.double()
    assert torch.equal(whole.double(), exact)  # no rounding anywhere: the premise above
    run = product.kernel_of(a, b, bias)
    for lo in range(0, 6000, 640):  # a slice's columns and its bias's line up
        tile = run(a, b[:, lo:lo + 640], bias[lo:lo + 640], product.scratch(40, min(640, 6000 - lo)))
        assert torch.equal(tile, whole[:, lo:lo + 640])


@needs_cc
@pytest.mark.parametrize("k", [1, 10, 50])
def test_distinct_scores_give_torch_topk_exactly(kernel, monkeypatch, k):
    a, b, bias = operands()
    exclude = exclusions(70, 5000, 30)
    recomputed = []
    real = S.rank_whole
    monkeypatch.setattr(S, "rank_whole", lambda *x: recomputed.append(x[5].tolist()) or real(*x))
    got = S.top_k(a, b, bias, exclude, k)
    want = unfused(a, b, bias, exclude, k)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)
    assert recomputed == []  # every row's list came from its heap, none was ranked whole


def crowded(rows: int, n: int, user: int, left: int):
    """Exclusions of ``rows`` users, 30 each, but user ``user`` has only ``left`` items left."""
    items, offsets = exclusions(rows, n, 30)
    owner = row_ids(offsets, len(items))
    items = torch.cat([items[owner != user], torch.arange(n - left)])
    owner = torch.cat([owner[owner != user], torch.full((n - left,), user)])
    order = torch.argsort(owner, stable=True)
    return items[order], torch.searchsorted(owner[order], torch.arange(rows))


@needs_cc
@pytest.mark.parametrize("nan", [False, True])
def test_ties_short_rows_and_nan_are_ranked_whole_as_before(kernel, monkeypatch, nan):
    a, b, _ = operands(rows=20)
    k = 10
    a[0] = 0.0                            # every score of user 0 tied at 0
    top = torch.topk(a[1] @ b, k + 1).indices
    b[:, 4001] = b[:, top[3]]             # user 1's 4th best tied by item 4001, for everyone
    if nan:
        a[5, 0] = torch.nan               # user 5's scores all NaN
        b[:, 2999] = torch.nan            # item 2999: NaN for everyone, ranked first by topk
    exclude = crowded(20, 5000, 2, 5)     # user 2 has 5 items left, fewer than k
    recomputed = []
    real = S.rank_whole
    monkeypatch.setattr(S, "rank_whole", lambda *x: recomputed.append(x[5].tolist()) or real(*x))
    got = S.top_k(a, b, None, exclude, k)
    want = unfused(a, b, None, exclude, k)
    assert torch.equal(got[1], want.indices)
    assert torch.equal(got[0].nan_to_num(), want.values.nan_to_num())
    if nan:  # every row meets the NaN item (user 2 excludes it): all ranked whole
        assert recomputed == [list(range(20))]
    else:    # the tied rows and the short one, no other
        assert recomputed == [[0, 1, 2]]
        assert want.values[1, 3] == want.values[1, 4]


@needs_cc
def test_exclusions_are_sorted_within_rows_and_walked_once():
    items = torch.tensor([9, 3, 7, 5, 1])
    offsets = torch.tensor([0, 3, 3])       # user 0: 9, 3, 7; user 1: none; user 2: 5, 1
    got, starts, ends = S.exclusions(items, offsets, 3, 10)
    assert got.tolist() == [3, 7, 9, 1, 5]
    assert starts.tolist() == [0, 3, 3] and ends.tolist() == [3, 3, 5]
    got, starts, ends = S.exclusions(items[:0], offsets[:0], 4, 10)  # no exclusions at all
    assert len(got) == 0 and starts.tolist() == ends.tolist() == [0] * 4


@needs_cc
def test_recommend_streams_a_large_catalogue_to_the_same_lists(kernel, monkeypatch):
    """recommend of an AutoRec above MIN_ITEMS: the fused path (asserted taken) gives the values
    and items of NCE_SCORE_TOPK=torch's product-then-top_k path, in several of its blocks."""
    items, users = 6000, 90
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain", "n_items": items, "width": 32}).eval()
    rows, offsets = exclusions(users, items, 25, seed=3)
    exact_codes_and_head(model, seed=3)
    monkeypatch.setattr("models.base.FACTOR_BLOCK_SCORES", items * 40)  # blocks of 40 users
    calls = []
    real = S.top_k
    monkeypatch.setattr(S, "top_k", lambda *x: calls.append(len(x[0])) or real(*x))
    fused = model.recommend(rows, offsets, 50)
    assert calls == [40, 40, 10]
    monkeypatch.setenv(S.ENV, "torch")
    plain = model.recommend(rows, offsets, 50)
    assert len(calls) == 3
    assert torch.equal(fused[0], plain[0]) and torch.equal(fused[1], plain[1])
    # exclude_seen=False and k = n - 1 (the largest k it takes)
    monkeypatch.delenv(S.ENV)
    some = user_slice(rows, offsets, 0, 40)
    for kw, k in (({"exclude_seen": False}, 50), ({}, items - 1)):
        fused = model.recommend(*some, k, **kw)
        monkeypatch.setenv(S.ENV, "torch")
        plain = model.recommend(*some, k, **kw)
        monkeypatch.delenv(S.ENV)
        assert torch.equal(fused[1], plain[1]) and torch.equal(fused[0], plain[0])


def test_where_it_does_not_apply():
    a, b, _ = operands(n=5000)
    small = operands(n=S.MIN_ITEMS - 1)
    assert not S.applies(*small[:2], 10)                  # a catalogue that fits the cache
    assert not S.applies(a, b, 0) and not S.applies(a, b, 5000)
    assert not S.applies(a.double(), b.double(), 10)      # the C loop reads float32
    assert S.tile_items(1) == S.TILE_SCORES and S.tile_items(10_000) == S.MIN_TILE_ITEMS
    assert S.tile_items(300) % 64 == 0


def test_the_pin_and_a_bad_value_say_the_fix(monkeypatch):
    monkeypatch.setenv(S.ENV, "torch")
    assert S.available() == (False, f"{S.ENV}=torch")
    monkeypatch.setenv(S.ENV, "fast")
    with pytest.raises(ValueError, match="use auto"):
        S.available()


def test_without_a_compiler_scoring_keeps_torch(monkeypatch, tmp_path):
    monkeypatch.setattr(native.shutil, "which", lambda name: None)
    monkeypatch.setattr(S, "library", lambda: (None, native.build("x", "", str(tmp_path))[1]))
    ok, why = S.available()
    assert not ok and why.startswith("no C compiler")
    a, b, _ = operands()
    assert not S.applies(a, b, 10)
    monkeypatch.setenv(S.ENV, "native")
    with pytest.raises(RuntimeError, match="Install a C compiler"):
        S.available()


@pytest.mark.skipif(native.compiler() is None, reason="builds C")
def test_native_build_is_cached_atomic_and_says_why_it_failed(tmp_path):
    src = "int forty_two(void) { return 42; }\n"
    path, how = native.build("t", src, str(tmp_path))
    assert how.endswith("-O2 -march=native -shared -fPIC")
    import ctypes
    assert native.load(path, {"forty_two": (ctypes.c_int, ())}).forty_two() == 42
    stamp = (tmp_path / path.split("/")[-1]).stat().st_mtime_ns
    assert native.build("t", src, str(tmp_path))[0] == path          # cached: not rebuilt
    assert (tmp_path / path.split("/")[-1]).stat().st_mtime_ns == stamp
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.split("/")[-1]]  # no leftovers
    bad, why = native.build("u", "this is not C", str(tmp_path))
    assert bad is None and "failed" in why and "error" in why
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.split("/")[-1]]


def test_the_cache_is_private_and_never_the_home(monkeypatch, tmp_path):
    """A library in the cache is loaded into the process: the default folder is this user's,
    0700, under the temporary folder; one writable by others is not used."""
    import os
    import stat
    import tempfile
    monkeypatch.delenv(native.CACHE_ENV, raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    home = os.path.expanduser("~")
    where = native.cache_folder()
    assert where == tmp_path / f"nce-autorec-native-{os.getuid()}"
    assert stat.S_IMODE(where.stat().st_mode) == 0o700 and not str(where).startswith(home + "/")
    where.chmod(0o777)  # now others could plant a library there: not used
    other = native.cache_folder()
    assert other != where and other.parent == tmp_path
    assert stat.S_IMODE(other.stat().st_mode) == 0o700
    monkeypatch.setenv(native.CACHE_ENV, str(tmp_path / "pinned"))
    assert native.cache_folder() == tmp_path / "pinned" and (tmp_path / "pinned").is_dir()


@needs_fused
@pytest.mark.parametrize("threads", [1, 2])
def test_fused_kernel_chunks_tails_and_threads_give_the_exact_lists(monkeypatch, threads):
    """Many passes over the items (a small chunk), a catalogue that is no multiple of the
    micro-tile's items (its last tile overlaps the one before), blocks of users with padding,
    and rows split over threads: torch.topk's values and items of the exact scores, bit for bit."""
    monkeypatch.setenv(S.ENV, "fused")
    lib = S.library()[0]
    rows, n, d, k = 2 * lib.fused_users() + 7, 5003, 24, 50
    monkeypatch.setattr(S, "CHUNK_BYTES", 4 * d * 10 * lib.fused_items())  # 10 micro-tiles a pass
    assert n % lib.fused_items() and rows % lib.fused_users()
    a, b, bias = operands(rows=rows, n=n, d=d, seed=4)
    exclude = exclusions(rows, n, 40, seed=4)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = S.top_k(a, b, bias, exclude, k)
        alone = S.top_k(a[5:6], b, bias, user_slice(*exclude, 5, 6), k)  # a block of one user
    finally:
        torch.set_num_threads(before)
    want = unfused(a, b, bias, exclude, k)
    assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)
    assert torch.equal(alone[1], want.indices[5:6])


@needs_fused
def test_fused_kernel_reads_a_column_major_operand_through_one_kept_copy(monkeypatch):
    """NCE-PLRec's regression is (rank, n) row-major, so ``b.T`` is not item rows: the fused
    kernel reads a copy, made once for the unchanged tensor and made again after an in-place
    change (its version moves)."""
    monkeypatch.setenv(S.ENV, "fused")
    monkeypatch.setattr(S, "_rows", {})
    a, b, bias = operands(rows=40)
    b = b.contiguous()  # (d, n) row-major: its transpose has a column stride of n
    exclude = exclusions(40, 5000, 10)
    first = S.top_k(a, b, None, exclude, 10)
    copy = S._rows["rows"]
    assert S.top_k(a, b, None, exclude, 10)[1].equal(first[1]) and S._rows["rows"] is copy
    b[:, 17] = 1.0  # in place: item 17 scores each user's sum of a, high in many lists
    again = S.top_k(a, b, None, exclude, 10)
    assert S._rows["rows"] is not copy and not torch.equal(again[1], first[1])
    assert torch.equal(again[1], unfused(a, b, None, exclude, 10).indices)


def test_the_path_is_pinned_or_measured_once_and_a_blas_pin_keeps_the_tiles(monkeypatch):
    a, b, bias = operands(rows=40)
    exclude = exclusions(40, 5000, 10)
    monkeypatch.setattr(S, "_paths", {})
    monkeypatch.setattr(S, "fused_here", lambda: True)
    monkeypatch.setenv(S.ENV, "tiles")
    assert S.path_for(a, b, bias, exclude, 10) == "tiles"
    monkeypatch.setenv(S.ENV, "auto")
    monkeypatch.setenv(product.KERNEL_ENV, "numpy")  # a run that repeats bit for bit: no timing
    assert S.path_for(a, b, bias, exclude, 10) == "tiles" and S.chosen_paths() == {}
    monkeypatch.delenv(product.KERNEL_ENV)
    calls = []
    monkeypatch.setattr(S, "choose_path", lambda *x: calls.append(x[1].shape) or "fused")
    for _ in range(3):
        assert S.path_for(a, b, bias, exclude, 10) == "fused"
    assert calls == [(24, 5000)]
    assert S.chosen_paths() == {(5000, 24, torch.get_num_threads()): "fused"}


@pytest.mark.parametrize("tiles_cost, want", [(80.0, "tiles"), (95.0, "fused")])
def test_choose_path_prefers_the_tiles_only_by_the_margin(monkeypatch, tiles_cost, want):
    """A fake clock: each path's call advances it by a fixed cost; the tiles are chosen at 80%
    of the fused kernel's time, not at 95% (within the margin the fused kernel is kept)."""
    now, costs = [0.0], {"fused": 100.0, "tiles": tiles_cost}

    def heaps(path, *args):
        now[0] += costs[path]
    monkeypatch.setattr(product.time, "perf_counter", lambda: now[0])  # P.least_times' clock
    monkeypatch.setattr(S, "heaps", heaps)
    a, b, bias = operands(rows=4)
    assert S.choose_path(a, b, bias, exclusions(4, 5000, 1), 10) == want


def test_a_fused_pin_without_avx512_says_the_fix(monkeypatch):
    class NoAvx512:
        @staticmethod
        def fused_lanes():
            return 0
    monkeypatch.setattr(S, "library", lambda: (NoAvx512(), "cc -O2"))
    monkeypatch.setenv(S.ENV, "fused")
    with pytest.raises(RuntimeError, match="no AVX-512.*use NCE_SCORE_TOPK=tiles or auto"):
        S.available()
    monkeypatch.setenv(S.ENV, "auto")
    assert S.available() == (True, "cc -O2") and not S.fused_here()
