"""Training on the real stack: Ray Train's TorchTrainer on a Ray head started for the session,
the shipped ml-latest-small prepared by the real ETL, a real MLflow tracking server. One Ray
session for the module; each ``run`` starts a worker group (~15-30 s on 2 cores), so the runs are
shared through fixtures."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from models.autorec import AutoRec
from models.registry import load_model_file
from prepared.errors import UsageError
from prepared.metrics import hit_matrix, per_user
from runtime.raycluster import checkpoints
from training.config import TrainConfig
from training.train import TrainingError, run

pytestmark = [pytest.mark.spark, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
# the shared two-worker run (also the killed worker's) and its one-process twin: long enough to
# beat popularity, so that the run also shows the healthy case
EPOCHS = 10
SHARED_LR = 3e-3


def config(data: Path, out: Path, **kw) -> TrainConfig:
    base = dict(data=str(data), model="nce-autorec", width=64, lr=2e-3, batch_size=64,
                epochs=EPOCHS, patience=100, num_workers=2, output=str(out), experiment="tests")
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def one_process(small_prepared, runs_dir) -> dict:
    """The two workers' configuration trained in one process through the epochs a Ray worker
    runs (``benchmarks.tune_defaults.train_one``, ``training.loop.epochs``): what one rank alone
    learns, without a third Ray Train run (one-worker Ray runs: tests/infra/test_faults.py,
    tests/prepared/test_integrity.py)."""
    from benchmarks.tune_defaults import load, train_one

    prep, rows, valid = load(str(small_prepared))
    cfg = config(small_prepared, runs_dir, num_workers=1, run_name="one-process", lr=SHARED_LR)
    return train_one(cfg, prep, rows, valid)


@pytest.fixture(scope="module")
def two_workers(small_prepared, ray_head, mlflow_server, runs_dir) -> dict:
    """Also the killed worker's run and the healthy one: rank 1 is killed once at the start of
    epoch 3 and the run resumes from epoch 2's checkpoint; it beats popularity, and it keeps its
    checkpoints when asked. What the tests below read of a two-worker run (exact validation,
    every epoch logged once, the ranks' shares) must hold after a resume too, and one run less
    is ~35 s of the suite. (Its driver output is kept: a module's fixture has no capsys.)"""
    import contextlib
    import io

    from training.hooks import ENV

    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setenv(ENV, "training.faults:kill_a_rank:2")  # rank 1, once
        result = run(config(small_prepared, runs_dir, run_name="two", max_failures=2,
                            lr=SHARED_LR, keep_checkpoints=True), mlflow_server.url)
    return {**result, "stdout": out.getvalue()}


def load_model(path: str) -> AutoRec:
    return load_model_file(path)


def warm_rows(prepared: Path) -> pd.DataFrame:
    rows = pq.read_table(prepared / "rows").to_pandas()
    return rows[~rows["cold"]].sort_values("user_index").reset_index(drop=True)


def reference_validation(model: AutoRec, rows: pd.DataFrame, with_recs: bool = False) -> tuple:
    """Validation NDCG and Recall@50 computed slowly, in one process, with prepared.metrics
    (and the top-50 lists)."""
    rows = rows[rows["valid_items"].map(len) > 0]
    with torch.no_grad():
        flat = torch.from_numpy(np.concatenate(rows["train_items"].to_list()).astype(np.int64))
        lengths = rows["train_items"].map(len).to_numpy()
        offsets = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64))
        scores = model.score(flat, offsets).numpy()
    for u, train in enumerate(rows["train_items"]):
        scores[u, train] = -np.inf
    recs = np.argsort(-scores, axis=1, kind="stable")[:, :50]
    truth = [np.asarray(v) for v in rows["valid_items"]]
    m = per_user(hit_matrix(recs, truth), np.array([len(t) for t in truth]))
    return (float(m["NDCG"].mean()), float(m["Recall@50"].mean())) + ((recs,) if with_recs else ())


def test_two_workers_learn_as_one_process_does_and_report_exact_validation(
        one_process, two_workers, small_prepared):
    """Two DDP workers learn what one process running the workers' epochs learns (only the
    shuffle differs: Ray Data's local shuffle, not a permutation per epoch), and the NDCG the
    workers computed together equals a one-process recomputation from the returned model."""
    assert two_workers["epochs_run"] == one_process["epochs"] == EPOCHS
    assert 1 <= two_workers["best_epoch"] <= EPOCHS and len(one_process["curve"]) == EPOCHS
    assert [t for t, _ in one_process["curve"]] == sorted(t for t, _ in one_process["curve"])
    # random ranking gives NDCG ~0.02 here; a few epochs of NCE-AutoRec give ~0.1
    assert two_workers["best_valid_ndcg"] > 0.1
    assert abs(one_process["best_ndcg"] - two_workers["best_valid_ndcg"]) < 0.02
    # each worker's share of users, sums all-reduced, against the whole in one process
    ndcg, recall = reference_validation(load_model(two_workers["model_path"]),
                                        warm_rows(small_prepared))
    assert two_workers["best_valid_ndcg"] == pytest.approx(ndcg, abs=1e-5)
    assert two_workers["best_valid_recall_at_50"] == pytest.approx(recall, abs=1e-5)


