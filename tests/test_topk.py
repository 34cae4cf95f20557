"""models.topk.top_k gives torch.topk's answer exactly (values, items, order, ties) on blocks
that take its threshold path, and on those that fall back."""

import pytest
import torch

from models import topk as T


def same_as_torch(scores: torch.Tensor, k: int) -> None:
    want = torch.topk(scores, k, dim=1)
    got = T.top_k(scores, k)
    assert torch.equal(got.indices, want.indices)
    assert torch.equal(got.values, want.values) or torch.allclose(
        got.values, want.values, equal_nan=True)  # NaN != NaN under torch.equal


def test_threshold_path_matches_torch_on_distinct_scores():
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(37, 3200, generator=g)  # 3200 = 64 x k: the threshold path
    same_as_torch(scores, 50)
    same_as_torch(torch.randn(5, 1001, generator=g), 7)  # items in no group (1001 % 8)


def test_rows_with_ties_excluded_items_and_nan_match_torch():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(8, 640, generator=g)
    k = 10
    scores[0, :] = 0.5                               # every score tied
    scores[1, [3, 300]] = 9.0                        # a tie at the top
    top = torch.topk(scores[2], k + 1).values
    scores[2, scores[2] == top[-1]] = top[-2]        # the k-th tied with the (k+1)-th
    scores[3, 5:] = -torch.inf                       # fewer than k candidates left
    scores[4, 639] = torch.nan                       # a NaN among the items in no group
    scores[5, 17] = torch.nan                        # and in a group
    scores[6, [1, 2]] = torch.tensor([0.0, -0.0])    # signed zeros tie...
    scores[6, 3:] = -5.0                             # ...at the top, the rest tied lower
    same_as_torch(scores, k)


def test_unique_answer_does_not_depend_on_the_fallback():
    # rows 0 and 1 are the same scores but for a tie in row 1: row 0 takes the threshold path,
    # row 1 torch.topk's; both give the same items for the distinct part
    g = torch.Generator().manual_seed(2)
    row = torch.randn(1, 1280, generator=g)
    scores = row.repeat(2, 1)
    scores[1, 0] = scores[1, 1] = -100.0  # a tie far below the top 20: still redone
    got = T.top_k(scores, 20)
    assert torch.equal(got.indices[0], torch.topk(row[0], 20).indices)
    assert torch.equal(got.indices[0], got.indices[1])


@pytest.mark.parametrize("shape,k", [((3, 100), 5), ((0, 5000), 5), ((4, 5000), 1)])
def test_small_or_empty_blocks_and_k_one(shape, k):
    same_as_torch(torch.randn(*shape), k)


def test_degenerate_threshold_falls_back():
    scores = torch.full((3, 6400), -torch.inf)
    scores[:, :60] = torch.randn(3, 60)  # the group maxima are mostly -inf: every item a candidate
    same_as_torch(scores, 50)
