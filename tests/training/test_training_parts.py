"""Training's pieces without Ray: feeding batches, validation metrics, early stopping and phases,
configuration and prepared-directory errors, MLflow URIs."""

import json
import math

import numpy as np
import pyarrow as pa
import pytest
import torch

from prepared import protocol
from prepared import schema as S
from prepared.errors import UsageError
from prepared.metrics import hit_matrix, per_user
from prepared.reader import Prepared, open_prepared
from runtime.tracking import check_reachable, tracking_uri
from training.config import TrainConfig, check
from training.feed import (
    BatchMaker,
    FeedPlan,
    batch_from_arrow,
    column_bytes,
    epoch_seed,
    fits_in_object_store,
    in_valid_sample,
    union_sorted,
    valid_batch,
)
from training.loop import new_progress, next_state
from training.validate import batch_metrics, model_metrics, top_metrics


def L(rows):  # noqa: N802
    return pa.array(rows, pa.list_(pa.int32()))


def rows_table(train, valid=None, users=None):
    users = list(range(len(train))) if users is None else users
    return pa.table({"user_index": pa.array(users, pa.int32()), "train_items": L(train),
                     "valid_items": L(valid or [[] for _ in train])})


def plan(**kw):
    base = dict(needs_rstar=False, needs_negatives=False, merge_valid=False, rstar_item=None,
                neg_popularity=None, num_negatives=0, seed=0)
    return FeedPlan(**{**base, **kw})


# -- feeding --------------------------------------------------------------------------------------

def test_final_retraining_input_is_the_sorted_union_of_train_and_valid():
    train, valid = [[1, 5], [], [0, 9, 3]], [[2], [4, 7], []]
    vals, off = union_sorted(np.array([1, 5, 0, 9, 3]), np.array([0, 2, 2]),
                              np.array([2, 4, 7]), np.array([0, 1, 3]), 3)
    got = [vals[off[i]:(off[i + 1] if i < 2 else len(vals))].tolist() for i in range(3)]
    assert got == [sorted(t + v) for t, v in zip(train, valid)]


def test_rstar_for_another_beta_is_gathered_from_the_per_item_table():
    pop = np.array([1, 10, 0, 100])
    table = protocol.rstar_per_item(pop, z=100.0, beta=0.5).astype(np.float32)
    # by hand: max(log 100 - 0.5 log pop, 0); items without training positives get 0
    by_hand = [np.log(100), np.log(100) - 0.5 * np.log(10), 0, np.log(100) - 0.5 * np.log(100)]
    assert table == pytest.approx(by_hand, rel=1e-6)
    b = BatchMaker(plan(needs_rstar=True, rstar_item=table))(rows_table([[0, 3], [1]]), epoch=0)
    assert b.train_rstar.tolist() == pytest.approx(table[[0, 3, 1]].tolist())


def rstar_rows(train, rstar):
    """User rows with their stored R* (as the ETL writes them: float32, aligned with the items)."""
    rows = rows_table(train)
    return rows.append_column(S.TRAIN_RSTAR, pa.array(rstar, pa.list_(pa.float32())))


def test_the_stored_rstar_values_reach_the_batch_as_stored():
    """With R* stored for the run's beta the batch carries each row's own values, aligned with
    its items: not ones, not a per-item table (the values here differ for the same item 3, as
    no per-item table could give)."""
    stored = [[0.25, 2.5], [], [0.0, 1.75, 3.0]]
    feed = plan(needs_rstar=True)
    assert S.TRAIN_RSTAR in feed.columns()  # read from the rows
    b = BatchMaker(feed)(rstar_rows([[0, 3], [], [1, 3, 4]], stored), epoch=0)
    assert b.train_rstar.tolist() == [0.25, 2.5, 0.0, 1.75, 3.0]
    assert b.train_items.tolist() == [0, 3, 1, 3, 4] and b.train_offsets.tolist() == [0, 2, 2]
    # the same rows through batch_from_arrow (every stored column, as the models' tests read them)
    whole = rstar_rows([[0, 3], [], [1, 3, 4]], stored).append_column(
        S.NEG_ITEMS, L([[], [], []])).append_column(S.NEG_COUNTS, L([[], [], []]))
    assert batch_from_arrow(whole).train_rstar.tolist() == [0.25, 2.5, 0.0, 1.75, 3.0]
    # a per-item table replaces the column, which is then not read at all
    assert S.TRAIN_RSTAR not in plan(needs_rstar=True, rstar_item=np.ones(5)).columns()
    assert S.TRAIN_RSTAR not in plan().columns()  # a model without R*