def test_validation_reports_the_popular_share_and_the_codes_effective_rank(
        two_workers, mlflow_server, small_prepared):
    """Beside NDCG, each epoch logs the share of the top-50 lists from the 10% most popular
    items (as evaluation's popularity analysis counts it) and the effective rank of the codes."""
    from mlflow.tracking import MlflowClient

    from prepared.protocol import head_items

    client = MlflowClient(mlflow_server.url)
    history = lambda key: {m.step: m.value for m in client.get_metric_history(
        two_workers["mlflow_run_id"], key)}
    share, erank = history("valid_head_share"), history("code_effective_rank")
    assert len(share) == len(erank) == EPOCHS
    assert all(1.0 <= v <= 64 for v in erank.values())  # width 64
    *_, recs = reference_validation(load_model(two_workers["model_path"]),
                                    warm_rows(small_prepared), with_recs=True)
    pop = pq.read_table(small_prepared / "items").column("pop_train").to_numpy()
    head = np.zeros(len(pop), bool)
    head[head_items(pop)] = True
    assert share[two_workers["best_epoch"]] == pytest.approx(head[recs].mean(), abs=1e-6)


def test_validation_is_shared_out_evenly_between_the_ranks(two_workers, mlflow_server):
    """Each rank scores about half the validation users (the session's rows are one Parquet file,
    which an unequal split of Ray Data's blocks handed entirely to one rank)."""
    from mlflow.tracking import MlflowClient

    shares = [m.value for m in MlflowClient(mlflow_server.url).get_metric_history(
        two_workers["mlflow_run_id"], "valid_largest_rank_share")]
    assert len(shares) == EPOCHS and all(0.5 <= s <= 0.6 for s in shares), shares


def test_a_run_on_one_node_starts_no_preemption_watcher(two_workers, ray_head):
    """The session's head is one node: Ray Train's watcher of node drains, an actor of its own
    per run, is not started (runtime.raycluster.ONE_NODE_ENV), while the run's other actors
    are."""
    from ray.util.state import list_actors

    classes = {a.class_name for a in list_actors(limit=10_000, raise_on_missing_output=False)}
    assert {"TrainController", "RayTrainWorker"} <= classes, classes
    assert "PreemptionWatcher" not in classes, classes


def test_a_validation_sample_reads_only_its_users(small_prepared, ray_head):
    from training.feed import in_valid_sample, valid_dataset

    rows = warm_rows(small_prepared)
    got = sorted(r["user_index"] for r in valid_dataset(str(small_prepared / "rows"), 0.3)
                 .select_columns(["user_index"]).take_all())
    want = rows["user_index"][in_valid_sample(rows["user_index"].to_numpy(), 0.3)].tolist()
    assert got == sorted(want) and 0.2 * len(rows) < len(got) < 0.4 * len(rows)


def test_mlflow_holds_params_epoch_metrics_artifacts_and_a_loadable_model(two_workers, mlflow_server,
                                                                          small_prepared):
    import mlflow.pyfunc
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server.url)
    r = client.get_run(two_workers["mlflow_run_id"])
    assert r.info.status == "FINISHED"
    assert r.data.tags["dataset"] == "ml-latest-small" and r.data.tags["model"] == "nce-autorec"
    assert r.data.tags["mode"] == "joint"
    assert r.data.params["lr"] == str(SHARED_LR) and r.data.params["num_workers"] == "2"
    for key in ("loss_nce", "loss_predict", "valid_ndcg", "valid_recall_at_50", "epoch_seconds",
                "users_per_second"):
        history = client.get_metric_history(r.info.run_id, key)
        assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1)), key
    best = max(client.get_metric_history(r.info.run_id, "valid_ndcg"), key=lambda m: m.value)
    assert best.value == pytest.approx(two_workers["best_valid_ndcg"])
    artifacts = {a.path for a in client.list_artifacts(r.info.run_id)}
    assert {"learning_curves.png", "dataset", "history.json", "config.yaml"} <= artifacts
    assert [a.path for a in client.list_artifacts(r.info.run_id, "dataset")] == ["dataset/manifest.json"]
    # what the UI shows besides the numbers: the run's description and its dataset input (once,
    # though this run resumed after its killed worker)
    note = r.data.tags["mlflow.note.content"]
    assert note.startswith("**nce-autorec on ml-latest-small**\n"), note
    assert f"validation NDCG@50 {two_workers['best_valid_ndcg']:.4f} at epoch" in note
    (data,) = r.inputs.dataset_inputs
    # MLflow keeps one dataset per name and digest in an experiment, so the source is the first
    # path that content was trained from (another test trains on a copy): it must hold the same data
    assert data.dataset.name == "ml-latest-small"
    source = Path(json.loads(data.dataset.source)["uri"])
    made_of = ("inputs", "parameters", "counts")
    seen, want = (json.loads((d / "manifest.json").read_text()) for d in (source, small_prepared))
    assert {k: seen[k] for k in made_of} == {k: want[k] for k in made_of}
    assert json.loads(data.dataset.profile)["users"] == json.loads(
        (small_prepared / "manifest.json").read_text())["counts"]["users"]
    assert "test_ndcg" in client.get_experiment(r.info.experiment_id).tags["mlflow.note.content"]

    # the logged model, loaded by URI, scores user rows as the model itself does
    rows = warm_rows(small_prepared).head(20)
    pyfunc = mlflow.pyfunc.load_model(two_workers["model_uri"])
    got = pyfunc.predict(pd.DataFrame({"item_indices": rows["train_items"].map(list)}),
                         params={"k": 10})
    model = load_model(two_workers["model_path"])
    for i, train in enumerate(rows["train_items"]):
        with torch.no_grad():
            s = model.score(torch.tensor(train, dtype=torch.int64), torch.tensor([0]))[0]
        s[torch.tensor(train, dtype=torch.int64)] = -torch.inf
        assert got["item_indices"][i] == torch.topk(s, 10).indices.tolist()
        assert not set(got["item_indices"][i]) & set(train)


