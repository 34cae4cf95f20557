"""The README's main job end to end, through the same entry points: the stack (the session's, so a
second start must reuse it), spark-submit ETL on the shipped ml-latest-small (its items with 10
ratings or more, as the session's data), ray job submit training of NCE-AutoRec (2 epochs here)
and of PureSVD (closed form), spark-submit scoring and evaluation; then the MLflow server holds
both runs with their metrics, models and plots; a rerun redoes nothing. ``make demo`` trains
AutoRec too: a third ``ray job submit`` of the same path as NCE-AutoRec's (~30 s here), left out
with ``--models``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from infra.demo import LABELS

MODELS = ("nce-autorec", "puresvd")  # one gradient model, one closed form
LABELLED = {LABELS[m] for m in MODELS}

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.spark, pytest.mark.ray]


def main_job(local_stack, var: Path) -> tuple[str, dict]:
    # the shipped ml-latest-small cut as the session's data is (tests/conftest.py): the same
    # stages and commands, a third of the items to score and evaluate
    ratings = var / "ratings.csv"
    if not ratings.exists():
        import pandas as pd

        from tests.conftest import MIN_ITEM_RATINGS

        full = pd.read_csv(ROOT / "data" / "ml-latest-small" / "ratings.csv")
        counts = full["movieId"].value_counts()
        full[full["movieId"].isin(counts.index[counts >= MIN_ITEM_RATINGS])].to_csv(
            ratings, index=False)
    cmd = [sys.executable, "-m", "infra.demo", "--var", str(var), "--epochs", "2",
           "--models", ",".join(MODELS),
           "--input", str(ratings),
           "--stack-state", str(local_stack.state), "--mlflow-config", str(local_stack.mlflow_config)]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-5000:]
    return log, json.loads(log.split("SUMMARY ", 1)[1].splitlines()[0])


@pytest.fixture(scope="module")
def first_run(local_stack, tmp_path_factory):
    var = tmp_path_factory.mktemp("main-job")
    return var, *main_job(local_stack, var)


def test_main_job_runs_every_stage_and_prints_the_results(first_run, local_stack):
    var, log, summary = first_run
    assert log.count("already running") == 2  # the stack was reused, not started twice
    for stage in ("== 1/5", "== 2/5", "== 3/5", "== 4/5", "== 5/5"):
        assert stage in log
    assert "$ spark-submit etl/prepare.py" in log and "$ ray job submit" in log
    assert "$ spark-submit evaluation/score.py" in log and "$ spark-submit evaluation/evaluate.py" in log
    assert "epoch   2" in log  # training progress streamed from the Ray job
    assert log.count("$ spark-submit evaluation/score.py") == 1  # the models in one app
    assert log.count('"scored_users"') == 2
    assert "Downloading artifacts" not in log  # MLflow's bars, one line per redraw in a pipe
    # each `ray job submit` (the README's command, the `ray` CLI itself) ran to the end, and the
    # demo showed the jobs' own lines, not Ray's banners and INFO records (held for a failure)
    assert len(re.findall(r"^   Ray job raysubmit_\w+ succeeded$", log, re.M)) == 2
    assert "Next steps" not in log and "Tailing logs" not in log and "\tINFO " not in log
    assert "(TrainController pid=" not in log and "Setting up process group" not in log
    assert "Running entrypoint for job" not in log
    table = log.split("Test metrics (ml-latest-small", 1)[1]
    assert "R-Precision" in table and all(m in table for m in LABELLED)
    assert f"popularity plot: {var / 'eval' / 'ml-latest-small' / 'popularity.png'}" in log
    url = local_stack.services["mlflow"].url
    assert "MLflow UI, the runs by test NDCG: " + url + "/#/experiments/" in log
    assert "orderByKey=metrics.%60test_ndcg%60&orderByAsc=false&compareRunsMode=CHART" in log
    assert "  side by side: " + url + "/#/compare-runs?runs=" in log
    # registered by name, and the commands that serve one printed to be copied
    assert "registered: models:/demo-nce-autorec@champion, models:/demo-puresvd@champion" in log
    assert "mlflow models serve -m models:/demo-nce-autorec@champion --env-manager local -p 5001" in log
    assert "curl -s http://127.0.0.1:5001/invocations" in log
    assert (var / "eval" / "ml-latest-small" / "popularity.png").read_bytes()[:4] == b"\x89PNG"
    assert (var / "eval" / "ml-latest-small" / "cold_start.png").exists()


def test_main_job_writes_its_results_file_without_machine_paths(first_run):
    var, _, summary = first_run
    results = json.loads((var / "results" / "demo.json").read_text())
    assert summary["results"] == str(var / "results" / "demo.md")
    assert set(results["training"]) == LABELLED
    assert results["training"]["NCE-AutoRec"]["epochs_run"] == 2 and results["commit"]
    assert results["command"] == "make demo (--epochs 2 --models nce-autorec,puresvd)"
    ndcg = [r for r in results["test"] if r["metric"] == "NDCG" and r["group"] == "warm"]
    assert len(ndcg) == 2 and all(0 < r["mean"] < 1 and r["ci95"] > 0 for r in ndcg)
    assert results["training"]["PureSVD"]["epochs_run"] == 1  # a closed-form fit
    assert set(results["popularity"]) == LABELLED
    assert {"stack", "etl", "train NCE-AutoRec", "score", "evaluate", "total"} <= set(
        results["seconds"])
    md = (var / "results" / "demo.md").read_text()
    assert "R-Precision" in md and "var/eval/ml-latest-small/popularity.png" in md
    assert str(var) not in md and str(ROOT) not in md and str(var) not in json.dumps(results)


def test_mlflow_holds_every_run_with_metrics_models_and_plots(first_run, mlflow_server):
    from mlflow.tracking import MlflowClient

    _, _, summary = first_run
    client = MlflowClient(mlflow_server.url)
    assert set(summary["runs"]) == LABELLED
    for label, run_id in summary["runs"].items():
        run = client.get_run(run_id)
        assert run.info.status == "FINISHED"
        epochs = 1 if label == "PureSVD" else 2  # a closed-form fit is one "epoch"
        assert len(client.get_metric_history(run_id, "valid_ndcg")) == epochs
        assert 0 < run.data.metrics["test_ndcg"] < 1 and run.data.metrics["test_ndcg_ci95"] > 0
        assert "cold_ndcg" in run.data.metrics and "test_popularity_coverage" in run.data.metrics
        # what the UI lists: the key metrics, not every K (those are the run's metrics table),
        # the prepared data as the run's dataset input, only the parameters the model takes
        assert "test_precision_at_5" not in run.data.metrics and len(run.data.metrics) < 60, \
            sorted(run.data.metrics)
        (data,) = run.inputs.dataset_inputs
        assert data.dataset.name == "ml-latest-small" and data.dataset.digest
        assert not {"margin", "kl_cap", "rank" if label != "PureSVD" else "width"} & set(
            run.data.params)
        assert client.get_experiment(run.info.experiment_id).tags[
            "mlflow.experimentKind"] == "custom_model_development"
        # the description the UI shows: trained on what, and the test numbers evaluation wrote
        note = run.data.tags["mlflow.note.content"].split("\n")
        model = {LABELS[m]: m for m in MODELS}[label]
        assert note[0].startswith(f"**{model}") and note[0].endswith(" on ml-latest-small**"), note
        assert note[-1].startswith("- test (") and "NDCG 0." in note[-1] and "Recall@50 0." in note[-1]
        assert f"NDCG {run.data.metrics['test_ndcg']:.4f} ± {run.data.metrics['test_ndcg_ci95']:.4f}" \
            in note[-1]
        top = {a.path for a in client.list_artifacts(run_id)}
        assert "learning_curves.png" in top
        ev = {a.path for a in client.list_artifacts(run_id, "evaluation-test")}
        assert {"evaluation-test/popularity.png", "evaluation-test/cold_start.png",
                "evaluation-test/metrics.csv", "evaluation-test/metrics_table.json"} <= ev
        models = client.search_logged_models(experiment_ids=[run.info.experiment_id],
                                             filter_string=f"source_run_id = '{run_id}'")
        assert len(models) == 1
        assert client.get_model_version_by_alias(f"demo-{model}", "champion").run_id == run_id


def test_a_second_run_redoes_nothing(first_run, local_stack):
    var, _, summary = first_run
    log, again = main_job(local_stack, var)
    assert again["runs"] == summary["runs"]
    assert "already prepared" in log and log.count("finished already") == 2
    assert log.count("already scored") == 2 and "already evaluated" in log
    assert "$ spark-submit" not in log and "$ ray job submit" not in log
    from mlflow.tracking import MlflowClient  # registered once: the rerun made no new version

    versions = MlflowClient(local_stack.services["mlflow"].url).search_model_versions(
        "name = 'demo-nce-autorec'")
    assert len(versions) == 1
    assert "R-Precision" in log  # the table is printed again from the stored results
