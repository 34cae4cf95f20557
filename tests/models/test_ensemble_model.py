"""The ensemble of trained models (models/ensemble.py, an extension): its scores against a numpy
computation by hand, its file through the registry's one layout, and what it refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from models.batch import sparse_rows
from models.ensemble import Ensemble
from models.registry import MODELS, build, check_shapes, read, save
from prepared.errors import UsageError

N_ITEMS = 7


def svd(rank: int, seed: int):
    """A PureSVD with fixed random item factors (its score is r V V^T)."""
    m = build("puresvd", {"n_items": N_ITEMS, "rank": rank}).eval()
    m.items_factors.copy_(torch.from_numpy(np.random.default_rng(seed).normal(
        size=(N_ITEMS, rank)).astype(np.float32)))
    return m


def popularity(counts):
    m = build("popularity", {"n_items": N_ITEMS}).eval()
    m.counts.copy_(torch.tensor(counts, dtype=torch.float32))
    return m


def reference(members, rows: list[list[int]]) -> np.ndarray:
    """Each member's scores by hand (float64), standardised per row (ddof 1), summed."""
    total = np.zeros((len(rows), N_ITEMS))
    for m in members:
        if m.name == "puresvd":
            v = m.items_factors.double().numpy()
            x = np.zeros((len(rows), N_ITEMS))
            for u, r in enumerate(rows):
                x[u, r] = 1.0
            s = x @ v @ v.T
        else:
            s = np.tile(m.counts.double().numpy(), (len(rows), 1))
        total += (s - s.mean(1, keepdims=True)) / s.std(1, ddof=1, keepdims=True)
    return total


ROWS = [[0, 3], [1], [2, 4, 6], [5]]


def test_scores_are_the_sum_of_the_members_standardised_scores():
    members = [svd(3, 0), svd(2, 1), popularity([5, 1, 4, 2, 9, 3, 0])]
    ens = Ensemble(members).eval()
    items, offsets = sparse_rows(ROWS)
    got = ens.score(items, offsets).double().numpy()
    np.testing.assert_allclose(got, reference(members, ROWS), rtol=1e-5, atol=1e-5)
    # scaling a member changes nothing: standardising takes its scale out
    members[0].items_factors.mul_(10.0)
    np.testing.assert_allclose(Ensemble(members).score(items, offsets).double().numpy(), got,
                               rtol=1e-4, atol=1e-4)
    # a constant row (popularity with equal counts) adds zeros, not NaN
    flat = Ensemble([svd(3, 0), popularity([2] * N_ITEMS)]).score(items, offsets)
    assert torch.isfinite(flat).all()


def test_recommend_ranks_the_summed_scores_without_the_users_items():
    members = [svd(3, 0), popularity([5, 1, 4, 2, 9, 3, 0])]
    ens = Ensemble(members).eval()
    items, offsets = sparse_rows(ROWS)
    _, top = ens.recommend(items, offsets, k=3)
    want = reference(members, ROWS)
    for u, r in enumerate(ROWS):
        want[u, r] = -np.inf
    assert top.tolist() == np.argsort(-want, axis=1, kind="stable")[:, :3].tolist()
    assert not any(set(t) & set(r) for t, r in zip(top.tolist(), ROWS))


def test_the_file_is_the_registrys_layout_and_rebuilds_the_same_model():
    members = [svd(3, 0), popularity([5, 1, 4, 2, 9, 3, 0])]
    ens = Ensemble(members)
    saved = save(ens)
    assert saved["model"] == "ensemble" and "ensemble" not in MODELS  # read, never trained
    json.dumps(saved["model_args"])  # plain JSON, as every model's arguments
    assert set(saved["state_dict"]) == {"members.0.items_factors", "members.1.counts"}
    again = read(torch.load(_roundtrip(saved), weights_only=True), "ens.pt")
    items, offsets = sparse_rows(ROWS)
    assert torch.equal(again.score(items, offsets), ens.score(items, offsets))
    assert again.describe().startswith("ensemble of 2: puresvd (rank 3)")


def _roundtrip(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_arguments_that_do_not_describe_the_weights_are_refused():
    saved = save(Ensemble([svd(3, 0), popularity([1] * N_ITEMS)]))
    args = json.loads(json.dumps(saved["model_args"]))
    args["members"][0]["model_args"]["rank"] = 300
    with pytest.raises(UsageError, match=r"members\.0\.items_factors: the arguments make "
                                         r"\(7, 300\), the weights hold \(7, 3\)"):
        check_shapes("ensemble", args, saved["state_dict"], "ens.pt")
    with pytest.raises(UsageError, match="name no members"):
        build("ensemble", {"n_items": N_ITEMS})


def test_what_an_ensemble_refuses():
    with pytest.raises(ValueError, match="at least one member"):
        Ensemble([])
    other = build("popularity", {"n_items": N_ITEMS + 1})
    with pytest.raises(ValueError, match=r"different catalogues \(\[7, 8\] items\)"):
        Ensemble([svd(2, 0), other])
    with pytest.raises(ValueError, match="not an ensemble"):
        Ensemble([svd(2, 0), Ensemble([svd(2, 1)])])
