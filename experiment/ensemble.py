"""An ensemble of trained runs, written as a run of its own (an extension beyond the paper, issue 57).

    python experiment/ensemble.py --members var/runs/nce-w1000 var/runs/nce-w500 var/runs/ar-w1000 \\
        --data var/data/gowalla --run-name family-ensemble
    spark-submit evaluation/score.py --model var/runs/family-ensemble --data var/data/gowalla ...

An item's score is the sum of the members' scores, each standardised per user
(``models.ensemble``). With ``--choose valid`` (the default) every non-empty subset of the members
is scored on the validation split, with the validation metric of training (NDCG over the top 50,
training items left out), and the best subset is the ensemble; ties go to the smaller subset.
That needs members trained on train only. Members retrained on train + valid (the protocol's
finals) cannot be chosen among on valid, which they have seen: choose among their trials, then
pass the chosen members' finals with ``--choose all``.

The result is a run like training's: RUNS_DIR/RUN_NAME/model.pt (the registry's layout, the
members' weights inside), run.json (written last: a summary means it is complete) and an MLflow
run with the model logged, so scoring, evaluation, the Model Registry and ``mlflow models serve``
take it as any trained model. It trains nothing, needs no Ray, and runs in this process.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a script (python experiment/ensemble.py)
    _root = str(Path(__file__).resolve().parents[1])
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent]
    sys.path.insert(0, _root)

import argparse
import io
import itertools
import json
import time
from dataclasses import asdict, dataclass

import torch

from evaluation.model_source import ModelSource, load_source
from evaluation.tables import fmt_point
from experiment.records import read_json
from models.ensemble import Ensemble, standardised
from models.registry import save
from prepared import schema as S
from prepared.errors import UsageError
from prepared.protocol import TOP_K
from prepared.reader import Prepared, open_prepared
from prepared.uri import absolute, filesystem, join
from runtime.atomic import write_bytes
from runtime.cli import add_options, option, strict_parser, values
from runtime.progress import EVERY, duration
from runtime.runs import MODEL_FILE, RUN_RECORD, finished_record, summary_line
from training.closed_form import SCORE_USERS, read_rows
from training.feed import valid_batch
from training.validate import batch_metrics

CHOICES = ("valid", "all")
MAX_MEMBERS = 8  # 255 subsets, each scored on every validation user


@dataclass(frozen=True)
class EnsembleConfig:
    """experiment/ensemble.py's flags (``runtime.cli``)."""

    members: tuple[str, ...] = option(
        metavar="MODEL", help="the trained models: run directories, model.pt files or MLflow "
                              "model URIs (runs:/RUN_ID/model, models:/NAME@ALIAS), all trained "
                              "on --data")
    data: str = option(help="the prepared directory the members were trained on")
    run_name: str = option(help="names the ensemble's run directory and its MLflow run")
    choose: str = option("valid", choices=CHOICES,
                         help="valid: the subset of --members with the best validation NDCG "
                              "(members trained on train only); all: every member, for finals "
                              "retrained on train+valid whose subset was chosen among their trials")
    runs_dir: str = option("var/runs", help="the folder of runs: the ensemble goes to "
                                            "RUNS_DIR/RUN_NAME (absolute path or URI)")
    experiment: str = option("", show_default=False,
                             help="MLflow experiment (default: the dataset)")
    mlflow_uri: str | None = option(None, help="tracking server (default: MLFLOW_TRACKING_URI, "
                                               "else ./mlflow/state)")
    overwrite: bool = option(False, help="replace an existing run of this name")


def check_members(sources: list[ModelSource], prep: Prepared, choose: str) -> str:
    """The members' common training splits, once each member is known to score ``prep``'s
    catalogue and the splits allow ``choose``."""
    for src in sources:
        if src.model == Ensemble.name:
            raise UsageError(f"--members {src.uri}: an ensemble; pass its members instead")
        if src.n_items != prep.n_items:
            raise UsageError(f"--members {src.uri}: it scores {src.n_items:,} items, --data "
                             f"{prep.uri} has {prep.n_items:,}; pass models trained on --data")
    splits = {src.train_splits for src in sources}
    if len(splits) > 1:
        by = ", ".join(f"{s.uri}: {s.train_splits}" for s in sources)
        raise UsageError(f"--members were trained on different splits ({by}); an ensemble's "
                         "members read one input (scoring gives them the same rows): pass the "
                         "trials (train) or the finals (train,valid), not both")
    split = splits.pop()
    if choose == "valid" and split != "train":
        raise UsageError(f"--members were retrained on {split}: validation cannot choose among "
                         "models that have seen it. Choose among their trials (trained on train) "
                         "with --choose valid, then pass the chosen members' finals with "
                         "--choose all")
    return split


