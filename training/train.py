"""Train a model (the AutoRec family data-parallel on Ray Train, or a closed-form baseline fitted
in a Ray task), tracked in MLflow.

    python training/train.py --data var/data/ml-latest-small --model nce-autorec
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        python training/train.py --data /abs/prepared --model nce-autorec --num-workers 4 --use-gpu \\
        --runs-dir /abs/or/s3/runs --mlflow-uri http://mlflow-host:5000

``--config FILE`` takes the options from a YAML file (flags beside it win); every run writes
its whole configuration, resolved, to RUNS_DIR/RUN_NAME/config.yaml and MLflow, which --config
reads back for a new run.

Each epoch prints one line (losses, validation NDCG beside the popularity baseline's on the same
users, Recall@50, users/s, time left) and logs them to MLflow. A run whose best validation NDCG is
not above popularity's, or whose code collapses (effective rank < 2), says so in WARNING lines
and is tagged health=below-popularity / collapsed in MLflow (training/validate.py ``health``).
Checkpoints go to RUNS_DIR/RUN_NAME every epoch; rerunning with the same --run-name resumes there.
The run returns its best epoch by validation NDCG (the last epoch for the final retraining,
--train-splits train,valid), written to RUNS_DIR/RUN_NAME/model.pt and logged to MLflow as a
pyfunc that scores user rows.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python training/train.py): make packages importable
    _root = str(Path(__file__).resolve().parents[1])
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    sys.path.insert(0, _root)

import argparse
import dataclasses
import datetime as dt
import io
import json
import os
import time

from models.registry import MODELS, load_weights_only, payload
from prepared import schema as S
from prepared.errors import UsageError
from prepared.protocol import head_items
from prepared.reader import Prepared, open_prepared
from prepared.uri import absolute, filesystem, join
from prepared.verify import naming_damaged_files
from runtime.atomic import write_bytes
from runtime.cli import flag_of, stage_parser, values
from runtime.cli import given as given_fields
from runtime.logs import no_bars_in_logs
from runtime.paths import project_root
from runtime.raycluster import (
    apply_one_node_env,
    check_fits,
    checkpoints,
    drop_checkpoints,
    join_address,
    local_cpus,
    ray_for,
    watch_run,
    worker_cpus,
)
from runtime.runs import (
    CHECKPOINT_BEST,
    CHECKPOINT_STATE,
    MODEL_FILE,
    RUN_RECORD,
    finished_record,
    finished_summary,
    summary_line,
)
from training import feed as F
from training.config import TrainConfig, check, data_shape, with_preset
from training.hooks import hook_specs
from training.hooks import resolve as resolve_hooks
from training.run_record import check_resume, config_file, read_run_record
from training.validate import COLLAPSED_RANK, HEALTHY, health

#: the split every data-dependent scale of a hyperparameter (the AutoRec family's omega, the unit
#: of lambda) is computed on: the one model selection trains on, also for the final retraining on
#: train+valid, so that the regularisation validation chose is the one the final model gets
STATISTICS_SPLIT = "train"


class TrainingError(RuntimeError):
    """Training ran but failed in a way the message explains (divergence, worker failures)."""


def build_parser() -> argparse.ArgumentParser:
    """Every flag of TrainConfig (its defaults and help live there), --config FILE, and where
    to connect: ``runtime.cli.stage_parser``, which experiment/run.py builds its own with."""
    return stage_parser("training/train.py", __doc__, TrainConfig)


def check_job_paths(args: argparse.Namespace, config: type = TrainConfig) -> None:
    """Under ``ray job submit`` the entry point runs in a throw-away copy of --working-dir: the
    defaults (./var/runs, ./mlflow/state) and relative paths would land there and be lost.
    ``config``: the caller's options dataclass, whose ``output`` field names the flag."""
    if "RAY_JOB_CONFIG_JSON_ENV_VAR" not in os.environ:
        return
    output_flag = flag_of(next(f for f in dataclasses.fields(config) if f.name == "output"))
    missing = [f for f, v in ((output_flag, args.output), ("--mlflow-uri", args.mlflow_uri or
                                                           os.environ.get("MLFLOW_TRACKING_URI")))
               if not v]
    relative = [f"{f} {v}" for f, v in (("--data", args.data), (output_flag, args.output))
                if v and "://" not in v and not Path(v).is_absolute()]
    if missing or relative:
        raise UsageError(
            "under ray job submit this command runs in a temporary copy of the working directory: "
            + ("pass " + " and ".join(missing) if missing else "")
            + ("; " if missing and relative else "")
            + (", ".join(relative) + " must be absolute" if relative else "")
            + f" (e.g. {output_flag} /abs/runs --mlflow-uri http://127.0.0.1:5000 or "
              "sqlite:////abs/mlflow.db)")


