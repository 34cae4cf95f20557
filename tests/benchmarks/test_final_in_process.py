"""benchmarks/final_in_process.py's test metrics against values by hand."""

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest
import torch

from benchmarks import final_in_process as final
from prepared import schema as S


class Remembers:
    """A stand-in model that records its input rows and ranks items 0, 1, 2, ... leaving its
    inputs out (what ``recommend`` does with the seen items)."""

    def __init__(self):
        self.inputs = []

    def recommend(self, items, offsets, k):
        ends = [*offsets[1:].tolist(), len(items)]
        out = []
        for a, b in zip(offsets.tolist(), ends):
            seen = set(items[a:b].tolist())
            self.inputs.append(sorted(seen))
            out.append([i for i in range(k + len(seen)) if i not in seen][:k])
        return None, torch.tensor(out)


def rows_table(train, valid, test):
    lists = lambda v: pa.array(v, pa.list_(pa.int32()))
    return pa.table({S.USER_ID: pa.array([f"u{i}" for i in range(len(train))]),
                     S.TRAIN_ITEMS: lists(train), S.VALID_ITEMS: lists(valid),
                     S.TEST_ITEMS: lists(test)})


def test_the_final_ranks_without_train_and_valid_and_scores_on_test():
    """u0: inputs {0, 2} (train) + {1} (valid), ranking 3, 4, 5, ...; test {3, 9}: Recall@20
    1, paper's NDCG (1 + 1 / log2 8) / (1 + 1 / log2 3) (ranks 1 and 7 of the top 50), NDCG@20
    the same ideal. u1: no test item, left out. u2: inputs {}, ranking 0, 1, ...; test {60}:
    outside the top 50, all 0."""
    net = Remembers()
    per_user = final.test_metrics(net, rows_table([[0, 2], [5], []], [[1], [], []],
                                                  [[3, 9], [], [60]]))
    assert net.inputs[:3] == [[0, 1, 2], [5], []]
    assert per_user["user_id"].tolist() == ["u0", "u2"]
    want = (1 + 1 / math.log2(8)) / (1 + 1 / math.log2(3))
    np.testing.assert_allclose(per_user["ndcg"], [want, 0.0])
    np.testing.assert_allclose(per_user["recall_at_20"], [1.0, 0.0])
    np.testing.assert_allclose(per_user["ndcg_at_20_truncated"], [want, 0.0])


def test_the_paired_difference_is_over_the_users_both_scored():
    mine = pd.DataFrame({"user_id": ["a", "b", "c"], "ndcg": [0.5, 0.2, 0.1],
                         "recall_at_20": [1.0, 0.0, 0.5], "ndcg_at_20_truncated": [0.4, 0.1, 0.1]})
    other = pd.DataFrame({"user_id": ["a", "b", "z"], "ndcg": [0.3, 0.2, 0.9],
                          "recall_at_20": [0.0, 0.0, 1.0], "ndcg_at_20_truncated": [0.2, 0.3, 0.9]})
    d = final.paired(mine, other)
    assert d["users"] == 2
    assert d["ndcg"]["mean"] == pytest.approx(0.1)
    assert d["recall_at_20"]["mean"] == pytest.approx(0.5)
    assert d["ndcg_at_20_truncated"]["ci95"] == pytest.approx(1.96 * 0.2 / math.sqrt(2))


def test_pairs_against_several_seeds_pool_them_and_one_seed_is_the_plain_pair():
    from evaluation.seeds import pooled_interval

    cols = ["ndcg", "recall_at_20", "ndcg_at_20_truncated"]
    mine = pd.DataFrame({"user_id": ["a", "b", "c"], **{c: [0.5, 0.2, 0.1] for c in cols}})
    seeds = [pd.DataFrame({"user_id": ["a", "b", "c"], **{c: v for c in cols}})
             for v in ([0.3, 0.2, 0.0], [0.4, 0.0, 0.1])]
    d = final.paired(mine, *seeds)
    # per-user differences: seed 0 (0.2, 0, 0.1), seed 1 (0.1, 0.2, 0); by hand
    per_seed = [0.1, 0.1]
    user_means = np.array([0.15, 0.1, 0.05])
    want = pooled_interval(per_seed, float(user_means.var()), 3)
    assert d["seeds"] == 2 and d["ndcg"]["per_seed"] == pytest.approx(per_seed)
    assert d["ndcg"]["mean"] == pytest.approx(0.1) and d["ndcg"]["ci95"] == pytest.approx(want["ci95"])
    one = final.paired(mine, seeds[0])
    assert one["ndcg"]["ci95"] == pytest.approx(1.96 * np.array([0.2, 0, 0.1]).std() / math.sqrt(3))
    assert "per_seed" not in one["ndcg"]