def reference_popularity(prepared: Path) -> tuple[float, float]:
    """The popularity baseline's validation NDCG and Recall@50 computed slowly in one process:
    training counts as every user's scores, her training items removed, numpy's stable ranking
    (ties to the lower index), prepared.metrics."""
    rows = warm_rows(prepared)
    rows = rows[rows["valid_items"].map(len) > 0]
    pop = pq.read_table(prepared / "items").column("pop_train").to_numpy().astype(float)
    scores = np.tile(pop, (len(rows), 1))
    for u, train in enumerate(rows["train_items"]):
        scores[u, train] = -np.inf
    recs = np.argsort(-scores, axis=1, kind="stable")[:, :50]
    truth = [np.asarray(v) for v in rows["valid_items"]]
    m = per_user(hit_matrix(recs, truth), np.array([len(t) for t in truth]))
    return float(m["NDCG"].mean()), float(m["Recall@50"].mean())


def test_popularity_is_measured_exactly_beside_validation_and_decides_the_health(
        two_workers, mlflow_server, small_prepared):
    """Every run measures the popularity baseline once, on the same validation users (two ranks'
    sums all-reduced), equal to a one-process recomputation. Popularity is strong on MovieLens
    (0.13 here), and the run's health says on which side of it the run ended (its code, rank ~8
    of 64, is not collapsed)."""
    from mlflow.tracking import MlflowClient

    ndcg, recall = reference_popularity(small_prepared)
    assert two_workers["valid_ndcg_popularity"] == pytest.approx(ndcg, abs=1e-5) and ndcg > 0.01
    assert two_workers["valid_recall_at_50_popularity"] == pytest.approx(recall, abs=1e-5)
    assert two_workers["best_code_effective_rank"] >= 2.0
    side = "ok" if two_workers["best_valid_ndcg"] > ndcg else "below-popularity"
    assert two_workers["health"] == side
    r = MlflowClient(mlflow_server.url).get_run(two_workers["mlflow_run_id"])
    assert r.data.tags["health"] == side
    assert r.data.metrics["valid_ndcg_popularity"] == pytest.approx(ndcg, abs=1e-5)


def test_a_run_that_beats_popularity_is_healthy(two_workers, mlflow_server, runs_dir):
    from mlflow.tracking import MlflowClient

    result = two_workers
    assert len(checkpoints(str(runs_dir / "two"))) == 2  # kept when asked: Ray keeps 2
    assert result["best_valid_ndcg"] > result["valid_ndcg_popularity"] > 0.01
    assert result["health"] == "ok" and result["best_code_effective_rank"] >= 2.0
    assert "WARNING: run two" not in result["stdout"]
    assert "run two:" in result["stdout"]  # the driver's output was captured
    assert MlflowClient(mlflow_server.url).get_run(
        result["mlflow_run_id"]).data.tags["health"] == "ok"


