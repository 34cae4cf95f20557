"""The closed-form baselines against plain numpy references (protocol.md's definitions), on a
small random matrix, through the interface every stage uses (``fit`` then ``score`` of rows)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from models.batch import sparse_rows
from models.registry import build
from prepared.errors import UsageError

M, N = 40, 15  # users, items


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    r = (rng.random((M, N)) < 0.3).astype(np.float64)
    r[0, :] = 0  # a user without items scores zeros
    r[0, 3] = 1
    pop = r.sum(axis=0)
    rstar = r * np.maximum(np.log(M) - 0.9 * np.log(np.maximum(pop, 1)), 0)
    rows = [np.flatnonzero(row).tolist() for row in r]
    return r, rstar, rows


def fitted(name, args, data):
    r, rstar, rows = data
    model = build(name, {"n_items": N, **args})
    model.fit(sp.csr_matrix(r, dtype=np.float32), sp.csr_matrix(rstar, dtype=np.float32), seed=0)
    items, offsets = sparse_rows(rows)
    with torch.no_grad():
        return model.score(items, offsets).numpy().astype(np.float64)


def test_puresvd_equals_the_exact_svd_projection(data):
    r, _, _ = data
    k = 5
    _, _, vt = np.linalg.svd(r, full_matrices=False)
    v = vt[:k].T
    np.testing.assert_allclose(fitted("puresvd", {"rank": k}, data), r @ v @ v.T, atol=1e-6, rtol=1e-6)


def test_nce_plrec_equals_the_protocol_formula(data):
    r, rstar, _ = data
    k, lam = 6, 2.5
    _, sigma, qt = np.linalg.svd(rstar, full_matrices=False)
    v = qt[:k].T * np.sqrt(sigma[:k])
    rq = r @ v
    y = np.linalg.inv(rq.T @ rq + lam * np.eye(k)) @ rq.T @ r
    np.testing.assert_allclose(fitted("nce-plrec", {"rank": k, "lam": lam}, data), rq @ y,
                               atol=1e-6, rtol=1e-6)


def test_ease_equals_a_ridge_regression_per_item_without_itself(data):
    """EASE's closed form against its definition: column j of B is the ridge regression of item j
    on every other item (diag(B) = 0), solved item by item."""
    r, _, _ = data
    lam = 3.0
    b = np.zeros((N, N))
    for j in range(N):
        others = [i for i in range(N) if i != j]
        x = r[:, others]
        b[others, j] = np.linalg.solve(x.T @ x + lam * np.eye(N - 1), x.T @ r[:, j])
    np.testing.assert_allclose(fitted("ease", {"lam": lam}, data), r @ b, atol=1e-6, rtol=1e-6)


def test_ease_refuses_a_catalogue_it_cannot_hold(monkeypatch):
    from models import closed_form

    monkeypatch.setattr(closed_form, "available_memory", lambda: 4 * 2**30)
    with pytest.raises(UsageError, match=r"ease on 44,865 items needs 7\.5 GiB for its n x n "
                       r"weights .* 4\.0 GiB available: use a model with a low-rank state"):
        build("ease", {"n_items": 44_865, "lam": 100.0})  # refused before allocating B


def test_ease_serves_a_model_it_could_not_fit_here(monkeypatch):
    """Scoring builds the model to load B (4 n^2 bytes); only a fit needs its n x n matrix and
    the sparse Gram: an executor with room for B but not for a fit must still serve it."""
    from models import closed_form

    n = 2000
    monkeypatch.setattr(closed_form, "available_memory", lambda: 6 * n * n)
    model = build("ease", {"n_items": n, "lam": 100.0})  # holding B fits
    full = sp.csr_matrix(np.ones((3, n), dtype=np.float32))  # X'X dense: 12 n^2 bytes sparse
    with pytest.raises(UsageError, match=r"ease on 2,000 items needs 0\.1 GiB for fitting its n x n "
                                         r"matrix \(float32"):
        model.fit(full)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_ease_solves_in_place_in_either_precision(data, dtype):
    """``ease_weights`` returns the one dense array it solved in, B to within float32's rounding
    of the float64 inverse, with a zero diagonal."""
    from models.ease import ease_weights

    r, _, _ = data
    lam = 3.0
    want = np.eye(N) - (p := np.linalg.inv(r.T @ r + lam * np.eye(N))) / np.diag(p)
    b = ease_weights(sp.csr_matrix(r.astype(np.float32)), lam, dtype)
    assert b.dtype == dtype and b.shape == (N, N) and b.flags.c_contiguous
    assert not np.diagonal(b).any()
    np.testing.assert_allclose(b, want, rtol=1e-4 if dtype == np.float32 else 1e-10,
                               atol=1e-5 if dtype == np.float32 else 1e-12)


def test_ease_falls_back_to_float32_when_float64_does_not_fit(monkeypatch, data):
    """The same fit with memory for float64 and with memory for float32 only: the same top-10
    lists for every user, and the precision recorded."""
    from models import closed_form
    from models.ease import fit_bytes, sparse_gram_bytes

    r, _, _ = data
    train = sp.csr_matrix(r.astype(np.float32))
    # between a float32 fit (8 n^2 + the sparse Gram) and a float64 one (20 n^2 + it)
    between = sparse_gram_bytes(train) + (fit_bytes(N, np.float32) + fit_bytes(N)) / 2
    out = {}
    for have in (10**9, int(between / closed_form.USABLE_MEMORY)):
        monkeypatch.setattr(closed_form, "available_memory", lambda have=have: have)
        model = build("ease", {"n_items": N, "lam": 3.0})
        info = model.fit(train)
        out[info["fit_dtype"]] = (r @ model.weights.numpy().astype(np.float64))
    assert set(out) == {"float64", "float32"}
    np.testing.assert_array_equal(np.argsort(-out["float64"], 1)[:, :10],
                                  np.argsort(-out["float32"], 1)[:, :10])


def test_nce_plrec_needs_rstar():
    model = build("nce-plrec", {"n_items": 3, "rank": 1})
    with pytest.raises(ValueError, match="R\\*"):
        model.fit(sp.csr_matrix(np.eye(3, dtype=np.float32)), None)


def test_the_final_retraining_fits_on_train_and_valid_with_their_rstar():
    """training.closed_form.matrices: train+valid rows for the protocol's retraining, and R* from
    the train+valid popularity (the reader's rule) on exactly those entries."""
    import pyarrow as pa

    from prepared.reader import Prepared
    from training.closed_form import matrices
    from training.config import TrainConfig

    rows = pa.table({"train_items": pa.array([[0, 3], [1], []], pa.list_(pa.int32())),
                     "valid_items": pa.array([[2], [], [3, 1]], pa.list_(pa.int32()))})
    prep = Prepared(uri="x", manifest={"parameters": {"rstar_z": "users", "beta": 1.0},
                                       "counts": {"warm_users": 3, "rstar_z": 3}},
                    pop_train=np.array([1, 1, 0, 1]), pop_train_valid=np.array([1, 2, 1, 2]))
    cfg = TrainConfig(data="x", model="nce-plrec", train_splits="train,valid")
    r, rstar = matrices(prep, cfg, rows)
    assert r.toarray().tolist() == [[1, 0, 1, 1], [0, 1, 0, 0], [0, 1, 0, 1]]
    want = np.maximum(np.log(3) - np.log([1, 2, 1, 2]), 0)  # Z = 3 users, train+valid popularity
    np.testing.assert_allclose(rstar.toarray(), r.toarray() * want, rtol=1e-6)
    r_train, _ = matrices(prep, TrainConfig(data="x", model="nce-plrec"), rows)
    assert r_train.toarray().tolist() == [[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 0, 0]]
