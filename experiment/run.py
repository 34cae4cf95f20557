"""The paper's experiment on one prepared dataset, from one command: every model searched on
validation with Ray Tune, retrained on train+valid, scored and evaluated on test, tabled.

    python experiment/run.py --data var/data/ml-100k --models nce-autorec,autorec,puresvd
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
        python experiment/run.py --data /abs/var/data/ml-100k --models nce-autorec,autorec \\
        --grid paper --experiments-dir /abs/var/experiments --mlflow-uri http://127.0.0.1:5000

Stages (a rerun with the same --name skips every finished one, trial by trial):
  1. search    per model, a Ray Tune grid search (``--grid small|paper|FILE``, experiment/grids.py)
               whose trials are training/train.py runs: train split, early stopping on validation
               NDCG, DDP inside a trial (--num-workers), as many trials at once as the cluster
               fits. An interrupted trial resumes from its last checkpoint.
  2. select    per model, the trial with the best validation NDCG, and its best epoch (and the
               length of fine-tune phase 1); with --seeds N > 1 the best point is rerun with
               the other seeds, and where the runner-up is within that seed spread it is too,
               and the higher mean over the seeds is chosen (``reseed_choice``).
  3. retrain   from scratch on train+valid with that configuration for exactly that many epochs
               (``--train-splits train,valid``: the protocol's final model), once per seed of
               --seeds N (seeds --seed .. --seed + N - 1; a resume with more runs only the new
               ones, with fewer uses the first N).
  4. register  the first seed's final model in the MLflow Model Registry as DATASET-MODEL
               (--register-as PREFIX: PREFIX-MODEL), alias @champion (the other seeds are
               scored from their runs); moving an alias another experiment set says so;
               not a model whose chosen trial was unhealthy on validation (below popularity or
               a collapsed code, training/validate.py ``health``): it is scored from its run
               with a WARNING line, unless --allow-unhealthy.
  5. score     top-50 of every user with ``models:/DATASET-MODEL@champion`` (evaluation/score.py),
               and with each other seed's model.
  6. evaluate  the paper's metrics on test with 95% CIs, popularity, cold start
               (evaluation/evaluate.py, every seed's lists in one Spark application), and the
               experiment's table (table.md, table.csv): with several seeds each metric and
               paired difference pooled over them (evaluation/seeds.py: the mean over seeds, a
               CI over users and seeds, the seed spread; paired.csv per seed and pooled).

``--config FILE`` takes the options from a YAML file (flags beside it win); the experiment
writes its configuration, resolved, to EXPERIMENTS_DIR/NAME/config.yaml and its MLflow run: --config
reads it back (the same name: it resumes that experiment).

MLflow: one run per experiment (experiment NAME), one child per model, whose children are the
trials and the final retraining; the table and plots are artifacts of the experiment's run.
Everything lands under EXPERIMENTS_DIR/NAME: trials/, final/ (MODEL-final: the first seed, as
before --seeds; MODEL-final-seedS the others), recs/ (MODEL, MODEL-seedS), evaluation/,
experiment.json, and
the results: table.md, table.csv, paired.csv, figures/, published together with their manifest
results.json written last (a reader checks it: ``read_results``).
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python experiment/run.py)
    _root = str(Path(__file__).resolve().parents[1])
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    sys.path.insert(0, _root)

import argparse
import csv
import dataclasses
import io
import json
import math
import os
import time
from dataclasses import dataclass

from models.registry import MODELS
from prepared.errors import UsageError
from prepared.protocol import STANDARD, TABLE, TOP_K
from prepared.reader import Prepared, open_prepared
from runtime.atomic import write_text
from runtime.runs import RUN_RECORD, finished_summary
from runtime.logs import no_bars_in_logs
from runtime.cli import config_yaml, option, stage_parser, values
from runtime.raycluster import apply_ray_env, check_fits, join_address, local_cpus, worker_cpus
from experiment import grids
from training.config import VALID_BY, TrainConfig, check
from training.train import ADDED_OPTIONS, check_job_paths
from training.validate import COLLAPSED_RANK, HEALTHY

ROOT = Path(__file__).resolve().parents[1]
PARENT = "mlflow.parentRunId"  # MLflow's tag that nests a run under another in the UI
# what a trial changes in the experiment's configuration: never where or how it runs
FIXED = ("data", "grid", "epochs", "patience", "seed", "valid_sample", "valid_by", "batch_size")


@dataclass(frozen=True)
class ExperimentConfig:
    """Every flag of experiment/run.py (``runtime.cli`` builds the parser from the fields)."""

    data: str = option(help="a prepared directory (etl/prepare.py --output) with a validation "
                            "split")
    models: str = option("nce-autorec,autorec,puresvd",
                         help="comma-separated models to search, in the table's order")
    grid: str = option("small", help="small (45 trials over every model, joint mode), paper "
                                     "(the paper's settings), or a YAML/JSON file {model: "
                                     "{flag: [values]}} or a list of those (experiment/grids.py)")
    name: str = option("", show_default=False,
                       help="the experiment: its folder under --experiments-dir and its MLflow "
                            "experiment; "
                            "an existing name resumes it (default: DATASET-GRID)")
    # --experiments-dir, not --output: in the Spark stages --output is the output folder
    # itself (issue 29); --output is still taken, with a note
    output: str = option("", show_default=False, flag="experiments-dir", renamed_from="output",
                         metavar="EXPERIMENTS_DIR",
                         help="the folder of experiments: this one goes to "
                              "EXPERIMENTS_DIR/NAME (--name); absolute path (default: "
                              "./var/experiments, made absolute)")
    epochs: int = option(200, help="most epochs a trial trains (early stopping ends sooner)")
    patience: int | None = option(None, help="epochs without a better validation NDCG before a "
                                             "trial stops (default: each model's own)")
    batch_size: int | None = option(None, help="users per step over all workers, every trial "
                                               "(default: each model's own)")
    valid_sample: float = option(1.0, help="fraction of validation users scored each epoch "
                                           "(training/train.py --valid-sample)")
    valid_by: str = option("fold-in", choices=VALID_BY,
                           help="how the per-user models (bpr, cml, cdae) score validation users "
                                "(training/train.py --valid-by): trained is about 100x cheaper "
                                "on sparse catalogues; the others ignore it")
    seed: int = option(0, help="every trial's and the final runs' seed")
    seeds: int = option(3, help="final retrainings per model, seeds --seed .. --seed + N - 1: "
                                "the table pools them (mean over seeds, a CI over users and "
                                "seeds, the seed spread); a resume with more runs only the new "
                                "ones, with fewer uses the first N")
    num_workers: int = option(2, help="Ray Train workers per trial (DDP ranks)")
    cpus_per_worker: float = option(0.0,
                                    help="CPUs per worker; 0 = share the cluster's out")
    concurrency: int = option(0,
                              help="trials at once; 0 = as many as the cluster's CPUs fit")
    no_register: bool = option(False, help="do not register the final models (score them from "
                                            "their runs)")
    register_as: str = option("", show_default=False, metavar="PREFIX",
                              help="register the final models as PREFIX-MODEL (default: the "
                                   "dataset's name, DATASET-MODEL, as the docs use): a second "
                                   "experiment on the same set with its own prefix leaves the "
                                   "first one's @champion where it is")
    allow_unhealthy: bool = option(False, help="register a final model as @champion even when "
                                               "its chosen trial's validation NDCG was not "
                                               "above popularity's or its code collapsed (by "
                                               "default such a model is scored from its run, "
                                               "not registered)")
    stop_after: str = option("evaluate", choices=("search", "evaluate"),
                             help="search: stop once every model's trials ran and its best point "
                                  "is chosen (search.md ranks every trial), before the final "
                                  "retraining; rerun with --stop-after evaluate to go on. The "
                                  "grid file may grow in between: a staged search")

    def model_list(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]


# -- the plan: every trial's configuration, checked before anything runs --------------------------

def trial_config(cfg: ExperimentConfig, root: str, model: str, point: dict) -> TrainConfig:
    return TrainConfig(data=cfg.data, model=model, epochs=cfg.epochs, patience=cfg.patience,
                       batch_size=cfg.batch_size, valid_sample=cfg.valid_sample, seed=cfg.seed,
                       valid_by=cfg.valid_by if MODELS[model].per_user else "fold-in",
                       num_workers=cfg.num_workers, cpus_per_worker=cfg.cpus_per_worker,
                       run_name=grids.point_name(model, point), output=f"{root}/trials",
                       experiment=cfg.name, **point)


def plan(cfg: ExperimentConfig, prep: Prepared, root: str) -> dict[str, list[dict]]:
    """Per model, its points; every point's TrainConfig checked (a bad grid fails here)."""
    if not cfg.model_list():
        raise UsageError("--models: name at least one model, e.g. --models nce-autorec,autorec")
    if cfg.seeds < 1:
        raise UsageError(f"--seeds {cfg.seeds}: the final retraining needs at least one seed; "
                         "pass --seeds 1 for one run per model, 3 (the default) or more for a "
                         "seed spread")
    if int(prep.manifest["counts"].get("positives", {}).get("valid", 0)) == 0:
        raise UsageError(f"--data {cfg.data}: the dataset has no validation split, so nothing can "
                         "be selected; prepare it with a --holdout-fraction larger than "
                         "--test-fraction")
    axes = grids.grid(cfg.grid, cfg.model_list())
    out = {}
    for model, model_axes in axes.items():
        pts = grids.points(model_axes)
        for p in pts:
            try:
                check(trial_config(cfg, root, model, p))
            except UsageError as e:
                raise UsageError(f"--grid {cfg.grid}: {model} {p}: {e}") from None
            check_trial_record(cfg, root, model, p)
        out[model] = pts
    return out


