"""The experiment's configuration and its plan: every flag of experiment/run.py
(``ExperimentConfig``), and every trial's training configuration, checked before anything runs
(a bad grid, or a trial on record run with other settings, fails here)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from experiment import grids
from experiment.ensemble import MAX_MEMBERS
from experiment.records import read_json
from models.registry import MODELS
from prepared.errors import UsageError
from prepared.reader import Prepared
from runtime.cli import option
from runtime.runs import RUN_RECORD
from training.config import VALID_BY, TrainConfig, check


@dataclass(frozen=True)
class ExperimentConfig:
    """Every flag of experiment/run.py (``runtime.cli`` builds the parser from the fields)."""

    data: str = option(help="a prepared directory (etl/prepare.py --output) with a validation "
                            "split")
    models: str = option("nce-autorec,autorec,puresvd",
                         help="comma-separated models to search, in the table's order")
    grid: str = option("small", help="small (one to a few trials per model, joint mode), paper "
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
    ensemble: str = option("", show_default=False, metavar="MODELS",
                           help="comma-separated models of --models whose chosen trials are "
                                "ensembled (an extension beyond the paper: experiment/ensemble.py):"
                                " the subset best on validation, assembled from the same models' "
                                "finals per seed, scored, evaluated and tabled as 'ensemble' "
                                "(default: none)")
    ensemble_top: int = option(1, metavar="K",
                               help="with --ensemble: each model's K best trials on validation "
                                    "are candidates (its chosen trial first), so two settings of "
                                    "one model (two widths, say) can both be members; a chosen "
                                    "candidate other than the model's choice gets its own finals "
                                    "per seed (final/TRIAL-final[-seedS]). 1: the chosen trials")
    stop_after: str = option("evaluate", choices=("search", "evaluate"),
                             help="search: stop once every model's trials ran and its best point "
                                  "is chosen (search.md ranks every trial), before the final "
                                  "retraining; rerun with --stop-after evaluate to go on. The "
                                  "grid file may grow in between: a staged search")

    def model_list(self) -> list[str]:
        return [m.strip() for m in self.models.split(",") if m.strip()]

    def ensemble_list(self) -> list[str]:
        return [m.strip() for m in self.ensemble.split(",") if m.strip()]


def trial_config(cfg: ExperimentConfig, root: str, model: str, point: dict) -> TrainConfig:
    """A grid point's training run; a run setting the grid searches (``batch_size``, say: a
    wider code wants a larger batch) overrides the experiment's value for that point."""
    run = {"batch_size": cfg.batch_size, **point}
    return TrainConfig(data=cfg.data, model=model, epochs=cfg.epochs, patience=cfg.patience,
                       valid_sample=cfg.valid_sample, seed=cfg.seed,
                       valid_by=cfg.valid_by if MODELS[model].per_user else "fold-in",
                       num_workers=cfg.num_workers, cpus_per_worker=cfg.cpus_per_worker,
                       run_name=grids.point_name(model, point), output=f"{root}/trials",
                       experiment=cfg.name, **run)


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
    check_ensemble(cfg)
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


def check_ensemble(cfg: ExperimentConfig) -> None:
    """--ensemble names two or more of --models, each once; --ensemble-top K gives at most
    MAX_MEMBERS candidates (every subset of them is scored on validation)."""
    members = cfg.ensemble_list()
    if cfg.ensemble_top < 1 or len(members) * cfg.ensemble_top > MAX_MEMBERS:
        raise UsageError(f"--ensemble-top {cfg.ensemble_top}: each --ensemble model's K best "
                         f"trials are candidates, at most {MAX_MEMBERS} in all (every subset is "
                         f"scored on validation); with {max(len(members), 1)} model(s) pass K "
                         f"from 1 to {MAX_MEMBERS // max(len(members), 1)}")
    if not members:
        return
    unknown = [m for m in members if m not in cfg.model_list()]
    if unknown or len(set(members)) != len(members) or len(members) < 2:
        raise UsageError(f"--ensemble {cfg.ensemble}: name two or more of --models "
                         f"({cfg.models}), each once"
                         + (f"; {', '.join(unknown)} is not among them" if unknown else ""))


def check_trial_record(cfg: ExperimentConfig, root: str, model: str, point: dict) -> None:
    """A trial already run under this point's name must have run this point's configuration: a
    finished trial is reused as is, so one run with other settings (another unit of lambda, an
    edited record) would otherwise enter the selection silently."""
    from training.run_record import check_resume

    tc = trial_config(cfg, root, model, point)
    record = read_json(Path(root) / "trials" / tc.run_name / RUN_RECORD)
    try:
        check_resume(tc, record)
    except UsageError as e:
        raise UsageError(f"experiment {cfg.name!r}: its trial {tc.run_name} ran with settings "
                         f"this code and these flags do not give it ({e}). Pass another --name "
                         "for a new experiment, or remove that trial's directory to rerun it"
                         ) from None