def test_a_collapsed_run_is_tagged_warned_and_not_made_champion_silently(
        small_prepared, ray_head, mlflow_server, runs_dir, capsys):
    """A width-1 AutoRec (one code direction: every user the same list, up to scale) is
    "collapsed": said on the driver in one WARNING line, tagged in MLflow; the experiment's
    registration refuses it as @champion unless allowed, and then tags the version."""
    from mlflow.tracking import MlflowClient

    from experiment.register import register_if_healthy

    result = run(config(small_prepared, runs_dir, num_workers=1, run_name="width1",
                        model="autorec", width=1, epochs=2), mlflow_server.url)
    # one code direction at most (here none: the one unit is dead, every code 0)
    assert result["best_code_effective_rank"] < 2.0
    assert result["health"] == "below-popularity,collapsed"
    out = capsys.readouterr().out
    assert f"WARNING: run width1 is unhealthy ({result['health']})" in out
    client = MlflowClient(mlflow_server.url)
    assert client.get_run(result["mlflow_run_id"]).data.tags["health"] == result["health"]

    chosen = {"trial": "width1", "valid_ndcg": result["best_valid_ndcg"],
              "health": result["health"], "valid_ndcg_popularity": result["valid_ndcg_popularity"],
              "code_effective_rank": result["best_code_effective_rank"]}
    name = "tests-width1"
    assert register_if_healthy(mlflow_server.url, name, result, chosen, False) == \
        result["model_uri"]
    assert f"WARNING: {name}: not registered as models:/{name}@champion" in capsys.readouterr().out
    with pytest.raises(Exception, match="(?i)not found|does not exist|alias"):
        client.get_model_version_by_alias(name, "champion")
    assert register_if_healthy(mlflow_server.url, name, result, chosen, True) == \
        f"models:/{name}@champion"
    assert "(--allow-unhealthy)" in capsys.readouterr().out
    assert client.get_model_version_by_alias(name, "champion").tags["health"] == result["health"]


@pytest.fixture(scope="module")
def closed_form(small_prepared, ray_head, mlflow_server, runs_dir) -> dict:
    """A PureSVD run whose name another process holds first: refused while the holder lives,
    trained once it is killed (its lock left behind, as a killed run leaves it). One Ray run
    serves the second-writer test and the closed-form test."""
    import subprocess
    import sys

    from mlflow.tracking import MlflowClient

    from training.train import WRITER_LOCK

    # an experiment of its own, so that the refusal is seen to create none
    cfg = config(small_prepared, runs_dir, run_name="svd", model="puresvd", width=None, rank=32,
                 experiment="closed-form")
    lock = runs_dir / "svd" / WRITER_LOCK
    lock.parent.mkdir(parents=True)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys; from runtime.publish import WriterLock; "
         "WriterLock.local(sys.argv[1], 'x').acquire(); print('held', flush=True); "
         "sys.stdin.read()", str(lock)], cwd=ROOT, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UsageError) as refused:
            run(cfg, mlflow_server.url)
        experiment = MlflowClient(mlflow_server.url).get_experiment_by_name(cfg.experiment)
    finally:
        holder.kill()  # as a killed run: its lock stays behind
        holder.wait()
    stale = lock.exists()
    return {"cfg": cfg, "refused": str(refused.value), "holder": holder.pid,
            "experiment_while_refused": experiment, "lock_after_kill": stale,
            "result": run(cfg, mlflow_server.url)}


def test_a_closed_form_model_trains_logs_and_scores_like_autorec(closed_form, small_prepared,
                                                                mlflow_server, runs_dir, spark,
                                                                tmp_path):
    """PureSVD through the same entry point: fitted in a Ray task, its validation NDCG equal to a
    one-process recomputation, one MLflow run with the same layout, scored by Spark unchanged."""
    import mlflow.pyfunc
    from mlflow.tracking import MlflowClient

    from evaluation.score import score

    cfg, result = closed_form["cfg"], closed_form["result"]
    model = load_model(result["model_path"])
    assert model.name == "puresvd" and model.model_args() == {"n_items": model.n_items, "rank": 32}
    ndcg, recall, recs = reference_validation(model, warm_rows(small_prepared), with_recs=True)
    assert result["best_valid_ndcg"] == pytest.approx(ndcg, abs=1e-9) and ndcg > 0.15
    assert result["best_valid_recall_at_50"] == pytest.approx(recall, abs=1e-9)

    client = MlflowClient(mlflow_server.url)
    r = client.get_run(result["mlflow_run_id"])
    assert r.info.status == "FINISHED" and r.data.tags["model"] == "puresvd"
    # only what PureSVD takes: its rank, not the AutoRec family's width nor Adam's settings
    assert r.data.params["rank"] == "32" and r.data.params["model"] == "puresvd"
    assert not {"width", "beta", "margin", "lr", "epochs", "batch_size"} & set(r.data.params)
    assert [m.value for m in client.get_metric_history(r.info.run_id, "valid_ndcg")] == \
        [pytest.approx(ndcg)]
    # the popularity of its lists beside NDCG, as a gradient run logs it: the share of the top 50
    # from the 10% most popular items, recomputed from the slow reference's lists
    from prepared.protocol import head_items
    from prepared.reader import open_prepared

    head = np.isin(recs, head_items(open_prepared(str(small_prepared)).pop_train)).mean(1).mean()
    assert [m.value for m in client.get_metric_history(r.info.run_id, "valid_head_share")] == \
        [pytest.approx(head, abs=1e-4)]
    assert "learning_curves.png" in {a.path for a in client.list_artifacts(r.info.run_id)}
    rows = warm_rows(small_prepared).head(5)
    got = mlflow.pyfunc.load_model(result["model_uri"]).predict(
        pd.DataFrame({"item_indices": rows["train_items"].map(list)}), params={"k": 5})
    for i, train in enumerate(rows["train_items"]):
        _, top = model.recommend(torch.tensor(train, dtype=torch.int64), torch.tensor([0]), 5)
        assert got["item_indices"][i] == top[0].tolist()

    recs = score(spark, model=result["model_uri"], data=str(small_prepared),
                 output=str(tmp_path / "recs"), users="warm", mlflow_uri=mlflow_server.url)
    assert recs["model_kind"] == "puresvd" and recs["scored_users"] == len(warm_rows(small_prepared))

    with pytest.raises(UsageError, match="model was 'puresvd', now 'ease'"):
        run(replace(cfg, model="ease", rank=None), mlflow_server.url)