def feed_prepared(rule: str = "users") -> Prepared:
    """A prepared set stored at beta 1.0 (Z: 10 warm users, or the splits' positives)."""
    return Prepared(uri="x", manifest={"parameters": {"rstar_z": rule, "beta": 1.0,
                                                      "negatives": 20},
                                       "counts": {"warm_users": 10}},
                    pop_train=np.array([5, 1, 0, 2]), pop_train_valid=np.array([8, 2, 1, 4]))


@pytest.mark.parametrize("beta", [None, 1.0])
def test_the_feed_reads_the_stored_rstar_when_beta_is_the_stored_one(beta):
    from models.registry import MODELS
    from training.feed import plan as feed_plan

    feed = feed_plan(MODELS["nce-autorec"], feed_prepared(),
                     TrainConfig(data="d", model="nce-autorec", run_name="r", beta=beta))
    assert feed.needs_rstar and feed.rstar_item is None and S.TRAIN_RSTAR in feed.columns()


@pytest.mark.parametrize("beta, splits, rule, pop, z", [
    # --beta 0.5 against the stored 1.0: Z = the 10 warm users, the training popularity
    (0.5, "train", "users", [5, 1, 0, 2], 10),
    # the final retraining at the stored beta: train+valid popularity; Z = its 15 positives
    (None, "train,valid", "positives", [8, 2, 1, 4], 15),
    (1.3, "train,valid", "users", [8, 2, 1, 4], 10),
])
def test_another_beta_recomputes_rstar_from_popularity_by_the_protocols_rule(beta, splits, rule,
                                                                            pop, z):
    """``--beta`` other than the stored one (or the final retraining, whose popularity differs)
    must not feed the stored values: R* = max(log Z - beta log pop_j, 0), 0 for an item without
    a training positive, gathered per item into the batch."""
    from models.registry import MODELS
    from training.feed import plan as feed_plan

    cfg = TrainConfig(data="d", model="nce-autorec", run_name="r", beta=beta, train_splits=splits)
    feed = feed_plan(MODELS["nce-autorec"], feed_prepared(rule), cfg)
    used = 1.0 if beta is None else beta
    by_hand = [max(math.log(z) - used * math.log(p), 0.0) if p else 0.0 for p in pop]
    assert feed.rstar_item is not None and S.TRAIN_RSTAR not in feed.columns()
    assert feed.rstar_item.tolist() == pytest.approx(by_hand, rel=1e-6)
    # the stored (beta 1.0, train) values in the rows must be ignored: 9.0 is none of them
    rows = rstar_rows([[0, 3], [1]], [[9.0, 9.0], [9.0]])
    if feed.merge_valid:
        rows = rows.set_column(2, S.VALID_ITEMS, L([[2], []]))
    b = BatchMaker(feed)(rows, epoch=0)
    items = b.train_items.tolist()
    assert items == ([0, 2, 3, 1] if feed.merge_valid else [0, 3, 1])
    assert b.train_rstar.tolist() == pytest.approx([by_hand[i] for i in items], rel=1e-6)


def test_a_model_without_rstar_gets_no_rstar_whatever_the_beta():
    from models.registry import MODELS
    from training.feed import plan as feed_plan

    feed = feed_plan(MODELS["autorec"], feed_prepared(),
                     TrainConfig(data="d", model="autorec", run_name="r", beta=0.5))
    assert not feed.needs_rstar and feed.rstar_item is None and S.TRAIN_RSTAR not in feed.columns()


def test_prepared_rstar_table_uses_train_valid_popularity_for_the_final_retraining():
    prep = Prepared(uri="x", manifest={"parameters": {"rstar_z": "positives", "beta": 1.0},
                                       "counts": {"rstar_z": 3, "warm_users": 9}},
                    pop_train=np.array([1, 2]), pop_train_valid=np.array([2, 4]))
    assert prep.rstar_table(1.0, False) == pytest.approx(np.log(3) - np.log([1, 2]))
    assert prep.rstar_table(1.0, True) == pytest.approx(np.maximum(np.log(6) - np.log([2, 4]), 0))
    # Z = the number of warm users (the default rule) is the same for both splits
    users = Prepared(uri="x", manifest={"parameters": {"rstar_z": "users", "beta": 1.0},
                                        "counts": {"rstar_z": 9, "warm_users": 9}},
                     pop_train=np.array([1, 2]), pop_train_valid=np.array([2, 4]))
    assert users.rstar_table(1.0, True) == pytest.approx(np.log(9) - np.log([2, 4]))
    assert prep.rstar_is_stored(None, False) and prep.rstar_is_stored(1.0, False)
    assert not prep.rstar_is_stored(0.8, False) and not prep.rstar_is_stored(None, True)


