"""The NCE target R* pinned end to end: the ETL stores it by the protocol's formula (any beta, either
Z), the real feed puts the stored values in ``Batch.train_rstar``, and the NCE head's loss in a real
training step is the MSE against exactly those values.

Without these checks a feed that dropped the stored column (ones in its place) would train a plain
two-headed AutoRec and pass every other fast test. Every expected value here is written from
protocol.md ("NCE target R*"), sharing no code with etl/, prepared/protocol.py or models/losses.py:

    r*_uj = max(log Z - beta * log pop_j, 0)      natural log, observed training entries only
    pop_j = warm users' training positives of item j
    Z     = warm users (``--rstar-z users``, the default) or their training positives (``positives``)
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pds
import pyarrow.parquet as pq
import pytest
import torch

from models.autorec import NCEAutoRec
from prepared import schema as S
from prepared.reader import open_prepared
from tests.etl_helpers import prepare, reference_positives, reference_time_split
from training.config import TrainConfig
from training.feed import BatchMaker, batch_from_arrow, plan
from training.loop import build_model
from training.step import make_optimizers, train_batch

pytestmark = pytest.mark.spark

BATCH_USERS = 200  # one training batch of warm users: enough items for R* to span its range


def reference_rstar(pop: np.ndarray, z: float, beta: float) -> np.ndarray:
    """protocol.md's R* of an observed entry of an item with popularity ``pop`` (>= 1), float64."""
    return np.maximum(np.log(float(z)) - beta * np.log(pop.astype(np.float64)), 0.0)


def warm_train_popularity(prepared) -> tuple[pd.Series, int]:
    """(item_index -> warm users' training positives, number of warm users), counted from the
    prepared split's long form (raw ids) and the users table's cold flag, not from the items
    table's popularity or the rows' R*."""
    split = pq.read_table(prepared / S.SPLIT_DIR).to_pandas()
    users = pq.read_table(prepared / S.USERS_DIR).to_pandas()
    items = pq.read_table(prepared / S.ITEMS_DIR).to_pandas()
    cold = set(users.loc[users[S.COLD], S.USER_ID])
    warm_train = split[(split[S.SPLIT] == "train") & ~split[S.USER_ID].isin(cold)]
    index_of = dict(zip(items[S.ITEM_ID], items[S.ITEM_INDEX]))
    pop = warm_train[S.ITEM_ID].map(index_of).value_counts()
    return pop, len(users) - len(cold)


