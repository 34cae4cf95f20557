"""The experiment runner end to end on the real stack: Ray Tune trials that are Ray Train runs, a
real MLflow server, retraining on train+valid, registry aliases, Spark scoring and evaluation.

One tiny experiment (autorec at two points, puresvd at one, on ml-latest-small) is started as
the README's command would, killed once its first trial has finished, and resumed: the tests read
what it left."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[1]
GRID = {"autorec": {"lam": [10.0, 30.0], "width": [32], "lr": [0.003]},
        "puresvd": {"rank": [10]}}  # one point: selection is autorec's to show; a trial less


@pytest.fixture(scope="module")
def killed_and_resumed(small_prepared, ray_head, mlflow_server, spark, tmp_path_factory):
    from experiment.run import ExperimentConfig, run_experiment

    base = tmp_path_factory.mktemp("experiments")
    grid = base / "grid.json"
    grid.write_text(json.dumps(GRID))
    flags = {"data": str(small_prepared), "models": "autorec,puresvd", "grid": str(grid),
             "name": "tiny", "output": str(base), "epochs": 3, "batch_size": 64}
    cmd = [sys.executable, "experiment/run.py", "--mlflow-uri", mlflow_server.url,
           "--ray-address", ray_head.address]
    for k, v in flags.items():
        cmd += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **ray_head.env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    # a run that hangs is killed too, so that the reading below ends
    watchdog = threading.Timer(600, os.killpg, (proc.pid, signal.SIGKILL))
    watchdog.start()
    first = []
    for line in proc.stdout:  # killed as soon as the first trial reports
        first.append(line)
        if "[autorec] trial 1/2" in line:
            break
    watchdog.cancel()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first_log = "".join(first)
    assert "[autorec] trial 1/2" in first_log, first_log[-4000:]
    done_first = [d.name for d in (base / "tiny" / "trials").iterdir()
                  if "summary" in json.loads((d / "run.json").read_text())]
    stamps = {n: (base / "tiny" / "trials" / n / "run.json").stat().st_mtime for n in done_first}
    state = run_experiment(ExperimentConfig(**flags), mlflow_server.url, ray_head.address)
    return {"first_log": first_log, "done_first": done_first, "stamps": stamps, "state": state,
            "root": base / "tiny"}


def test_a_killed_experiment_resumes_without_rerunning_finished_trials(killed_and_resumed,
                                                                      mlflow_server):
    from mlflow.tracking import MlflowClient

    r = killed_and_resumed
    assert len(r["done_first"]) == 1
    for name, stamp in r["stamps"].items():  # the finished trial's record was not rewritten
        assert (r["root"] / "trials" / name / "run.json").stat().st_mtime == stamp
    client = MlflowClient(mlflow_server.url)
    exp = client.get_experiment_by_name("tiny")
    trials = client.search_runs([exp.experiment_id], "tags.kind = 'trial'", max_results=100)
    # one MLflow run per point: the killed trial's resumed run is the same run, not a second one
    assert sorted(t.info.run_name for t in trials) == [
        "autorec-lam10-lr0.003-width32", "autorec-lam30-lr0.003-width32", "puresvd-rank10"]
    assert all(t.info.status == "FINISHED" for t in trials)


def test_the_experiment_selects_retrains_registers_scores_and_tables(killed_and_resumed,
                                                                    mlflow_server):
    from mlflow.tracking import MlflowClient

    r = killed_and_resumed
    state, root = r["state"], r["root"]
    client = MlflowClient(mlflow_server.url)
    for model, s in state["models"].items():
        trials = [json.loads((root / "trials" / d / "run.json").read_text())["summary"]
                  for d in os.listdir(root / "trials") if d.startswith(model)]
        best = max(trials, key=lambda t: t["best_valid_ndcg"])
        assert s["chosen"]["valid_ndcg"] == best["best_valid_ndcg"]
        # the final model: train+valid, the chosen point, exactly the chosen epochs
        final = client.get_run(s["final"]["mlflow_run_id"])
        assert final.data.params["train_splits"] == "train,valid"
        assert final.data.tags["mlflow.parentRunId"] == s["run_id"]
        assert client.get_run(s["run_id"]).data.tags["mlflow.parentRunId"] == state["run_id"]
        if model == "autorec":
            assert int(final.data.params["epochs"]) == s["chosen"]["best_epoch"]
            assert s["final"]["epochs_run"] == s["chosen"]["best_epoch"]
        recs = json.loads((root / "recs" / model / "_manifest.json").read_text())
        if s["chosen"].get("health") in (None, "ok"):
            # the registry's champion is the final run's model, and it is what was scored
            version = client.get_model_version_by_alias(f"ml-latest-small-{model}", "champion")
            assert version.run_id == s["final"]["mlflow_run_id"]
            assert recs["model"] == f"models:/ml-latest-small-{model}@champion"
        else:  # below popularity on validation (3 epochs): scored from its run, not registered
            assert final.data.tags["health"] == s["chosen"]["health"]
            assert recs["model"] == s["final"]["model_uri"]
            with pytest.raises(Exception, match="(?i)not found|does not exist|alias"):
                client.get_model_version_by_alias(f"ml-latest-small-{model}", "champion")
    table = (root / "table.md").read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| autorec") or
            ln.startswith("| puresvd")]
    assert len(rows) == 2 and all(" ± " in ln for ln in rows)
    lines = (root / "table.csv").read_text().splitlines()
    assert lines[0].startswith("model,R-Precision mean") and len(lines) == 3
    ndcg = {ln.split(",")[0]: float(ln.split(",")[3]) for ln in lines[1:]}
    # the lists hit: random top-50 lists score about 0.016 test NDCG on this set
    assert all(0.03 < v < 0.6 for v in ndcg.values()), ndcg
    artifacts = [a.path for a in client.list_artifacts(state["run_id"])]
    assert "table.md" in artifacts and "plots" in artifacts
    assert client.get_run(state["run_id"]).info.status == "FINISHED"
