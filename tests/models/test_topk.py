"""models.topk.top_k gives torch.topk's answer exactly (values, items, order, ties) on rows it
ranks by the group maxima, and on those it hands to torch.topk, at every group size its rule
picks."""

import pytest
import torch

from models import topk as T


def same_as_torch(scores: torch.Tensor, k: int) -> None:
    want = torch.topk(scores, k, dim=1)
    got = T.top_k(scores, k)
    assert torch.equal(got.indices, want.indices)
    assert torch.allclose(got.values, want.values, equal_nan=True)  # NaN != NaN under equal


def widths_ranked(monkeypatch, scores: torch.Tensor, k: int) -> list[int]:
    """The row lengths torch.topk was called on inside top_k."""
    widths, real = [], torch.topk
    monkeypatch.setattr(torch, "topk", lambda x, k, dim: widths.append(x.shape[1]) or real(x, k, dim))
    T.top_k(scores, k)
    monkeypatch.setattr(torch, "topk", real)
    return widths


@pytest.mark.parametrize("n, k, per", [
    (44_865, 50, 30),   # the Yahoo shape: sqrt(879.7) = 29.66
    (3200, 10, 17),     # sqrt(290.9) = 17.06
    (1100, 10, 10),     # sqrt(100) exactly
    (5000, 1, 50),      # sqrt(2500)
    (44_865, 200, 15),  # sqrt(223.2) = 14.94
    (3000, 10, 17),     # sqrt(272.7) = 16.51 rounds up
    (60, 50, 1),        # fewer items than 2 (k + 1): groups of one
    (1, 1, 1),
])
def test_group_size_is_sqrt_of_items_over_k_plus_one(n, k, per):
    assert T.group_size(n, k) == per


def test_group_maxima_path_matches_torch_on_distinct_scores(monkeypatch):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(37, 3200, generator=g)  # 188 groups of 17 >= 4 (k + 1), 4 items in none
    same_as_torch(scores, 10)
    # the 188 maxima, then 11 groups' 187 scores and the 4 in no group: no row ranked in full
    assert widths_ranked(monkeypatch, scores, 10) == [188, 11 * 17 + 4]
    odd = torch.randn(5, 3001, generator=g)  # 157 groups of 19, 18 items in none: candidates
    same_as_torch(odd, 7)
    assert widths_ranked(monkeypatch, odd, 7) == [157, 8 * 19 + 18]


def test_rows_with_ties_excluded_items_and_nan_match_torch(monkeypatch):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(9, 3000, generator=g)     # 176 groups of 17, items 2992.. in none
    k = 10
    scores[0, :] = 0.5                               # every score tied
    scores[1, [3, 300]] = 9.0                        # a tie at the top
    top = torch.topk(scores[2], k + 1).values
    scores[2, scores[2] == top[-1]] = top[-2]        # the k-th tied with the (k+1)-th
    scores[3, 5:] = -torch.inf                       # fewer than k candidates left
    scores[4, 2995] = torch.nan                      # a NaN among the items in no group
    scores[5, 17] = torch.nan                        # and in a group
    scores[6, [1, 2]] = torch.tensor([0.0, -0.0])    # signed zeros tie...
    scores[6, 3:] = -5.0                             # ...at the top, the rest tied lower
    scores[7, [5, 1000]] = -50.0                     # a tie far below the top: no matter
    same_as_torch(scores, k)
    # rows 0-6 are ranked again in full; rows 7 and 8 are not
    assert widths_ranked(monkeypatch, scores, k) == [176, 11 * 17 + 8, 3000]
    assert len(T.top_k(scores[7:], k).indices) == 2 and widths_ranked(
        monkeypatch, scores[7:], k) == [176, 11 * 17 + 8]


# (n, k, widths torch.topk ranks on distinct scores): [G, (k + 1) g + leftover] where the block
# has at least 4 (k + 1) groups of g = group_size(n, k), else [n], the whole row
SHAPES = [
    ((44_865, 50), [1495, 51 * 30 + 15]),   # Yahoo: 1,495 groups of 30, 15 items in none
    ((44_865, 200), [2991, 201 * 15]),      # a multiple of 15: every item in a group
    ((1100, 10), [110, 11 * 10]),           # a multiple of 10
    ((5000, 1), [100, 2 * 50]),
    ((32, 1), [8, 2 * 4]),                  # the smallest block by the maxima at k = 1
    ((31, 1), [31]),                        # 7 groups of 4 < 4 (k + 1): the whole row
    ((816, 50), [204, 51 * 4]),             # 204 = 4 (k + 1) groups: by the maxima
    ((815, 50), [815]),                     # 203 groups: the whole row
    ((204, 50), [204]),                     # k + 1 < groups < 4 (k + 1)
    ((60, 50), [60]),                       # k + 1 >= groups of one
    ((50, 50), [50]),                       # k = n
    ((5, 3), [5]),                          # tiny catalogues
    ((1, 1), [1]),
]


@pytest.mark.parametrize("shape, widths", SHAPES)
def test_every_group_size_matches_torch_and_ranks_what_the_rule_says(monkeypatch, shape, widths):
    n, k = shape
    g = torch.Generator().manual_seed(n + k)
    # each row a permutation of 0..n-1: distinct scores (float32 randn ties among the top 201
    # of 44,865 often enough to send a row to torch.topk)
    scores = torch.rand(6, n, generator=g).argsort(dim=1).float()
    same_as_torch(scores, k)
    assert widths_ranked(monkeypatch, scores, k) == widths


@pytest.mark.parametrize("shape, widths", SHAPES)
def test_every_group_size_matches_torch_on_ties_excluded_items_and_nan(shape, widths):
    n, k = shape
    g = torch.Generator().manual_seed(n * k)
    scores = torch.randn(8, n, generator=g)
    scores[0] = torch.randint(0, 3, (n,), generator=g).float()   # few values: ties everywhere
    scores[1, torch.randperm(n, generator=g)[: n // 2]] = -torch.inf  # half the items excluded
    scores[2, : max(n - k + 1, 1)] = -torch.inf                  # fewer than k finite scores
    scores[3, n - 1] = torch.nan                                 # the last item (in no group, or
    scores[4, 0] = torch.nan                                     # in one) and the first NaN
    scores[5, torch.topk(scores[5], min(k, n)).indices[-1]] = scores[5].max()  # a tie at the top
    scores[6] = (scores[6] * 4).round() / 4                      # coarse scores: ties inside
    same_as_torch(scores, k)                                     # the best groups
    same_as_torch(scores[6:], k)


def test_small_or_empty_blocks_and_k_one():
    for shape, k in [((3, 100), 5), ((0, 5000), 5), ((4, 5000), 1), ((2, 2815), 10)]:
        same_as_torch(torch.randn(*shape), k)


def test_mostly_excluded_rows():
    scores = torch.full((3, 6400), -torch.inf)  # 376 groups of 17, k = 20: by the maxima
    scores[:, :60] = torch.randn(3, 60)         # one finite score in each of 60 groups
    scores[2, 15:] = -torch.inf                 # fewer than k + 1 finite: torch.topk's row
    same_as_torch(scores, 20)