def config_from_args(args: argparse.Namespace, prep: Prepared) -> TrainConfig:
    """The flags as a TrainConfig, with what they leave to the run: its name, absolute paths,
    and a ``--preset``'s settings (said on stdout)."""
    given = values(args, TrainConfig)
    shape = data_shape(prep) if given["preset"] == "auto" else None  # the rule reads the data
    given, line = with_preset(given, given_fields(args), shape)
    if line:
        print(line, flush=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    run_name = given["run_name"] or "-".join(
        x for x in (given["model"], *map(str, labels(given["model"], given).values()),
                    given["preset"], prep.dataset, stamp) if x)
    output = absolute(given["output"] or str(project_root() / "var" / "runs"))
    data = absolute(given["data"])
    return TrainConfig(**{**given, "data": data, "run_name": run_name, "output": output,
                          "experiment": given["experiment"] or prep.dataset})


def labels(model: str, values: dict) -> dict:
    """Of ``values``, the model's hyperparameters that name a run beside the model (``HP.label``,
    e.g. the two-headed models' mode), where set."""
    declared = MODELS[model].hyperparameters
    return {k: v for k, v in values.items()
            if k in declared and declared[k].label and v is not None}


def model_title(cfg: TrainConfig) -> str:
    """The model and its labels as given (``labels``): "nce-autorec limited-finetune"."""
    return " ".join([cfg.model, *map(str, labels(cfg.model, cfg.hyperparameters()).values())])


def run_statistics(cfg: TrainConfig, prep: Prepared, record: dict | None) -> dict:
    """The training policy's ``data_statistics`` for this run and the split they were computed
    on: ``{"split": ..., "values": {...}}``, what run.json records. A resumed run keeps its
    record's: its checkpoints were trained with them."""
    if record is not None and "data_statistics" in record:
        return record["data_statistics"]
    values = MODELS[cfg.model].trainer.data_statistics(prep, STATISTICS_SPLIT, cfg)
    return {"split": STATISTICS_SPLIT, "values": values}


def statistics_params(stats: dict) -> dict:
    """``run_statistics`` as MLflow params: each value under its name, and the split."""
    return {**stats["values"], "data_statistics_split": stats["split"]} if stats["values"] else {}


# -- Ray -----------------------------------------------------------------------------------------

def start_ray(cfg: TrainConfig, address: str | None) -> float:
    """Join the cluster (or start a local Ray) and check the workers fit; returns CPUs per worker."""
    address = join_address(address)
    ray = ray_for(address)
    if not ray.is_initialized():
        if address:
            ray.init(address=address, log_to_driver=True)
        else:  # a CPU beyond the workers' for Ray Data's reads (runtime.raycluster.local_cpus)
            ray.init(num_cpus=local_cpus(cfg.num_workers, cfg.cpus_per_worker), log_to_driver=True)
    from training.loop import quiet_ray_logs
    quiet_ray_logs()
    apply_one_node_env(sum(1 for n in ray.nodes() if n["Alive"]))
    res = ray.cluster_resources()
    cpw = worker_cpus(cfg.num_workers, cfg.cpus_per_worker, res.get("CPU", 0))
    check_fits(cfg.num_workers, cpw, use_gpu=cfg.use_gpu, resources=res,
               reading=MODELS[cfg.model].kind != "closed-form")  # a closed-form fit reads itself
    return cpw


def fit(cfg: TrainConfig, prep: Prepared, mlflow_cfg: dict | None, cpw: float,
        data: dict | None = None):
    """Train ``cfg`` on Ray Train; ``data``: the model's data statistics (``run_statistics``'s
    values; default: computed on ``STATISTICS_SPLIT``)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from training.ingest import ShardedValidation
    from training.loop import WorkerPlan, train_loop

    plan = F.plan(MODELS[cfg.model], prep, cfg)
    # rows that fit: read once, here, into the object store; re-reading them costs seconds per
    # epoch in task scheduling alone (more than an epoch on MovieLens-sized data), and at the
    # Yahoo shape 14 s an epoch. Decided per dataset, by the columns it reads: validation's (a
    # sample of the users) may fit where training's do not
    reads = {"train": (plan.columns(), 1.0)}
    if not cfg.final_retraining:
        reads["valid"] = (F.VALID_COLUMNS, cfg.valid_sample)
    held = F.fits_in_object_store(prep.rows_uri, cfg.data_cache, reads)
    datasets = {"train": F.train_dataset(prep.rows_uri, plan, held["train"])}
    if "valid" in held:
        datasets["valid"] = F.valid_dataset(prep.rows_uri, cfg.valid_sample, held["valid"])
    run_dir = join(cfg.output, cfg.run_name)
    epoch_hooks = hook_specs()
    resolve_hooks(epoch_hooks)  # a bad NCE_TEST_HOOK is one line here, not a worker's traceback
    data = run_statistics(cfg, prep, None)["values"] if data is None else data
    worker_plan = WorkerPlan(cfg=cfg, feed=plan, n_items=prep.n_items, n_users=prep.n_users,
                             data=data, start=start_weights(cfg, prep, data, run_dir),
                             head_items=head_items(prep.pop_train), popularity=prep.pop_train,
                             threads=max(1, int(cpw)),
                             mlflow=mlflow_cfg, run_dir=run_dir, epoch_hooks=tuple(epoch_hooks))
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"plan": worker_plan},
        scaling_config=ScalingConfig(num_workers=cfg.num_workers, use_gpu=cfg.use_gpu,
                                     resources_per_worker={"CPU": cpw},
                                     placement_strategy=cfg.placement),
        run_config=RunConfig(name=cfg.run_name, storage_path=cfg.output,
                             failure_config=FailureConfig(max_failures=cfg.max_failures),
                             checkpoint_config=CheckpointConfig(num_to_keep=2)),
        # Ray's own default too, made explicit: NCCL between GPUs, gloo between CPU processes
        torch_config=TorchConfig(backend="nccl" if cfg.use_gpu else "gloo"),
        datasets=datasets, dataset_config=ShardedValidation())
    with watch_run(run_dir, f"run {cfg.run_name}", cfg.num_workers, cpw, cfg.use_gpu):
        return trainer.fit()


def start_weights(cfg: TrainConfig, prep: Prepared, data: dict, run_dir: str):
    """The weights the run starts from when its training policy computes them from the training
    matrices (``Training.starts_from_data``: e.g. ``--init svd``), put in Ray's object store
    for the workers; None otherwise, and for a run that resumes from its checkpoint."""
    import ray

    from training import closed_form
    from training.loop import build_model

    if not MODELS[cfg.model].trainer.starts_from_data(cfg) or checkpoints(run_dir):
        return None
    t0 = time.perf_counter()
    model, policy = build_model(cfg, prep.n_items, prep.n_users, data)
    rows = closed_form.read_rows(prep, [S.USER_INDEX, S.TRAIN_ITEMS, S.VALID_ITEMS])
    line = policy.start(*closed_form.matrices(prep, cfg, rows), cfg.seed)
    print(f"run {cfg.run_name}: {line} ({time.perf_counter() - t0:.1f}s)", flush=True)
    return ray.put({k: v.detach().cpu() for k, v in model.state_dict().items()})


def run(cfg: TrainConfig, mlflow_uri: str | None = None, ray_address: str | None = None,
        prep: Prepared | None = None, tags: dict[str, str] | None = None) -> dict:
    """Train ``cfg``; returns the summary (best epoch, metrics, where the model is). ``prep`` is
    ``cfg.data`` already opened (the CLI opens it to name the run); ``tags`` go on a new MLflow
    run (``mlflow.parentRunId`` nests it under an experiment's run)."""
    check(cfg)
    prep = prep or open_prepared(cfg.data)
    done = finished_already(cfg)
    if done is not None:
        return done
    lock = run_lock(cfg)
    if lock is not None:  # two runs of one name would overwrite each other's files and MLflow run
        lock.acquire()
    try:
        return _run(cfg, prep, mlflow_uri, ray_address, tags)
    finally:
        if lock is not None:
            lock.release()


def finished_already(cfg: TrainConfig) -> dict | None:
    """The summary of a run of this name that finished (said in one line), else None; refuses
    a run directory of another configuration (``check_resume``)."""
    record = read_run_record(cfg)
    check_resume(cfg, record)
    done = finished_summary(record)
    if done is not None:
        print(f"run {cfg.run_name} finished already (best epoch {done['best_epoch']}); "
              f"its model is {done['model_path']}. Pass another --run-name to train "
              "again", flush=True)
    return done


WRITER_LOCK = ".writer.lock"  # in the run directory; a dot: no reader takes it for data


def run_lock(cfg: TrainConfig):
    """The run directory's writer lock (``runtime.publish.WriterLock``): a second process
    training the same run name is refused with the holder's pid and host, and a lock whose pid
    no longer runs here (a killed run) is taken over by the rerun that resumes it. None for a
    run directory that is not on a local disk (no exclusive create there)."""
    from runtime.publish import WriterLock

    run_dir = join(cfg.output, cfg.run_name)
    if "://" in run_dir and not run_dir.startswith("file://"):
        return None
    local = Path(run_dir.removeprefix("file://"))
    local.mkdir(parents=True, exist_ok=True)
    return WriterLock.local(str(local / WRITER_LOCK), f"run {cfg.run_name} ({local})")


def _run(cfg: TrainConfig, prep: Prepared, mlflow_uri: str | None, ray_address: str | None,
         tags: dict[str, str] | None) -> dict:
    """``run`` once the run directory is this process's."""
    import torch

    from runtime import tracking

    done = finished_already(cfg)  # again, held: another writer may have finished it meanwhile
    if done is not None:
        return done
    record = read_run_record(cfg)
    if record is not None:
        check_saved_files(cfg)
    uri = tracking.tracking_uri(mlflow_uri)
    tracking.check_reachable(uri)
    run_id = tracking.open_run(uri, cfg.experiment, cfg.run_name,
                               (record or {}).get("mlflow_run_id"),
                               tags={"dataset": prep.dataset, "model": cfg.model,
                                     **{k: str(v) for k, v in
                                        labels(cfg.model, cfg.resolved()).items()},
                                     "train_splits": cfg.train_splits, **(tags or {})})
    # what the model reads from the data (e.g. the AutoRec family's unit of lambda, "overlap"),
    # and on which split: the selection's, also for the final retraining (STATISTICS_SPLIT)
    stats = run_statistics(cfg, prep, record)
    tracking.log_params(uri, run_id, {**cfg.logged_params(), "n_items": prep.n_items,
                                      "dataset": prep.dataset, **statistics_params(stats),
                                      "etl_beta": prep.beta(), "etl_negatives": prep.negatives(),
                                      "users": prep.manifest["counts"]["users"]})
    tracking.log_dataset(uri, run_id, prep.manifest, prep.uri, context=cfg.train_splits)
    run_record = {"config": cfg.to_dict(), "mlflow_uri": uri, "mlflow_run_id": run_id,
                  "data_statistics": stats}
    if record and "trained" in record:
        run_record["trained"] = record["trained"]
    write_bytes(join(join(cfg.output, cfg.run_name), RUN_RECORD),
                json.dumps(run_record, indent=2).encode())
    # the configuration a user can rerun (--config), beside run.json and in MLflow
    text = config_file(cfg, run_id)
    write_bytes(join(join(cfg.output, cfg.run_name), "config.yaml"), text.encode())
    tracking.log_text(uri, run_id, text, "config.yaml")
    print(f"run {cfg.run_name}: {model_title(cfg)} on {prep.dataset} "
          f"({prep.manifest['counts']['warm_users']:,} training users, {prep.n_items:,} items), "
          f"{cfg.num_workers} worker(s); checkpoints in {join(cfg.output, cfg.run_name)}; "
          f"MLflow {uri} run {run_id}", flush=True)

    model_path = join(join(cfg.output, cfg.run_name), MODEL_FILE)
    if "trained" in run_record:  # an earlier call trained it; MLflow was down at the end
        print(f"run {cfg.run_name}: training finished already (best epoch "
              f"{run_record['trained']['best_epoch']}); logging its results to MLflow", flush=True)
        saved = read_model_file(model_path)
        summary, history = run_record["trained"], saved["history"]
        best, model_args = saved["state_dict"], saved["model_args"]
    else:
        summary, history, best, model_args = train_run(cfg, prep, uri, run_id, ray_address,
                                                       stats["values"])
        buf = io.BytesIO()
        # the layout of models.registry.save, plus what the run learnt
        torch.save(payload(cfg.model, model_args, best,
                           config=cfg.to_dict(), summary=summary, history=history), buf)
        write_bytes(model_path, buf.getvalue())
        run_record["trained"] = summary  # the model is safe: a rerun only logs, never retrains
        write_bytes(join(join(cfg.output, cfg.run_name), RUN_RECORD),
                    json.dumps(run_record, indent=2).encode())
    if not cfg.keep_checkpoints:  # model.pt and run.json's "trained" now stand for them
        dropped = drop_checkpoints(join(cfg.output, cfg.run_name))
        if dropped:
            print(f"run {cfg.run_name}: deleted its {dropped} checkpoint(s), model.pt holds the "
                  "best weights (--keep-checkpoints keeps them)", flush=True)
    model_uri = log_results(cfg, prep, uri, run_id, summary, history, best, model_args, model_path)
    warning = health_warning(summary, cfg.run_name, remedy(cfg))
    if warning:
        print(warning, flush=True)
    summary = {**summary, "model_path": model_path, "model_uri": model_uri,
               "mlflow_run_id": run_id, "mlflow_uri": uri, "run_name": cfg.run_name}
    # written last: a run directory with a summary is a finished run
    write_bytes(join(join(cfg.output, cfg.run_name), RUN_RECORD),
                json.dumps(finished_record(run_record, summary), indent=2).encode())
    return summary


def read_model_file(path: str) -> dict:
    fs, p = filesystem(path)
    with fs.open_input_stream(p) as f:
        return load_weights_only(io.BytesIO(f.read()), path)


def check_saved_files(cfg: TrainConfig) -> None:
    """Before Ray starts a resume: every ``.pt`` file of the run (model, checkpoints) must load
    weights-only, so that a tampered file is refused here in one line rather than unpickled, or
    failed on, by every worker restart."""
    from pyarrow import fs as pafs

    run_dir = join(cfg.output, cfg.run_name)
    fs, path = filesystem(run_dir)
    for info in fs.get_file_info(pafs.FileSelector(path, recursive=True)):
        if info.is_file and info.path.endswith(".pt"):
            read_model_file(join(run_dir, info.path[len(path):].lstrip("/")))


def train_run(cfg: TrainConfig, prep: Prepared, uri: str, run_id: str, ray_address: str | None,
              data: dict | None = None):
    """Train on Ray; returns (summary, per-epoch history, best weights, model arguments).
    ``data``: the model's data statistics (``run_statistics``)."""

    from runtime import tracking

    t0 = time.perf_counter()
    if MODELS[cfg.model].engine == "spark":
        from training import closed_form

        return closed_form.fit_on_spark(cfg, prep)
    cpw = start_ray(cfg, ray_address)
    if MODELS[cfg.model].kind == "closed-form":
        from training import closed_form

        # one task with the CPUs the workers would have had (a closed-form fit is one process)
        return closed_form.fit(cfg, prep, cpus=cpw * cfg.num_workers)
    from ray.train import TrainingFailedError
    try:
        result = fit(cfg, prep, {"uri": uri, "run_id": run_id}, cpw, data)
    except TrainingFailedError as e:
        tracking.mark_failed(uri, run_id)
        raise TrainingError(
            f"training failed after {cfg.max_failures} restart(s) of the worker group: "
            f"{str(e).strip().splitlines()[-1] if str(e).strip() else type(e).__name__}. "
            f"Rerun the same command (same --run-name {cfg.run_name}) to resume from the last "
            f"checkpoint in {join(cfg.output, cfg.run_name)}; the workers' logs are in Ray's "
            "session directory (/tmp/ray/session_latest/logs on the head)") from e
    if result.checkpoint is None:
        raise TrainingError(f"run {cfg.run_name} ended without a checkpoint: {result.error}")
    with result.checkpoint.as_directory() as d:
        state = load_weights_only(Path(d) / CHECKPOINT_STATE, "the last checkpoint")
        best = load_weights_only(Path(d) / CHECKPOINT_BEST, "the last checkpoint") \
            if (Path(d) / CHECKPOINT_BEST).exists() else None
    progress, history = state["progress"], state["progress"]["history"]
    if progress["diverged"]:
        tracking.mark_failed(uri, run_id)
        raise TrainingError(
            f"the training loss became NaN or infinite in epoch {progress['diverged']}: lower "
            f"--lr (now {cfg.learning_rate:g}) or "
            f"{MODELS[cfg.model].trainer.divergence_hint(cfg.resolved())}; the checkpoints up "
            f"to epoch {progress['diverged'] - 1} are in {join(cfg.output, cfg.run_name)}")
    # epoch 0, the start a policy computed (``Training.start``), is validated like an epoch
    valid_hist = [r for r in [progress.get("start"), *history] if r and "valid_ndcg" in r]
    pop = progress.get("popularity") or {}
    best_rec = next((r for r in valid_hist if r["epoch"] == progress["best_epoch"]), {})
    summary = {"best_epoch": progress["best_epoch"], "epochs_run": progress["epoch"],
               "phase_epochs": progress["phase_epochs"],
               "best_valid_ndcg": progress["best_ndcg"] if valid_hist else None,
               "best_valid_recall_at_50": next((r["valid_recall_at_50"] for r in valid_hist
                                                if r["epoch"] == progress["best_epoch"]), None),
               # none with --epochs 0 (the start is the model)
               "mean_users_per_second": (sum(r["users_per_second"] for r in history)
                                         / len(history)) if history else 0.0,
               "wall_seconds": time.perf_counter() - t0,
               # the floor the run must clear, on the same validation users (training.validate)
               "valid_ndcg_popularity": pop.get("ndcg"),
               "valid_recall_at_50_popularity": pop.get("recall_at_50"),
               "best_code_effective_rank": best_rec.get("code_effective_rank")}
    if valid_hist:
        summary["health"] = health(summary["best_valid_ndcg"], summary["valid_ndcg_popularity"],
                                   summary["best_code_effective_rank"])
    return summary, history, best, state["model_args"]


def remedy(cfg: TrainConfig) -> str:
    """What an unhealthy run should try next: its training policy's word
    (``Training.remedy``), given the hyperparameters the model's grids search."""
    cls = MODELS[cfg.model]
    searched = ["--" + k.replace("_", "-") for k, hp in cls.hyperparameters.items() if hp.search]
    return cls.trainer.remedy(cfg.resolved(), searched)


def health_warning(summary: dict, run_name: str,
                   hint: str = "try another --lr") -> str | None:
    """The driver's one WARNING line about a run whose ``health`` is not ok (None if it is, or
    was not checked: a final retraining has no validation); ``hint``: what to try (``remedy``)."""
    h = summary.get("health")
    if h in (None, HEALTHY):
        return None
    said = []
    if "below-popularity" in h:
        said.append(f"its best validation NDCG {summary['best_valid_ndcg']:.4f} is not above the "
                    f"popularity baseline's {summary['valid_ndcg_popularity']:.4f} on the same "
                    "users")
    if "collapsed" in h:
        said.append(f"its encoder's code collapsed (effective rank "
                    f"{summary['best_code_effective_rank']:.2f} at the best epoch, below "
                    f"{COLLAPSED_RANK:g}: every user gets nearly the same list)")
    return (f"WARNING: run {run_name} is unhealthy ({h}): " + "; ".join(said)
            + ". It finished and is saved, tagged health=" + h + " in MLflow; " + hint)


def log_results(cfg: TrainConfig, prep: Prepared, uri: str, run_id: str, summary: dict,
                history: list[dict], best: dict, model_args: dict, model_path: str) -> str:
    """The end of a run in MLflow: missing epochs, the model, curves, summary; returns the model
    URI. A server that is down gets a minute to come back, then the run stops with how to finish
    it (the trained model is already saved; a rerun logs without training)."""
    from runtime import tracking

    if not tracking.wait_reachable(uri, cfg.mlflow_wait):
        raise TrainingError(
            f"training finished (best epoch {summary['best_epoch']}, model saved at {model_path}), "
            f"but the MLflow server {uri} does not answer, so the run's results are not logged "
            f"yet. Start it again and rerun the same command (--run-name {cfg.run_name}): it logs "
            "them without training again")
    if summary.get("health"):  # filter runs by it: tags.health != 'ok'
        from mlflow.tracking import MlflowClient

        MlflowClient(uri).set_tag(run_id, "health", summary["health"])
    tracking.describe_run(uri, run_id, f"{model_title(cfg)} on {prep.dataset}", summary)
    added = tracking.backfill(uri, run_id, history)
    if added and MODELS[cfg.model].kind == "gradient":  # a closed-form fit logs its one record here
        print(f"MLflow: logged {added} epoch(s) missed while the server was down", flush=True)
    return tracking.log_trained(
        uri, run_id, state_dict=best, item_ids=prep.item_ids(), model=cfg.model,
        model_args=model_args, model_info={"train_splits": cfg.train_splits},
        manifest=prep.manifest, history=history,
        summary={k: v for k, v in summary.items() if k != "phase_epochs" and v is not None},
        title=f"{model_title(cfg)} on {prep.dataset} ({cfg.run_name})")


def main(argv: list[str] | None = None) -> int:
    no_bars_in_logs()
    try:
        args = build_parser().parse_args(argv)  # --config FILE's errors are UsageErrors
        check_job_paths(args)
        join_address(args.ray_address)  # a job server's http address fails here, not mid-run
        check(TrainConfig(**values(args, TrainConfig)))  # flags first: no data read for a typo
        prep = open_prepared(absolute(args.data))
        cfg = config_from_args(args, prep)
        with naming_damaged_files(prep.uri):  # a shard that fails to read: named in one line
            summary = run(cfg, args.mlflow_uri, args.ray_address, prep)
    except (UsageError, TrainingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, UsageError) else 1
    best = summary["best_valid_ndcg"]
    pop = summary.get("valid_ndcg_popularity")
    print(f"\nbest epoch {summary['best_epoch']} of {summary['epochs_run']}"
          + (f": validation NDCG {best:.4f}, Recall@50 {summary['best_valid_recall_at_50']:.4f}"
             if best is not None else " (final retraining: the last epoch)")
          + (f" (popularity: NDCG {pop:.4f})" if pop is not None else "")
          + (f"; health {summary['health']}" if summary.get("health") else ""))
    print(f"model: {summary['model_path']}\nMLflow: {summary['model_uri']} "
          f"(run {summary['mlflow_run_id']} in {summary['mlflow_uri']})")
    print(summary_line(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
