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
  3b. ensemble with --ensemble M1,M2,..: every subset of those models' chosen trials (with
               --ensemble-top K, each model's K best) scored on validation, the best assembled
               from their finals per seed (a chosen trial other than its model's choice is
               retrained on train+valid for it; experiment/ensemble.py; an extension beyond the
               paper), then registered, scored and tabled as a model.
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
import dataclasses
import time

from evaluation.tables import fmt_point, seeds_paired_csv, table_csv

# the stages, each in its module (this file runs them in order)
from experiment.ensemble import experiment_stage as ensemble_stage
from experiment.plan import ExperimentConfig, plan
from experiment.records import read_json, write_json
from experiment.register import register_if_healthy, registered_name
from experiment.report import (
    figures,
    log_report,
    pool_over_seeds,
    pool_popularity,
    search_md,
    seed_label,
    table_md,
    table_rows,
)
from experiment.results import publish_results
from experiment.search import check_trial_fits, search
from experiment.selection import final_seeds, reseed_choice, seeded, select, train_finals
from experiment.state import PARENT, config_file, open_state, parent_runs
from models.ensemble import Ensemble
from prepared.errors import UsageError
from prepared.protocol import TOP_K
from prepared.reader import Prepared, open_prepared
from prepared.uri import absolute
from runtime.atomic import write_text
from runtime.cli import stage_parser, values
from runtime.logs import no_bars_in_logs
from runtime.paths import project_root
from runtime.raycluster import join_address, local_cpus, ray_for
from training.train import check_job_paths

ENSEMBLE = Ensemble.name  # the row of --ensemble, beside the models'

# -- the whole experiment --------------------------------------------------------------------------

def run_experiment(cfg: ExperimentConfig, mlflow_uri: str | None = None,
                   ray_address: str | None = None) -> dict:
    """Every stage, skipping what finished; returns the experiment's state (also
    EXPERIMENTS_DIR/NAME/experiment.json)."""
    prep = open_prepared(cfg.data)
    cfg = resolved(cfg, prep)
    root = Path(cfg.output) / cfg.name
    lock = experiment_lock(cfg, root)
    lock.acquire()  # two runs of one experiment would rerun each other's trials and overwrite
    try:
        return _run_experiment(cfg, prep, root, mlflow_uri, ray_address)
    finally:
        lock.release()


WRITER_LOCK = ".writer.lock"  # in the experiment's directory, as in a training run's


def experiment_lock(cfg: ExperimentConfig, root: Path):
    """The experiment directory's writer lock (``runtime.publish.WriterLock``): a second process
    running the same experiment is refused with the holder's pid and host; a killed one's lock is
    taken over."""
    from runtime.publish import WriterLock

    root.mkdir(parents=True, exist_ok=True)
    return WriterLock.local(str(root / WRITER_LOCK), f"experiment {cfg.name} ({root})")