def check_trial_record(cfg: ExperimentConfig, root: str, model: str, point: dict) -> None:
    """A trial already run under this point's name must have run this point's configuration: a
    finished trial is reused as is, so one run by older code whose flags now mean something else
    (lambda before its units, 2026-11-25) would otherwise enter the selection silently."""
    from training.train import check_resume

    tc = trial_config(cfg, root, model, point)
    record = read_json(Path(root) / "trials" / tc.run_name / RUN_RECORD)
    try:
        check_resume(tc, record)
    except UsageError as e:
        raise UsageError(f"experiment {cfg.name!r}: its trial {tc.run_name} ran with settings "
                         f"this code and these flags do not give it ({e}). Pass another --name "
                         "for a new experiment, or remove that trial's directory to rerun it"
                         ) from None


# -- the experiment's state: EXPERIMENTS_DIR/NAME/experiment.json, rewritten after every stage -------------

def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_json(path: Path, data: dict) -> None:
    """Through a temporary sibling and a rename: never half-written."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def finished(run_dir: Path) -> dict | None:
    """A train.py run's summary if it finished (its run.json has one)."""
    return finished_summary(read_json(run_dir / RUN_RECORD))


def open_state(cfg: ExperimentConfig, root: Path) -> dict:
    state = read_json(root / "experiment.json")
    if state is None:
        return {"config": dataclasses.asdict(cfg), "models": {}}
    old = state["config"]
    old = {**ADDED_OPTIONS, **old}  # what an experiment recorded before an option existed ran as
    changed = {k: (old.get(k), getattr(cfg, k)) for k in FIXED if old.get(k) != getattr(cfg, k)}
    if changed:
        raise UsageError(
            f"experiment {cfg.name!r} exists in {root.parent} with other settings: "
            + ", ".join(f"{k} was {a!r}, now {b!r}" for k, (a, b) in changed.items())
            + ". Pass the same flags to resume it, or another --name for a new experiment")
    state["config"] = dataclasses.asdict(cfg)  # models and cluster settings may change
    return state


# -- MLflow: experiment run > model run > trial and final runs ------------------------------------

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


# -- 1. search -------------------------------------------------------------------------------------

def trial(config: dict) -> dict:
    """One Tune trial: a training/train.py run of one point (resumes its checkpoint if any)."""
    from training.train import TrainingError, run

    cfg = TrainConfig.from_dict(config["train"])
    kind = config.get("kind", "trial")
    tags = {PARENT: config["parent"], "kind": kind,
            **({} if kind == "trial" else {"seed": str(cfg.seed)})}
    try:
        s = run(cfg, config["mlflow_uri"], tags=tags)
    except TrainingError as e:  # diverged, or workers kept failing: a result, not a crash
        return {"valid_ndcg": float("nan"), "failed": str(e).splitlines()[0]}
    return {"valid_ndcg": s["best_valid_ndcg"], "best_epoch": s["best_epoch"],
            "wall_seconds": s.get("wall_seconds", 0.0), "health": s.get("health") or ""}