def test_resampled_negatives_are_seeded_per_epoch_and_independent_of_batching():
    pop = np.array([5, 1, 0, 20, 3])
    make = BatchMaker(plan(needs_negatives=True, neg_popularity=pop, num_negatives=50, seed=7))
    table = rows_table([[0], [1], [3], [4]], users=[10, 11, 12, 13])

    def negs(batch, u):
        lo = int(batch.neg_offsets[u])
        hi = int(batch.neg_offsets[u + 1]) if u + 1 < len(batch) else len(batch.neg_items)
        return dict(zip(batch.neg_items[lo:hi].tolist(), batch.neg_counts[lo:hi].tolist()))

    whole = make(table, epoch=3)
    assert all(sum(negs(whole, u).values()) == 50 for u in range(4))
    assert all(2 not in negs(whole, u) for u in range(4))  # zero popularity: never drawn
    part = make(table.slice(2, 2), epoch=3)
    assert [negs(part, u) for u in range(2)] == [negs(whole, u) for u in (2, 3)]
    assert [negs(make(table, epoch=4), u) for u in range(4)] != [negs(whole, u) for u in range(4)]
    assert epoch_seed(7, 3) == epoch_seed(7, 3) != epoch_seed(7, 4)


def test_validation_rows_are_split_over_ranks_exactly_once():
    train = [[0]] * 7
    valid = [[1], [], [2], [3], [4, 5], [], [6]]
    table = rows_table(train, valid)
    seen = []
    for rank in range(3):
        vb = valid_batch(table, rank, 3)
        if vb is not None:
            seen += [int(x) for x in vb.valid_items[vb.valid_offsets]]  # first item of each user
    assert sorted(seen) == [1, 2, 3, 4, 6]  # every user with a validation item, once


def test_a_validation_sample_is_fixed_nested_spread_and_the_size_asked_for():
    users = np.arange(200_000)
    tenth, fifth = in_valid_sample(users, 0.1), in_valid_sample(users, 0.2)
    assert abs(tenth.mean() - 0.1) < 0.003 and abs(fifth.mean() - 0.2) < 0.004
    assert not (tenth & ~fifth).any()  # nested: the smaller sample's users are in the larger
    # the same users whatever else is in the array (a hash of the index, not of the position)
    assert np.array_equal(in_valid_sample(users[::-1], 0.1), tenth[::-1])
    # spread over the whole index range, not its first tenth (indices follow the ids' order)
    per_quarter = tenth.reshape(4, -1).mean(axis=1)
    assert np.all(np.abs(per_quarter - 0.1) < 0.005), per_quarter
    assert in_valid_sample(users, 1.0).all()
    # the users it keeps are pinned: prepared.protocol.splitmix64 of the index (a change of hash
    # would silently change every run's validation sample)
    assert np.flatnonzero(in_valid_sample(np.arange(40), 0.25)).tolist() == [3, 10, 18, 20, 21, 33]
    top = protocol.splitmix64(np.arange(40, dtype=np.uint64)) >> np.uint64(11)
    assert np.array_equal(in_valid_sample(np.arange(40), 0.25), top < np.uint64(1 << 51))


def test_the_object_store_rule_counts_the_bytes_of_the_columns_read(tmp_path):
    """``column_bytes``: each column's bytes over every file, a list's under its name (its leaf
    is ``name.list.element``). Plain int32 data, no compression: 4 bytes a value, plus the
    pages' headers and the lists' levels."""
    import pyarrow.parquet as pq

    rows = tmp_path / "rows"
    rows.mkdir()
    for f in range(2):
        lists = [list(range(10 * u, 10 * u + 10)) for u in range(1_000)]  # 10,000 values a file
        pq.write_table(pa.table({
            S.USER_INDEX: pa.array(range(1_000), pa.int32()),
            S.TRAIN_ITEMS: pa.array(lists, pa.list_(pa.int32())),
            S.NEG_ITEMS: pa.array([["x" * 100] * 10] * 1_000, pa.list_(pa.string()))}),
            rows / f"part-{f}.parquet", compression="none", use_dictionary=False)
    sizes = column_bytes(str(rows))
    assert sorted(sizes) == sorted([S.USER_INDEX, S.TRAIN_ITEMS, S.NEG_ITEMS])
    assert 2 * 4_000 <= sizes[S.USER_INDEX] < 2 * 4_000 + 200
    # + repetition and definition levels
    assert 2 * 40_000 <= sizes[S.TRAIN_ITEMS] < 2 * 40_000 + 2 * 3_000
    assert sizes[S.NEG_ITEMS] > 2 * 1_000_000  # the 1 MB of strings a file
    # an explicit --data-cache decides without asking Ray, for every dataset alike
    reads = {"train": ([S.NEG_ITEMS], 1.0), "valid": ([S.USER_INDEX], 0.1)}
    assert fits_in_object_store(str(rows), "memory", reads) == {"train": True, "valid": True}
    assert fits_in_object_store(str(rows), "stream", reads) == {"train": False, "valid": False}


