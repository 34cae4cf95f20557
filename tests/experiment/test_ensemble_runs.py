"""experiment/ensemble.py on real prepared data and a real MLflow server: the subset it chooses is
the one a numpy computation of every subset's validation NDCG ranks first, its run loads from
its directory and from MLflow as any trained model, Spark scores it as the model itself ranks,
and what it refuses says the fix."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from models.batch import sparse_rows, to_csr
from models.registry import build, save
from prepared import metrics as M
from prepared import schema as S

pytestmark = [pytest.mark.spark, pytest.mark.ray]  # the session's Spark ETL and MLflow server


def warm_rows(prepared: Path) -> pd.DataFrame:
    rows = pd.read_parquet(prepared / S.ROWS_DIR).sort_values(S.USER_INDEX)
    return rows[~rows[S.COLD]].reset_index(drop=True)


def write_run(path: Path, model, train_splits: str) -> None:
    """``model`` as training writes a finished run: model.pt (the registry's layout and config)."""
    path.mkdir(parents=True)
    torch.save(save(model, config={"model": model.name, "run_name": path.name,
                                   "train_splits": train_splits}, summary={}), path / "model.pt")


@pytest.fixture(scope="module")
def members(small_prepared, tmp_path_factory):
    """Three members of different kinds and scales, as runs trained on train: two PureSVDs fitted
    on the train split, and an AutoRec with random weights and popularity biases (personal lists
    that still hit the validation items)."""
    base = tmp_path_factory.mktemp("ensemble")
    rows = warm_rows(small_prepared)
    n_items = len(pd.read_parquet(small_prepared / S.ITEMS_DIR))
    items, offsets = sparse_rows(list(rows[S.TRAIN_ITEMS]))
    train = to_csr(items, offsets, n_items)
    models = {}
    for rank in (4, 24):
        m = build("puresvd", {"n_items": n_items, "rank": rank})
        m.fit(train, seed=0)
        models[f"svd{rank}"] = m.eval()
    torch.manual_seed(0)
    ar = build("autorec", {"n_items": n_items, "width": 8, "lam_units": "plain"}).eval()
    pop = torch.from_numpy(np.asarray(train.sum(axis=0)).ravel())
    with torch.no_grad():
        ar.heads["predict"].bias.copy_(torch.log1p(pop))
    models["ar"] = ar
    for name, m in models.items():
        write_run(base / "runs" / name, m, "train")
        write_run(base / "finals" / name, m, "train,valid")
    return base, models


def reference_ndcg(models: list, rows: pd.DataFrame) -> float:
    """Mean validation NDCG (top 50, training items left out; ``prepared.metrics``) of the sum of
    ``models``' scores standardised per user, in float64 numpy."""
    rows = rows[rows[S.VALID_ITEMS].map(len) > 0]
    items, offsets = sparse_rows(list(rows[S.TRAIN_ITEMS]))
    total = 0.0
    for m in models:
        with torch.no_grad():
            s = m.score(items, offsets).double().numpy()
        total = total + (s - s.mean(1, keepdims=True)) / s.std(1, ddof=1, keepdims=True)
    for u, seen in enumerate(rows[S.TRAIN_ITEMS]):
        total[u, seen] = -np.inf
    top = np.argsort(-total, axis=1, kind="stable")[:, :50]
    truth = [np.asarray(t) for t in rows[S.VALID_ITEMS]]
    values = M.per_user(M.hit_matrix(top, truth), np.array([len(t) for t in truth]))
    return float(values["NDCG"].mean())


@pytest.fixture(scope="module")
def assembled(members, small_prepared, mlflow_server, tmp_path_factory):
    from experiment.ensemble import main

    base, _ = members
    out = tmp_path_factory.mktemp("ens-runs")
    argv = ["--members", *(str(base / "runs" / n) for n in ("svd4", "svd24", "ar")),
            "--data", str(small_prepared), "--run-name", "ens", "--runs-dir", str(out),
            "--mlflow-uri", mlflow_server.url]
    assert main(argv) == 0
    record = json.loads((out / "ens" / "run.json").read_text())
    return out, record["summary"], argv


def test_validation_chooses_the_subset_a_numpy_reference_ranks_first(assembled, members,
                                                                       small_prepared, capsys):
    _, summary, _ = assembled
    base, models = members
    rows = warm_rows(small_prepared)
    names = ["svd4", "svd24", "ar"]
    subsets = [("svd4",), ("svd24",), ("ar",), ("svd4", "svd24"), ("svd4", "ar"),
               ("svd24", "ar"), ("svd4", "svd24", "ar")]
    ref = {s: reference_ndcg([models[n] for n in s], rows) for s in subsets}
    best = max(subsets, key=lambda s: (round(ref[s], 9), -len(s)))
    assert summary["members"] == [str(base / "runs" / n) for n in names if n in best]
    assert summary["best_valid_ndcg"] == pytest.approx(ref[best], abs=1e-6)
    # the choice is not a formality: the subsets differ by more than the reference's tolerance
    assert max(ref.values()) - min(ref.values()) > 0.01


def test_the_run_loads_from_its_directory_and_from_mlflow_as_the_chosen_members_sum(
        assembled, members, small_prepared, mlflow_server):
    from mlflow.tracking import MlflowClient

    from evaluation.model_source import load_source
    from models.ensemble import Ensemble

    out, summary, _ = assembled
    _, models = members
    chosen = [models[Path(m).name] for m in summary["members"]]
    rows = warm_rows(small_prepared).head(40)
    items, offsets = sparse_rows(list(rows[S.TRAIN_ITEMS]))
    want = Ensemble(chosen).eval().score(items, offsets)
    for uri in (str(out / "ens"), summary["model_uri"]):
        src = load_source(uri, mlflow_server.url)
        assert src.model == "ensemble" and src.train_splits == "train"
        assert torch.equal(src.build().score(items, offsets), want)
    # what `mlflow models serve` loads: the project's pyfunc, ids in and out
    import mlflow

    mlflow.set_tracking_uri(mlflow_server.url)
    served = mlflow.pyfunc.load_model(summary["model_uri"])
    ids = pd.read_parquet(small_prepared / S.ITEMS_DIR).sort_values(S.ITEM_INDEX)[S.ITEM_ID]
    ids = ids.astype(str).to_numpy()
    answer = served.predict(pd.DataFrame({"item_ids": [list(ids[r]) for r in rows[S.TRAIN_ITEMS][:3]]}),
                            params={"k": 5})
    _, top = Ensemble(chosen).eval().recommend(*sparse_rows(list(rows[S.TRAIN_ITEMS][:3])), 5)
    assert [list(a) for a in answer["item_indices"]] == top.tolist()
    run = MlflowClient(mlflow_server.url).get_run(summary["mlflow_run_id"])
    assert run.data.params["n_members"] == str(len(chosen))
    assert run.data.metrics["best_valid_ndcg"] == pytest.approx(summary["best_valid_ndcg"])
    assert run.data.tags["model"] == "ensemble"


def test_spark_scores_the_ensemble_as_it_ranks_itself(spark, assembled, small_prepared, tmp_path):
    from evaluation.score import score
    from models.registry import load_model_file

    out, _, _ = assembled
    m = score(spark, model=str(out / "ens"), data=str(small_prepared), output=str(tmp_path / "r"),
              k=10, users="warm")
    recs = pd.read_parquet(tmp_path / "r").set_index("user_id")
    rows = warm_rows(small_prepared)
    ids = pd.read_parquet(small_prepared / S.ITEMS_DIR).sort_values(S.ITEM_INDEX)[S.ITEM_ID]
    ids = ids.astype(str).to_numpy()
    model = load_model_file(str(out / "ens" / "model.pt"))
    items, offsets = sparse_rows(list(rows[S.TRAIN_ITEMS]))
    _, top = model.recommend(items, offsets, 10)
    assert m["scored_users"] == len(rows)
    for u, user in enumerate(rows[S.USER_ID].astype(str)):
        assert list(recs.loc[user, "item_ids"]) == list(ids[top[u].numpy()])


def test_finals_are_assembled_whole_and_never_chosen_on_valid(assembled, members, small_prepared,
                                                                mlflow_server, tmp_path, capsys):
    from experiment.ensemble import main

    base, _ = members
    finals = [str(base / "finals" / n) for n in ("svd4", "ar")]
    common = ["--data", str(small_prepared), "--runs-dir", str(tmp_path),
              "--mlflow-uri", mlflow_server.url]
    assert main(["--members", *finals, "--run-name", "f", *common]) == 2
    err = capsys.readouterr().err
    assert "retrained on train,valid: validation cannot choose" in err and "--choose all" in err
    assert not (tmp_path / "f").exists()  # nothing written
    assert main(["--members", *finals, "--run-name", "f", "--choose", "all", *common]) == 0
    summary = json.loads((tmp_path / "f" / "run.json").read_text())["summary"]
    assert summary["members"] == finals and summary["best_valid_ndcg"] is None

    mixed = [str(base / "runs" / "svd4"), finals[1]]
    assert main(["--members", *mixed, "--run-name", "g", "--choose", "all", *common]) == 2
    assert "trained on different splits" in capsys.readouterr().err


def test_what_it_refuses_says_the_fix(assembled, members, small_prepared, tmp_path, capsys):
    from experiment.ensemble import main

    out, _, argv = assembled
    assert main(argv) == 2  # the same run name again
    assert "exists already; choose another --run-name or pass --overwrite" in \
        capsys.readouterr().err
    base, models = members
    wide = build("puresvd", {"n_items": models["ar"].n_items + 3, "rank": 2})
    write_run(tmp_path / "wide", wide, "train")
    assert main(["--members", str(base / "runs" / "ar"), str(tmp_path / "wide"), "--data",
                 str(small_prepared), "--run-name", "w", "--runs-dir", str(tmp_path)]) == 2
    assert "scores" in (err := capsys.readouterr().err) and "pass models trained on --data" in err
    assert main(["--members", str(base / "runs" / "ar"), str(base / "runs" / "ar"), "--data",
                 str(small_prepared), "--run-name", "w", "--runs-dir", str(tmp_path)]) == 2
    assert "named twice" in capsys.readouterr().err
    # a tracking server that does not answer: said before any scoring, nothing written
    assert main(["--members", str(base / "runs" / "ar"), "--data", str(small_prepared),
                 "--run-name", "m", "--runs-dir", str(tmp_path), "--mlflow-uri",
                 "http://127.0.0.1:9"]) == 2
    assert "make stack" in capsys.readouterr().err and not (tmp_path / "m").exists()
