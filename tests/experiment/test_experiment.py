"""The experiment runner end to end on the real stack: Ray Tune trials that are Ray Train runs, a
real MLflow server, retraining on train+valid, registry aliases, Spark scoring and evaluation.

One tiny experiment (autorec at one point, puresvd at two, on ml-latest-small; two seeds of
each final model) is started as the README's command would, killed once its first trial has
finished, and resumed: the tests read what it left. Selection is puresvd's to show: a second
autorec point would cost two Ray Train trials (its own and the seed check's, which
tests/experiment/test_experiment_parts.py checks), a second puresvd point a closed-form fit."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.ray]
ROOT = Path(__file__).resolve().parents[2]
GRID = {"autorec": {"lam": [10.0], "width": [32], "lr": [0.003]},
        "puresvd": {"rank": [10, 20]}}


@pytest.fixture(scope="module")
def killed_and_resumed(small_prepared, ray_head, mlflow_server, spark, tmp_path_factory):
    from experiment.plan import ExperimentConfig
    from experiment.run import run_experiment

    base = tmp_path_factory.mktemp("experiments")
    grid = base / "grid.json"
    grid.write_text(json.dumps(GRID))
    flags = {"data": str(small_prepared), "models": "autorec,puresvd", "grid": str(grid),
             "name": "tiny", "output": str(base), "epochs": 3, "batch_size": 64, "seeds": 2}
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
        if "[autorec] trial 1/1" in line:
            break
    watchdog.cancel()
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    first_log = "".join(first)
    assert "[autorec] trial 1/1" in first_log, first_log[-4000:]
    done_first = [d.name for d in (base / "tiny" / "trials").iterdir()
                  if "summary" in json.loads((d / "run.json").read_text())]
    stamps = {n: (base / "tiny" / "trials" / n / "run.json").stat().st_mtime for n in done_first}
    state = run_experiment(ExperimentConfig(**flags), mlflow_server.url, ray_head.address)
    return {"first_log": first_log, "done_first": done_first, "stamps": stamps, "state": state,
            "root": base / "tiny", "flags": flags}


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
        "autorec-lam10-lr0.003-width32", "puresvd-rank10", "puresvd-rank20"]
    assert all(t.info.status == "FINISHED" for t in trials)


def test_the_experiment_selects_retrains_registers_scores_and_tables(killed_and_resumed,
                                                                    mlflow_server):
    from mlflow.tracking import MlflowClient

    r = killed_and_resumed
    state, root = r["state"], r["root"]
    client = MlflowClient(mlflow_server.url)
    for model, s in state["models"].items():
        trials = [json.loads((root / "trials" / d / "run.json").read_text())["summary"]
                  for d in os.listdir(root / "trials") if d.startswith(model)
                  and "-seed" not in d]
        best = max(trials, key=lambda t: t["best_valid_ndcg"])
        assert len(trials) == len(GRID[model][next(iter(GRID[model]))])
        # one point (autorec), or a closed form whose fit does not depend on the seed: no
        # trial is rerun with another seed before choosing
        assert s["chosen"].get("seed_check") is None
        assert not any("-seed" in d for d in os.listdir(root / "trials"))
        assert s["chosen"]["valid_ndcg"] == best["best_valid_ndcg"]
        # the final model: train+valid, the chosen point, exactly the chosen epochs
        final = client.get_run(s["final"]["mlflow_run_id"])
        assert final.data.params["train_splits"] == "train,valid"
        assert final.data.tags["mlflow.parentRunId"] == s["run_id"]
        assert client.get_run(s["run_id"]).data.tags["mlflow.parentRunId"] == state["run_id"]
        if model == "autorec":
            assert int(final.data.params["epochs"]) == s["chosen"]["best_epoch"]
            assert s["final"]["epochs_run"] == s["chosen"]["best_epoch"]
        # --seeds 2: a second final run of the same choice with seed 1, scored from its run
        assert sorted(s["finals"]) == ["0", "1"] and s["final"] == s["finals"]["0"]
        second = client.get_run(s["finals"]["1"]["mlflow_run_id"])
        assert (final.data.params["seed"], second.data.params["seed"]) == ("0", "1")
        assert second.data.params["train_splits"] == "train,valid"
        assert second.data.tags["mlflow.parentRunId"] == s["run_id"]
        other = json.loads((root / "recs" / f"{model}-seed1" / "_manifest.json").read_text())
        assert other["mlflow_run_id"] == s["finals"]["1"]["mlflow_run_id"]
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
    main = table.split("## The common conventions")[0]  # the paper's metrics' table
    rows = [ln for ln in main.splitlines() if ln.startswith("| autorec") or
            ln.startswith("| puresvd")]
    assert len(rows) == 2 and all(" ± " in ln for ln in rows)
    assert "each with 2 seeds" in table and "| seeds | NDCG seed sd (min–max) |" in table
    lines = list(csv.DictReader((root / "table.csv").open()))
    assert [r["model"] for r in lines] == ["autorec", "puresvd"]
    ndcg = {r["model"]: float(r["NDCG mean"]) for r in lines}
    # the lists hit: random top-50 lists score about 0.016 test NDCG on this set
    assert all(0.03 < v < 0.6 for v in ndcg.values()), ndcg
    # the pooled mean is the mean of the two seeds' means (each seed's in evaluation/)
    seed_means = {(r["label"], r["metric"]): float(r["mean"]) for r in
                  csv.DictReader((root / "evaluation" / "metrics.csv").open())
                  if r["group"] == "warm" and r["metric"] == "NDCG" and not r["K"]}
    for r in lines:
        pair = [seed_means[f"{r['model']} seed {s}", "NDCG"] for s in (0, 1)]
        assert float(r["NDCG mean"]) == pytest.approx(sum(pair) / 2, abs=2e-6)
        assert float(r["ndcg_seed_min"]) == pytest.approx(min(pair), abs=2e-6)
        assert r["seeds"] == "2"
        # the common conventions, pooled the same way (their own table and columns)
        hr = [float(next(x["mean"] for x in csv.DictReader(
            (root / "evaluation" / "metrics.csv").open()) if x["label"] == f"{r['model']} seed {s}"
            and x["group"] == "warm" and (x["metric"], x["K"]) == ("HR", "20"))) for s in (0, 1)]
        assert float(r["HR@20 mean"]) == pytest.approx(sum(hr) / 2, abs=2e-6)
        assert float(r["NDCG@20 (truncated) mean"]) > 0 and float(r["MRR@50 mean"]) > 0
    assert "## The common conventions" in table
    # every trial ranked by validation NDCG
    ranked = (root / "search.md").read_text()
    assert "## puresvd: 2 of 2 trial(s) finished" in ranked and "| 2 | rank=" in ranked
    paired = list(csv.DictReader((root / "paired.csv").open()))
    ndcg_pairs = {r["seed"]: r for r in paired if r["metric"] == "NDCG"}
    assert sorted(ndcg_pairs) == ["0", "1", "pooled"]
    assert {r["reference"] for r in paired} == {"autorec"} and ndcg_pairs["pooled"]["seeds"] == "2"
    assert float(ndcg_pairs["pooled"]["mean_difference"]) == pytest.approx(
        (float(ndcg_pairs["0"]["mean_difference"]) + float(ndcg_pairs["1"]["mean_difference"]))
        / 2, abs=2e-6)
    assert float(lines[1]["paired_ndcg_minus_first"]) == pytest.approx(
        -float(ndcg_pairs["pooled"]["mean_difference"]), abs=2e-6)
    artifacts = [a.path for a in client.list_artifacts(state["run_id"])]
    assert "table.md" in artifacts and "plots" in artifacts
    run = client.get_run(state["run_id"])
    assert run.info.status == "FINISHED"
    # the pooled numbers in MLflow: the table's NDCG, its seed spread, the paired difference
    assert run.data.metrics["test_ndcg_autorec"] == pytest.approx(ndcg["autorec"], abs=2e-6)
    assert run.data.metrics["test_ndcg_autorec_seed_sd"] == pytest.approx(
        float(lines[0]["ndcg_seed_sd"]), abs=2e-6)
    assert run.data.metrics["test_paired_ndcg_puresvd_minus_first"] == pytest.approx(
        float(lines[1]["paired_ndcg_minus_first"]), abs=2e-6)


@pytest.fixture(scope="module")
def with_ensemble(killed_and_resumed, ray_head, mlflow_server):
    """The finished experiment resumed with --ensemble autorec,puresvd --ensemble-top 2 (after
    the tests above have read its first results): no final run is trained again; the ensemble
    of the candidates (autorec's one trial, puresvd's two) is assembled, scored and tabled
    beside the models."""
    from experiment.plan import ExperimentConfig
    from experiment.run import run_experiment

    r = killed_and_resumed
    stamps = {p: p.stat().st_mtime for p in (r["root"] / "final").glob("*/run.json")}
    flags = {**r["flags"], "ensemble": "autorec,puresvd", "ensemble_top": 2}
    return run_experiment(ExperimentConfig(**flags), mlflow_server.url, ray_head.address), stamps


def test_an_ensemble_of_the_chosen_models_is_assembled_scored_and_tabled(
        with_ensemble, killed_and_resumed, mlflow_server):
    from mlflow.tracking import MlflowClient

    from evaluation.tables import fmt_point
    from experiment import grids
    from experiment.selection import seeded

    state, stamps = with_ensemble
    root = killed_and_resumed["root"]
    assert stamps and all(p.stat().st_mtime == s for p, s in stamps.items())  # nothing retrained
    e = state["models"]["ensemble"]
    # the subset validation chose among the candidates: each model's chosen trial, then
    # puresvd's other point (--ensemble-top 2; autorec has one)
    choice = json.loads((root / "trials" / "ensemble" / "run.json").read_text())
    other = next(r["point"] for r in state["models"]["puresvd"]["chosen"]["all"]
                 if r["point"] != state["models"]["puresvd"]["chosen"]["point"])
    assert e["candidates"] == {"autorec": state["models"]["autorec"]["chosen"]["trial"],
                               "puresvd": state["models"]["puresvd"]["chosen"]["trial"],
                               "puresvd#2": grids.point_name("puresvd", other)}
    trials = {label: str(root / "trials" / t) for label, t in e["candidates"].items()}
    assert choice["config"]["members"] == list(trials.values())
    assert choice["summary"]["members"] == [trials[m] for m in e["members"]] and e["members"]
    assert e["chosen"]["valid_ndcg"] == choice["summary"]["best_valid_ndcg"]
    assert e["chosen"]["trials"] == 7  # every subset of the three
    # per seed, the members' finals of that seed, assembled whole: a model's choice's from
    # stage 3, puresvd's second point's (where chosen) refitted on train+valid for it
    for seed, name in (("0", "ensemble-final"), ("1", "ensemble-final-seed1")):
        final = json.loads((root / "final" / name / "run.json").read_text())
        assert final["config"]["choose"] == "all"
        own = {m: state["models"][m]["finals"][seed]["model_path"] for m in ("autorec", "puresvd")}
        own["puresvd#2"] = str(root / "final" / seeded(f"{e['candidates']['puresvd#2']}-final",
                                                       int(seed), 0) / "model.pt")
        assert final["summary"]["members"] == [own[m] for m in e["members"]]
        assert e["finals"][seed]["mlflow_run_id"] == final["summary"]["mlflow_run_id"]
        if "puresvd#2" in e["members"]:
            second = json.loads((Path(own["puresvd#2"]).parent / "run.json").read_text())
            assert second["config"]["train_splits"] == "train,valid"
            assert second["config"]["rank"] == other["rank"]
            assert second["config"]["seed"] == int(seed)
    client = MlflowClient(mlflow_server.url)
    run = client.get_run(e["final"]["mlflow_run_id"])
    assert run.data.tags["mlflow.parentRunId"] == state["run_id"] and run.data.tags["seed"] == "0"
    # registered and scored as a model, its seeds pooled in the table beside the others
    recs = json.loads((root / "recs" / "ensemble" / "_manifest.json").read_text())
    assert recs["model"] == "models:/ml-latest-small-ensemble@champion"
    assert (root / "recs" / "ensemble-seed1" / "_manifest.json").is_file()
    lines = list(csv.DictReader((root / "table.csv").open()))
    assert [r["model"] for r in lines] == ["autorec", "puresvd", "ensemble"]
    row = lines[2]
    assert row["seeds"] == "2" and 0.03 < float(row["NDCG mean"]) < 0.6
    assert row["chosen"] == fmt_point({"members": "+".join(e["members"])})
    assert "| ensemble |" in (root / "table.md").read_text()

