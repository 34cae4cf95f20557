"""The experiment's state: EXPERIMENTS_DIR/NAME/experiment.json, rewritten after every stage
(``open_state`` refuses a resume with other settings), its resolved configuration
(config.yaml), and its MLflow runs: experiment run > model run > trial and final runs."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from experiment.plan import ExperimentConfig
from experiment.records import read_json
from prepared.errors import UsageError
from runtime.cli import config_yaml

PARENT = "mlflow.parentRunId"  # MLflow's tag that nests a run under another in the UI
# what a trial changes in the experiment's configuration: never where or how it runs
FIXED = ("data", "grid", "epochs", "patience", "seed", "valid_sample", "valid_by", "batch_size")


def open_state(cfg: ExperimentConfig, root: Path) -> dict:
    state = read_json(root / "experiment.json")
    if state is None:
        return {"config": dataclasses.asdict(cfg), "models": {}}
    old = state["config"]
    changed = {k: (old.get(k), getattr(cfg, k)) for k in FIXED if old.get(k) != getattr(cfg, k)}
    if changed:
        raise UsageError(
            f"experiment {cfg.name!r} exists in {root.parent} with other settings: "
            + ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in changed.items())
            + ". Pass the same flags to resume it, or another --name for a new experiment")
    state["config"] = dataclasses.asdict(cfg)  # models and cluster settings may change
    return state



def parent_runs(uri: str, cfg: ExperimentConfig, state: dict, models: list[str],
                dataset: str) -> None:
    from runtime import tracking

    state["mlflow_uri"] = uri
    state["run_id"] = tracking.open_run(uri, cfg.name, f"experiment {cfg.name}",
                                        state.get("run_id"),
                                        tags={"dataset": dataset, "kind": "experiment",
                                              "grid": cfg.grid})
    tracking.log_params(uri, state["run_id"], {k: v for k, v in dataclasses.asdict(cfg).items()})
    tracking.log_text(uri, state["run_id"], config_file(cfg, state["run_id"]), "config.yaml")
    for m in models:
        s = state["models"].setdefault(m, {})
        s["run_id"] = tracking.open_run(uri, cfg.name, f"{m} (search)", s.get("run_id"),
                                        tags={PARENT: state["run_id"], "dataset": dataset,
                                              "model": m, "kind": "model"})


def config_file(cfg: ExperimentConfig, run_id: str | None = None) -> str:
    """config.yaml of an experiment: every option, resolved (its name, absolute paths), that
    ``--config`` takes back. The name stays in: an experiment is meant to be rerun under its name
    (a rerun skips what finished), and its default name would be the same anyway."""
    header = (f"experiment/run.py configuration of experiment {cfg.name}"
              + (f" (MLflow run {run_id})" if run_id else "") + ", resolved.\n"
              "python experiment/run.py --config THIS_FILE resumes it (finished stages are "
              "skipped); change name: (or pass --name NEW) for a new experiment.\nFlags given "
              "beside --config override its values; --mlflow-uri and --ray-address are not part "
              "of it.")
    return config_yaml(dataclasses.asdict(cfg), ExperimentConfig, header)