def listed(column) -> np.ndarray:
    """The values of a list column, rows concatenated (pyarrow directly, not the feed's ``flat``)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return pc.list_flatten(column).to_numpy(zero_copy_only=False)


def training_rows(rows_uri: str, columns: list[str]) -> pa.Table:
    """The first ``BATCH_USERS`` warm users' rows, ``columns`` only: what ``training.feed``'s
    train dataset gives a worker (Ray Data reads the same Parquet with the same filter)."""
    ds = pds.dataset(rows_uri, format="parquet")
    table = ds.to_table(columns=columns, filter=pc.field(S.COLD) == False)  # noqa: E712
    return table.sort_by(S.USER_INDEX).slice(0, BATCH_USERS)


def dense_nce_reference(model: NCEAutoRec, users_items: list[np.ndarray], rstar: list[np.ndarray],
                        n_items: int) -> float:
    """The NCE head's loss by protocol.md, densely in float64: the mean over the batch's B * n
    entries of (t_uj - y_uj)^2, t = R* at the user's training items and 0 elsewhere,
    y = W_c ReLU(W_e' r_u + b_e) + b_c."""
    b = len(users_items)
    x = np.zeros((b, n_items))
    t = np.zeros((b, n_items))
    for u, (items, values) in enumerate(zip(users_items, rstar)):
        x[u, items] = 1.0
        t[u, items] = values
    p = lambda v: v.detach().double().numpy()
    h = np.maximum(x @ p(model.encoder.weight) + p(model.encoder_bias), 0.0)
    y = h @ p(model.heads["nce"].weight).T + p(model.heads["nce"].bias)
    return float(np.mean((t - y) ** 2))


def per_user(values: np.ndarray, rows: pa.Table) -> list[np.ndarray]:
    """Split concatenated per-entry ``values`` back into the rows' users."""
    lengths = pc.list_value_length(rows.column(S.TRAIN_ITEMS)).to_numpy(zero_copy_only=False)
    return np.split(values, np.cumsum(lengths)[:-1])


@pytest.mark.parametrize("loss_path", ["fast", "dense"])
def test_stored_rstar_reaches_the_nce_loss_of_a_training_step(small_prepared, loss_path):
    prep = open_prepared(str(small_prepared))
    cfg = TrainConfig(data=str(small_prepared), model="nce-autorec", width=16,
                      loss_path=loss_path, seed=0)
    feed = plan(NCEAutoRec, prep, cfg)
    # the ETL's beta and the train split: the feed reads the stored column, no per-item table
    assert feed.needs_rstar and feed.rstar_item is None and S.TRAIN_RSTAR in feed.columns()

    rows = training_rows(prep.rows_uri, feed.columns())
    items = listed(rows.column(S.TRAIN_ITEMS)).astype(np.int64)
    stored = listed(rows.column(S.TRAIN_RSTAR))

    # the stored column is protocol.md's R* of each entry's item (ETL beta 1, Z = warm users)
    pop, warm = warm_train_popularity(small_prepared)
    assert prep.beta() == 1.0 and prep.manifest["parameters"]["rstar_z"] == "users"
    expected = reference_rstar(pop.reindex(items).to_numpy(), warm, 1.0)
    np.testing.assert_allclose(stored, expected, rtol=1e-6, atol=1e-6)
    # a target worth pinning: far from the binary rows, and varying with popularity
    assert np.abs(expected - 1.0).mean() > 1.0 and expected.max() - expected.min() > 3.0
    assert expected.std() > 0.5

    # the real feed (BatchMaker, as each training worker runs it) carries exactly that column
    batch = BatchMaker(feed)(rows, epoch=0)
    np.testing.assert_array_equal(batch.train_items.numpy(), items)
    np.testing.assert_array_equal(batch.train_rstar.numpy(), stored)
    # and so does the Arrow -> Batch conversion of whole stored rows
    whole = training_rows(prep.rows_uri, list(S.ROW_COLUMNS))
    np.testing.assert_array_equal(batch_from_arrow(whole).train_rstar.numpy(), stored)

    # real training steps: the model the loop builds, its optimizers, its step; each step's NCE
    # term (computed before that step's update) equals the dense float64 reference with this R*
    torch.manual_seed(cfg.seed)
    model, policy = build_model(cfg, prep.n_items, prep.n_users,
                              NCEAutoRec.trainer.data_statistics(prep))
    steps = policy.phases()[0]
    optimizers = make_optimizers(policy, steps, cfg.learning_rate)
    targets = per_user(expected, rows)
    item_rows = per_user(items, rows)
    for _ in range(3):
        want = dense_nce_reference(model, item_rows, targets, prep.n_items)
        ones = dense_nce_reference(model, item_rows, [np.ones_like(t) for t in targets],
                                   prep.n_items)
        with torch.no_grad():
            plain = model(BatchMaker(feed)(rows.set_column(
                rows.schema.get_field_index(S.TRAIN_RSTAR), S.TRAIN_RSTAR,
                pa.array([[1.0] * len(t) for t in targets], pa.list_(pa.float32()))), 0))["nce"]
        got = float(train_batch(model, batch, steps, optimizers)["nce"])
        assert got == pytest.approx(want, rel=1e-5)
        # the test can tell: with R* = 1 (a plain second MSE head) the loss is another number
        assert float(plain) == pytest.approx(ones, rel=1e-5)
        assert abs(want - ones) > 1e3 * 1e-5 * want


def test_feed_for_another_beta_gathers_the_formula(small_prepared):
    """A --beta other than the ETL's: the feed recomputes R* per item from the popularity."""
    prep = open_prepared(str(small_prepared))
    cfg = TrainConfig(data=str(small_prepared), model="nce-autorec", beta=1.3)
    feed = plan(NCEAutoRec, prep, cfg)
    assert feed.rstar_item is not None and S.TRAIN_RSTAR not in feed.columns()
    rows = training_rows(prep.rows_uri, feed.columns())
    items = listed(rows.column(S.TRAIN_ITEMS)).astype(np.int64)
    pop, warm = warm_train_popularity(small_prepared)
    expected = reference_rstar(pop.reindex(items).to_numpy(), warm, 1.3)
    got = BatchMaker(feed)(rows, epoch=0).train_rstar.numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    assert (expected == 0).any()  # beta > 1 clips the most popular items' targets at 0


# -- the ETL with a non-default beta and Z -------------------------------------------------------

def synthetic_u_data(path, users=60, items=40, seed=5) -> pd.DataFrame:
    """A small u.data (user, item, rating, time) with skewed item popularity, so that R* varies;
    returns it as the reference reads raw data."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, items + 1) ** 0.8
    recs = []
    for u in range(1, users + 1):
        chosen = rng.choice(items, size=rng.integers(3, 25), replace=False, p=weights / weights.sum())
        for k, i in enumerate(chosen):
            recs.append((u, 100 + i, int(rng.integers(1, 6)), 1000 + 7 * u + k))
    path.write_text("".join(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in recs))
    raw = pd.DataFrame(recs, columns=["user", "item", "rating", "ts"]).astype(
        {"user": str, "item": str, "rating": float, "ts": float})
    raw["order"] = range(len(raw))
    return raw


@pytest.mark.parametrize("beta, rule", [(0.5, "positives"), (2.0, "users")])
def test_etl_stores_rstar_for_beta_and_z(spark, tmp_path, beta, rule):
    raw = synthetic_u_data(tmp_path / "u.data")
    out = prepare(spark, tmp_path / "out", dataset="ml-100k", input=(str(tmp_path / "u.data"),),
                  negatives=5, cold_users=0.1, beta=beta, rstar_z=rule)
    assert out.manifest["parameters"]["beta"] == beta
    assert out.manifest["parameters"]["rstar_z"] == rule

    # popularity from the raw data by the independent reference split and the output's cold users
    ref = reference_time_split(reference_positives(raw, lambda r: r > 3))
    got_split = set(zip(out.split.user_id, out.split.item_id, out.split.split))
    assert got_split == set(zip(ref.user, ref.item, ref.split))
    cold = set(out.users.loc[out.users.cold, "user_id"])
    assert 0 < len(cold) < len(out.users)
    warm_train = ref[(ref.split == "train") & ~ref.user.isin(cold)]
    pop_by_id = warm_train.item.value_counts()
    z = len(warm_train) if rule == "positives" else len(out.users) - len(cold)
    assert out.manifest["counts"]["rstar_z"] == z

    index_of = dict(zip(out.items.item_id, out.items.item_index))
    pop = pd.Series(pop_by_id.to_numpy(), index=[index_of[i] for i in pop_by_id.index])
    checked = clipped = 0
    for row in out.rows.itertuples():  # cold users' rows too: computed like everyone's
        items = np.asarray(row.train_items, np.int64)
        want = np.array([reference_rstar(np.array([pop[j]]), z, beta)[0] if j in pop.index
                         else 0.0 for j in items])
        np.testing.assert_allclose(np.asarray(row.train_rstar), want, rtol=1e-6, atol=1e-6)
        checked += len(items)
        clipped += int((want == 0).sum())
    assert checked == len(ref[ref.split == "train"])
    if beta > 1:  # the clip at 0 is exercised: Z = warm users < pop^2 for the popular items
        assert clipped > 0
    else:
        assert clipped == 0 and min(math.log(z) - beta * math.log(p) for p in pop) > 0