def test_materialized_datasets_are_split_in_place_with_the_streaming_shares(ray_head):
    """Small data (materialized by the driver) is split without a streaming coordinator:
    training rows in equal shares (the remainder dropped, as an equal streaming split drops it),
    validation rows every one exactly once, shares within one row of each other."""
    import ray.data

    from training.ingest import split_in_memory

    ds = ray.data.from_items([{"u": i} for i in range(7)], override_num_blocks=3).materialize()
    out = split_in_memory({"train": ds, "valid": ds}, 3)
    train = [[r["u"] for r in share["train"].iter_rows()] for share in out]
    valid = [[r["u"] for r in share["valid"].iter_rows()] for share in out]
    assert [len(t) for t in train] == [2, 2, 2] and len(set(sum(train, []))) == 6
    assert sorted(sum(valid, [])) == list(range(7))
    assert max(map(len, valid)) - min(map(len, valid)) <= 1
    # an iterator per rank, read again each epoch: the same rows the second time
    assert [r["u"] for r in out[0]["valid"].iter_rows()] == valid[0]
    alone = split_in_memory({"train": ds, "valid": ds}, 1)[0]
    assert sorted(r["u"] for r in alone["train"].iter_rows()) == list(range(7))


def test_splitting_held_rows_with_every_cpu_taken_raises_no_false_alarm(ray_head, monkeypatch):
    """Ray Data warns that a dataset "will hang" when it executes while Ray reports no CPU free,
    as when the workers hold theirs; splitting materialized rows cannot hang, and logs no such
    warning. (No CPU free is Ray's report, patched: really holding every CPU would also hold
    back the tasks that slice the blocks.)"""
    import logging

    import ray
    import ray.data
    from ray.util.debug import reset_log_once

    from training.ingest import split_in_memory

    ds = ray.data.from_items([{"u": i} for i in range(7)], override_num_blocks=3).materialize()
    said = []
    handler = logging.Handler()
    handler.emit = lambda record: said.append(record.getMessage())
    logger = logging.getLogger("ray.data.dataset")
    monkeypatch.setattr(ray, "available_resources", lambda: {"memory": 1.0})
    alarms = lambda: [m for m in said if "available CPUs" in m]
    logger.addHandler(handler)
    try:
        reset_log_once("cpu_warning")
        ds.split(2)  # Ray Data's own split: the false alarm this test is about
        assert alarms(), said
        said.clear()
        reset_log_once("cpu_warning")
        out = split_in_memory({"train": ds, "valid": ds}, 2)
    finally:
        logger.removeHandler(handler)
    assert not alarms(), said
    assert sorted(r["u"] for share in out for r in share["valid"].iter_rows()) == list(range(7))


def test_each_dataset_is_held_or_streamed_on_its_own(ray_head):
    """A validation sample that fits is split in place while the training rows stream (the
    Yahoo shape's case), and the other way round: each rank gets both, training in equal
    shares, validation every row exactly once."""
    import threading

    import ray.data
    from ray.data.dataset import MaterializedDataset

    from training.ingest import ShardedValidation, split_in_memory

    rows = lambda: ray.data.from_items([{"u": i} for i in range(40)], override_num_blocks=4)
    held, streamed = lambda: rows().materialize(), lambda: rows().map_batches(lambda b: b)
    in_place = type(split_in_memory({"valid": held()}, 2)[0]["valid"])
    for train, valid in ((streamed(), held()), (held(), streamed())):
        out = ShardedValidation().configure({"train": train, "valid": valid}, 2, None, None)
        kept = "valid" if isinstance(valid, MaterializedDataset) else "train"
        # the held one split in place: no coordinator actor, no executor every epoch
        assert type(out[0][kept]) is in_place
        assert type(out[0]["train" if kept == "valid" else "valid"]) is not in_place
        got = {}

        def read(rank: int, name: str, out=out, got=got) -> None:
            got[rank, name] = [r["u"] for r in out[rank][name].iter_rows()]

        # a streaming split's shares are read together, as the ranks read them
        readers = [threading.Thread(target=read, args=(r, n)) for r in (0, 1)
                   for n in ("train", "valid")]
        for t in readers:
            t.start()
        for t in readers:
            t.join(120)
        assert len(got[0, "train"]) == len(got[1, "train"]) == 20
        for name in ("train", "valid"):
            assert sorted(got[0, name] + got[1, name]) == list(range(40)), name


