"""models.topk.top_k gives torch.topk's answer exactly (values, items, order, ties) on rows it
ranks by the group maxima, and on those it hands to torch.topk."""

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


def test_group_maxima_path_matches_torch_on_distinct_scores(monkeypatch):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(37, 3200, generator=g)  # 50 groups of 64 >= 4 (k + 1): by the maxima
    same_as_torch(scores, 10)
    # the 50 maxima, then 11 groups' 704 scores: no row ranked in full
    assert widths_ranked(monkeypatch, scores, 10) == [50, 11 * 64]
    odd = torch.randn(5, 3001, generator=g)  # 46 groups, 57 items in none: always candidates
    same_as_torch(odd, 7)
    assert widths_ranked(monkeypatch, odd, 7) == [46, 8 * 64 + 57]


def test_rows_with_ties_excluded_items_and_nan_match_torch(monkeypatch):
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(9, 3000, generator=g)     # 46 groups, items 2944.. in none
    k = 10
    scores[0, :] = 0.5                               # every score tied
    scores[1, [3, 300]] = 9.0                        # a tie at the top
    top = torch.topk(scores[2], k + 1).values
    scores[2, scores[2] == top[-1]] = top[-2]        # the k-th tied with the (k+1)-th
    scores[3, 5:] = -torch.inf                       # fewer than k candidates left
    scores[4, 2990] = torch.nan                      # a NaN among the items in no group
    scores[5, 17] = torch.nan                        # and in a group
    scores[6, [1, 2]] = torch.tensor([0.0, -0.0])    # signed zeros tie...
    scores[6, 3:] = -5.0                             # ...at the top, the rest tied lower
    scores[7, [5, 1000]] = -50.0                     # a tie far below the top: no matter
    same_as_torch(scores, k)
    # rows 0-6 are ranked again in full; rows 7 and 8 are not
    assert widths_ranked(monkeypatch, scores, k) == [46, 11 * 64 + 56, 3000]
    assert len(T.top_k(scores[7:], k).indices) == 2 and widths_ranked(
        monkeypatch, scores[7:], k) == [46, 11 * 64 + 56]


@pytest.mark.parametrize("shape,k", [((3, 100), 5), ((0, 5000), 5), ((4, 5000), 1),
                                     ((2, 2815), 10)])
def test_small_or_empty_blocks_and_k_one(shape, k):
    same_as_torch(torch.randn(*shape), k)


def test_mostly_excluded_rows():
    scores = torch.full((3, 6400), -torch.inf)  # 100 groups, k = 20: by the maxima
    scores[:, :60] = torch.randn(3, 60)         # one finite score in each of 60 groups
    scores[2, 15:] = -torch.inf                 # fewer than k + 1 finite: torch.topk's row
    same_as_torch(scores, 20)
