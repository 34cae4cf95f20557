"""2. select, 3. retrain: per model, the trial with the best validation NDCG, settled with
the seeds where the two best are within the seed spread (``reseed_choice``), and its final
runs on train+valid, one per seed (``final_config``, ``run_finals``, ``seeds_to_run``; a final
run of an earlier choice is moved aside, ``retire_stale_final``)."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path

from evaluation.tables import fmt_point
from experiment.plan import ExperimentConfig, trial_config
from experiment.records import finished, finished_trials, read_json, with_ndcg
from experiment.search import Progress, concurrency, memory_bound, tune_trials
from models.registry import MODELS
from prepared.errors import UsageError
from runtime.runs import RUN_RECORD, finished_summary
from training.config import TrainConfig


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
                 seed: int | None = None, name: str | None = None) -> TrainConfig:
    """The chosen point on train+valid for the chosen epochs, with ``seed`` (default --seed):
    phase 1 as long as the selection run's, phase 2 (or the only phase) up to its best epoch.
    Its run is ``final_name(name)``, ``name`` the model's by default (another trial's final,
    an ensemble candidate, is named by its point)."""
    seed = cfg.seed if seed is None else seed
    two_phase = len(chosen["phase_epochs"]) > 1
    pre = chosen["phase_epochs"][0] if two_phase else 0
    base = trial_config(cfg, str(root), model, chosen["point"])
    return dataclasses.replace(base, train_splits="train,valid", pretrain_epochs=pre,
                               # best epoch 0: the start (--start-from svd) was the best
                               epochs=0 if chosen["best_epoch"] == 0
                               else max(1, chosen["best_epoch"] - pre), patience=None,
                               valid_sample=1.0, seed=seed,
                               run_name=final_name(name or model, seed, cfg.seed),
                               output=str(root / "final"))


def current_final(cfg: ExperimentConfig, root: Path, model: str, chosen: dict,
                  seed: int, name: str | None = None) -> TrainConfig:
    """``final_config`` of ``seed``, with a final run on record of an earlier choice moved aside
    (``retire_stale_final``) and said so."""
    fc = final_config(cfg, root, model, chosen, seed, name)
    moved = retire_stale_final(fc)
    if moved:
        print(f"   the final run on record was of an earlier choice; moved to {moved}", flush=True)
    return fc


def run_finals(cfg: ExperimentConfig, root: Path, model: str, chosen: dict, todo: list[int],
               state: dict, n_items: int, name: str | None = None) -> None:
    """The final runs of the seeds in ``todo`` side by side, as the search runs its trials, where
    the cluster takes more than one at a time: one after another, each Ray Train run would leave
    the rest of the cluster idle. ``run_experiment`` then reads each back (train.py's resume)
    and, should one have failed, runs it there and reports its error."""
    at_once = min(len(todo), memory_bound(model, n_items, concurrency(cfg)))
    if at_once < 2:
        return
    configs = [current_final(cfg, root, model, chosen, seed, name) for seed in todo]
    tune_trials(model, root, configs, state, at_once,
                Progress(f"{model} finals", len(configs), 0, at_once), kind="final")


def seeds_to_run(cfg: ExperimentConfig, root: Path, model: str, chosen: dict,
                 name: str | None = None) -> list[int]:
    """The seeds of ``final_seeds`` whose final run has not finished with this choice: what a
    (re)run retrains. A finished run of another choice (a grown grid chose anew) is retired and
    runs again; seeds beyond --seeds are left alone (a resume with fewer uses the first N)."""
    from training.run_record import check_resume

    todo = []
    for seed in final_seeds(cfg):
        fc = final_config(cfg, root, model, chosen, seed, name)
        record = read_json(Path(fc.output) / fc.run_name / RUN_RECORD)
        try:
            check_resume(fc, record)
        except UsageError:
            todo.append(seed)
            continue
        if finished_summary(record) is None:
            todo.append(seed)
    return todo


def train_finals(cfg: ExperimentConfig, root: Path, model: str, chosen: dict, state: dict,
                 prep, uri: str, ray_address: str | None, tags: dict[str, str],
                 name: str | None = None) -> dict[str, dict]:
    """{seed: summary} of ``chosen``'s final runs on train+valid, one per seed: those not
    finished with this choice side by side where the cluster takes several (``run_finals``),
    then each read back (or, should one have failed, run here and its error reported) by
    train.py's resume. The runs are tagged with ``tags`` and the seed."""
    from training.train import run as train

    seeds = final_seeds(cfg)
    todo = seeds_to_run(cfg, root, model, chosen, name)
    print(f"retraining on train+valid for {final_config(cfg, root, model, chosen).epochs}"
          f" epoch(s) with seed(s) {', '.join(map(str, seeds))}"
          + (f" ({len(seeds) - len(todo)} finished already)" if len(todo) < len(seeds)
             else ""), flush=True)
    run_finals(cfg, root, model, chosen, todo, state, prep.n_items, name)
    return {str(seed): train(current_final(cfg, root, model, chosen, seed, name), uri,
                             ray_address, prep, tags={**tags, "kind": "final", "seed": str(seed)})
            for seed in seeds}


def retire_stale_final(fc: TrainConfig) -> Path | None:
    """Move aside a final run recorded with another configuration than ``fc``; returns where it
    went. It happens when a finished experiment is resumed with a grown grid and validation now
    chooses another point: the retraining must run the new choice, not fail on the old record,
    and the old run is kept (its MLflow run too) rather than deleted."""
    from training.run_record import check_resume, read_run_record

    try:
        check_resume(fc, read_run_record(fc))
        return None
    except UsageError:
        old = Path(fc.output) / fc.run_name
        dest = old.with_name(f"{old.name}.superseded-{time.strftime('%Y%m%d-%H%M%S')}")
        old.rename(dest)
        return dest