@pytest.mark.parametrize("fraction", [1.0, 0.3])
def test_small_data_read_by_the_driver_is_ray_datas_read(small_prepared, ray_head, fraction):
    """The rows small data trains on, read by the driver (no Ray tasks), are Ray Data's: the same
    rows in the same order and blocks (one Parquet file here), the same columns and types."""
    from training import feed as F

    rows = str(small_prepared / "rows")
    plan = F.FeedPlan(True, True, False, None, None, 100, 0)
    for build in (lambda here: F.valid_dataset(rows, fraction, here),
                  lambda here: F.train_dataset(rows, plan, here)):
        ray_read, driver = build(False).materialize(), build(True)
        assert driver.schema() == ray_read.schema()
        assert [len(b) for b in driver.iter_batches(batch_size=None)] == \
            [len(b) for b in ray_read.iter_batches(batch_size=None)]
        assert driver.take_all() == ray_read.take_all() and driver.count() > 100


def test_a_killed_worker_costs_one_epoch_and_the_run_finishes(runs_dir, two_workers,
                                                             one_process, mlflow_server):
    from mlflow.tracking import MlflowClient

    marker = runs_dir / "two" / "fault-injected.txt"
    assert marker.exists() and "killed rank 1 at the start of epoch 3" in marker.read_text()
    assert two_workers["epochs_run"] == EPOCHS
    # resumed from epoch 2's checkpoint: every epoch logged once, none repeated
    history = MlflowClient(mlflow_server.url).get_metric_history(two_workers["mlflow_run_id"],
                                                                 "valid_ndcg")
    assert sorted(m.step for m in history) == list(range(1, EPOCHS + 1))
    assert abs(two_workers["best_valid_ndcg"] - one_process["best_ndcg"]) < 0.02


def test_a_failed_run_resumes_when_rerun_with_its_name(small_prepared, ray_head, mlflow_server,
                                                      runs_dir, monkeypatch):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("NCE_TEST_HOOK", "training.faults:kill_a_rank:1")  # rank 1, once
    # started from the SVD (--start-from svd): the driver's start reaches the workers, is
    # validated as epoch 0, and a resume continues from the checkpoint, not from a new start
    cfg = config(small_prepared, runs_dir, run_name="resume", model="autorec", epochs=3,
                 max_failures=0, start_from="svd", lr=1e-4)
    with pytest.raises(TrainingError, match="Rerun the same command .*--run-name resume"):
        run(cfg, mlflow_server.url)
    failed = json.loads((runs_dir / "resume" / "run.json").read_text())
    assert checkpoints(str(runs_dir / "resume"))  # a failed run keeps what it resumes from
    client = MlflowClient(mlflow_server.url)
    assert client.get_run(failed["mlflow_run_id"]).info.status == "FAILED"

    result = run(replace(cfg, max_failures=1), mlflow_server.url)  # killed once only: it finishes
    assert result["mlflow_run_id"] == failed["mlflow_run_id"] and result["epochs_run"] == 3
    history = client.get_metric_history(result["mlflow_run_id"], "valid_ndcg")
    assert sorted(m.step for m in history) == [0, 1, 2, 3]  # epoch 1 was not trained again
    # the start is PLRec at the model's lambda: far above what a few epochs from random reach
    # (~0.05 here), and never below the run's best
    start = next(m.value for m in history if m.step == 0)
    assert start > 0.12 and result["best_valid_ndcg"] >= start
    assert not checkpoints(str(runs_dir / "resume"))  # finished: model.pt stands for them
    assert (runs_dir / "resume" / "model.pt").exists()

    again = run(cfg, mlflow_server.url)  # finished: returns its result, trains nothing
    assert again == result
    with pytest.raises(UsageError, match="already exists.*width was 64, now 32.*another --run-name"):
        run(replace(cfg, width=32), mlflow_server.url)


BASELINES = {"bpr": {"lr": 1e-2, "valid_by": "trained"}, "cml": {"lr": 3e-3},
             "cdae": {"lr": 3e-3}, "vae-cf": {"lr": 1e-3}}