@torch.no_grad()
def subset_metrics(models: list, rows, subsets: list[tuple[int, ...]],
                   every: float = EVERY) -> dict:
    """{subset: (mean NDCG, mean Recall@50, users)} of each subset's ensemble on the validation
    users of ``rows``: each member scores a block of users once, its rows standardised, and
    every subset sums its members' (what ``Ensemble.score`` computes, in the same order). A
    progress line every ``every`` seconds."""
    sums = {s: [0.0, 0.0] for s in subsets}
    users = 0
    t0 = last = time.perf_counter()
    for lo in range(0, rows.num_rows, SCORE_USERS):
        if (now := time.perf_counter()) - last >= every:
            rate = lo / (now - t0)
            print(f"validation: {lo:,}/{rows.num_rows:,} users, {rate:,.0f} users/s, "
                  f"~{duration((rows.num_rows - lo) / rate)} left", flush=True)
            last = now
        vb = valid_batch(rows.slice(lo, SCORE_USERS), 0, 1)
        if vb is None:
            continue
        scores = [standardised(m.score(vb.train_items, vb.train_offsets)) for m in models]
        for s in subsets:
            total = scores[s[0]].clone()
            for i in s[1:]:
                total += scores[i]
            ndcg, recall = batch_metrics(total, vb)
            sums[s][0] += float(ndcg.sum())
            sums[s][1] += float(recall.sum())
        users += len(vb)
    if not users:
        raise UsageError("no warm user has a validation item: nothing to choose on; pass "
                         "--choose all")
    return {s: (n / users, r / users, users) for s, (n, r) in sums.items()}


def ranked(metrics: dict) -> list[tuple[int, ...]]:
    """The subsets by validation NDCG, best first; a tie goes to fewer members, then to the
    members given first. The first is the choice."""
    return sorted(metrics, key=lambda s: (-metrics[s][0], len(s), s))


def subsets_table(metrics: dict, labels: list[str], chosen: tuple[int, ...]) -> str:
    """Markdown: every subset scored, best first, the chosen one marked."""
    lines = [f"| members | validation NDCG | Recall@{TOP_K} | |", "|---|---|---|---|"]
    for s in ranked(metrics):
        mark = "chosen" if s == chosen else ""
        lines.append(f"| {' + '.join(labels[i] for i in s)} | {metrics[s][0]:.4f} | "
                     f"{metrics[s][1]:.4f} | {mark} |")
    return "\n".join(lines)


def log_to_mlflow(cfg: EnsembleConfig, prep: Prepared, model: Ensemble, state: dict,
                  summary: dict, table: str, split: str, chosen: list[ModelSource],
                  tags: dict[str, str]) -> tuple:
    """(run id, tracking URI, model URI) of the ensemble's MLflow run: params naming the chosen
    members and their runs, the validation figures, the subsets' table and the model (the layout
    training logs, so a service or scoring loads it the same way)."""
    from runtime import tracking

    uri = tracking.tracking_uri(cfg.mlflow_uri)
    tracking.check_reachable(uri)
    run_id = tracking.open_run(uri, cfg.experiment or prep.dataset, cfg.run_name, None,
                               tags={"dataset": prep.dataset, "model": Ensemble.name,
                                     "train_splits": split, **tags})
    tracking.log_params(uri, run_id, {
        "model": Ensemble.name, "choose": cfg.choose, "data": prep.uri,
        "candidates": json.dumps(list(cfg.members)), "n_members": len(chosen),
        **{f"member_{i}": src.uri for i, src in enumerate(chosen)},
        **{f"member_{i}_run": src.run_id for i, src in enumerate(chosen) if src.run_id}})
    title = f"{model.name} of {len(model.members)} on {prep.dataset}"
    tracking.describe_run(uri, run_id, title, summary)
    if table:
        tracking.log_text(uri, run_id, table + "\n", "subsets.md")
    model_uri = tracking.log_trained(
        uri, run_id, state_dict=state, item_ids=prep.item_ids(), model=Ensemble.name,
        model_args=model.model_args(), model_info={"train_splits": split},
        manifest=prep.manifest, history=[],
        summary={k: v for k, v in summary.items() if isinstance(v, int | float)}, title=title)
    return run_id, uri, model_uri