def train_valid_rows(rng, b, n_items, most_train, most_valid):
    """``b`` users' sorted training rows (1 to ``most_train`` - 1 items) and disjoint validation
    rows (1 to ``most_valid`` - 1 items)."""
    train = [sorted(rng.choice(n_items, rng.integers(1, most_train), replace=False).tolist())
             for _ in range(b)]
    valid = [sorted(rng.choice(sorted(set(range(n_items)) - set(t)), rng.integers(1, most_valid),
                               replace=False).tolist()) for t in train]
    return train, valid


def test_batch_metrics_match_the_numpy_reference():
    rng = np.random.default_rng(0)
    n_items, b = 120, 40
    train, valid = train_valid_rows(rng, b, n_items, 30, 70)
    vb = valid_batch(rows_table(train, valid), 0, 1)
    scores = torch.from_numpy(rng.normal(size=(b, n_items)).astype(np.float32))
    ndcg, recall = batch_metrics(scores, vb)
    masked = scores.numpy().copy()
    for u, t in enumerate(train):
        masked[u, t] = -np.inf
    recs = np.argsort(-masked, axis=1, kind="stable")[:, :50]
    ref = per_user(hit_matrix(recs, [np.array(v) for v in valid]), np.array([len(v) for v in valid]))
    assert ndcg.numpy() == pytest.approx(ref["NDCG"], abs=1e-9)
    assert recall.numpy() == pytest.approx(ref["Recall@50"], abs=1e-9)


def random_rows(rng, b, n_items, most):
    return [sorted(rng.choice(n_items, rng.integers(0, most), replace=False).tolist())
            for _ in range(b)]


def test_recommend_in_cache_sized_blocks_equals_one_block(monkeypatch):
    """Users scored a few at a time give the lists of one product over all of them: the input
    and exclusion rows are sliced per block (users without items, exclusions other than the
    input, and no exclusion at all included)."""
    import models.base
    from models.batch import sparse_rows
    from models.registry import build

    torch.manual_seed(0)
    rng = np.random.default_rng(1)
    n_items = 57
    model = build("autorec", {"lam_units": "plain", "n_items": n_items, "width": 8}).eval()
    items, offsets = sparse_rows(random_rows(rng, 23, n_items, 12))
    ex_items, ex_offsets = sparse_rows(random_rows(rng, 23, n_items, 30))
    whole = [model.recommend(items, offsets, 10), model.recommend(items, offsets, 10, False),
             model.recommend(items, offsets, 50, exclude=(ex_items, ex_offsets))]
    monkeypatch.setattr(models.base, "SCORE_BLOCK_FLOATS", 3 * n_items)  # blocks of 3 users
    blocked = [model.recommend(items, offsets, 10), model.recommend(items, offsets, 10, False),
               model.recommend(items, offsets, 50, exclude=(ex_items, ex_offsets))]
    for (v1, i1), (v2, i2) in zip(whole, blocked):
        assert v1.shape == v2.shape and torch.equal(i1, i2)
        assert torch.allclose(v1, v2, atol=1e-6)
    # what is excluded never appears (its -inf tail aside) and the rest is the plain top-k
    values, top = blocked[2]
    for u, lo in enumerate(ex_offsets.tolist()):
        hi = ex_offsets[u + 1] if u + 1 < len(ex_offsets) else len(ex_items)
        ranked = top[u][torch.isfinite(values[u])].tolist()
        assert not set(ranked) & set(ex_items[lo:hi].tolist())
        assert len(ranked) == min(50, n_items - (hi - lo))


def test_model_metrics_equal_the_metrics_of_the_model_scores():
    from models.registry import build

    torch.manual_seed(0)
    rng = np.random.default_rng(2)
    n_items, b = 300, 64
    train, valid = train_valid_rows(rng, b, n_items, 40, 20)
    vb = valid_batch(rows_table(train, valid), 0, 1)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": n_items, "width": 16}).eval()
    got = model_metrics(model, vb)
    want = batch_metrics(model.score(vb.train_items, vb.train_offsets), vb)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-12) and float(w.sum()) > 0