def _run_experiment(cfg: ExperimentConfig, prep: Prepared, root: Path, mlflow_uri: str | None,
                    ray_address: str | None) -> dict:
    points = plan(cfg, prep, str(root))
    total = sum(len(p) for p in points.values())
    print(f"experiment {cfg.name}: {', '.join(f'{m} {len(p)}' for m, p in points.items())} "
          f"point(s), {total} trial(s) on {prep.dataset}; in {root}", flush=True)
    uri = connect(cfg, list(points), mlflow_uri, ray_address)
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
        retrain(cfg, root, model, state, prep, uri, ray_address)

    scored = list(points)
    if cfg.ensemble and cfg.stop_after != "search":  # 3b: the ensemble of the chosen models
        state["models"][ENSEMBLE] = ensemble_stage(cfg, root, state, points, prep, uri,
                                                   ray_address)
        scored.append(ENSEMBLE)
    else:  # an earlier run's ensemble is not this run's table
        state["models"].pop(ENSEMBLE, None)
    write_json(root / "experiment.json", state)

    # every trial ranked, in every run: what a staged search reads to grow its grid
    write_text(root / "search.md", search_md(state, list(points), cfg.name))
    state["search"] = str(root / "search.md")
    write_json(root / "experiment.json", state)
    if cfg.stop_after == "search":
        return state

    from runtime.spark import get_spark

    spark = get_spark("experiment")
    recs, labels = score_models(spark, cfg, root, scored, state, prep.dataset, uri)
    rows, files = evaluate_models(spark, cfg, root, points, state, prep.dataset, uri, recs, labels)
    publish_results(root, files)
    state["figures"] = sorted(str(root / k) for k in files if k.startswith("figures/"))
    log_report(uri, state["run_id"], root, rows)
    state["table"] = str(root / "table.md")
    state["done"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_json(root / "experiment.json", state)
    return state


def resolved(cfg: ExperimentConfig, prep: Prepared) -> ExperimentConfig:
    """``cfg`` as the experiment records it: an absolute --data (a URI as given), its name
    (default DATASET-GRID) and an absolute --experiments-dir (default ./var/experiments)."""
    return dataclasses.replace(
        cfg, data=absolute(cfg.data),
        name=cfg.name or f"{prep.dataset}-{Path(cfg.grid).stem}",
        output=str(Path(cfg.output or project_root() / "var" / "experiments").resolve()))


def connect(cfg: ExperimentConfig, models: list[str], mlflow_uri: str | None,
            ray_address: str | None) -> str:
    """The MLflow tracking URI, checked reachable, and Ray, joined or started here, with every
    trial's workers checked to fit the cluster (``check_trial_fits``)."""
    address = join_address(ray_address)
    ray = ray_for(address)

    from runtime import tracking

    uri = tracking.tracking_uri(mlflow_uri)
    tracking.check_reachable(uri)
    if not ray.is_initialized():
        # a local Ray keeps a CPU beyond the trial's workers for Ray Data, as train.py's does
        ray.init(address=address, log_to_driver=True) if address else ray.init(
            num_cpus=local_cpus(cfg.num_workers, cfg.cpus_per_worker), log_to_driver=True)
    check_trial_fits(cfg, models)
    return uri


def retrain(cfg: ExperimentConfig, root: Path, model: str, state: dict, prep: Prepared, uri: str,
            ray_address: str | None) -> None:
    """3. retrain: the chosen point of ``model`` on train+valid, once per seed
    (``train_finals``)."""
    s = state["models"][model]
    print(f"\n== {model}: chose {fmt_point(s['chosen']['point'])} (validation NDCG "
          f"{s['chosen']['valid_ndcg']:.4f} at epoch {s['chosen']['best_epoch']}); ",
          end="", flush=True)
    s["finals"] = train_finals(cfg, root, model, s["chosen"], state, prep, uri, ray_address,
                               {PARENT: s["run_id"]})
    s["final"] = s["finals"][str(cfg.seed)]  # the first seed's: registered, and its epochs
    write_json(root / "experiment.json", state)


def score_models(spark, cfg: ExperimentConfig, root: Path, models: list[str], state: dict,
                 dataset: str, uri: str) -> tuple[list[str], dict[str, list[str]]]:
    """4-5: register (the first seed), score (every seed); returns the lists' folders and, per
    model, its seeds' evaluation labels."""
    seeds = final_seeds(cfg)
    recs, labels = [], {}
    for model in models:
        s = state["models"][model]
        f = s["final"]
        s["model_uri"] = f["model_uri"] if cfg.no_register else register_if_healthy(
            uri, registered_name(cfg.register_as, dataset, model), f, s["chosen"],
            cfg.allow_unhealthy)
        for seed in seeds:
            recs.append(str(score_seed(spark, cfg, root, model, seed, s, uri)))
            labels.setdefault(model, []).append(seed_label(model, seed, len(seeds)))
        s["evaluation_label"] = model
        write_json(root / "experiment.json", state)
    return recs, labels


def score_seed(spark, cfg: ExperimentConfig, root: Path, model: str, seed: int, s: dict,
               uri: str) -> Path:
    """The top-K lists of ``model``'s final run of ``seed`` (``s``: the model's state), scored
    unless those on disk are of this run and model URI already; returns their folder."""
    from evaluation.score import score

    seeds = final_seeds(cfg)
    scored = s.setdefault("scored_seeds", {})
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
    return out


def evaluate_models(spark, cfg: ExperimentConfig, root: Path, points: dict[str, list[dict]],
                    state: dict, dataset: str, uri: str, recs: list[str],
                    labels: dict[str, list[str]]) -> tuple[list[dict], dict[str, bytes]]:
    """6. evaluate: every seed's lists on test in one Spark application (evaluate.py), pooled over
    the seeds where there are several; returns the table's rows and the results' files."""
    from evaluation.evaluate import evaluate

    seeds = final_seeds(cfg)
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
    title = f"{cfg.name}: {dataset}, grid {Path(cfg.grid).name}"
    files = {"table.md": table_md(rows, title).encode(), "table.csv": table_csv(rows).encode(),
             **({"paired.csv": paired_bytes} if paired_bytes else {}),
             **{f"figures/{k}": v for k, v in figures(root, points).items()}}
    return rows, files


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