# under Ray: BPR for the per-user vectors DDP keeps on every rank (CDAE and CML feed and step
# the same way: per_user, the same hashed draws), VAE-CF for a per-row model with its own
# training state; CDAE and CML are checked in one process (each Ray run costs ~16 s of Ray's)
ON_RAY = ("bpr", "vae-cf")


def trained_vectors_validation(model, rows: pd.DataFrame) -> float:
    """Validation NDCG from a per-user model's trained user vectors (``--valid-by trained``),
    slowly, in one process."""
    rows = rows[rows["valid_items"].map(len) > 0]
    users = torch.from_numpy(rows["user_index"].to_numpy().astype(np.int64))
    with torch.no_grad():
        scores = (model.users(users) @ model.items.weight.T).numpy()
    for u, train in enumerate(rows["train_items"]):
        scores[u, train] = -np.inf
    recs = np.argsort(-scores, axis=1, kind="stable")[:, :50]
    truth = [np.asarray(v) for v in rows["valid_items"]]
    return float(per_user(hit_matrix(recs, truth), np.array([len(t) for t in truth]))["NDCG"].mean())


@pytest.mark.parametrize("model", ON_RAY)
def test_the_gradient_baselines_train_distributed_and_report_exact_validation(
        model, small_prepared, ray_head, mlflow_server, runs_dir):
    """A gradient baseline under the same DDP loop, two workers (per-user vectors included):
    it learns (validation NDCG well above random's 0.02), and the validation NDCG the workers
    computed together is what one process computes from the saved model: by fold-in (a function
    of the row, so exact across ranks too), and for BPR by ``--valid-by trained`` (each rank
    scores its users from the user vectors DDP keeps equal on every rank)."""
    cfg = config(small_prepared, runs_dir, run_name=f"{model}-two", model=model, width=None,
                 epochs=3, **BASELINES[model])
    result = run(cfg, mlflow_server.url)
    assert result["epochs_run"] == 3
    # random ranking: about 0.016; three epochs of BPR's trained vectors reach ~0.03, its
    # fold-in and the others' ~0.1
    assert result["best_valid_ndcg"] > (0.02 if cfg.valid_by == "trained" else 0.06)
    saved, rows = load_model(result["model_path"]), warm_rows(small_prepared)
    fold_in, _ = reference_validation(saved, rows)
    if cfg.valid_by == "trained":
        ndcg = trained_vectors_validation(saved, rows)
        assert result["best_valid_ndcg"] == pytest.approx(ndcg, abs=1e-4)
        assert abs(fold_in - ndcg) > 1e-4  # the fold-in's lists are others
    else:
        # Fold-in is a function of the row, but its dot products run in user blocks of another
        # size here, so float32 sums differ in the last bits and, after 60 Adam steps, can swap
        # two nearly tied items for a user: one such swap moves the mean by about 3e-5 (seen
        # with CML). A lost or doubled share of users would move it by 1e-2.
        assert result["best_valid_ndcg"] == pytest.approx(fold_in, abs=2e-4)
    if model == "bpr":
        # per-user parameters under DDP: one process (the trainer's own epochs, no Ray) learns
        # what two workers do; a one-worker Ray run would cost ~20 s more for the same check
        from benchmarks.tune_defaults import load, train_one

        prep, table, valid = load(str(small_prepared))
        one = train_one(replace(cfg, run_name="bpr-one", num_workers=1), prep, table, valid)
        assert one["epochs"] == 3
        assert abs(one["best_ndcg"] - result["best_valid_ndcg"]) < 0.02, one["best_ndcg"]


@pytest.mark.parametrize("model", sorted(set(BASELINES) - set(ON_RAY)))
def test_the_other_gradient_baselines_learn_and_report_exact_validation(model, small_prepared,
                                                                         runs_dir):
    """CDAE and CML through the trainer's own epochs in one process (what each Ray worker runs;
    their DDP path is BPR's, above): they learn, and the validation NDCG the loop reports after
    the last epoch is what the slow reference computes from the model as it ends."""
    from benchmarks.tune_defaults import load, train_one

    cfg = config(small_prepared, runs_dir, run_name=f"{model}-one", model=model, width=None,
                 epochs=3, num_workers=1, **BASELINES[model])
    prep, table, valid = load(str(small_prepared))
    one = train_one(cfg, prep, table, valid)
    assert one["epochs"] == 3 and len(one["curve"]) == 3
    last = one["curve"][-1][1]
    assert last > 0.06  # random lists: about 0.016
    # the same tolerance as above: the reference scores in one block, the loop in its own
    assert last == pytest.approx(reference_validation(one["net"], warm_rows(small_prepared))[0],
                                 abs=2e-4)