@pytest.mark.parametrize("name", ["bpr", "cml", "cdae"])
def test_validation_by_trained_vectors_scores_each_user_by_its_own_vector(name):
    """``--valid-by trained``: the metrics of the scores from each validation user's trained
    vector (its index carried by the batch, here shuffled and with a user left out), in blocks;
    not the fold-in's."""
    from models.registry import build

    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    n_items, b = 300, 48
    train, valid = train_valid_rows(rng, b, n_items, 30, 10)
    valid[5] = []  # no validation item: left out of the batch, with its index
    users = rng.permutation(100)[:b].tolist()
    vb = valid_batch(rows_table(train, valid, users), 0, 1)
    assert vb.users.tolist() == [u for i, u in enumerate(users) if i != 5]
    model = build(name, {"n_items": n_items, "n_users": 100, "width": 8}).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5 * torch.randn_like(p))  # trained-looking vectors, not the init's
        want = batch_metrics(model.score_users(model.users(vb.users), vb.train_items,
                                               vb.train_offsets), vb)
        _, top = model.recommend(vb.train_items, vb.train_offsets, 50, users=vb.users)
        folded = model_metrics(model, vb)
    got = top_metrics(top, vb)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, atol=1e-12) and float(w.sum()) > 0
    assert not torch.allclose(got[0], folded[0])  # the fold-in path is another one


def test_valid_by_trained_is_for_models_with_trained_user_vectors():
    check(cfg(model="cdae", valid_by="trained"))
    with pytest.raises(UsageError, match="--valid-by trained: autorec has no trained user "
                                         "vectors \\(only bpr, cml, cdae have\\); drop the flag"):
        check(cfg(model="autorec", valid_by="trained"))


def test_a_run_resumes_only_with_its_validation():
    from dataclasses import replace

    from training.run_record import check_resume

    c = cfg(model="bpr", run_name="r")
    check_resume(c, {"config": c.to_dict()})  # the same settings: it resumes
    with pytest.raises(UsageError, match="valid_by was 'fold-in', now 'trained'"):
        check_resume(replace(c, valid_by="trained"), {"config": c.to_dict()})


# -- early stopping and phases ----------------------------------------------------------------------

def cfg(**kw):
    return TrainConfig(data="/x", **kw)


def test_early_stopping_keeps_the_best_epoch():
    p, c = new_progress(), cfg(patience=2, epochs=100)
    for ndcg in (0.1, 0.3, 0.2, 0.25):
        next_state(p, c, 1, None, ndcg)
    assert (p["best_epoch"], p["best_ndcg"], p["done"]) == (2, 0.3, True)
    assert p["phase_epochs"] == [4]


def test_without_patience_each_model_stops_after_its_own_and_the_run_logs_it():
    # CDAE dips for several epochs before it climbs past its early best (models/cdae.py)
    for model, patience in (("autorec", 5), ("cdae", 20)):
        p, c = new_progress(), cfg(model=model, epochs=100)
        for ndcg in [0.2] + [0.1] * (patience - 1):
            next_state(p, c, 1, None, ndcg)
        assert not p["done"], model
        next_state(p, c, 1, None, 0.1)
        assert p["done"] and p["best_epoch"] == 1, model
        assert c.resolved()["patience"] == patience
    assert cfg(model="cdae", patience=3).stop_patience == 3


def test_epoch_cap_and_final_retraining_return_the_last_epoch():
    p, c = new_progress(), cfg(epochs=3, train_splits="train,valid")
    improved = [next_state(p, c, 1, None, None)[0] for _ in range(3)]
    assert improved == [True] * 3 and p["best_epoch"] == 3 and p["done"]


def test_finetune_phase_one_ends_when_its_loss_converges_or_after_fixed_epochs():
    p, c = new_progress(), cfg(model="nce-autorec", mode="limited-finetune", epochs=50)
    switches = [next_state(p, c, 2, loss, None)[1] for loss in (1.0, 0.5, 0.4, 0.3999)]
    assert switches == [False, False, False, True] and p["phase"] == 1
    assert p["phase_epochs"] == [4] and p["phase_epoch"] == 0
    p, c = new_progress(), cfg(model="nce-autorec", mode="full-finetune", pretrain_epochs=2)
    assert [next_state(p, c, 2, 1.0 / (e + 1), None)[1] for e in range(2)] == [False, True]


# -- bad configuration and input ---------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(model="autorec", mode="joint"),
     r"--mode joint: autorec does not take it \(only ns-autorec, nce-autorec do\).*Drop the flag"),
    (dict(model="gru4rec"), "--model gru4rec: no such model; choose one of autorec, .*ease"),
    (dict(model="puresvd", width=10),
     r"--width 10: puresvd does not take it \(only .*\); its hyperparameters: --rank. Drop the flag"),
    (dict(model="autorec", rank=10),
     r"--rank 10: autorec does not take it \(only .*\); its hyperparameters: --width, --lam"),
    (dict(width=0), "--width 0"),
    (dict(lr=0.0), "--lr 0.0"),
    (dict(lam=-1.0), "--lam -1.0"),
    (dict(beta=20.0), "--beta 20.0"),
    (dict(batch_size=1, num_workers=2), "at least one user per worker"),
    (dict(patience=0), "--patience 0"),
    (dict(model="nce-autorec", mode="full-finetune", train_splits="train,valid"),
     "pass phase 1's epoch count"),
    (dict(train_splits="valid"), "--train-splits valid"),
    (dict(valid_sample=0.0), "--valid-sample 0.0: a fraction of the validation users"),
    (dict(valid_sample=1.5), "--valid-sample 1.5"),
    (dict(model="bpr", loss_path="fast"), "--loss-path fast: bpr has one way"),
])
def test_bad_configuration_names_the_flag_and_the_fix(kwargs, match):
    with pytest.raises(UsageError, match=match):
        check(cfg(**kwargs))


