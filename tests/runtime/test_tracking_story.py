"""What MLflow's UI shows of a run besides its numbers: the experiment's and the run's
descriptions (their "mlflow.note.content" tags) and the prepared dataset as a dataset input, on a
real SQLite tracking store."""

from __future__ import annotations

import json

import pytest

from runtime import tracking


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    """One store for the module (creating its schema takes seconds); each test its own runs."""
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    return uri, MlflowClient(uri)


MANIFEST = {"dataset": "shop", "inputs": [{"path": "/d/events.csv", "sha256": "ab"}],
            "parameters": {"seed": 0}, "counts": {"users": 12, "items": 11, "cold_users": 1,
                                                  "positives": {"train": 40, "test": 20}}}


def test_an_experiment_says_how_to_compare_its_runs(store):
    uri, client = store
    exp = tracking.experiment_id(client, uri, "shop")
    tags = client.get_experiment(exp).tags
    assert "sort by `test_ndcg`" in tags[tracking.NOTE] and "metrics_table.json" in tags[tracking.NOTE]
    # MLflow 3's UI opens a model-training experiment on its runs list, not the GenAI overview
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    old = client.create_experiment("older")  # made before descriptions: gets one when used
    assert tracking.experiment_id(client, uri, "older") == old
    assert client.get_experiment(old).tags[tracking.NOTE] == tracking.EXPERIMENT_NOTE
    theirs = client.create_experiment("theirs", tags={tracking.NOTE: "mine",
                                                       "mlflow.experimentKind": "genai_development"})
    tracking.experiment_id(client, uri, "theirs")  # a user's own description and kind are kept
    assert {k: client.get_experiment(theirs).tags[k] for k in (tracking.NOTE, "mlflow.experimentKind")
            } == {tracking.NOTE: "mine", "mlflow.experimentKind": "genai_development"}


def test_a_runs_description_gets_its_test_metrics_once_evaluated(store):
    uri, client = store
    run = client.create_run(tracking.experiment_id(client, uri, "shop"), run_name="r").info.run_id
    tracking.describe_run(uri, run, "NCE-AutoRec on shop", {
        "best_valid_ndcg": 0.21234, "best_epoch": 7, "epochs_run": 10,
        "valid_ndcg_popularity": 0.1316, "health": "ok"})
    note = client.get_run(run).data.tags[tracking.NOTE]
    assert note.split("\n") == [
        "**NCE-AutoRec on shop**", "",
        "- validation NDCG@50 0.2123 at epoch 7 of 10 (popularity 0.1316)", "- health: ok",
        "- test metrics: not evaluated yet (evaluation/evaluate.py writes them here)"]
    for ndcg in ("0.2500", "0.2600"):  # evaluated again: the test line is replaced, not added
        tracking.add_test_description(client, run, "test", f"(9 warm users): NDCG {ndcg} ± 0.0100")
    note = client.get_run(run).data.tags[tracking.NOTE].split("\n")
    assert note[-1] == "- test (9 warm users): NDCG 0.2600 ± 0.0100"
    assert sum(x.startswith("- test") for x in note) == 1
    # a validation-target evaluation has its own line; the test line stays
    tracking.add_test_description(client, run, "valid", "(9 warm users): NDCG 0.3000 ± 0.0100")
    note = client.get_run(run).data.tags[tracking.NOTE].split("\n")
    assert note[-2:] == ["- test (9 warm users): NDCG 0.2600 ± 0.0100",
                         "- valid (9 warm users): NDCG 0.3000 ± 0.0100"]
    assert note[:4] == ["**NCE-AutoRec on shop**", "",
                        "- validation NDCG@50 0.2123 at epoch 7 of 10 (popularity 0.1316)",
                        "- health: ok"]


def test_the_prepared_dataset_is_the_runs_input_once(store):
    uri, client = store
    run = client.create_run(tracking.experiment_id(client, uri, "shop"), run_name="r").info.run_id
    for _ in range(2):  # a resumed run logs nothing twice
        tracking.log_dataset(uri, run, MANIFEST, "/var/data/shop", context="train")
    inputs = client.get_run(run).inputs.dataset_inputs
    assert len(inputs) == 1
    d = inputs[0].dataset
    assert (d.name, d.source_type, json.loads(d.source)) == ("shop", "local", {"uri": "/var/data/shop"})
    assert json.loads(d.profile) == {"users": 12, "items": 11, "cold_users": 1,
                                     "positives": {"train": 40, "test": 20}}
    assert {t.key: t.value for t in inputs[0].tags} == {"mlflow.data.context": "train"}
    # the digest follows what the dataset was made from, not when
    other = {**MANIFEST, "parameters": {"seed": 1}}
    run2 = client.create_run(tracking.experiment_id(client, uri, "shop")).info.run_id
    tracking.log_dataset(uri, run2, other, "/var/data/shop", context="train")
    assert client.get_run(run2).inputs.dataset_inputs[0].dataset.digest != d.digest
    assert len(d.digest) == 10
