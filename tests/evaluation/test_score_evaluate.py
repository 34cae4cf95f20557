"""Batch scoring and evaluation on real Spark (the session's local[2]) over ml-latest-small prepared by the
real ETL: Spark's top-K equals the model's own, metrics equal the numpy reference user by user,
bad input is refused with a clear message, and results land in a real MLflow server."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from evaluation.evaluate import evaluate
from evaluation.score import score
from evaluation.spark_metrics import METRICS, metric_key
from models.autorec import AutoRec
from models.batch import sparse_rows
from models.registry import build, save
from prepared import metrics as M
from prepared import schema as S
from prepared.errors import UsageError
from tests.etl_helpers import relist_files, reshard_rows

pytestmark = pytest.mark.spark


def rows_of(prepared: Path) -> pd.DataFrame:
    return pd.read_parquet(prepared / S.ROWS_DIR).sort_values(S.USER_INDEX).reset_index(drop=True)


def item_ids(prepared: Path) -> np.ndarray:
    items = pd.read_parquet(prepared / S.ITEMS_DIR).sort_values(S.ITEM_INDEX)
    return items[S.ITEM_ID].astype(str).to_numpy()


def save_model(path: Path, prepared: Path, *, n_items: int | None = None,
               train_splits: str = "train", run: dict | None = None) -> AutoRec:
    """A small NCE-AutoRec in training's model.pt format: random weights plus log-popularity
    biases, so that its lists are personal yet hit the truth often enough to test metrics."""
    pop = pd.read_parquet(prepared / S.ITEMS_DIR).sort_values(S.ITEM_INDEX)[S.POP_TRAIN].to_numpy()
    torch.manual_seed(0)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": n_items or len(pop), "width": 16}).eval()
    with torch.no_grad():
        model.heads["predict"].bias[:len(pop)] = torch.log1p(torch.from_numpy(pop[:model.n_items]))
    path.mkdir(parents=True, exist_ok=True)
    torch.save(save(model, config={"model": "nce-autorec", "run_name": path.name,
                                   "train_splits": train_splits}, summary={}), path / "model.pt")
    if run:
        (path / "run.json").write_text(json.dumps(run))
    return model


def direct_top(model: AutoRec, rows: pd.DataFrame, k: int, extra_exclude: tuple[str, ...] = ()):
    """Each user's top k straight from the model: input = train items, exclude = input + extra."""
    items, offsets = sparse_rows(list(rows[S.TRAIN_ITEMS]))
    with torch.no_grad():
        scores = model.score(items, offsets)
    for u, row in enumerate(rows.itertuples()):
        seen = list(row.train_items) + [i for c in extra_exclude for i in getattr(row, c)]
        scores[u, seen] = -torch.inf
    top = torch.topk(scores, k, dim=1)
    return top.values.numpy(), top.indices.numpy()