def test_open_prepared_explains_what_is_wrong(tmp_path):
    with pytest.raises(UsageError, match="no such directory.*spark-submit etl/prepare.py"):
        open_prepared(str(tmp_path / "nope"))
    (tmp_path / "half").mkdir()
    with pytest.raises(UsageError, match="not a prepared dataset \\(no manifest.json"):
        open_prepared(str(tmp_path / "half"))
    # a raw folder is named as the ETL's input, with an output of its own under var/
    raw = tmp_path / "ml-latest-small"
    raw.mkdir()
    for name in ("ratings.csv", "README.txt", "movies.csv"):
        (raw / name).write_text("userId,movieId,rating,timestamp\n")
    with pytest.raises(UsageError) as e:
        open_prepared(str(raw))
    assert (f"a raw dataset (movies.csv, ratings.csv), not a prepared one; prepare it with: "
            f"spark-submit etl/prepare.py --dataset NAME --input {raw} --output "
            f"var/data/ml-latest-small, then pass --data var/data/ml-latest-small") in str(e.value)
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "manifest.json").write_text(json.dumps({"schema_version": 0}))
    with pytest.raises(UsageError,
                       match=f"schema version 0, but this code reads version {S.SCHEMA_VERSION}"):
        open_prepared(str(tmp_path / "old"))


def test_an_mlflow_file_store_is_refused_with_what_to_use_instead(monkeypatch):
    for uri in ("./mlruns", "mlruns", "file:///tmp/mlruns"):
        with pytest.raises(UsageError, match=f"--mlflow-uri={uri} is an MLflow file store.*sqlite"):
            tracking_uri(uri)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "/abs/mlruns")
    with pytest.raises(UsageError, match="MLFLOW_TRACKING_URI=/abs/mlruns is an MLflow file"):
        tracking_uri(None)
    for uri in ("sqlite:////tmp/x.db", "http://127.0.0.1:5000", "databricks",
                "postgresql://u@h/db"):
        assert tracking_uri(uri) == uri