def concurrency(cfg: ExperimentConfig) -> int:
    """Trials at once: as many as the cluster's CPUs give every trial's workers plus one CPU for
    that trial's Ray Data reads. Seen on 3 CPUs: two trials of one 1-CPU worker each (one CPU
    over for both) both stalled before their first epoch, every CPU idle."""
    import ray

    cpus = ray.cluster_resources().get("CPU", 1)
    cpw = worker_cpus(cfg.num_workers, cfg.cpus_per_worker, cpus)
    per_trial = cfg.num_workers * cpw + 1
    if not cfg.concurrency:
        return max(1, int(cpus // per_trial))
    if cfg.concurrency > 1 and cfg.concurrency * per_trial > cpus:
        raise UsageError(f"--concurrency {cfg.concurrency} x (--num-workers {cfg.num_workers} x "
                         f"{cpw:g} CPUs + 1 for its data) needs {cfg.concurrency * per_trial:g} "
                         f"of the cluster's {cpus:g} CPUs, and trials without a CPU for their "
                         "data reads stall; lower --cpus-per-worker (e.g. "
                         f"{(cpus / cfg.concurrency - 1) / cfg.num_workers:.2g}) or --concurrency")
    return cfg.concurrency


def check_trial_fits(cfg: ExperimentConfig, models: list[str]) -> None:
    """Refuse, before any trial starts, workers the cluster could never hold: every trial would
    otherwise wait for them forever (the same check as training/train.py's, once, up front)."""
    import ray

    res = ray.cluster_resources()
    check_fits(cfg.num_workers, worker_cpus(cfg.num_workers, cfg.cpus_per_worker, res.get("CPU", 0)),
               resources=res, reading=any(MODELS[m].kind != "closed-form" for m in models))


def memory_bound(model: str, n_items: int, at_once: int) -> int:
    """``at_once``, lowered so that the fits of that many trials of ``model`` fit in this node's
    available memory (the share ``models.closed_form.check_memory`` allows a fit). Seen on
    citeulike-a (16,980 items): two EASE trials at once, 7.5 GiB each, with 8.2 GiB available;
    both refused, and the experiment stopped. On a cluster each trial's own node still refuses a
    fit that does not fit it, with the size it needs."""
    from models import closed_form

    need = MODELS[model].fit_memory(n_items)
    if not need:
        return at_once
    have = closed_form.available_memory()
    fits = max(1, int(closed_form.USABLE_MEMORY * have // need))
    if fits < at_once:
        print(f"== {model}: {fits} trial(s) at a time, not {at_once}: a fit on {n_items:,} items "
              f"holds {need / 2**30:.1f} GiB and {have / 2**30:.1f} GiB are available", flush=True)
    return min(at_once, fits)


class Progress:
    """Prints a line per finished trial: done / left, the best so far, time left."""

    def __init__(self, model: str, total: int, done_before: int, at_once: int,
                 best_before: tuple[float, str] = (-1.0, "")):
        """``best_before``: (NDCG, trial) of the trials that finished before a resume."""
        self.model, self.total, self.done, self.at_once = model, total, done_before, at_once
        self.t0, self.ran, self.best = time.perf_counter(), 0, best_before

    def trial_done(self, name: str, result: dict) -> None:
        self.done += 1
        self.ran += 1
        ndcg = result.get("valid_ndcg")
        if ndcg is not None and not math.isnan(ndcg) and ndcg > self.best[0]:
            self.best = (ndcg, name)
        left = self.total - self.done
        per = (time.perf_counter() - self.t0) / self.ran
        eta = f", about {per * left / self.at_once / 60:.0f} min left" if left else ""
        unhealthy = result.get("health") not in (None, "", HEALTHY)
        what = (f"failed ({result['failed']})" if result.get("failed") else
                "trained" if ndcg is None else f"validation NDCG {ndcg:.4f}"
                + (f" (WARNING: {result['health']})" if unhealthy else ""))
        best = f"; best {self.best[0]:.4f} ({self.best[1]})" if self.best[1] else ""
        print(f"[{self.model}] trial {self.done}/{self.total} {name}: {what}{best}; "
              f"{left} left{eta}", flush=True)


def search(cfg: ExperimentConfig, root: Path, model: str, points: list[dict],
           state: dict, n_items: int) -> None:
    """Run the points of ``model`` whose run has not finished, as one Tune grid search."""
    done = finished_trials(root, model, points)  # each run record read once
    pending = [p for p in points if p not in [q for q, _ in done]]
    at_once = memory_bound(model, n_items, concurrency(cfg))
    print(f"\n== search {model}: {len(points)} point(s), {len(done)} finished already; "
          f"{at_once} at a time", flush=True)
    if not pending:
        return
    progress = Progress(model, len(points), len(done), at_once,
                        max(((t["best_valid_ndcg"], t["run_name"]) for _, t in with_ndcg(done)),
                            default=(-1.0, "")))
    tune_trials(model, root, [trial_config(cfg, str(root), model, p) for p in pending], state,
                at_once, progress)


def tune_trials(model: str, root: Path, configs: list[TrainConfig], state: dict, at_once: int,
                progress: Progress, kind: str = "trial") -> None:
    """Run ``configs`` (trials of ``model``) as one Tune grid search, ``at_once`` at a time;
    ``kind``: their MLflow runs' tag (``seed-trial``: a point rerun with another seed)."""
    from ray import tune

    class Report(tune.Callback):
        def on_trial_result(self, iteration, trials, trial, result, **info):
            progress.trial_done(trial.config["train"]["run_name"], result)

    base = {"mlflow_uri": state["mlflow_uri"], "parent": state["models"][model]["run_id"],
            "kind": kind}
    space = {**base, "train": tune.grid_search([c.to_dict() for c in configs])}
    tuner = tune.Tuner(
        # the trial itself only waits on its Ray Train run, whose workers hold the CPUs: no CPU
        # (a CPU per trial would starve Ray Data's reads on small clusters), and one byte of
        # memory because Tune refuses a request of nothing
        tune.with_resources(trial, {"CPU": 0, "memory": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(max_concurrent_trials=at_once),
        run_config=tune.RunConfig(name=f"{progress.model.replace(' ', '-')}-"
                                       f"{time.strftime('%Y%m%d-%H%M%S')}",
                                  storage_path=str(root / "tune"), verbose=0,
                                  callbacks=[Report()]))
    grid = tuner.fit()
    errors = [r.error for r in grid if r.error]
    if errors:
        raise RuntimeError(f"{len(errors)} trial(s) of {model} crashed; the first: "
                           f"{str(errors[0]).strip().splitlines()[-1]}. Rerun the same command: "
                           "finished trials are kept")


# -- 2. select, 3. retrain -------------------------------------------------------------------------

def select(root: Path, model: str, points: list[dict], point: dict | None = None) -> dict:
    """The finished point with the best validation NDCG (the first of equals), or ``point``'s
    trial (the choice the seeds settled: ``reseed_choice``)."""
    done = finished_trials(root, model, points)
    rows = with_ndcg(done)
    if not rows:
        raise RuntimeError(f"no trial of {model} finished with a validation NDCG; see the trials' "
                           f"logs above and their runs in {root / 'trials'}")
    point, s = (max(rows, key=lambda r: r[1]["best_valid_ndcg"]) if point is None else
                next(r for r in rows if r[0] == point))
    return {"point": point, "valid_ndcg": s["best_valid_ndcg"],
            "valid_recall_at_50": s.get("best_valid_recall_at_50"),
            "best_epoch": s["best_epoch"], "phase_epochs": s.get("phase_epochs") or [],
            "trial": s["run_name"], "trials": len(points), "finished": len(rows),
            # None: not checked (a closed-form fit, or a trial run before the check existed)
            "health": s.get("health"), "valid_ndcg_popularity": s.get("valid_ndcg_popularity"),
            "code_effective_rank": s.get("best_code_effective_rank"),
            "search_seconds": sum(t.get("wall_seconds", 0.0) for _, t in done),
            "all": [{"point": p, "valid_ndcg": t["best_valid_ndcg"],
                     "best_epoch": t["best_epoch"]} for p, t in rows]}


# -- 2b. the two best, re-run with the seeds when validation cannot tell them apart ---------------

def seed_trial_config(cfg: ExperimentConfig, root: str, model: str, point: dict,
                      seed: int) -> TrainConfig:
    """A trial of ``point`` with another seed than the search's: ``POINT-seedS`` in trials/."""
    base = trial_config(cfg, root, model, point)
    return dataclasses.replace(base, seed=seed, run_name=f"{base.run_name}-seed{seed}")


def within_spread(best: list[float], second: float) -> bool:
    """Whether the runner-up's validation NDCG (the search's seed) is within the seed spread of
    the best's: the gap between the two single-seed values at most the standard deviation of a
    difference of two single-seed values, sqrt(2) x the sd (ddof 1) of the best point's values
    over the seeds (``best``, the search's seed first). A gap inside it is what reseeding alone
    could give, so the choice needs the seeds."""
    import statistics

    sd = statistics.stdev(best) if len(best) > 1 else 0.0
    return best[0] - second <= math.sqrt(2) * sd


def seed_mean(values: list[float]) -> float:
    """The mean validation NDCG over the seeds that ended with one (a diverged seed is left out;
    NaN when none did)."""
    ok = [v for v in values if v is not None and not math.isnan(v)]
    return sum(ok) / len(ok) if ok else math.nan


def reseed_choice(cfg: ExperimentConfig, root: Path, model: str, points: list[dict],
                  chosen: dict, state: dict, n_items: int) -> dict:
    """The choice, settled with the seeds where the two best points are within the seed spread.

    With --seeds N > 1 the best point's trial is rerun with the other seeds (N - 1 more trials,
    resumed as any trial); where the runner-up is within its spread (``within_spread``) the
    runner-up is rerun too and the point with the higher mean validation NDCG over the N seeds is
    chosen (its search-seed trial gives the final run's epochs). ``seed_check`` in the choice
    records the values. Closed-form fits are left as chosen: their fit does not depend on the
    training seed, and a refit of a large one costs minutes of memory-bound work for nothing."""
    ranked = sorted(chosen["all"], key=lambda r: -r["valid_ndcg"])
    if cfg.seeds < 2 or len(ranked) < 2 or MODELS[model].kind == "closed-form":
        return chosen
    best, second = ranked[:2]
    extra = final_seeds(cfg)[1:]

    def values(point: dict, v0: float) -> list[float]:
        configs = [seed_trial_config(cfg, str(root), model, point, s) for s in extra]
        run_trials(cfg, root, model, configs, state, n_items)
        got = [(finished(root / "trials" / c.run_name) or {}).get("best_valid_ndcg")
               for c in configs]
        return [v0, *[math.nan if v is None else v for v in got]]

    b = values(best["point"], best["valid_ndcg"])
    check = {"best": fmt_point(best["point"]), "best_seeds": b, "second": fmt_point(second["point"]),
             "second_valid_ndcg": second["valid_ndcg"], "rerun": False}
    if not within_spread([v for v in b if not math.isnan(v)], second["valid_ndcg"]):
        return {**chosen, "seed_check": check}
    s = values(second["point"], second["valid_ndcg"])
    check.update(rerun=True, second_seeds=s)
    winner = second["point"] if seed_mean(s) > seed_mean(b) else best["point"]
    print(f"== {model}: {check['second']} within the seed spread of {check['best']} on "
          f"validation: mean over {len(b)} seeds {seed_mean(s):.4f} against "
          f"{seed_mean(b):.4f}; chose {fmt_point(winner)}", flush=True)
    return {**select(root, model, points, winner), "seed_check": check}


def run_trials(cfg: ExperimentConfig, root: Path, model: str, configs: list[TrainConfig],
               state: dict, n_items: int) -> None:
    """The trials of ``configs`` that have not finished, as the search runs its points; their
    progress lines say ``[MODEL seeds]``."""
    pending = [c for c in configs if finished(root / "trials" / c.run_name) is None]
    if not pending:
        return
    at_once = memory_bound(model, n_items, concurrency(cfg))
    print(f"\n== {model}: {len(pending)} trial(s) with other seeds: "
          f"{', '.join(c.run_name for c in pending)}", flush=True)
    tune_trials(model, root, pending, state, at_once,
                Progress(f"{model} seeds", len(configs), len(configs) - len(pending), at_once),
                kind="seed-trial")


def final_seeds(cfg: ExperimentConfig) -> list[int]:
    """The final retrainings' seeds: --seed, --seed + 1, ..., --seed + --seeds - 1. The first is
    the trials' seed, so one seed is exactly the experiment before --seeds existed."""
    return [cfg.seed + i for i in range(cfg.seeds)]


def seeded(name: str, seed: int, first: int) -> str:
    """``name`` for the first seed (the name an experiment from before --seeds gave its only
    final run and lists: resuming one reuses them as its first seed), ``NAME-seedS`` for the
    others."""
    return name if seed == first else f"{name}-seed{seed}"


def final_name(model: str, seed: int, first: int) -> str:
    """The final run of ``model`` with ``seed``: ``MODEL-final``, ``MODEL-final-seedS``."""
    return seeded(f"{model}-final", seed, first)


def final_config(cfg: ExperimentConfig, root: Path, model: str, chosen: dict,
                 seed: int | None = None) -> TrainConfig:
    """The chosen point on train+valid for the chosen epochs, with ``seed`` (default --seed):
    phase 1 as long as the selection run's, phase 2 (or the only phase) up to its best epoch."""
    seed = cfg.seed if seed is None else seed
    two_phase = len(chosen["phase_epochs"]) > 1
    pre = chosen["phase_epochs"][0] if two_phase else 0
    base = trial_config(cfg, str(root), model, chosen["point"])
    return dataclasses.replace(base, train_splits="train,valid", pretrain_epochs=pre,
                               epochs=max(1, chosen["best_epoch"] - pre), patience=None,
                               valid_sample=1.0, seed=seed,
                               run_name=final_name(model, seed, cfg.seed),
                               output=str(root / "final"))


def current_final(cfg: ExperimentConfig, root: Path, model: str, chosen: dict,
                  seed: int) -> TrainConfig:
    """``final_config`` of ``seed``, with a final run on record of an earlier choice moved aside
    (``retire_stale_final``) and said so."""
    fc = final_config(cfg, root, model, chosen, seed)
    moved = retire_stale_final(fc)
    if moved:
        print(f"   the final run on record was of an earlier choice; moved to {moved}", flush=True)
    return fc


def run_finals(cfg: ExperimentConfig, root: Path, model: str, chosen: dict, todo: list[int],
               state: dict, n_items: int) -> None:
    """The final runs of the seeds in ``todo`` side by side, as the search runs its trials, where
    the cluster takes more than one at a time: one after another, each Ray Train run would leave
    the rest of the cluster idle. ``run_experiment`` then reads each back (train.py's resume)
    and, should one have failed, runs it there and reports its error."""
    at_once = min(len(todo), memory_bound(model, n_items, concurrency(cfg)))
    if at_once < 2:
        return
    configs = [current_final(cfg, root, model, chosen, seed) for seed in todo]
    tune_trials(model, root, configs, state, at_once,
                Progress(f"{model} finals", len(configs), 0, at_once), kind="final")


def seeds_to_run(cfg: ExperimentConfig, root: Path, model: str, chosen: dict) -> list[int]:
    """The seeds of ``final_seeds`` whose final run has not finished with this choice: what a
    (re)run retrains. A finished run of another choice (a grown grid chose anew) is retired and
    runs again; seeds beyond --seeds are left alone (a resume with fewer uses the first N)."""
    from training.train import check_resume

    todo = []
    for seed in final_seeds(cfg):
        fc = final_config(cfg, root, model, chosen, seed)
        record = read_json(Path(fc.output) / fc.run_name / RUN_RECORD)
        try:
            check_resume(fc, record)
        except UsageError:
            todo.append(seed)
            continue
        if finished_summary(record) is None:
            todo.append(seed)
    return todo


def retire_stale_final(fc: TrainConfig) -> Path | None:
    """Move aside a final run recorded with another configuration than ``fc``; returns where it
    went. It happens when a finished experiment is resumed with a grown grid and validation now
    chooses another point: the retraining must run the new choice, not fail on the old record,
    and the old run is kept (its MLflow run too) rather than deleted."""
    from training.train import check_resume, read_run_record

    try:
        check_resume(fc, read_run_record(fc))
        return None
    except UsageError:
        old = Path(fc.output) / fc.run_name
        dest = old.with_name(f"{old.name}.superseded-{time.strftime('%Y%m%d-%H%M%S')}")
        old.rename(dest)
        return dest


# -- 4. register -----------------------------------------------------------------------------------

def registered_name(prefix: str, dataset: str, model: str) -> str:
    """The registry name of an experiment's final ``model``: PREFIX-MODEL (--register-as), by
    default DATASET-MODEL."""
    return f"{prefix or dataset}-{model}"


def register(uri: str, name: str, model_uri: str, run_id: str) -> str:
    """``models:/NAME@champion`` pointing at ``model_uri`` (a new version unless the alias already
    points at this run's model). Where the alias pointed at a run of another MLflow experiment,
    a NOTE line says whose champion this replaces (two experiments on one set share DATASET-MODEL
    unless one has --register-as)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    try:
        current = client.get_model_version_by_alias(name, "champion")
    except Exception:  # noqa: BLE001 (no such model or alias yet)
        current = None
    if current is not None and current.run_id == run_id:
        return f"models:/{name}@champion"
    if current is not None and current.run_id:
        before, now = (client.get_run(r).info.experiment_id for r in (current.run_id, run_id))
        if before != now:
            other = client.get_experiment(before).name
            print(f"NOTE: {name}@champion moves from version {current.version} (a run of "
                  f"experiment {other!r}) to this experiment's model; pass --register-as "
                  "PREFIX (or --no-register) to keep both", flush=True)
    import mlflow

    mlflow.set_tracking_uri(uri)
    # register_model resolves MLflow 3's logged-model URIs (models:/m-...) to their source
    version = mlflow.register_model(model_uri, name)
    client.set_registered_model_alias(name, "champion", version.version)
    return f"models:/{name}@champion"


def unhealthy(chosen: dict) -> str | None:
    """The chosen trial's health when it is not ok (None when ok or not checked)."""
    h = chosen.get("health")
    return h if h not in (None, HEALTHY) else None


def register_if_healthy(uri: str, name: str, final: dict, chosen: dict, allow: bool) -> str:
    """``register`` the final model, unless its chosen trial was unhealthy on validation: then a
    WARNING line, and its run's model URI (scored and tabled as any other, never @champion
    silently). ``allow`` (--allow-unhealthy) registers it anyway, with the same warning. The
    final run (trained on train+valid, no validation of its own) and the model version carry
    the trial's health as a tag."""
    from mlflow.tracking import MlflowClient

    h = unhealthy(chosen)
    if h is None:
        return register(uri, name, final["model_uri"], final["mlflow_run_id"])
    client = MlflowClient(uri)
    client.set_tag(final["mlflow_run_id"], "health", h)
    num = lambda k: float("nan") if chosen.get(k) is None else chosen[k]
    why = (f"its chosen trial {chosen.get('trial')} is {h} on validation (NDCG "
           f"{chosen['valid_ndcg']:.4f}, popularity's {num('valid_ndcg_popularity'):.4f}, code "
           f"effective rank {num('code_effective_rank'):.2f})")
    if not allow:
        print(f"WARNING: {name}: not registered as models:/{name}@champion: {why}; scored "
              "from its run instead. Pass --allow-unhealthy to register it anyway", flush=True)
        return final["model_uri"]
    model_uri = register(uri, name, final["model_uri"], final["mlflow_run_id"])
    version = client.get_model_version_by_alias(name, "champion")
    client.set_model_version_tag(name, version.version, "health", h)
    print(f"WARNING: {name}: registered as {model_uri} although {why} (--allow-unhealthy)",
          flush=True)
    return model_uri


# -- 6. the table ----------------------------------------------------------------------------------

def fmt_point(p: dict) -> str:
    return ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in sorted(p.items())) or "defaults"


def table_rows(state: dict, rows: list[dict], pop: dict | None = None,
               pairs: list[dict] = ()) -> list[dict]:
    """One row per model: test metrics (mean, CI) of warm users, its NDCG minus the first
    model's per user (paired: mean, CI; Holm-corrected t-test and Wilcoxon p-values) and minus the
    best after the first (``best``, the same; None for the first and the best themselves), the
    popularity of what it recommends, the choice and the times. With seeds (evaluation/seeds.py's
    pooled rows) the metrics and pairs are the pooled ones, and ``seeds``, ``seed_spread`` (the
    NDCG's sd, min, max over seeds) and the paired NDCG's ``seed_sd`` come along; the per-seed
    pairs are paired.csv's, not the table's."""
    # evaluate.py's pairs are reference - other; the table says other - reference
    ndcg = {(p.get("comparison", "first"), p["label"]): p for p in pairs if p["metric"] == "NDCG"
            and p.get("seed", "pooled") == "pooled"}

    def against(comparison: str, label: str) -> dict | None:
        p = ndcg.get((comparison, label))
        return p and {"reference": p["reference"], "diff": (-p["mean_difference"], p["ci95"]),
                      "p": (p.get("t_p_holm", math.nan), p.get("wilcoxon_p_holm", math.nan)),
                      "seed_sd": p.get("seed_sd", math.nan)}

    out = []
    for model, s in state["models"].items():
        if "evaluation_label" not in s:
            continue
        mine = {r["metric"]: r for r in rows if r["label"] == s["evaluation_label"]
                and r["group"] == "warm"}
        finals = (s.get("finals") or {"": s["final"]}).values()
        nd = mine.get("NDCG", {})
        out.append({"model": model, "chosen": fmt_point(s["chosen"]["point"]),
                    "valid_ndcg": s["chosen"]["valid_ndcg"], "epochs": s["final"]["epochs_run"],
                    "trials": s["chosen"]["trials"],
                    "search_minutes": s["chosen"]["search_seconds"] / 60,
                    # every seed's retraining
                    "final_minutes": sum(f.get("wall_seconds", 0.0) for f in finals) / 60,
                    "seeds": nd.get("seeds", 1),
                    "seed_spread": tuple(nd.get(k, math.nan) for k in ("seed_sd", "seed_min",
                                                                        "seed_max")),
                    "users": next(iter(mine.values()))["users"] if mine else 0,
                    # the chosen trial's (training/validate.py health); "" where unchecked
                    "health": s["chosen"].get("health") or "",
                    "median_popularity": (pop or {}).get(s["evaluation_label"], {}).get(
                        "median_popularity", float("nan")),
                    "share_top10pct": (pop or {}).get(s["evaluation_label"], {}).get(
                        "share_top10pct", float("nan")),
                    "paired_ndcg": (against("first", s["evaluation_label"]) or {}).get("diff"),
                    "paired_p": (against("first", s["evaluation_label"]) or {}).get("p"),
                    "paired_seed_sd": (against("first", s["evaluation_label"]) or {}).get(
                        "seed_sd", math.nan),
                    "best": against("best", s["evaluation_label"]),
                    **{m: (mine[m]["mean"], mine[m]["ci95"]) for m in (*TABLE, *STANDARD)
                       if m in mine}})
    return out


def best_of(rows: list[dict]) -> str | None:
    """The model the "best" comparisons are against (the best after the first by test NDCG)."""
    return next((r["best"]["reference"] for r in rows if r.get("best")), None)


def p_pair(p: tuple[float, float] | None) -> str:
    """``0.0031 / 0.0042``: the t-test's and the Wilcoxon test's p-values; "–" where undefined."""
    return " / ".join("–" if math.isnan(x) else f"{x:.2g}" for x in p) if p else "–"


def table_md(rows: list[dict], title: str) -> str:
    first = rows[0]["model"] if rows else ""
    best = best_of(rows)
    against_best = [f"NDCG − {best}, paired", f"p vs {best} (t / Wilcoxon)"] if best else []
    head = ["model", *TABLE, f"NDCG − {first}, paired", f"p vs {first} (t / Wilcoxon)",
            *against_best, "median pop.", "top-10% share",
            "chosen (validation)", "valid NDCG", "epochs", "trials", "search min", "final min",
            "health"]
    seeds = max((r.get("seeds", 1) for r in rows), default=1)
    if seeds > 1:
        head += ["seeds", "NDCG seed sd (min–max)"]
    lines = [f"# {title}", "", "Test metrics of warm users, mean ± 95% CI; models chosen by "
             "validation NDCG and retrained on train+valid"
             + (f", each with {seeds} seeds: the mean over seeds, its CI covering users and "
                "seeds (1.96 √(Var over users of the per-user seed mean / users + Var of the "
                "per-seed means / seeds): conservative, it counts the seed noise at most twice), "
                "the NDCG's seed spread in its own column; the first seed's model is the "
                "registered one" if seeds > 1 else "")
             + ". NDCG − first, paired: the mean over "
             "users of (this model's NDCG − the first model's) with its 95% CI"
             + (" (seed s of one against seed s of the other, pooled as above; paired.csv has "
                "each seed's too)" if seeds > 1 else "")
             + "; where the CI excludes 0 the two differ, and only there does one beat the "
             "other. p: two-sided p-values over users of the paired t-test "
             "and the Wilcoxon signed-rank test on the same per-user NDCG differences"
             + (" (each user's mean over seeds)" if seeds > 1 else "") + ", "
             "Holm-corrected over every NDCG comparison of the table"
             + (f" (against {first} and against {best}, the best after it by test NDCG)"
                if best else "") + "; paired.csv has them uncorrected too, and for Recall@50. "
             "Median pop.: the median training "
             "popularity of the recommended items; top-10% share: the share of recommendations "
             "from the 10% most popular items. Health: the chosen trial's on validation: ok, "
             "below-popularity (its best validation NDCG not above the popularity baseline's "
             "on the same users) or collapsed (its code's effective rank below "
             f"{COLLAPSED_RANK:g}); an unhealthy model is not registered as @champion unless "
             "--allow-unhealthy; – where not checked (closed-form fits).", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = [ci_cell(r, m) for m in TABLE]
        d = r.get("paired_ndcg")
        cells += [f"{d[0]:+.4f} ± {d[1]:.4f}" if d else "–", p_pair(r.get("paired_p"))]
        if best:
            b = r.get("best")
            cells += [f"{b['diff'][0]:+.4f} ± {b['diff'][1]:.4f}" if b else "–",
                      p_pair(b and b["p"])]
        lines.append(f"| {r['model']} | " + " | ".join(cells) + f" | {r['median_popularity']:,.0f}"
                     f" | {r['share_top10pct']:.3f} | {r['chosen']} | "
                     f"{r['valid_ndcg']:.4f} | {r['epochs']} | {r['trials']} | "
                     f"{r['search_minutes']:.1f} | {r['final_minutes']:.1f} | "
                     + (f"**{r['health']}**" if r.get("health") not in ("", None, HEALTHY)
                        else r.get("health") or "–") + " |"
                     + (f" {r.get('seeds', 1)} | {spread(r.get('seed_spread'))} |"
                        if seeds > 1 else ""))
    lines += standard_md(rows, seeds)
    return "\n".join(lines) + "\n"


def standard_md(rows: list[dict], seeds: int) -> list[str]:
    """The second table: the common conventions (``STANDARD``) of the same lists and users,
    that a number may be set beside a published table using them. Not the paper's definitions,
    so never in its columns."""
    if not any(m in r for r in rows for m in STANDARD):
        return []
    lines = ["", "## The common conventions (an extension beside the paper's metrics)", "",
             "The same lists and users, mean ± 95% CI" + (" (pooled over the seeds as above)"
                                                         if seeds > 1 else "")
             + ": NDCG@K (truncated) with its ideal over min(|T|, K) test items, where the "
             "paper's NDCG ranks the whole top-50 against an untruncated ideal; Recall@K over "
             "|T| as the paper's; HR@K, 1 where any test item is in the top K; MRR@K, 1 / the rank "
             "of the first test item in the top K (0 where none is).", "",
             "| model | " + " | ".join(STANDARD) + " |", "|" + "---|" * (len(STANDARD) + 1)]
    for r in rows:
        lines.append(f"| {r['model']} | " + " | ".join(ci_cell(r, m) for m in STANDARD) + " |")
    return lines


def ci_cell(r: dict, metric: str) -> str:
    """``0.2454 ± 0.0102``: a row's mean and 95% CI of ``metric``; "–" where it has none."""
    return f"{r[metric][0]:.4f} ± {r[metric][1]:.4f}" if metric in r else "–"


def spread(x: tuple[float, float, float] | None) -> str:
    """``0.0021 (0.2401–0.2442)``: sd over seeds (min–max); "–" with one seed."""
    if not x or math.isnan(x[0]):
        return "–"
    return f"{x[0]:.4f} ({x[1]:.4f}–{x[2]:.4f})"


def table_csv(rows: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["model", *[f"{m} {x}" for m in TABLE for x in ("mean", "ci95")],
                "paired_ndcg_minus_first", "paired_ci95", "paired_t_p_holm",
                "paired_wilcoxon_p_holm", "best_after_first", "paired_ndcg_minus_best", "best_ci95",
                "best_t_p_holm", "best_wilcoxon_p_holm",
                "median_popularity", "share_top10pct", "chosen",
                "valid_ndcg", "epochs", "trials", "search_minutes", "final_minutes", "users",
                "health", "seeds", "ndcg_seed_sd", "ndcg_seed_min", "ndcg_seed_max",
                "paired_seed_sd", *[f"{m} {x}" for m in STANDARD for x in ("mean", "ci95")]])
    num = lambda x: "" if x is None or math.isnan(x) else f"{x:.6f}"  # noqa: E731
    for r in rows:
        d, p, b = r.get("paired_ndcg"), r.get("paired_p"), r.get("best")
        w.writerow([r["model"], *[f"{r[m][i]:.6f}" if m in r else "" for m in TABLE
                                  for i in (0, 1)],
                    *([f"{d[0]:.6f}", f"{d[1]:.6f}"] if d else ["", ""]),
                    *([f"{x:.6g}" for x in p] if p else ["", ""]),
                    best_of(rows) or "",  # what the next four compare with, on every row
                    *([f"{x:.6f}" for x in b["diff"]] + [f"{x:.6g}" for x in b["p"]] if b
                      else ["", "", "", ""]),
                    f"{r['median_popularity']:.1f}",
                    f"{r['share_top10pct']:.4f}", r["chosen"], f"{r['valid_ndcg']:.6f}",
                    r["epochs"], r["trials"], f"{r['search_minutes']:.2f}",
                    f"{r['final_minutes']:.2f}", r["users"], r.get("health", ""),
                    r.get("seeds", 1), *map(num, r.get("seed_spread") or (None,) * 3),
                    num(r.get("paired_seed_sd")),
                    *[f"{r[m][i]:.6f}" if m in r else "" for m in STANDARD for i in (0, 1)]])
    return buf.getvalue()


# -- the paper's figures from the trials ----------------------------------------------------------

def finished_trials(root: Path, model: str, pts: list[dict]) -> list[tuple[dict, dict]]:
    """(point, summary) of every finished trial of ``model``, failed ones included."""
    runs = ((p, finished(root / "trials" / grids.point_name(model, p))) for p in pts)
    return [(p, s) for p, s in runs if s]


def with_ndcg(trials: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """The trials that ended with a validation NDCG (not diverged)."""
    return [(p, s) for p, s in trials if s.get("best_valid_ndcg") is not None
            and not math.isnan(s["best_valid_ndcg"])]


def trial_results(root: Path, model: str, pts: list[dict]) -> list[tuple[dict, dict]]:
    return with_ndcg(finished_trials(root, model, pts))


def best_by(results: list[tuple[dict, dict]], key: str) -> dict:
    """The best validation NDCG at each value of ``key`` (over every other setting)."""
    out: dict = {}
    for p, s in results:
        if key in p:
            out[p[key]] = max(out.get(p[key], -1.0), s["best_valid_ndcg"])
    return out


def figures(root: Path, points: dict[str, list[dict]]) -> dict[str, bytes]:
    """The paper's figures that the search answers: validation NDCG per optimisation mode, against
    N (NS heads) and against beta, and validation NDCG against wall time per mode (convergence);
    each drawn for the models whose grid varied that setting."""
    from evaluation import plots
    from models.registry import model_class
    from training.train import read_model_file

    # a grid point names only what it sets (the protocol grid sets mode only where it searches
    # the fine-tune modes): the model's defaults fill the rest, so its joint-mode points count
    # as joint. Trials are found by the points as given (their names).
    defaults = {m: model_class(m).defaults() for m in points}
    results = {m: [({**defaults[m], **p}, s) for p, s in trial_results(root, m, pts)]
               for m, pts in points.items()}
    points = {m: [{**defaults[m], **p} for p in pts] for m, pts in points.items()}
    varied = lambda m, k: len({p[k] for p in points[m] if k in p}) > 1
    out = {}
    for key, name, label, log_x in (("mode", "ndcg_per_mode.png", "optimisation mode", False),
                                    ("num_negatives", "ndcg_against_n.png", "N (negatives)", True),
                                    ("beta", "ndcg_against_beta.png", "beta", False)):
        series = {m: best_by(results[m], key) for m in points if varied(m, key)}
        if series:
            out[name] = plots.png_bytes(plots.setting_effect(
                series, label, f"Best validation NDCG per {label} ({root.name})", log_x))
    curves = {}
    for m in points:
        if not varied(m, "mode"):
            continue
        for mode in dict.fromkeys(p["mode"] for p in points[m]):
            mine = [(p, s) for p, s in results[m] if p.get("mode") == mode]
            if not mine:
                continue
            p, s = max(mine, key=lambda r: r[1]["best_valid_ndcg"])
            history = read_model_file(s["model_path"]).get("history", [])
            t, y, clock = [], [], 0.0
            for rec in history:
                clock += rec.get("epoch_seconds", rec.get("train_seconds", 0.0))
                if "valid_ndcg" in rec:
                    t.append(clock)
                    y.append(rec["valid_ndcg"])
            curves[f"{m} {mode}"] = (t, y)
    if curves:
        out["convergence.png"] = plots.png_bytes(plots.convergence(
            curves, f"Validation NDCG against training time, best trial per mode ({root.name})"))
    return out


# -- the whole experiment --------------------------------------------------------------------------

def run_experiment(cfg: ExperimentConfig, mlflow_uri: str | None = None,
                   ray_address: str | None = None) -> dict:
    """Every stage, skipping what finished; returns the experiment's state (also
    EXPERIMENTS_DIR/NAME/experiment.json)."""
    import ray

    from runtime import tracking
    from training.train import run as train

    prep = open_prepared(cfg.data)
    cfg = dataclasses.replace(
        cfg, data=cfg.data if "://" in cfg.data else str(Path(cfg.data).resolve()),
        name=cfg.name or f"{prep.dataset}-{Path(cfg.grid).stem}",
        output=str(Path(cfg.output or ROOT / "var" / "experiments").resolve()))
    root = Path(cfg.output) / cfg.name
    points = plan(cfg, prep, str(root))
    total = sum(len(p) for p in points.values())
    print(f"experiment {cfg.name}: {', '.join(f'{m} {len(p)}' for m, p in points.items())} "
          f"point(s), {total} trial(s) on {prep.dataset}; in {root}", flush=True)
    uri = tracking.tracking_uri(mlflow_uri)
    tracking.check_reachable(uri)
    apply_ray_env()
    if not ray.is_initialized():
        address = join_address(ray_address)
        # a local Ray keeps a CPU beyond the trial's workers for Ray Data, as train.py's does
        ray.init(address=address, log_to_driver=True) if address else ray.init(
            num_cpus=local_cpus(cfg.num_workers, cfg.cpus_per_worker), log_to_driver=True)
    check_trial_fits(cfg, list(points))
    state = open_state(cfg, root)
    parent_runs(uri, cfg, state, list(points), prep.dataset)
    write_json(root / "experiment.json", state)
    write_text(root / "config.yaml", config_file(cfg, state["run_id"]))

    for model, pts in points.items():  # 1-3: search, select, retrain
        s = state["models"][model]
        search(cfg, root, model, pts, state, prep.n_items)
        s["chosen"] = select(root, model, pts)
        write_json(root / "experiment.json", state)
        if cfg.stop_after == "search":
            continue
        s["chosen"] = reseed_choice(cfg, root, model, pts, s["chosen"], state, prep.n_items)
        write_json(root / "experiment.json", state)
        seeds = final_seeds(cfg)
        todo = seeds_to_run(cfg, root, model, s["chosen"])
        print(f"\n== {model}: chose {fmt_point(s['chosen']['point'])} (validation NDCG "
              f"{s['chosen']['valid_ndcg']:.4f} at epoch {s['chosen']['best_epoch']}); "
              f"retraining on train+valid for {final_config(cfg, root, model, s['chosen']).epochs}"
              f" epoch(s) with seed(s) {', '.join(map(str, seeds))}"
              + (f" ({len(seeds) - len(todo)} finished already)" if len(todo) < len(seeds)
                 else ""), flush=True)
        run_finals(cfg, root, model, s["chosen"], todo, state, prep.n_items)
        finals = {}
        for seed in seeds:  # a finished run is read back, not retrained (train.py's resume)
            fc = current_final(cfg, root, model, s["chosen"], seed)
            finals[str(seed)] = train(fc, uri, ray_address, prep,
                                      tags={PARENT: s["run_id"], "kind": "final",
                                            "seed": str(seed)})
        s["finals"] = finals
        s["final"] = finals[str(cfg.seed)]  # the first seed's: registered, and its epochs
        write_json(root / "experiment.json", state)

    # every trial ranked, in every run: what a staged search reads to grow its grid
    write_text(root / "search.md", search_md(state, list(points), cfg.name))
    state["search"] = str(root / "search.md")
    write_json(root / "experiment.json", state)
    if cfg.stop_after == "search":
        return state

    from evaluation.evaluate import evaluate
    from evaluation.score import score
    from runtime.spark import get_spark

    spark = get_spark("experiment")
    seeds = final_seeds(cfg)
    recs, labels = [], {}
    for model in points:  # 4-5: register (the first seed), score (every seed)
        s = state["models"][model]
        f = s["final"]
        s["model_uri"] = f["model_uri"] if cfg.no_register else register_if_healthy(
            uri, registered_name(cfg.register_as, prep.dataset, model), f, s["chosen"],
            cfg.allow_unhealthy)
        scored = s.setdefault("scored_seeds", {})
        for seed in seeds:
            f = s["finals"][str(seed)]
            # the first seed as before --seeds: registered, in recs/MODEL; the others from
            # their runs (one @champion per model), in recs/MODEL-seedS
            model_uri = s["model_uri"] if seed == cfg.seed else f["model_uri"]
            out = root / "recs" / seeded(model, seed, cfg.seed)
            current = (read_json(out / "_manifest.json") or {}).get("mlflow_run_id") == \
                f["mlflow_run_id"] and (s.get("scored") if seed == cfg.seed
                                        else scored.get(str(seed))) == model_uri
            if not current:
                print(f"\n== score {model}" + (f" seed {seed}" if len(seeds) > 1 else "")
                      + f": top {TOP_K} of every user with {model_uri}", flush=True)
                score(spark, model=model_uri, data=cfg.data, output=str(out), k=TOP_K,
                      users="all", mlflow_uri=uri, overwrite=True)
                if seed == cfg.seed:
                    s["scored"] = model_uri
                else:
                    scored[str(seed)] = model_uri
            recs.append(str(out))
            labels.setdefault(model, []).append(seed_label(model, seed, len(seeds)))
        s["evaluation_label"] = model
        write_json(root / "experiment.json", state)

    print(f"\n== evaluate {len(recs)} model(s) on test"
          + (f" ({len(points)} models x {len(seeds)} seeds)" if len(seeds) > 1 else ""),
          flush=True)
    m = evaluate(spark, recs=recs, labels=[x for ls in labels.values() for x in ls],
                 compare=[ls[0] for ls in labels.values()], data=cfg.data,
                 output=str(root / "evaluation"), target="test", mlflow_uri=uri, overwrite=True)
    paired = root / "evaluation" / "paired.csv"  # per user, the first model minus each other
    if len(seeds) == 1:  # evaluate.py's rows and pairs are the models'
        metric_rows, pairs = m["rows"], m.get("paired", [])
        paired_bytes = paired.read_bytes() if paired.is_file() else None
    else:
        metric_rows, pairs = pool_over_seeds(spark, root / "evaluation", labels, seeds)
        paired_bytes = seeds_paired_csv(pairs).encode() if pairs else None
    rows = table_rows(state, metric_rows, pool_popularity(m.get("popularity"), labels), pairs)
    title = f"{cfg.name}: {prep.dataset}, grid {Path(cfg.grid).name}"
    files = {"table.md": table_md(rows, title).encode(), "table.csv": table_csv(rows).encode(),
             **({"paired.csv": paired_bytes} if paired_bytes else {}),
             **{f"figures/{k}": v for k, v in figures(root, points).items()}}
    publish_results(root, files)
    state["figures"] = sorted(str(root / k) for k in files if k.startswith("figures/"))
    log_report(uri, state["run_id"], root, rows)
    state["table"] = str(root / "table.md")
    state["done"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(root / "experiment.json", state)
    return state


def search_md(state: dict, models: list[str], name: str) -> str:
    """search.md: per model, every finished trial, best validation NDCG first (what the next
    stage of a staged search, ``--stop-after search``, reads to grow the grid)."""
    out = [f"# {name}: the search", "",
           "Every finished trial by validation NDCG, best first (one seed, the search's); the "
           "choice may differ where the seeds settled it (``reseed_choice``: the table's "
           "'chosen'). Nothing here was read on test.", ""]
    for m in models:
        c = state["models"][m]["chosen"]
        out += [f"## {m}: {c['finished']} of {c['trials']} trial(s) finished", "",
                "| rank | point | valid NDCG | best epoch |", "|---|---|---|---|"]
        ranked = sorted(c["all"], key=lambda r: -r["valid_ndcg"])
        out += [f"| {i} | {fmt_point(r['point'])} | {r['valid_ndcg']:.4f} | {r['best_epoch']} |"
                for i, r in enumerate(ranked, 1)]
        out.append("")
    return "\n".join(out)


def seed_label(model: str, seed: int, seeds: int) -> str:
    """The evaluation label of one seed's lists: the model itself with one seed (as before
    --seeds), ``MODEL seed S`` with several (each seed's metrics land in its own run)."""
    return model if seeds == 1 else f"{model} seed {seed}"


def pool_over_seeds(spark, evaluation: Path, labels: dict[str, list[str]],
                    seeds: list[int]) -> tuple[list[dict], list[dict]]:
    """The table's metric rows and paired rows pooled over seeds (evaluation/seeds.py) from the
    evaluation's per-user values: the same comparisons as evaluate.py makes of one seed each,
    the first model minus each other and, with three or more, the best after the first (by the
    pooled test NDCG) minus each remaining one."""
    from evaluation.evaluate import PAIRED, best_other
    from evaluation.seeds import pooled_metrics, pooled_pairs

    users = spark.read.parquet(str(evaluation / "per_user"))
    rows = pooled_metrics(users, labels, [*TABLE, *STANDARD])
    models = list(labels)
    plan = [("first", models[0], models[1:])] if len(models) > 1 else []
    best = best_other(rows, models)
    others = [m for m in models[1:] if m != best]
    if best is not None and others:
        plan.append(("best", best, others))
    pairs = pooled_pairs(users, labels, seeds, plan, list(PAIRED)) if plan else []
    return rows, pairs


def seeds_paired_csv(pairs: list[dict]) -> str:
    from evaluation.seeds import paired_csv

    return paired_csv(pairs)


def pool_popularity(pop: dict | None, labels: dict[str, list[str]]) -> dict:
    """Per model, the mean over its seeds of each popularity figure of evaluate.py (keyed by
    evaluation label): with one seed the figures themselves."""
    pop = pop or {}
    out = {}
    for model, ls in labels.items():
        mine = [pop[x] for x in ls if x in pop]
        if mine:
            out[model] = {k: sum(p[k] for p in mine) / len(mine) for k in mine[0]}
    return out


RESULTS = "results.json"  # the results' manifest: written last, lists every file with its size
RESULT_FILES = ("table.md", "table.csv", "paired.csv", "figures")


def publish_results(root: Path, files: dict[str, bytes]) -> None:
    """Write the results (``files``: relative path -> bytes) beside the experiment's other
    folders, so that no reader takes a mix of an earlier run's files and this one's for a result.

    Everything is written first into a hidden staging folder; the manifest ``results.json`` is
    removed, the files are moved in (``figures/`` whole, by one rename: no figure of an earlier
    run stays beside new ones), and the manifest, naming every file with its size, is written
    last. A reader checks it (``read_results``): between the first move and the manifest there
    is none, and a reader is told the results are being written."""
    import shutil

    stage = root / f".results.tmp-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    for name, data in files.items():
        (stage / name).parent.mkdir(parents=True, exist_ok=True)
        (stage / name).write_bytes(data)
    (root / RESULTS).unlink(missing_ok=True)  # from here until the end: no complete results
    old = root / f".figures.old-{os.getpid()}"
    if (root / "figures").exists():
        (root / "figures").rename(old)
    for name in RESULT_FILES:
        if (stage / name).exists():
            (stage / name).replace(root / name)
        elif name != "figures":  # an earlier run's file this run does not write (paired.csv)
            (root / name).unlink(missing_ok=True)
    shutil.rmtree(old, ignore_errors=True)
    shutil.rmtree(stage, ignore_errors=True)
    write_json(root / RESULTS, {"written": time.strftime("%Y-%m-%d %H:%M:%S"),
                                "files": {k: len(v) for k, v in sorted(files.items())}})


def read_results(root: Path) -> dict:
    """The results' manifest, once the files match it; refuses results being (re)written."""
    from prepared.files import FILES, check_files

    manifest = read_json(root / RESULTS)
    if manifest is None:
        raise UsageError(f"{root}: no {RESULTS}, so its results are incomplete: the experiment has "
                         "not finished, or is writing them right now; wait for it, or run it again "
                         "with the same --name")
    found = {n: (root / n).stat().st_size for n in RESULT_FILES if (root / n).is_file()}
    found |= {f"figures/{p.name}": p.stat().st_size for p in (root / "figures").glob("*")}
    check_files(str(root), manifest[FILES], found)
    return manifest


def log_report(uri: str, run_id: str, root: Path, rows: list[dict]) -> None:
    """The table and the evaluation's plots as artifacts of the experiment's run; per model its
    test NDCG as a metric (compare experiments in the UI)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    for name in ("table.md", "table.csv", "paired.csv"):
        if (root / name).is_file():
            client.log_artifact(run_id, str(root / name))
    for plot in sorted([*(root / "evaluation").glob("*.png"), *(root / "figures").glob("*.png")]):
        client.log_artifact(run_id, str(plot), "plots")
    for r in rows:  # with seeds: pooled (the mean over seeds, the CI over users and seeds)
        if "NDCG" in r:
            client.log_metric(run_id, f"test_ndcg_{r['model']}", r["NDCG"][0])
            client.log_metric(run_id, f"test_ndcg_{r['model']}_ci95", r["NDCG"][1])
        if r.get("seeds", 1) > 1 and not math.isnan(r["seed_spread"][0]):
            client.log_metric(run_id, f"test_ndcg_{r['model']}_seed_sd", r["seed_spread"][0])
        if r.get("paired_ndcg"):  # this model minus the first, paired, Holm-corrected p-values
            key = f"test_paired_ndcg_{r['model']}_minus_first"
            client.log_metric(run_id, key, r["paired_ndcg"][0])
            client.log_metric(run_id, f"{key}_ci95", r["paired_ndcg"][1])
            for test, p in zip(("t_p_holm", "wilcoxon_p_holm"), r.get("paired_p") or ()):
                if not math.isnan(p):
                    client.log_metric(run_id, f"{key}_{test}", p)
    client.set_terminated(run_id, "FINISHED")


def build_parser() -> argparse.ArgumentParser:
    """Every flag of ExperimentConfig, --config FILE and where to connect: the parser
    training/train.py builds (``runtime.cli.stage_parser``) with the experiment's flags."""
    return stage_parser("experiment/run.py", __doc__, ExperimentConfig)


def main(argv: list[str] | None = None) -> int:
    no_bars_in_logs()
    try:
        args = build_parser().parse_args(argv)  # --config FILE's errors are UsageErrors
        check_job_paths(args, ExperimentConfig)  # under ray job submit: see check_job_paths
        join_address(args.ray_address)  # a job server's http address fails here, not mid-run
        cfg = ExperimentConfig(**values(args, ExperimentConfig))
        state = run_experiment(cfg, args.mlflow_uri, args.ray_address)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:  # a trial crashed, no trial finished, a final run failed
        print(f"error: {e}", file=sys.stderr)
        return 1
    if cfg.stop_after == "search":
        print("\n" + Path(state["search"]).read_text(), flush=True)
        print(f"search: {state['search']}; rerun with --stop-after evaluate to retrain, score and "
              "evaluate the choices", flush=True)
        return 0
    print("\n" + Path(state["table"]).read_text(), flush=True)
    print(f"table: {state['table']} (and table.csv); figures: "
          f"{', '.join(Path(f).name for f in state['figures']) or 'none (no setting varied)'} in "
          f"{Path(state['table']).parent / 'figures'}; MLflow: run {state['run_id']} in "
          f"{state['mlflow_uri']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
