"""benchmarks/probe.py's metrics against values by hand."""

import math

import numpy as np
import pytest
import torch

from benchmarks import probe
from training.feed import ValidBatch


def test_recall_and_truncated_ndcg_at_k_by_hand():
    """k = 5. User 1: truth {1, 2}, list (1, 9, 2, 7, 8): recall 1, NDCG (1 + 1/log2 4) /
    (1 + 1/log2 3). User 2: truth of 6 items, list (6, 0, 3, 4, 12): recall 1/6, NDCG 1 / the
    ideal over min(6, 5) = 5 ranks."""
    ideal = lambda n: sum(1 / math.log2(j + 1) for j in range(1, n + 1))
    recall, ndcg = probe.at_k(np.array([[1, 9, 2, 7, 8], [6, 0, 3, 4, 12]]),
                              [{1, 2}, {5, 6, 7, 8, 10, 11}], k=5)
    assert recall == pytest.approx((1 + 1 / 6) / 2)
    assert ndcg == pytest.approx(((1 + 0.5) / ideal(2) + 1 / ideal(5)) / 2)


class ByInput:
    """A stand-in model whose top-k is each user's first input item + 10, then 0, 1, ...: the
    lists follow from the rows, so the blocks' offsets are checked too."""

    def recommend(self, items, offsets, k):
        first = items[offsets] + 10
        rest = torch.arange(k - 1).expand(len(offsets), k - 1)
        return None, torch.cat([first[:, None], rest], 1)


def test_valid_metrics_score_every_user_across_blocks(monkeypatch):
    monkeypatch.setattr(probe, "BLOCK", 2)  # three users: two blocks
    valid = ValidBatch(train_items=torch.tensor([3, 4, 5, 6, 7]),
                       train_offsets=torch.tensor([0, 2, 3]),
                       valid_items=torch.tensor([13, 15, 0, 99]),
                       valid_offsets=torch.tensor([0, 1, 3]))
    # lists (13, 0, 1, 2, 3), (15, 0, 1, 2, 3), (16, 0, 1, 2, 3); truths {13}, {15, 0}, {99}
    recall, ndcg = probe.valid_metrics(ByInput(), valid, k=5)
    assert recall == pytest.approx((1 + 1 + 0) / 3)
    assert ndcg == pytest.approx((1 + 1 + 0) / 3)


def test_settings_are_key_value_pairs():
    assert probe.parse(["width=500", "model=autorec", "dropout=0.5"]) == {
        "width": 500, "model": "autorec", "dropout": 0.5}
    with pytest.raises(SystemExit, match="KEY=VALUE"):
        probe.parse(["width"])
