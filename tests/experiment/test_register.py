"""Registering the experiment's final models (experiment/register.py) against a registry kept in a
dict: an unhealthy chosen trial must never make its model ``@champion`` unless
--allow-unhealthy, and a healthy one must. The MLflow client and ``mlflow.register_model`` are
stand-ins put where the code imports them, so the fast tier checks the rule without a server
(tests/training/test_train_ray.py checks it against a real one)."""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest

from experiment.register import register_if_healthy


class Registry:
    """What a tracking server would hold: model versions, aliases and tags, and each run's
    experiment; every write is recorded in ``calls``."""

    def __init__(self):
        self.versions: dict[str, list[dict]] = {}   # name -> versions (1-based)
        self.aliases: dict[tuple[str, str], str] = {}
        self.run_tags: dict[str, dict] = {}
        self.experiments = {"run-old": "1", "run-final": "1"}
        self.calls: list[tuple] = []

    def client(self, uri: str):
        registry = self

        class Client:
            def __init__(self, tracking_uri: str = uri):
                registry.calls.append(("client", tracking_uri))

            def get_model_version_by_alias(self, name, alias):
                if (name, alias) not in registry.aliases:
                    raise LookupError(f"alias {alias} of {name} not found")
                v = registry.aliases[name, alias]
                return SimpleNamespace(version=v, **registry.versions[name][int(v) - 1])

            def set_registered_model_alias(self, name, alias, version):
                registry.calls.append(("alias", name, alias, str(version)))
                registry.aliases[name, alias] = str(version)

            def set_tag(self, run_id, key, value):
                registry.calls.append(("run tag", run_id, key, value))
                registry.run_tags.setdefault(run_id, {})[key] = value

            def set_model_version_tag(self, name, version, key, value):
                registry.calls.append(("version tag", name, str(version), key, value))
                registry.versions[name][int(version) - 1]["tags"][key] = value

            def get_run(self, run_id):
                return SimpleNamespace(info=SimpleNamespace(
                    experiment_id=registry.experiments[run_id]))

            def get_experiment(self, experiment_id):
                return SimpleNamespace(name=f"experiment {experiment_id}")

        return Client

    def register_model(self, model_uri: str, name: str):
        run_id = model_uri.split("/")[1]  # the tests' URIs: runs:/RUN/model
        self.versions.setdefault(name, []).append({"run_id": run_id, "source": model_uri,
                                                   "tags": {}})
        self.calls.append(("register", name, model_uri))
        return SimpleNamespace(version=str(len(self.versions[name])))


@pytest.fixture
def registry(monkeypatch):
    """A Registry installed as ``mlflow`` (register_model, set_tracking_uri) and
    ``mlflow.tracking.MlflowClient`` for one test."""
    reg = Registry()
    mlflow = types.ModuleType("mlflow")
    mlflow.register_model = reg.register_model
    mlflow.set_tracking_uri = lambda uri: reg.calls.append(("tracking", uri))
    tracking = types.ModuleType("mlflow.tracking")
    tracking.MlflowClient = reg.client("http://tracking")
    mlflow.tracking = tracking
    monkeypatch.setitem(sys.modules, "mlflow", mlflow)
    monkeypatch.setitem(sys.modules, "mlflow.tracking", tracking)
    return reg


FINAL = {"model_uri": "runs:/run-final/model", "mlflow_run_id": "run-final"}


def chosen(health: str | None) -> dict:
    return {"trial": "t3", "valid_ndcg": 0.0123, "health": health,
            "valid_ndcg_popularity": 0.05, "code_effective_rank": 1.0}


@pytest.mark.parametrize("health", ["ok", None])  # None: a trial whose health was not checked
def test_a_healthy_model_is_registered_as_champion(registry, capsys, health):
    got = register_if_healthy("http://tracking", "ds-autorec", FINAL, chosen(health), False)
    assert got == "models:/ds-autorec@champion"
    assert registry.aliases == {("ds-autorec", "champion"): "1"}
    assert registry.versions["ds-autorec"][0]["source"] == FINAL["model_uri"]
    assert "WARNING" not in capsys.readouterr().out and not registry.run_tags


@pytest.mark.parametrize("health", ["collapsed", "below-popularity", "below-popularity,collapsed"])
def test_an_unhealthy_model_is_not_made_champion(registry, capsys, health):
    """Its run's own URI is scored instead; the run says why in a tag, the driver in a WARNING."""
    got = register_if_healthy("http://tracking", "ds-autorec", FINAL, chosen(health), False)
    assert got == FINAL["model_uri"]
    assert not registry.aliases and not registry.versions  # no version, no alias
    assert not [c for c in registry.calls if c[0] in ("register", "alias")]
    assert registry.run_tags == {"run-final": {"health": health}}
    out = capsys.readouterr().out
    assert "WARNING: ds-autorec: not registered as models:/ds-autorec@champion" in out
    assert f"is {health} on validation" in out and "--allow-unhealthy" in out


def test_an_unhealthy_model_leaves_the_previous_champion_in_place(registry):
    registry.register_model("runs:/run-old/model", "ds-autorec")
    registry.aliases["ds-autorec", "champion"] = "1"
    register_if_healthy("http://tracking", "ds-autorec", FINAL, chosen("collapsed"), False)
    assert registry.aliases == {("ds-autorec", "champion"): "1"}
    assert len(registry.versions["ds-autorec"]) == 1


def test_allow_unhealthy_registers_it_with_its_health_on_the_version(registry, capsys):
    got = register_if_healthy("http://tracking", "ds-autorec", FINAL, chosen("collapsed"), True)
    assert got == "models:/ds-autorec@champion"
    assert registry.aliases == {("ds-autorec", "champion"): "1"}
    assert registry.versions["ds-autorec"][0]["tags"] == {"health": "collapsed"}
    assert "(--allow-unhealthy)" in capsys.readouterr().out


def test_the_experiment_registers_only_its_healthy_models_by_default(registry, monkeypatch,
                                                                    tmp_path):
    """experiment/run.py's stage 4 with its default flags: the healthy model becomes
    DATASET-MODEL@champion and is scored from there; the unhealthy one from its run."""
    from experiment import run as R
    from experiment.plan import ExperimentConfig

    scored = {}

    def score_seed(spark, cfg, root, model, seed, s, uri):  # the URI each model is scored from
        scored[model] = s["model_uri"]
        return tmp_path / model

    monkeypatch.setattr(R, "score_seed", score_seed)
    state = {"models": {
        "good": {"final": {"model_uri": "runs:/run-good/model", "mlflow_run_id": "run-good"},
                 "chosen": chosen("ok")},
        "bad": {"final": FINAL, "chosen": chosen("collapsed")}}}
    registry.experiments["run-good"] = "1"
    cfg = ExperimentConfig(data=str(tmp_path), models="good,bad")
    R.score_models(None, cfg, tmp_path, ["good", "bad"], state, "ds", "http://tracking")
    assert scored == {"good": "models:/ds-good@champion", "bad": FINAL["model_uri"]}
    assert set(registry.aliases) == {("ds-good", "champion")}
