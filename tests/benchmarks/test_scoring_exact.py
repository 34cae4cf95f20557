"""benchmarks/scoring_exact.py compares the two scoring paths and counts what it claims: on a model
whose scores tie for some users, both paths agree and the tied rows are the ones ranked whole."""

import numpy as np
import pytest
import torch

from benchmarks import scoring_exact as E
from models import stream_topk
from models.batch import sparse_rows
from models.registry import build


@pytest.mark.skipif(stream_topk.library()[0] is None, reason="needs the fused kernel (cc)")
def test_both_ways_agree_and_count_the_rows_ranked_whole():
    torch.manual_seed(0)
    model = build("autorec", {"lam_units": "plain", "n_items": 5000, "width": 8}).eval()
    rng = np.random.default_rng(0)
    items, offsets = sparse_rows([rng.choice(5000, 10, replace=False) for _ in range(30)])
    with torch.no_grad():  # items 0 and 1 score alike for every user: a tie in some top-51s
        head = model.heads["predict"]
        head.weight[1] = head.weight[0]
        head.bias[1] = head.bias[0]
        head.bias[0] += 100.0   # ...at the top of every list where neither is an input item
        head.bias[1] += 100.0
    got = E.both_ways(model, items, offsets)
    tied = sum(1 for u in range(30)
               if not {0, 1} & set(items[offsets[u]:(offsets[u + 1] if u < 29 else None)].tolist()))
    assert got["lists_identical"] == got["values_identical"] == 30
    assert got["ranked_whole"] == tied > 0
    assert got["max_value_difference"] == 0.0