def assemble(cfg: EnsembleConfig, tags: dict[str, str] | None = None) -> dict:
    """Check, choose, write the run directory (model.pt, then run.json last), log to MLflow (its
    run tagged with ``tags`` too); returns the run's summary."""
    t0 = time.perf_counter()
    if not cfg.members:
        raise UsageError("--members: name at least one trained model")
    if len(cfg.members) > MAX_MEMBERS:
        raise UsageError(f"--members: {len(cfg.members)} models; at most {MAX_MEMBERS} (every "
                         "subset is scored on validation): pass the strongest few")
    if len(set(cfg.members)) != len(cfg.members):
        raise UsageError("--members: a model is named twice; name each once")
    run_dir = join(absolute(cfg.runs_dir), cfg.run_name)
    fs, path = filesystem(join(run_dir, RUN_RECORD))
    if fs.get_file_info(path).type.name != "NotFound" and not cfg.overwrite:
        raise UsageError(f"{run_dir} exists already; choose another --run-name or pass "
                         "--overwrite to replace it")
    from runtime import tracking

    tracking.check_reachable(tracking.tracking_uri(cfg.mlflow_uri))  # before minutes of scoring
    prep = open_prepared(cfg.data)
    sources = [load_source(m, cfg.mlflow_uri) for m in cfg.members]
    split = check_members(sources, prep, cfg.choose)
    models = [src.build() for src in sources]
    labels = [src.name for src in sources]
    metrics, table = {}, ""
    if split == "train":  # validation is unseen by every member: measure every subset on it
        every = range(len(models))
        subsets = [tuple(every)] if cfg.choose == "all" else [
            s for r in range(1, len(models) + 1) for s in itertools.combinations(every, r)]
        rows = read_rows(prep, [S.USER_INDEX, S.TRAIN_ITEMS, S.VALID_ITEMS])
        print(f"scoring {len(subsets)} subset(s) of {len(models)} members on the validation "
              f"users of {rows.num_rows:,} warm users", flush=True)
        metrics = subset_metrics(models, rows, subsets)
    chosen = ranked(metrics)[0] if metrics else tuple(range(len(models)))
    if metrics:
        table = subsets_table(metrics, labels, chosen)
        print(table, flush=True)
    model = Ensemble([models[i] for i in chosen]).eval()
    best = metrics.get(chosen, (None, None, 0))
    summary = {"best_valid_ndcg": best[0], "best_valid_recall_at_50": best[1],
               "valid_users": best[2], "best_epoch": 0, "epochs_run": 0,
               "members": [cfg.members[i] for i in chosen],
               "wall_seconds": round(time.perf_counter() - t0, 1)}
    saved = save(model, config={**asdict(cfg), "model": Ensemble.name, "train_splits": split},
                 summary=summary, history=[])
    buf = io.BytesIO()
    torch.save(saved, buf)
    write_bytes(join(run_dir, MODEL_FILE), buf.getvalue())
    run_id, uri, model_uri = log_to_mlflow(cfg, prep, model, saved["state_dict"], summary,
                                           table, split, [sources[i] for i in chosen],
                                           tags or {})
    summary = {**summary, "model_path": join(run_dir, MODEL_FILE), "model_uri": model_uri,
               "mlflow_run_id": run_id, "mlflow_uri": uri, "run_name": cfg.run_name}
    record = {"mlflow_run_id": run_id, "mlflow_uri": uri, "config": asdict(cfg)}
    write_bytes(join(run_dir, RUN_RECORD), json.dumps(finished_record(record, summary),
                                                      indent=2).encode())
    return summary


def assembled(cfg: EnsembleConfig, tags: dict[str, str]) -> dict:
    """``assemble``'s summary, or that of the run already assembled under this name from the same
    candidates the same way (a resumed experiment does not redo it)."""
    record = read_json(Path(absolute(cfg.runs_dir)) / cfg.run_name / RUN_RECORD) or {}
    done = record.get("config", {})
    if record.get("summary") and list(done.get("members", ())) == list(cfg.members) \
            and done.get("choose") == cfg.choose:
        return record["summary"]
    return assemble(cfg, tags)