@pytest.fixture(scope="module")
def scored(spark, small_prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("scoring")
    model = save_model(base / "run-a", small_prepared)
    m = score(spark, model=str(base / "run-a"), data=str(small_prepared), output=str(base / "recs"),
              k=50)
    return model, base, m


def test_spark_scores_equal_the_models_own_top_k(scored, small_prepared):
    model, base, manifest = scored
    rows = rows_of(small_prepared)
    recs = pd.read_parquet(base / "recs").set_index("user_id").loc[rows[S.USER_ID]]
    assert manifest["scored_users"] == len(rows) == len(recs)
    assert manifest["input_splits"] == ["train"] and manifest["exclude"] == ["train"]
    vals, idx = direct_top(model, rows, 50)
    ids = item_ids(small_prepared)
    assert all(list(got) == list(ids[want]) for got, want in zip(recs["item_ids"], idx))
    np.testing.assert_allclose(np.stack(recs["scores"].to_numpy()), vals, rtol=1e-5, atol=1e-5)
    # the lists never hold a training item, and the scores are sorted best first
    for row, got in zip(rows.itertuples(), recs["item_ids"]):
        assert not set(got) & set(ids[row.train_items])
    assert all(np.all(np.diff(s) <= 0) for s in recs["scores"])
    assert json.loads((base / "recs" / "_manifest.json").read_text())["k"] == 50


def test_exclude_train_valid_removes_valid_items_and_keeps_the_input(spark, scored, small_prepared):
    model, base, _ = scored
    out = base / "recs-tv"
    m = score(spark, model=str(base / "run-a"), data=str(small_prepared), output=str(out), k=10,
              users="warm", exclude="train,valid")
    rows = rows_of(small_prepared)
    rows = rows[~rows[S.COLD]]
    recs = pd.read_parquet(out).set_index("user_id").loc[rows[S.USER_ID]]
    assert m["exclude"] == ["train", "valid"] and m["scored_users"] == len(rows)
    _, idx = direct_top(model, rows, 10, extra_exclude=(S.VALID_ITEMS,))
    ids = item_ids(small_prepared)
    assert all(list(got) == list(ids[want]) for got, want in zip(recs["item_ids"], idx))
    for row, got in zip(rows.itertuples(), recs["item_ids"]):
        assert not set(got) & set(ids[list(row.train_items) + list(row.valid_items)])


def test_scoring_frees_the_drivers_copy_of_the_weights(spark, scored, small_prepared,
                                                        monkeypatch):
    """An experiment scores dozens of models in one application: each score() must leave no
    broadcast behind on the driver (unpersist would drop only the executors' copies), or the
    driver's heap fills up (citeulike-a's EASE, 1.15 GB, after 17 other models)."""
    _, base, _ = scored
    made = []
    real = type(spark.sparkContext).broadcast

    def recording(sc, value):
        made.append(real(sc, value))
        return made[-1]

    monkeypatch.setattr(type(spark.sparkContext), "broadcast", recording)
    score(spark, model=str(base / "run-a"), data=str(small_prepared), output=str(base / "freed"),
          k=5)
    assert len(made) == 2  # the weights and the item ids
    assert not any(bc._jbroadcast.isValid() for bc in made)  # destroyed, driver copy included
    assert not any(os.path.exists(bc._path) for bc in made)


def test_cold_users_and_user_lists(spark, scored, small_prepared):
    _, base, _ = scored
    rows = rows_of(small_prepared)
    m = score(spark, model=str(base / "run-a"), data=str(small_prepared), output=str(base / "cold"),
              k=5, users="cold")
    got = set(pd.read_parquet(base / "cold")["user_id"])
    assert got == set(rows.loc[rows[S.COLD], S.USER_ID]) and m["scored_users"] == len(got) > 0
    pick = list(rows[S.USER_ID][:3])
    score(spark, model=str(base / "run-a"), data=str(small_prepared), output=str(base / "three"),
          k=5, users=",".join(pick))
    assert sorted(pd.read_parquet(base / "three")["user_id"]) == sorted(pick)
    with pytest.raises(UsageError, match=r"1 of 2 user ids are not in .*nobody"):
        score(spark, model=str(base / "run-a"), data=str(small_prepared),
              output=str(base / "bad"), users=f"{pick[0]},nobody")
    assert not (base / "bad").exists()


def test_scoring_refuses_bad_input_and_leaves_nothing_half_written(spark, scored, small_prepared,
                                                                   tmp_path):
    _, base, _ = scored
    n = len(item_ids(small_prepared))
    save_model(tmp_path / "wide", small_prepared, n_items=n + 1)
    with pytest.raises(UsageError, match=rf"scores {n + 1:,} items but --data .* has {n:,}"):
        score(spark, model=str(tmp_path / "wide"), data=str(small_prepared),
              output=str(tmp_path / "x"))
    with pytest.raises(UsageError, match="already exists; pass --overwrite"):
        score(spark, model=str(base / "run-a"), data=str(small_prepared), output=str(base / "recs"))
    with pytest.raises(UsageError, match="no such file"):
        score(spark, model=str(tmp_path / "missing"), data=str(small_prepared),
              output=str(tmp_path / "x"))
    with pytest.raises(UsageError, match=rf"^--k {n + 1}: --data .* has {n:,} items; a list"):
        score(spark, model=str(base / "run-a"), data=str(small_prepared),
              output=str(tmp_path / "x"), k=n + 1)
    # arguments that do not fit the weights: refused on the driver, before any task builds it
    save_model(tmp_path / "broken", small_prepared)
    saved = torch.load(tmp_path / "broken" / "model.pt", weights_only=True)
    torch.save({**saved, "model_args": {**saved["model_args"], "width": 17}},
               tmp_path / "broken" / "model.pt")
    with pytest.raises(UsageError, match=r"broken: its model arguments do not describe its "
                                         r"weights \(e\.g\. .*: the arguments make \(.*17\)"):
        score(spark, model=str(tmp_path / "broken"), data=str(small_prepared),
              output=str(tmp_path / "out"))
    # weights the driver's heap cannot broadcast: refused with the flag, not a JVM OutOfMemoryError
    import evaluation.score as score_module
    from runtime.spark import SPARK_RESERVED, broadcast_room

    heap = 2 << 30  # the session's SPARK_DRIVER_MEMORY (tests/conftest.py)
    assert heap - SPARK_RESERVED - (64 << 20) <= broadcast_room(spark) <= heap - SPARK_RESERVED
    real = score_module.broadcast_room
    score_module.broadcast_room = lambda s: 1000  # a heap with room for 1000 bytes
    try:
        with pytest.raises(UsageError, match=r"^--model .*run-a's weights are 0\.00 GiB, more than "
                                             r"Spark's driver can broadcast .* --driver-memory 1g"):
            score(spark, model=str(base / "run-a"), data=str(small_prepared),
                  output=str(tmp_path / "big"))
    finally:
        score_module.broadcast_room = real
    # neither the output nor its hidden staging directory is left behind
    assert sorted(p.name for p in tmp_path.iterdir()) == ["broken", "wide"]


# ---- evaluation --------------------------------------------------------------------------------

def numpy_reference(recs: pd.DataFrame, prepared: Path, target: str = "test") -> pd.DataFrame:
    """Per-user metrics by prepared.metrics (numpy), truth from the split table."""
    split = pd.read_parquet(prepared / S.SPLIT_DIR)
    users = pd.read_parquet(prepared / S.USERS_DIR).set_index(S.USER_ID)[S.COLD]
    split["cold"] = split[S.USER_ID].map(users)
    want = np.where(split["cold"], split[S.SPLIT].isin(["valid", "test"]), split[S.SPLIT] == target)
    truth = split[want].groupby(S.USER_ID)[S.ITEM_ID].apply(lambda s: np.array(sorted(set(s))))
    recs = recs[recs["user_id"].isin(truth.index)].reset_index(drop=True)
    lists = [list(x) for x in recs["item_ids"]]
    width = max(len(x) for x in lists)
    vocab = {i: n for n, i in enumerate(sorted({i for x in lists for i in x} |
                                               {i for t in truth for i in t}))}
    mat = np.full((len(lists), width), -1)
    for u, x in enumerate(lists):
        mat[u, :len(x)] = [vocab[i] for i in x]
    t = [np.array([vocab[i] for i in truth[u]]) for u in recs["user_id"]]
    values = M.per_user(M.hit_matrix(mat, t), np.array([len(a) for a in t]))
    out = pd.DataFrame({metric_key(k): v for k, v in values.items()})
    out.insert(0, "user_id", recs["user_id"])
    out.insert(1, "group", np.where(recs["user_id"].map(users), "cold", "warm"))
    return out


@pytest.fixture(scope="module")
def evaluated(spark, scored, small_prepared):
    _, base, _ = scored
    m = evaluate(spark, recs=[str(base / "recs")], data=str(small_prepared),
                 output=str(base / "eval"), no_mlflow=True)
    return base, m


def test_spark_metrics_equal_the_numpy_reference_user_by_user(evaluated, small_prepared):
    base, manifest = evaluated
    ref = numpy_reference(pd.read_parquet(base / "recs"), small_prepared).set_index("user_id")
    got = pd.read_parquet(base / "eval" / "per_user").set_index("user_id").loc[ref.index]
    assert (got["group"] == ref["group"]).all()
    assert {"warm", "cold"} <= set(ref["group"])
    for m in METRICS:
        np.testing.assert_allclose(got[metric_key(m)], ref[metric_key(m)], rtol=0, atol=1e-12,
                                   err_msg=m)
    assert ref["ndcg"].mean() > 0.05  # the lists hit: the comparison is not between zeros
    # the summary: mean and CI per group equal prepared.metrics.summarise of the reference
    rows = {(r["group"], r["metric"]): r for r in manifest["rows"]}
    for group in ("warm", "cold"):
        part = ref[ref["group"] == group]
        want = M.summarise({m: part[metric_key(m)].to_numpy() for m in METRICS})
        for m in METRICS:
            assert rows[group, m]["users"] == want[m]["users"]
            assert rows[group, m]["mean"] == pytest.approx(want[m]["mean"], abs=1e-12)
            assert rows[group, m]["ci95"] == pytest.approx(want[m]["ci95"], abs=1e-9)


def test_evaluation_files(evaluated):
    base, manifest = evaluated
    out = base / "eval"
    table = pd.read_csv(out / "metrics.csv")
    assert list(table.columns) == ["label", "group", "target", "metric", "K", "mean", "ci95", "users"]
    recall = table[(table["metric"] == "Recall") & (table["group"] == "warm")]
    assert sorted(recall["K"]) == [5, 10, 15, 20, 50]
    assert (table["mean"].between(0, 1)).all()
    pop = json.loads((out / "popularity.json").read_text())
    assert set(pop[manifest["labels"][0]]) >= {"median_popularity", "share_top10pct", "coverage",
                                               "gini"}
    assert (out / "popularity.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((out / "manifest.json").read_text())["target"] == "test"


def test_lists_sharded_as_the_rows_are_read_beside_them_with_the_shuffles_numbers(
        spark, scored, small_prepared, tmp_path):
    """score.py writes one file per rows shard, named as the shard, holding exactly its users;
    evaluate.py then reads each beside its shard (no shuffle), and the same lists written
    elsewhere (no manifest: the shuffle by user) give the same numbers."""
    _, base, _ = scored
    data = reshard_rows(small_prepared, tmp_path / "data", 3)
    m = score(spark, model=str(base / "run-a"), data=str(data), output=str(tmp_path / "recs"), k=50)
    shards = json.loads((data / "manifest.json").read_text())["crc32"]
    assert m["row_shards"] == {f.split("/", 1)[1]: v for f, v in shards.items()
                               if f.startswith(S.ROWS_DIR + "/")} and len(m["row_shards"]) == 3
    for shard in m["row_shards"]:
        want = set(pd.read_parquet(data / S.ROWS_DIR / shard)[S.USER_ID].astype(str))
        assert set(pd.read_parquet(tmp_path / "recs" / shard)["user_id"]) == want, shard
    sharded = evaluate(spark, recs=[str(tmp_path / "recs")], labels=["A"], data=str(data),
                       output=str(tmp_path / "eval"), no_mlflow=True)
    assert sharded["lists_read"] == "beside their rows shards"
    (tmp_path / "plain").mkdir()
    pd.read_parquet(tmp_path / "recs")[["user_id", "item_ids"]].sample(frac=1, random_state=0) \
        .to_parquet(tmp_path / "plain" / "part-0.parquet")
    shuffled = evaluate(spark, recs=[str(tmp_path / "plain")], labels=["A"], data=str(data),
                        output=str(tmp_path / "eval-plain"), no_mlflow=True)
    assert shuffled["lists_read"] == "shuffled by user"
    a = pd.read_parquet(tmp_path / "eval" / "per_user").sort_values("user_id") \
        .reset_index(drop=True)
    b = pd.read_parquet(tmp_path / "eval-plain" / "per_user").sort_values("user_id") \
        .reset_index(drop=True)
    assert len(a) > 500
    pd.testing.assert_frame_equal(a, b, check_exact=True)  # per user: bit for bit
    assert len(sharded["rows"]) == len(shuffled["rows"])
    for x, y in zip(sharded["rows"], shuffled["rows"]):  # merged in another order: ulps apart
        assert {k: v for k, v in x.items() if k not in ("mean", "ci95")} == \
            {k: v for k, v in y.items() if k not in ("mean", "ci95")}
        assert x["mean"] == pytest.approx(y["mean"], abs=1e-12)
        assert x["ci95"] == pytest.approx(y["ci95"], abs=1e-12)
    assert sharded["popularity"] == shuffled["popularity"]


def test_short_lists_count_missing_positions_as_misses(spark, scored, small_prepared):
    """Some lists shorter than the file's k (here 5 < 50, as for users with few candidates): Spark
    pads them as the reference does."""
    _, base, _ = scored
    recs = pd.read_parquet(base / "recs")
    recs["item_ids"] = [list(x[:5]) if i % 2 else list(x) for i, x in enumerate(recs["item_ids"])]
    (base / "short").mkdir()
    recs[["user_id", "item_ids"]].to_parquet(base / "short" / "part-0.parquet")
    evaluate(spark, recs=[str(base / "short")], data=str(small_prepared),
             output=str(base / "eval-short"), no_mlflow=True)
    ref = numpy_reference(recs, small_prepared).set_index("user_id")
    got = pd.read_parquet(base / "eval-short" / "per_user").set_index("user_id").loc[ref.index]
    for m in ("MAP@50", "Recall@50", "Precision@20", "R-Precision", "NDCG@50 (truncated)"):
        np.testing.assert_allclose(got[metric_key(m)], ref[metric_key(m)], atol=1e-12, err_msg=m)


def test_the_files_k_bounds_the_metrics(spark, scored, evaluated, small_prepared, tmp_path):
    """Top-10 lists: metrics at cut-offs up to 10 only (NDCG and R-Precision need the top 50);
    lists longer than 50 are evaluated on their top 50, as the protocol defines the metrics."""
    _, base, _ = scored
    recs = pd.read_parquet(base / "recs")
    short = recs.assign(item_ids=[list(x[:10]) for x in recs["item_ids"]])[["user_id", "item_ids"]]
    short.to_parquet(tmp_path / "top10.parquet")
    m = evaluate(spark, recs=[str(tmp_path / "top10.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "e10"), no_mlflow=True)
    got = {r["metric"] for r in m["rows"] if r["group"] == "warm"}
    assert got == {f"{x}@{k}" for x in ("Precision", "Recall", "MAP", "F1", "HR", "MRR")
                   for k in (5, 10)} | {"NDCG@5 (truncated)", "NDCG@10 (truncated)"}
    full = {(r["metric"], r["group"]): r["mean"] for r in evaluated[1]["rows"]}
    for r in m["rows"]:  # what it does report equals the top-50 file's value at that cut-off
        assert r["mean"] == pytest.approx(full[r["metric"], r["group"]], abs=1e-12), r["metric"]

    rest = [i for i in item_ids(small_prepared)]
    longer = recs.assign(item_ids=[list(x) + [i for i in rest if i not in set(x)][:20]
                                   for x in recs["item_ids"]])[["user_id", "item_ids"]]
    longer.to_parquet(tmp_path / "top70.parquet")
    m = evaluate(spark, recs=[str(tmp_path / "top70.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "e70"), no_mlflow=True)
    assert {(r["metric"], r["group"]): r["mean"] for r in m["rows"]} == pytest.approx(full)

    recs.assign(item_ids=[list(x[:3]) for x in recs["item_ids"]])[["user_id", "item_ids"]] \
        .to_parquet(tmp_path / "top3.parquet")
    with pytest.raises(UsageError, match="lists hold 3 item.*smallest cut-off .* is 5.*--k 50"):
        evaluate(spark, recs=[str(tmp_path / "top3.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "e3"), no_mlflow=True)


def test_evaluation_refuses_bad_input(spark, scored, evaluated, small_prepared, tmp_path):
    _, base, _ = scored
    pd.DataFrame({"user_id": ["1"], "items": [["2"]]}).to_parquet(tmp_path / "nocol.parquet")
    with pytest.raises(UsageError, match=r"nocol.parquet: missing column\(s\) item_ids"):
        evaluate(spark, recs=[str(tmp_path / "nocol.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "o"), no_mlflow=True)
    pd.DataFrame({"user_id": ["nobody", "1"], "item_ids": [["2", "3", "4", "5", "6"]] * 2}).to_parquet(
        tmp_path / "unknown.parquet")
    with pytest.raises(UsageError, match=r"1 user\(s\) are not users of .* e.g. nobody"):
        evaluate(spark, recs=[str(tmp_path / "unknown.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "o"), no_mlflow=True)
    with pytest.raises(UsageError, match="already exists; pass --overwrite"):
        evaluate(spark, recs=[str(base / "recs")], data=str(small_prepared),
                 output=str(base / "eval"), no_mlflow=True)
    # a prepared directory whose split has no test positives
    import shutil
    empty = tmp_path / "no-test"
    shutil.copytree(small_prepared, empty)
    split = pd.read_parquet(empty / S.SPLIT_DIR)
    shutil.rmtree(empty / S.SPLIT_DIR)
    (empty / S.SPLIT_DIR).mkdir()
    split[split[S.SPLIT] != "test"].to_parquet(empty / S.SPLIT_DIR / "part-0.parquet")
    import pyarrow as pa
    import pyarrow.parquet as pq
    rows = pq.read_table(empty / S.ROWS_DIR)  # the user rows hold the same truth sets
    shutil.rmtree(empty / S.ROWS_DIR)
    (empty / S.ROWS_DIR).mkdir()
    at = rows.schema.get_field_index(S.TEST_ITEMS)
    pq.write_table(rows.set_column(at, S.TEST_ITEMS, pa.array([[]] * rows.num_rows,
                                                              pa.list_(pa.int32()))),
                   empty / S.ROWS_DIR / "part-0.parquet")
    relist_files(empty)
    with pytest.raises(UsageError, match="no warm user has a test item"):
        evaluate(spark, recs=[str(base / "recs")], data=str(empty), output=str(tmp_path / "o"),
                 no_mlflow=True)
    assert not (tmp_path / "o").exists()


def test_a_file_covering_some_users_is_refused_unless_users_names_them(spark, scored, evaluated,
                                                                     small_prepared, tmp_path):
    """30 of the warm users listed: its means would be over other users than the dataset's (or
    another file's), so it is refused, naming a missing user and the fix; ``--users`` naming the
    30 (or ``warm`` for a warm-only file) evaluates exactly those, each as the full file did."""
    _, base, _ = scored
    recs = pd.read_parquet(base / "recs")[["user_id", "item_ids"]]
    full = pd.read_parquet(base / "eval" / "per_user").set_index("user_id")
    ndcg = metric_key("NDCG")
    warm = sorted(full.index[full["group"] == "warm"])
    some = warm[:30]
    recs[recs["user_id"].isin(some)].to_parquet(tmp_path / "some.parquet")
    with pytest.raises(UsageError, match=rf"some.parquet: {len(warm) - 30:,} "
                                         r"warm and \d+ cold users with a truth set \(test for the "
                                         r"warm ones\) have no list in it, e\.g\. user \S+; evaluate "
                                         r"the users it covers with --users .* now all\), or score "
                                         r"every user"):
        evaluate(spark, recs=[str(tmp_path / "some.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "o"), no_mlflow=True)
    assert not (tmp_path / "o").exists()
    (tmp_path / "ids.txt").write_text("\n".join(some) + "\n")
    m = evaluate(spark, recs=[str(tmp_path / "some.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "o"), no_mlflow=True, users=f"@{tmp_path / 'ids.txt'}")
    assert m["users"] == f"@{tmp_path / 'ids.txt'}"
    assert {(r["group"], r["users"]) for r in m["rows"]} == {("warm", 30)}
    got = pd.read_parquet(tmp_path / "o" / "per_user").set_index("user_id")
    assert sorted(got.index) == some
    np.testing.assert_allclose(got.loc[some, ndcg], full.loc[some, ndcg], atol=1e-12)
    mean = next(r["mean"] for r in m["rows"] if r["metric"] == "NDCG")
    assert mean == pytest.approx(full.loc[some, ndcg].mean(), abs=1e-12)

    recs[recs["user_id"].isin(warm)].to_parquet(tmp_path / "warm.parquet")
    m = evaluate(spark, recs=[str(tmp_path / "warm.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "w"), no_mlflow=True, users="warm")
    before = {(r["metric"], r["users"]): r["mean"] for r in evaluated[1]["rows"]
              if r["group"] == "warm"}
    assert {(r["metric"], r["users"]): r["mean"] for r in m["rows"]} == pytest.approx(before)
    with pytest.raises(UsageError, match=r"--users: 1 of 2 user ids are not in --data .*nobody"):
        evaluate(spark, recs=[str(tmp_path / "some.parquet")], data=str(small_prepared),
                 output=str(tmp_path / "x"), no_mlflow=True, users=f"{some[0]},nobody")


def test_users_named_in_scorings_own_sharded_files_are_the_ones_evaluated(spark, scored, evaluated,
                                                                        small_prepared, tmp_path):
    """``--users`` naming raw user ids over score.py's own files, read shard by shard beside the
    rows: exactly those users are evaluated, each as the full run did (the shard pass once took
    the catalogue's item ids for the named users)."""
    _, base, _ = scored
    full = pd.read_parquet(base / "eval" / "per_user").set_index("user_id")
    some = sorted(full.index[full["group"] == "warm"])[:7]
    (tmp_path / "ids.txt").write_text("\n".join(some) + "\n")
    m = evaluate(spark, recs=[str(base / "recs")], data=str(small_prepared),
                 output=str(tmp_path / "o"), no_mlflow=True, users=f"@{tmp_path / 'ids.txt'}")
    assert m["lists_read"] == "beside their rows shards"
    assert {(r["group"], r["users"]) for r in m["rows"]} == {("warm", 7)}
    got = pd.read_parquet(tmp_path / "o" / "per_user").set_index("user_id")
    assert sorted(got.index) == some
    for key in (metric_key("NDCG"), metric_key("Recall@10"), metric_key("MAP@50")):
        np.testing.assert_array_equal(got.loc[some, key], full.loc[some, key])


def test_evaluation_refuses_recommendations_that_differ_from_their_manifest(spark, scored,
                                                                         small_prepared, tmp_path):
    import shutil
    _, base, _ = scored
    copy = tmp_path / "recs"
    shutil.copytree(base / "recs", copy)
    listed = json.loads((copy / "_manifest.json").read_text())["files"]
    part = next(f for f in listed if f.endswith(".parquet"))
    (copy / part).unlink()  # e.g. caught while an S3A rename copies the files
    with pytest.raises(UsageError, match=rf"--recs {copy} is incomplete: 1 file\(s\) its manifest "
                                         rf"lists are missing \(e.g. {part}\)"):
        evaluate(spark, recs=[str(copy)], data=str(small_prepared), output=str(tmp_path / "o"),
                 no_mlflow=True)
    assert not (tmp_path / "o").exists()


def test_two_models_compared_and_logged_into_their_mlflow_runs(spark, small_prepared, mlflow_server,
                                                               tmp_path):
    from mlflow.tracking import MlflowClient

    from runtime.tracking import log_final

    client = MlflowClient(mlflow_server.url)
    exp = client.create_experiment("scoring-test")
    run_a = client.create_run(exp, run_name="a").info.run_id
    save_model(tmp_path / "a", small_prepared,
               run={"mlflow_run_id": run_a, "mlflow_uri": mlflow_server.url})
    # the second model comes from MLflow, as logged by training
    run_b = client.create_run(exp, run_name="b").info.run_id
    model_b = save_model(tmp_path / "b", small_prepared)
    with torch.no_grad():
        model_b.heads["predict"].weight.mul_(3)
    torch.save(model_b.state_dict(), tmp_path / "weights.pt")
    uri_b = log_final(mlflow_server.url, run_b, weights=tmp_path / "weights.pt", item_ids=None,
                      model="nce-autorec", model_args=model_b.model_args(),
                      model_info={"train_splits": "train"},
                      manifest={}, history=[{"epoch": 1, "loss_nce": 1.0}], summary={},
                      title="b")
    score(spark, model=str(tmp_path / "a"), data=str(small_prepared), output=str(tmp_path / "ra"))
    mb = score(spark, model=uri_b, data=str(small_prepared), output=str(tmp_path / "rb"),
               mlflow_uri=mlflow_server.url)
    assert mb["mlflow_run_id"] == run_b and mb["model_args"]["width"] == 16
    # each job scores with its own model (Spark reuses Python workers across jobs)
    rows = rows_of(small_prepared)
    for out, model in (("ra", None), ("rb", model_b)):
        model = model or save_model(tmp_path / "a-again", small_prepared)
        vals, _ = direct_top(model, rows[:50], 50)
        got = pd.read_parquet(tmp_path / out).set_index("user_id").loc[rows[S.USER_ID][:50]]
        np.testing.assert_allclose(np.stack(got["scores"].to_numpy()), vals, rtol=1e-5, atol=1e-5)
    m = evaluate(spark, recs=[str(tmp_path / "ra"), str(tmp_path / "rb")], data=str(small_prepared),
                 output=str(tmp_path / "eval"), labels=["A", "B"])
    assert m["mlflow_runs"] == {"A": run_a, "B": run_b}
    assert (tmp_path / "eval" / "cold_start.png").read_bytes()[:4] == b"\x89PNG"
    for run_id, label in ((run_a, "A"), (run_b, "B")):
        data = client.get_run(run_id).data
        want = next(r for r in m["rows"] if r["label"] == label and r["group"] == "warm"
                    and r["metric"] == "NDCG")
        assert data.metrics["test_ndcg"] == pytest.approx(want["mean"])
        assert data.metrics["test_ndcg_ci95"] == pytest.approx(want["ci95"])
        # the key metrics only; every metric at every K is the run's table
        key = {f"{g}_{m}{ci}" for g in ("test", "cold") for m in ("ndcg", "recall_at_50")
               for ci in ("", "_ci95")} | {"test_users", "cold_users"} | {
            f"test_popularity_{k}" for k in ("share_top10pct", "median_popularity", "coverage")}
        paired = {f"test_paired_{m}_minus_b{x}" for m in ("ndcg", "recall_at_50")
                  for x in ("", "_ci95", "_t_p_holm", "_wilcoxon_p_holm")}
        assert set(data.metrics) == key | (paired if label == "A" else set())
        names = {a.path for a in client.list_artifacts(run_id, "evaluation-test")}
        assert {"evaluation-test/metrics.csv", "evaluation-test/popularity.png",
                "evaluation-test/cold_start.png", "evaluation-test/paired.csv",
                "evaluation-test/metrics_table.json"} <= names
        table = client.load_table(exp, "evaluation-test/metrics_table.json", run_ids=[run_id])
        mine = [r for r in m["rows"] if r["label"] == label]
        assert len(table) == len(mine) and set(table["group"]) == {"warm", "cold"}
        r10 = table[(table.group == "warm") & (table.metric == "Recall") & (table.K == 10)]
        want10 = next(r for r in mine if r["group"] == "warm" and r["metric"] == "Recall@10")
        assert r10["mean"].item() == pytest.approx(want10["mean"])
        assert {"path": "evaluation-test/metrics_table.json", "type": "table"} in json.loads(
            data.tags["mlflow.loggedArtifacts"])

    # the paired differences A - B, recomputed from the per-user values with pandas
    users = pd.read_parquet(tmp_path / "eval" / "per_user")
    users = users[users.group == "warm"]
    wide = users.pivot(index="user_id", columns="label", values=["ndcg", "recall_at_50"]).dropna()
    got = {p["metric"]: p for p in m["paired"]}
    assert set(got) == {"NDCG", "Recall@50"}
    for metric, key in (("NDCG", "ndcg"), ("Recall@50", "recall_at_50")):
        d = (wide[key]["A"] - wide[key]["B"]).to_numpy()
        p = got[metric]
        assert (p["reference"], p["label"], p["users"]) == ("A", "B", len(d))
        assert p["mean_difference"] == pytest.approx(d.mean())
        assert p["ci95"] == pytest.approx(1.96 * d.std() / np.sqrt(len(d)))
        assert p["reference_better"] == pytest.approx((d > 0).mean())
        assert p["reference_worse"] == pytest.approx((d < 0).mean())
        # the p-values, against scipy.stats on the same per-user values; one comparison per
        # metric, so Holm leaves them as they are
        a_, b_ = wide[key]["A"].to_numpy(), wide[key]["B"].to_numpy()
        assert p["t_p"] == pytest.approx(stats.ttest_rel(a_, b_).pvalue, abs=1e-9)
        assert p["wilcoxon_p"] == pytest.approx(
            stats.wilcoxon(d, method="asymptotic", correction=False).pvalue, abs=1e-9)
        assert (p["t_p_holm"], p["wilcoxon_p_holm"], p["comparison"]) == (
            p["t_p"], p["wilcoxon_p"], "first")
    assert got["NDCG"]["ci95"] > 0 and got["NDCG"]["mean_difference"] != 0  # B is another model
    ref = client.get_run(run_a).data.metrics
    assert ref["test_paired_ndcg_minus_b"] == pytest.approx(got["NDCG"]["mean_difference"])
    assert ref["test_paired_recall_at_50_minus_b_ci95"] == pytest.approx(got["Recall@50"]["ci95"])
    assert ref["test_paired_ndcg_minus_b_t_p_holm"] == pytest.approx(got["NDCG"]["t_p_holm"])
    assert ref["test_paired_recall_at_50_minus_b_wilcoxon_p_holm"] == pytest.approx(
        got["Recall@50"]["wilcoxon_p_holm"])
    assert "test_paired_ndcg_minus_a" not in client.get_run(run_b).data.metrics


def test_a_model_with_per_user_vectors_folds_cold_users_in_on_spark(spark, small_prepared,
                                                                    tmp_path):
    """BPR's users are folded in from their rows (models/peruser.py): Spark's executors, scoring
    the cold users in their own batches, give each the list the model gives it alone."""
    rows = rows_of(small_prepared)
    cold = rows[rows[S.COLD]].reset_index(drop=True)
    torch.manual_seed(0)
    model = build("bpr", {"n_items": len(item_ids(small_prepared)), "n_users": len(rows),
                          "width": 8}).eval()
    (tmp_path / "bpr").mkdir()
    torch.save(save(model, config={"model": "bpr", "run_name": "bpr", "train_splits": "train"},
                    summary={}), tmp_path / "bpr" / "model.pt")
    m = score(spark, model=str(tmp_path / "bpr"), data=str(small_prepared),
              output=str(tmp_path / "recs"), k=10, users="cold")
    assert m["scored_users"] == len(cold) > 0
    recs = pd.read_parquet(tmp_path / "recs").set_index("user_id").loc[cold[S.USER_ID]]
    vals, idx = direct_top(model, cold, 10)
    np.testing.assert_allclose(np.stack(recs["scores"].to_numpy()), vals, rtol=1e-4, atol=1e-4)
    ids = item_ids(small_prepared)
    same = [len(set(got) & set(ids[want])) / 10 for got, want in zip(recs["item_ids"], idx)]
    assert np.mean(same) > 0.95  # equal lists but for near-ties that float rounding may swap
