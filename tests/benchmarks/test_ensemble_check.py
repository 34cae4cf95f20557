"""benchmarks/ensemble_check.py's scoring of subsets, on stand-in models worked by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from benchmarks import ensemble_check as ec


class Fixed:
    """A stand-in model scoring every user with the same row."""

    def __init__(self, row):
        self.row = torch.tensor(row, dtype=torch.float32)

    def score(self, items, offsets):
        return self.row.expand(len(offsets), -1).clone()


def test_a_subset_sums_standardised_scores_and_leaves_the_seen_items_out():
    """k = 5, items 0-9. A scores items 1-6 with 10, 9, 8, 7, 6, 5; B scores items 7, 8, 9, 6,
    1, 2 with the same values: one multiset, so standardising maps both through one line and the
    sum ranks by the raw sums: item 1 16, 2 14, 6 12, 7 10, 8 9, 3 and 9 8. Top 5 (item 0 seen):
    A 1-5, B 7, 8, 9, 6, 1, the sum 1, 2, 6, 7, 8. User 0 (truth {2, 6, 8}): 1/3, 2/3, 3/3.
    User 1 has seen item 1 (truth {1, 2}): item 1 is in no list, item 2 in all three: 1/2."""
    a = Fixed([0, 10, 9, 8, 7, 6, 5, 0, 0, 0])
    b = Fixed([0, 6, 5, 0, 0, 0, 7, 10, 9, 8])
    seen = (np.array([0, 1]), np.array([0, 1]))  # (items, offsets): user 0 item 0, user 1 item 1
    got = ec.recall_of_subsets([a, b], seen, [{2, 6, 8}, {1, 2}], [(0,), (1,), (0, 1)], k=5)
    assert got[(0,)]["recall"] == pytest.approx([1 / 3, 1 / 2])
    assert got[(1,)]["recall"] == pytest.approx([2 / 3, 1 / 2])
    assert got[(0, 1)]["recall"] == pytest.approx([1.0, 1 / 2])


def test_standardised_rows_have_mean_zero_and_unit_sd():
    s = ec.standardised(Fixed([1.0, 2.0, 3.0, 10.0]), torch.tensor([0]), torch.tensor([0, 0]))
    assert s.shape == (2, 4)
    assert s.mean(1).abs().max() < 1e-6
    assert s.std(1).tolist() == pytest.approx([1.0, 1.0])
    np.testing.assert_allclose(s[0].numpy(), (np.array([1, 2, 3, 10]) - 4) / np.std(
        [1, 2, 3, 10], ddof=1), rtol=1e-5)


def test_members_split_into_trial_and_finals():
    with pytest.raises(SystemExit):
        ec.main(["--data", "x", "--member", "nce=trial.pt"])  # no finals


def test_the_paired_difference_is_per_seed_against_the_best_member():
    """Two seeds, two users. Member a's Recall@20 means 0.5, b's 0.25: a is the best member.
    The ensemble minus a per user: seed 0 (0.5, 0.5), seed 1 (0, 1): means 0.5 and 0.5, CIs
    1.96 * sd / sqrt(2) with sd 0 and sqrt(0.5)."""
    rows = []
    for seed, (ens, a, b) in enumerate([((1, 1), (0.5, 0.5), (0, 0.5)),
                                        ((1, 1), (1, 0), (0.5, 0))]):
        for name, r in (("a + b", ens), ("a", a), ("b", b)):
            rows.append({"seed": seed, "members": name, "test_recall20": float(np.mean(r)),
                         "recall_per_user": np.array(r, dtype=float)})
    got = ec.paired(rows, "a + b")
    assert got["against"] == "a"
    assert [p["mean"] for p in got["per_seed"]] == [0.5, 0.5]
    assert [p["ci95"] for p in got["per_seed"]] == pytest.approx([0, 1.96 * 0.5 ** 0.5 / 2 ** 0.5])
