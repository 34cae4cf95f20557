"""A run's directory record: RUNS_DIR/RUN_NAME/run.json holds the configuration and the MLflow
run, config.yaml the configuration resolved for ``--config``. A run resumes only with the
settings it was recorded with (``check_resume``), compared as this code resolves them."""

from __future__ import annotations

import json

from models.registry import MODELS
from prepared.errors import UsageError
from prepared.uri import filesystem, join
from runtime.cli import config_yaml
from runtime.runs import RUN_RECORD
from training.config import TrainConfig, resumable_options

# fields that may change when a run resumes (where and how it runs, not what it trains)
RESUMABLE_CHANGES = {"data_cache", "num_workers", "cpus_per_worker", "use_gpu", "placement",
                     "max_failures", "mlflow_wait", "keep_checkpoints",
                     "output", "run_name", "experiment"} | resumable_options()



def read_run_record(cfg: TrainConfig) -> dict | None:
    fs, path = filesystem(join(cfg.output, cfg.run_name))
    from pyarrow import fs as pafs
    rec = join(path, RUN_RECORD)
    if fs.get_file_info(rec).type == pafs.FileType.NotFound:
        return None
    with fs.open_input_stream(rec) as f:
        return json.loads(f.read())


def resolved_config(cfg: TrainConfig) -> dict:
    """``cfg`` with the model's hyperparameters it leaves to their defaults (None) filled in with
    the values the run uses (``TrainConfig.resolved``): what config.yaml records, so that the
    file still says what ran after a model's default changes."""
    return effective(cfg.to_dict())


def config_file(cfg: TrainConfig, run_id: str | None = None) -> str:
    """config.yaml of a run: every option, resolved, that ``--config`` takes back. The run's name
    is left out: fed back as it is, the file starts a new run instead of resuming this one."""
    header = (f"training/train.py configuration of run {cfg.run_name}"
              + (f" (MLflow run {run_id})" if run_id else "") + ", resolved.\n"
              "python training/train.py --config THIS_FILE trains it again as a new run; add "
              f"--run-name {cfg.run_name} to resume that run instead.\nFlags given beside "
              "--config override its values; --mlflow-uri and --ray-address are not part of it.")
    return config_yaml(resolved_config(cfg), TrainConfig, header, leave_out=("run_name",))


def effective(config: dict) -> dict:
    """A recorded configuration with its hyperparameters resolved as this code resolves them:
    a run recorded with None (the model's default) and one recorded with that default spelt out
    (a config.yaml fed back) ran the same thing, and so did a run recorded before a hyperparameter
    existed: its missing key reads as the default it ran with (a lever added off by default)."""
    if config.get("model") not in MODELS:
        return config
    return {**config, **TrainConfig.from_dict(config).resolved()}


def check_resume(cfg: TrainConfig, record: dict | None) -> None:
    if record is None:
        return
    old = record["config"]
    # compared as resolved (None and the default it stands for are the same setting), shown as
    # recorded and given
    was, now = effective(old), effective(cfg.to_dict())
    diff = {k: (old.get(k), v) for k, v in cfg.to_dict().items()
            if k not in RESUMABLE_CHANGES and was.get(k) != now[k]}
    if diff:
        raise UsageError(
            f"run {cfg.run_name!r} already exists in {cfg.output} with other settings: " +
            ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in diff.items()) +
            ". Pass the same flags to resume it, or another --run-name for a new run")
