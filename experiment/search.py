"""1. search: per model, a Ray Tune grid search whose trials are training/train.py runs, as
many at once as the cluster's CPUs (``concurrency``) and this node's memory (``memory_bound``)
fit, with a line per finished trial (``Progress``)."""

from __future__ import annotations

import math
import time
from pathlib import Path

from experiment.plan import ExperimentConfig, trial_config
from experiment.records import finished_trials, with_ndcg
from experiment.state import PARENT
from models.registry import MODELS
from prepared.errors import UsageError
from runtime.raycluster import check_fits, worker_cpus
from training.config import TrainConfig
from training.validate import HEALTHY


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

    need = MODELS[model].trainer.fit_memory(n_items)
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
