"""WRMF on Spark MLlib's ALS: the fold-in against Spark's own user factors, and the quality against
the ``implicit`` package's ALS (a test dependency only) on ml-latest-small validation."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp
import torch

from models.batch import sparse_rows
from models.registry import build
from training.closed_form import validate

pytestmark = pytest.mark.spark

HP = {"rank": 32, "lam": 0.01, "alpha": 10.0, "iterations": 10}


@pytest.fixture(scope="module")
def warm(small_prepared):
    rows = pq.read_table(small_prepared / "rows")
    return rows.filter(np.logical_not(rows.column("cold").to_numpy()))


@pytest.fixture(scope="module")
def fitted(spark, warm, small_prepared):
    from pyspark.sql import functions as F

    pairs = (spark.read.parquet(str(small_prepared / "rows")).filter(~F.col("cold"))
             .select("user_index", F.explode("train_items").alias("item_index")))
    n_items = int(pq.read_table(small_prepared / "items").num_rows)
    model = build("wrmf", {"n_items": n_items, **HP})
    model.fit(pairs, seed=0)
    return model.eval(), pairs


def test_fold_in_is_the_als_user_step(fitted, warm):
    """Solving users against the final item factors is the normal equation of Spark's user step;
    checked against a plain numpy solve of the same equation, user by user."""
    model, _ = fitted
    y = model.item_factors.double().numpy()
    users = [list(r) for r in warm.column("train_items").to_pylist()[:40]] + [[]]
    items, offsets = sparse_rows(users)
    got = model.user_factors(items, offsets).double().numpy()
    for u, row in enumerate(users):
        yu = y[row]
        a = y.T @ y + HP["alpha"] * yu.T @ yu + HP["lam"] * len(row) * np.eye(HP["rank"])
        want = np.linalg.solve(a, (1 + HP["alpha"]) * yu.sum(axis=0)) if row else np.zeros(HP["rank"])
        np.testing.assert_allclose(got[u], want, rtol=1e-4, atol=1e-6)


def test_spark_als_matches_the_implicit_package_on_ml_latest_small_validation(fitted, warm):
    from implicit.cpu.als import AlternatingLeastSquares

    model, _ = fitted
    ours, _, users = validate(model, warm)
    lists = [list(r) for r in warm.column("train_items").to_pylist()]
    items, offsets = sparse_rows(lists)
    x = sp.csr_matrix((np.ones(len(items), np.float32), items.numpy(),
                       np.append(offsets.numpy(), len(items))), shape=(len(lists), model.n_items))
    # implicit's confidence is alpha * value: 1 + alpha for a positive, as Spark's 1 + alpha r
    ref = AlternatingLeastSquares(factors=HP["rank"], regularization=HP["lam"],
                                  alpha=1.0 + HP["alpha"], iterations=HP["iterations"],
                                  use_cg=False, random_state=0)
    ref.fit(x, show_progress=False)

    from training.feed import valid_batch
    from training.validate import batch_metrics

    vb = valid_batch(warm, 0, 1)  # implicit's own user factors of the validation users
    keep = np.flatnonzero(np.array([len(v) > 0 for v in warm.column("valid_items").to_pylist()]))
    scores = torch.from_numpy(np.asarray(ref.user_factors)[keep] @ np.asarray(ref.item_factors).T)
    ndcg = batch_metrics(scores.float(), vb)[0].numpy()
    theirs, ci = float(ndcg.mean()), float(1.96 * ndcg.std() / np.sqrt(len(ndcg)))
    assert len(ndcg) == users
    assert abs(ours - theirs) <= ci, (ours, theirs, ci)
    assert ours > 0.15  # far above popularity (~0.1 on ml-100k validation)


@pytest.mark.ray  # the session's stack: its MLflow server
def test_spark_submit_trains_wrmf_into_mlflow(small_prepared, mlflow_server, tmp_path):
    """The README's command: spark-submit training/train.py --model wrmf; one MLflow run of the
    same layout as every model's, and a model.pt that scores through the interface."""
    import json
    import subprocess

    from infra.submit import spark_submit
    from models.registry import load_model_file

    cmd, env = spark_submit("training/train.py", "--data", str(small_prepared), "--model", "wrmf",
                            "--rank", "8", "--iterations", "3", "--run-name", "wrmf-submitted",
                            "--runs-dir", str(tmp_path / "runs"), "--mlflow-uri", mlflow_server.url,
                            master="local[2]", driver_memory="1g")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    summary = json.loads(log.split("SUMMARY ", 1)[1].splitlines()[0])
    assert summary["epochs_run"] == 1 and 0.05 < summary["best_valid_ndcg"] < 1
    model = load_model_file(summary["model_path"])
    assert model.name == "wrmf" and model.model_args()["rank"] == 8
    from mlflow.tracking import MlflowClient

    run = MlflowClient(mlflow_server.url).get_run(summary["mlflow_run_id"])
    # alpha was not given: the run logs the class's default, the one place defaults live
    from models.wrmf import WRMF
    assert run.info.status == "FINISHED"
    assert float(run.data.params["alpha"]) == WRMF.defaults()["alpha"]
    assert run.data.metrics["valid_ndcg"] == pytest.approx(summary["best_valid_ndcg"])
