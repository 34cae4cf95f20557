"""benchmarks/scoring_exact.py compares the two scoring paths and counts what it claims: on a model
whose scores tie for some users, both paths agree and the tied rows are the ones ranked whole."""

import numpy as np
import pytest
import torch

from benchmarks import scoring_exact as E
from models import stream_topk
from models.batch import sparse_rows
from models.registry import build
from tests.scoring_helpers import exact_codes_and_head


@pytest.mark.skipif(stream_topk.library()[0] is None, reason="needs the fused kernel (cc)")
@pytest.mark.parametrize("path", ["tiles", "fused"])
def test_both_ways_agree_and_count_the_rows_ranked_whole(path):
    if path == "fused" and not stream_topk.fused_here():
        pytest.skip("no AVX-512 here: the fused kernel is not built")
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain", "n_items": 5000, "width": 8}).eval()
    rng = np.random.default_rng(0)
    items, offsets = sparse_rows([rng.choice(5000, 10, replace=False) for _ in range(30)])
    exact_codes_and_head(model)  # every path's scores the same bits: the counts are exact
    with torch.no_grad():  # items 0 and 1 score 700 for every user, above any other item
        head = model.heads["predict"]  # (|code . w| <= 10 items x 8 x 8 x 1): tied at the top
        head.weight[:2] = 0.0          # of every list where neither is an input item
        head.bias[:2] = 700.0
    got = E.both_ways(model, items, offsets, path)
    tied = sum(1 for u in range(30)
               if not {0, 1} & set(items[offsets[u]:(offsets[u + 1] if u < 29 else None)].tolist()))
    assert got["streamed_path"] == {"pinned": path}
    assert got["lists_identical"] == got["values_identical"] == 30
    assert got["ranked_whole"] == tied > 0
    assert got["max_value_difference"] == 0.0
    # against float64: the tied rows' order of 0 and 1 is a near tie (a gap of 0), nothing else
    for side in ("unfused", "streamed"):
        f64 = got["float64"][side]
        assert f64["beyond_rounding"] == 0 and f64["identical"] + f64["near_ties_only"] == 30


def test_float64_check_counts_a_swap_beyond_rounding():
    """The true lists are identical to float64's; two items of clearly different scores swapped
    are beyond rounding; two items of equal scores swapped are a near tie."""
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain", "n_items": 300, "width": 8}).eval()
    exact_codes_and_head(model)
    with torch.no_grad():  # items 3 and 7 score alike for every user
        head = model.heads["predict"]
        head.weight[7] = head.weight[3]
        head.bias[7] = head.bias[3]
    items, offsets = sparse_rows([[1, 2], [4, 5]])
    lists = model.recommend(items, offsets, 290)[1]
    assert E.against_float64(model, items, offsets, {"true": lists})["true"] == {
        "identical": 2, "near_ties_only": 0, "beyond_rounding": 0}
    scores = model.score(items, offsets)
    first, last = lists[0, 0], lists[0, -1]
    assert scores[0, first] > scores[0, last] + 1.0
    swapped = lists.clone()
    swapped[0, [0, -1]] = swapped[0, [-1, 0]]
    assert E.against_float64(model, items, offsets, {"swapped": swapped})["swapped"] == {
        "identical": 1, "near_ties_only": 0, "beyond_rounding": 1}
    both = E.against_float64(model, items, offsets, {"true": lists, "swapped": swapped})
    assert both == {"true": {"identical": 2, "near_ties_only": 0, "beyond_rounding": 0},
                    "swapped": {"identical": 1, "near_ties_only": 0, "beyond_rounding": 1}}
    row = lists[1].tolist()
    i, j = row.index(3), row.index(7)
    tie = lists.clone()
    tie[1, [i, j]] = tie[1, [j, i]]
    assert E.against_float64(model, items, offsets, {"tie": tie})["tie"] == {
        "identical": 1, "near_ties_only": 1, "beyond_rounding": 0}