def test_tracking_uri_is_absolute_and_an_unreachable_server_fails_fast(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert tracking_uri("sqlite:///rel.db") == f"sqlite:///{tmp_path / 'rel.db'}"
    assert tracking_uri(None).startswith("sqlite:////") and tracking_uri(None).endswith("mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")
    assert tracking_uri(None) == "http://127.0.0.1:9"
    with pytest.raises(UsageError, match="127.0.0.1:9 is not reachable.*--mlflow-uri"):
        check_reachable("http://127.0.0.1:9", timeout=2)
    with pytest.raises(UsageError, match="does not exist"):
        check_reachable(f"sqlite:///{tmp_path}/no/such/dir/m.db")


def test_under_ray_job_submit_paths_must_be_absolute(monkeypatch):
    from training.train import build_parser, check_job_paths

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    args = build_parser().parse_args(["--data", "var/data/x"])
    with pytest.raises(UsageError, match="pass --runs-dir and --mlflow-uri; --data var/data/x must "
                                         "be absolute"):
        check_job_paths(args)
    check_job_paths(build_parser().parse_args(["--data", "/abs/x", "--runs-dir", "/abs/runs",
                                               "--mlflow-uri", "http://127.0.0.1:5000"]))
    # the experiment's folder flag is named from its own options, not spelled at the call
    from experiment.plan import ExperimentConfig
    from experiment.run import build_parser as experiment_parser

    with pytest.raises(UsageError, match="pass --experiments-dir and --mlflow-uri"):
        check_job_paths(experiment_parser().parse_args(["--data", "/abs/x"]), ExperimentConfig)


def test_the_folder_of_runs_is_runs_dir_and_the_old_output_flag_still_works(capsys, tmp_path):
    """--output is the output folder itself in the Spark stages; training's is a folder of runs,
    so its flag says so. The old spelling is still taken, with a note naming the new one."""
    from experiment.run import build_parser as experiment_parser
    from training.train import build_parser

    assert build_parser().parse_args(["--data", "d", "--runs-dir", "/r"]).output == "/r"
    assert capsys.readouterr().err == ""
    assert build_parser().parse_args(["--data", "d", "--output", "/r"]).output == "/r"
    assert "--output is now --runs-dir (same meaning)" in capsys.readouterr().err
    assert experiment_parser().parse_args(["--data", "d", "--output", "/e"]).output == "/e"
    assert "--output is now --experiments-dir" in capsys.readouterr().err
    text = build_parser().format_help()
    assert "--runs-dir RUNS_DIR" in text and "\n  --output" not in text
    # a --config file may name it either way; the file a run writes uses the flag's name
    cfg = tmp_path / "c.yaml"
    cfg.write_text("runs_dir: /from/file\n")
    assert build_parser().parse_args(["--data", "d", "--config", str(cfg)]).output == "/from/file"
    cfg.write_text("output: /old/file\n")
    assert build_parser().parse_args(["--data", "d", "--config", str(cfg)]).output == "/old/file"


@pytest.mark.parametrize("path,dense", [("auto", None), ("fast", False), ("dense", True)])
def test_loss_path_sets_how_the_autorec_family_computes_its_loss(path, dense):
    from training.loop import build_model

    model, _ = build_model(cfg(model="nce-autorec", loss_path=path), n_items=50, n_users=None,
                           data={"overlap": 0.1})
    assert model.dense_loss is dense
    assert model.dense_for("nce", 4096) is (dense if dense is not None else False)


def bf16_step(bf16: bool, dense_loss: bool) -> tuple[dict, torch.nn.Module, torch.Tensor]:
    """One training step of a small NCE-AutoRec on a 3-user batch, under --bf16 or not, on the
    dense loss (the heads' nn.Linear over the scores) or the fast one: (its loss terms, the
    model after it, the predict head's weight before it)."""
    from models.batch import Batch
    from models.registry import build
    from training.step import make_optimizers, train_batch

    torch.manual_seed(0)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": 30, "width": 8})
    model.dense_loss = dense_loss
    batch = Batch(users=torch.arange(3), train_items=torch.tensor([0, 4, 7, 1, 29]),
                  train_offsets=torch.tensor([0, 3, 4]), train_rstar=torch.rand(5),
                  neg_items=torch.zeros(0, dtype=torch.long),
                  neg_counts=torch.zeros(0, dtype=torch.long),
                  neg_offsets=torch.zeros(3, dtype=torch.long))
    before = model.heads["predict"].weight.detach().clone()
    plan = model.trainer(model)
    steps = plan.phases()[0]
    terms = train_batch(model, batch, steps, make_optimizers(plan, steps, 0.01), bf16=bf16)
    return {k: float(v) for k, v in terms.items()}, model, before


def test_bf16_step_on_cpu_trains_like_float32():
    """The --bf16 path runs on a CPU (autocast's CPU backend): the loss terms are close to the
    float32 step's, the parameters stay float32, and they move."""
    terms = {}
    for bf16 in (False, True):
        # the heads' nn.Linear on the dense loss: what autocast runs in bf16
        terms[bf16], model, before = bf16_step(bf16, dense_loss=True)
        w = model.heads["predict"].weight
        assert w.dtype == torch.float32 and not torch.equal(w.detach(), before)
    full, half = terms[False], terms[True]
    assert full.keys() == half.keys()
    assert half["predict"] != full["predict"]  # the products did run in bf16
    for k in full:
        assert half[k] == pytest.approx(full[k], rel=2e-2), k


def test_bf16_changes_nothing_on_the_autorec_familys_fast_loss():
    """What --bf16's help says: the AutoRec family's fast loss (its MSE heads' default once a
    batch has 2/3 of --width users or more) runs its products in float32 under autocast too, and
    its encoder is an embedding bag autocast leaves alone, so a step under --bf16 is the float32
    step, bit for bit; only the products through the (batch, items) scores (the NS head's, the
    dense loss's) run in bf16."""
    full, m32, _ = bf16_step(False, dense_loss=False)
    half, m16, _ = bf16_step(True, dense_loss=False)
    assert half == full and full["predict"] > 0
    w32, w16 = m32.state_dict(), m16.state_dict()
    assert all(torch.equal(w32[k], w16[k]) for k in w32)


def test_batch_to_cpu_is_not_pinned():
    """Pinning is for host-to-GPU copies; a CPU batch stays as it is (pin_memory needs CUDA)."""
    from models.batch import Batch

    t = torch.arange(4)
    b = Batch(users=t, train_items=t, train_offsets=t, train_rstar=t.float(), neg_items=t,
              neg_counts=t, neg_offsets=t).to(torch.device("cpu"))
    assert b.users is t and not b.train_rstar.is_pinned()


def test_effective_rank_of_codes():
    """exp(entropy of the normalised singular values): d for equal directions, 1 for a line."""
    import math

    import torch

    from training.loop import effective_rank

    assert effective_rank(torch.eye(4) * 3) == pytest.approx(4.0)
    line = torch.outer(torch.arange(1.0, 6.0), torch.tensor([1.0, 2.0, 0.5]))
    assert effective_rank(line) == pytest.approx(1.0, abs=1e-6)
    two = torch.diag(torch.tensor([3.0, 1.0]))  # p = (3/4, 1/4)
    assert effective_rank(two) == pytest.approx(math.exp(-(0.75 * math.log(0.75) + 0.25 * math.log(0.25))))
    assert effective_rank(torch.zeros(3, 2)) == 0.0


def test_a_run_recorded_before_an_option_existed_resumes():
    """Options added later default to None, which is what an older run record's missing key
    reads as: the run resumes; a changed setting is still refused."""
    from dataclasses import replace

    from training.config import TrainConfig
    from training.run_record import check_resume

    cfg = TrainConfig(data="d", model="nce-autorec", run_name="r")
    old = {k: v for k, v in cfg.to_dict().items() if k not in ("finetune_init", "finetune_lr")}
    check_resume(cfg, {"config": old})
    with pytest.raises(UsageError, match="lam was None, now 3.0"):
        check_resume(replace(cfg, lam=3.0), {"config": old})
    # a hyperparameter added later (a lever, off by default): the record lacks it, the run
    # resumes at its default and is refused with the lever on (measured: a Gowalla trial
    # recorded before --pop-l2 existed was refused with "pop_l2 was None, now None")
    older = {k: v for k, v in cfg.to_dict().items() if k not in ("pop_l2", "nce_pos_weight")}
    check_resume(cfg, {"config": older})
    check_resume(replace(cfg, pop_l2=0.0), {"config": older})
    with pytest.raises(UsageError, match="pop_l2 was None, now 1.0"):
        check_resume(replace(cfg, pop_l2=1.0), {"config": older})


def test_the_experiment_under_ray_job_submit_needs_absolute_paths_and_a_tracking_uri(monkeypatch,
                                                                                       capsys):
    """Its default MLflow store and output would live in the job's throw-away working-dir copy
    (seen: a run's trials logged to a SQLite file deleted with the job)."""
    from experiment.run import main

    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", "{}")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    assert main(["--data", "/abs/x"]) == 2
    err = capsys.readouterr().err
    assert "pass --experiments-dir and --mlflow-uri" in err


def test_the_epoch_body_sums_each_term_over_the_users_and_the_phase_has_its_learning_rate():
    """``training.step.train_epoch`` (the loop's epoch, and benchmarks/tune_defaults.py's): each
    loss term summed as batch mean x batch users, the same steps as calling ``train_batch`` on
    each batch; ``phase_optimizers`` gives fine-tune phase 2 --finetune-lr (the model's
    policy's ``phase_lr``), phase 1 --lr."""
    from models.batch import Batch
    from training.loop import build_model
    from training.step import make_optimizers, phase_optimizers, train_batch, train_epoch

    def batch(rows):
        idx = torch.tensor([i for r in rows for i in r])
        offsets = torch.tensor([0, *np.cumsum([len(r) for r in rows])[:-1]])
        return Batch(users=torch.arange(len(rows)), train_items=idx, train_offsets=offsets,
                     train_rstar=torch.linspace(0.5, 2.0, len(idx)),
                     neg_items=torch.zeros(0, dtype=torch.long),
                     neg_counts=torch.zeros(0, dtype=torch.long),
                     neg_offsets=torch.zeros(len(rows), dtype=torch.long))

    batches = [batch([[0, 3], [5, 7, 9]]), batch([[1], [2, 4], [8, 9, 0]])]
    c = cfg(model="nce-autorec", mode="limited-finetune", lr=0.01, finetune_lr=0.002)
    (one, plan_one), (two, plan_two) = (build_model(c, 10, None, {"overlap": 0.5})
                                        for _ in range(2))
    two.load_state_dict(one.state_dict())
    steps = plan_one.phases()[0]
    sums, users = train_epoch(one, iter(batches), steps, make_optimizers(plan_one, steps, 0.01))
    opts = make_optimizers(plan_two, steps, 0.01)
    want = {}
    for b in batches:
        for k, v in train_batch(two, b, steps, opts).items():
            want[k] = want.get(k, 0.0) + float(v) * len(b)
    assert users == 5 and set(sums) == set(want)
    for k in want:
        assert float(sums[k]) == pytest.approx(want[k], rel=1e-6), k
    assert all(torch.equal(a, b) for a, b in zip(one.parameters(), two.parameters()))
    phases = plan_one.phases()
    assert [o.param_groups[0]["lr"] for o in phase_optimizers(plan_one, phases, 0, 0.01)] == [0.01]
    assert [o.param_groups[0]["lr"] for o in phase_optimizers(plan_one, phases, 1, 0.01)] == [0.002]