def candidates(state: dict, models: list[str], top: int) -> list[tuple[str, str, dict]]:
    """(label, model, point) of each of ``models``' ``top`` best trials on validation: its
    chosen trial first, labelled MODEL, then its other trials by validation NDCG, labelled
    MODEL#2, MODEL#3, ... (the first of equals first, as the selection ranks them)."""
    out = []
    for m in models:
        chosen = state["models"][m]["chosen"]
        others = sorted((r for r in chosen["all"] if r["point"] != chosen["point"]),
                        key=lambda r: -r["valid_ndcg"])
        out.append((m, m, chosen["point"]))
        out += [(f"{m}#{i}", m, r["point"]) for i, r in enumerate(others[:top - 1], start=2)]
    return out


def experiment_stage(cfg, root: Path, state: dict, points: dict[str, list[dict]],
                     prep: Prepared, uri: str, ray_address: str | None) -> dict:
    """experiment/run.py's ``--ensemble``: the subset of the candidates (``candidates``: each
    model's chosen trial, and with --ensemble-top K its next K - 1) that is best on validation
    (run ``trials/ensemble``), then per seed the same candidates' finals (runs
    ``final/ensemble-final[-seedS]``), each an MLflow run under the experiment's. A chosen
    candidate that is not its model's choice is retrained on train+valid per seed first
    (``final/TRIAL-final[-seedS]``, under its model's MLflow run). Returns the entry the scoring
    and the table read as a model's (``chosen``, ``finals``, ``final``)."""
    from experiment.grids import point_name
    from experiment.selection import final_name, final_seeds, select, train_finals
    from experiment.state import PARENT

    models = cfg.ensemble_list()
    cands = candidates(state, models, cfg.ensemble_top)
    trials = {label: str(root / "trials" / point_name(m, point)) for label, m, point in cands}
    common = {"data": cfg.data, "experiment": cfg.name, "mlflow_uri": state["mlflow_uri"],
              "overwrite": True}
    tags = {PARENT: state["run_id"], "model": Ensemble.name}
    print(f"\n== ensemble of {', '.join(trials)}: every subset of their trials on validation",
          flush=True)
    choice = assembled(EnsembleConfig(members=tuple(trials.values()), run_name=Ensemble.name,
                                      choose="valid", runs_dir=str(root / "trials"), **common),
                       {**tags, "kind": "trial"})
    chosen = [c for c in cands if trials[c[0]] in choice["members"]]
    finals_of = {}
    for label, m, point in chosen:
        s = state["models"][m]
        if label == m:  # the model's own choice: its finals ran in stage 3
            finals_of[label] = s["finals"]
            continue
        print(f"\n== {label} ({fmt_point(point)}), a member of the ensemble: ", end="",
              flush=True)
        finals_of[label] = train_finals(cfg, root, m, select(root, m, points[m], point), state,
                                        prep, uri, ray_address, {PARENT: s["run_id"]},
                                        name=point_name(m, point))
    labels = [label for label, _, _ in chosen]
    finals = {}
    for seed in final_seeds(cfg):
        paths = tuple(finals_of[label][str(seed)]["model_path"] for label in labels)
        finals[str(seed)] = assembled(
            EnsembleConfig(members=paths, run_name=final_name(Ensemble.name, seed, cfg.seed),
                           choose="all", runs_dir=str(root / "final"), **common),
            {**tags, "kind": "final", "seed": str(seed)})
    print(f"== ensemble: {' + '.join(labels)} (validation NDCG {choice['best_valid_ndcg']:.4f})",
          flush=True)
    return {"run_id": state["run_id"], "members": labels,
            "candidates": {label: Path(t).name for label, t in trials.items()},
            "chosen": {"point": {"members": "+".join(labels)},
                       "valid_ndcg": choice["best_valid_ndcg"],
                       "valid_recall_at_50": choice["best_valid_recall_at_50"],
                       "best_epoch": 0, "trial": Ensemble.name, "trials": 2 ** len(cands) - 1,
                       "search_seconds": choice["wall_seconds"]},
            "finals": finals, "final": finals[str(cfg.seed)]}


def build_parser() -> argparse.ArgumentParser:
    p = strict_parser(prog="experiment/ensemble.py", description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.RawDescriptionHelpFormatter,
                      epilog=__doc__.split("\n\n", 1)[1])
    add_options(p, EnsembleConfig)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        cfg = EnsembleConfig(**values(args, EnsembleConfig))
        summary = assemble(cfg)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    chosen = ", ".join(summary["members"])
    where = f"; validation NDCG {summary['best_valid_ndcg']:.4f}" \
        if summary["best_valid_ndcg"] is not None else ""
    print(f"ensemble {cfg.run_name}: {chosen}{where}; model {summary['model_path']}, MLflow "
          f"{summary['model_uri']}", flush=True)
    print(summary_line(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