def test_limited_finetune_phase_two_reaches_the_exact_head_on_its_frozen_encoder(
        small_prepared, ray_head, mlflow_server, runs_dir):
    """Phase 2 starts from the exact minimiser of its loss (--finetune-init ridge, summed over
    both ranks) and trains with its own early stopping: its validation NDCG is at least 98% of
    the ridge head's on the same frozen encoder (computed here in one process, in float64)."""
    from models.autorec.ridge import reference_head as ridge_head

    cfg = config(small_prepared, runs_dir, run_name="nce-limited", model="nce-autorec",
                 mode="limited-finetune", lam=30.0, pretrain_epochs=8, epochs=30, patience=3)
    result = run(cfg, mlflow_server.url)
    assert result["phase_epochs"][0] == 8 and result["phase_epochs"][1] < 30  # stopped early
    assert result["epochs_run"] == sum(result["phase_epochs"])  # both phases ran, under DDP
    model = load_model(result["model_path"])
    rows = warm_rows(small_prepared)
    trained = reference_validation(model, rows)[0]
    assert trained == pytest.approx(result["best_valid_ndcg"], abs=1e-4)
    table = pq.read_table(small_prepared / "rows")
    table = table.filter(pc.invert(table.column("cold")))
    ridge = load_model(result["model_path"])
    weight, bias = ridge_head(ridge, table, ridge.n_items, ridge.lam * ridge.lam_scale)
    ridge.heads["predict"].weight.data.copy_(weight)
    ridge.heads["predict"].bias.data.copy_(bias)
    exact = reference_validation(ridge, rows)[0]
    assert trained >= 0.98 * exact, (trained, exact)
    # the AutoRec family's training options and omega (computed on train, issue 31) are recorded
    from mlflow.tracking import MlflowClient

    params = MlflowClient(mlflow_server.url).get_run(result["mlflow_run_id"]).data.params
    assert params["finetune_init"] == "ridge" and float(params["finetune_lr"]) == 2e-3
    assert params["loss_path"] == "auto"
    assert params["data_statistics_split"] == "train"
    assert float(params["overlap"]) == pytest.approx(model.overlap)
    record = json.loads((runs_dir / "nce-limited" / "run.json").read_text())
    assert record["data_statistics"] == {"split": "train", "values": {"overlap": model.overlap}}


def test_a_second_writer_of_a_run_is_refused_before_anything_runs(closed_form, runs_dir):
    """Two processes training one run name would overwrite each other's model.pt and run.json
    and leave two MLflow runs of that name: the second is refused, naming the first one's pid,
    before it opens an MLflow run or starts Ray; once the holder is gone (killed), a rerun
    takes the lock over (the closed-form run below is that rerun)."""
    from training.train import WRITER_LOCK

    assert re.match(rf"^run svd \(.*\) is being written by another job: "
                    rf"pid {closed_form['holder']} on host ", closed_form["refused"])
    assert closed_form["experiment_while_refused"] is None  # no MLflow run was opened
    assert closed_form["lock_after_kill"]  # a killed holder's lock stays behind
    assert closed_form["result"]["best_valid_ndcg"] > 0.1  # the rerun took it over and trained
    assert not (runs_dir / "svd" / WRITER_LOCK).exists()


def test_more_workers_than_the_cluster_has_fails_at_start(small_prepared, ray_head, mlflow_server,
                                                          runs_dir):
    with pytest.raises(UsageError, match="--num-workers 5 .* the cluster has 3"):
        run(config(small_prepared, runs_dir, run_name="big", num_workers=5), mlflow_server.url)


def test_the_levers_beyond_the_paper_train_end_to_end(small_prepared, ray_head, mlflow_server,
                                                      runs_dir):
    """Every lever of issue 32 at once on the real stack: the flags are accepted, phase 1 runs
    its own length, the model file and MLflow record the levers and R*'s mean square (computed
    by the driver at the run's beta), and the run learns (above random lists, ~0.016 here)."""
    from mlflow.tracking import MlflowClient

    from models.autorec.training import rstar_mean_square
    from prepared.reader import open_prepared

    cfg = config(small_prepared, runs_dir, run_name="levers", mode="full-finetune",
                 pos_weight=2.0, dropout=0.3, nce_scale="rms", finetune_phase1_epochs=2,
                 finetune_phase1_lr=3e-3, epochs=3, beta=0.9)
    result = run(cfg, mlflow_server.url)
    assert result["phase_epochs"] == [2, 3]
    model = load_model(result["model_path"])
    ms = rstar_mean_square(open_prepared(str(small_prepared)), 0.9, False)
    assert model.model_args()["rstar_mean_square"] == pytest.approx(ms) and ms > 1
    assert (model.pos_weight, model.dropout, model.nce_scale) == (2.0, 0.3, "rms")
    params = MlflowClient(mlflow_server.url).get_run(result["mlflow_run_id"]).data.params
    assert params["finetune_init"] == "as-is" and params["finetune_phase1_epochs"] == "2"
    assert float(params["rstar_mean_square"]) == pytest.approx(ms)
    assert result["best_valid_ndcg"] > 0.02
