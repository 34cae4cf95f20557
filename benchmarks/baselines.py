"""The closed-form baselines on real data, by the paper's protocol: a small grid on validation,
the chosen configuration refitted from scratch on train+valid, NDCG on test with its 95% CI.

    .venv/bin/python benchmarks/baselines.py [--shared ../shared/datasets] [--datasets ml-100k,...]
                                             [--models bpr,cml,...]

A run updates the committed results in place: the rows it measures replace theirs (each row keeps
the command and date that produced it), every other row stays, so a new model joins the table
without rerunning the others.

Each dataset is prepared by the real ETL under ``spark-submit etl/prepare.py`` (ml-100k and
citeulike-a from ../shared, never copied here; ml-latest-small from data/). WRMF fits on a local
Spark through training/train.py's own Spark path (MLlib ALS). AutoRec and
NCE-AutoRec train in this process with the trainer's own steps and early stopping
(``benchmarks/tune_defaults.py``), the retraining for the chosen epoch count. Each closed-form model is fitted
through the same code as ``training/train.py``'s closed-form path (``training.closed_form``: the
training matrices, the model's ``fit``, the validation NDCG), in this process, without Ray, so the
grid costs seconds per point. Test: the refitted model scores the warm users with a test item from
their train+valid rows, train+valid items excluded, top 50, NDCG by ``prepared.metrics`` (the
code evaluate.py's test checks against). The experiment runner of a later issue replaces this
grid with the full protocol for every model.

Results: ``benchmarks/results/baselines.{json,md}``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks import report  # noqa: E402
from prepared import schema as S  # noqa: E402
from prepared.metrics import hit_matrix, per_user  # noqa: E402
from infra.submit import spark_submit  # noqa: E402
from models.batch import flat, sparse_rows  # noqa: E402
from models.registry import MODELS  # noqa: E402
from training.closed_form import matrices, read_rows, validate  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from prepared.reader import open_prepared  # noqa: E402

DATASETS = {  # name -> (ETL --dataset, input path relative to --shared, or to the repo for data/)
    "ml-100k": ("ml-100k", "shared:ml-100k/u.data"),
    "ml-latest-small": ("ml-latest-small", "repo:data/ml-latest-small/ratings.csv"),
    "citeulike-a": ("citeulike-a", "shared:citeulike-a/users.dat"),
}
GRIDS = {
    # the AutoRec family at its training defaults (width 200, lr 3e-4, batch 128, joint mode,
    # early stopping) over lambda: the shared default (30) collapses on sparse data
    "autorec": {"lam": [0.3, 3.0, 30.0]},
    "nce-autorec": {"lam": [0.3, 3.0, 30.0]},
    "popularity": {},
    "puresvd": {"rank": [5, 10, 20, 50, 100]},
    "nce-plrec": {"rank": [20, 50, 100, 200], "lam": [100.0, 1000.0, 10000.0, 100000.0]},
    "ease": {"lam": [10.0, 50.0, 100.0, 200.0, 500.0, 1000.0, 2000.0]},
    "wrmf": {"rank": [50, 100], "alpha": [5.0, 20.0], "lam": [0.01, 0.1]},
    # the gradient baselines at their defaults (each model's own lr, early stopping) over the
    # setting each is most sensitive to
    # (the KL weight is min(kl_cap, updates / anneal_steps): on a small set the cap is reached
    # only with a short anneal, so both move together)
    "vae-cf": {"kl_cap": [0.0, 0.2, 1.0], "anneal_steps": [200, 2000]},
    "cdae": {"lam": [0.1, 1.0]},
    "bpr": {"width": [64, 128], "lam": [1e-5, 1e-4, 1e-3]},
    "cml": {"margin": [0.5, 1.0], "cov_weight": [0.0, 1.0]},
}

# citeulike-a's 17k items make every EASE fit (a 17k x 17k inverse) and every AutoRec epoch costly on
# 2 cores: a narrower grid there, over the range the denser sets chose and the small lambdas that
# sparse data needs (the AutoRec family's shared default collapses on it)
OVERRIDES = {"citeulike-a": {
    "autorec": None,       # None: not run here (--with-autorec-on-citeulike runs lambda 0.3 and 3)
    "nce-autorec": None,
    "nce-plrec": {"rank": [50, 100, 200], "lam": [1000.0, 10000.0]},
    "ease": {"lam": [100.0, 500.0, 2000.0]},
    "wrmf": {"rank": [50, 100], "alpha": [5.0, 20.0], "lam": [0.01]},
    # the gradient baselines train a vector per user (5.3k here) and fold every validation user
    # in every epoch (most of a run, even gathered: benchmarks/results/fold_in_speed.md): the
    # point ml-100k and ml-latest-small agreed on (VAE-CF also without KL; BPR, whose choice was
    # its grid's corner, also a decade less lambda)
    "vae-cf": {"kl_cap": [0.0, 0.2], "anneal_steps": [200]},
    "cdae": {"lam": [0.1]},
    "bpr": {"width": [128], "lam": [1e-4, 1e-3]},
    "cml": {"margin": [1.0], "cov_weight": [0.0]},
}}


CITEULIKE_AUTOREC = {"lam": [0.3, 3.0]}  # the AutoRec family there, with --with-autorec-on-citeulike


def points(grid: dict) -> list[dict]:
    keys = sorted(grid)
    return [dict(zip(keys, values)) for values in itertools.product(*(grid[k] for k in keys))]


def fit(prep, cfg: TrainConfig, rows, table=None, valid=None):
    """(model, seconds, best epoch): a closed-form fit, or gradient training in this process
    (benchmarks/tune_defaults.py's loop: the trainer's steps, early stopping on ``valid``)."""
    if MODELS[cfg.model].kind == "gradient":
        from benchmarks.tune_defaults import train_one

        r = train_one(cfg, prep, table, valid)
        return r["net"], r["seconds"], r["best_epoch"], r["best_ndcg"]
    if MODELS[cfg.model].engine == "spark":  # training/train.py's own Spark path (local Spark)
        from models.registry import build
        from training.closed_form import fit_on_spark

        summary, history, state, args = fit_on_spark(cfg, prep)
        model = build(cfg.model, args)
        model.load_state_dict(state)
        return model.eval(), history[0]["train_seconds"], 1, summary["best_valid_ndcg"]
    train, rstar = matrices(prep, cfg, rows)
    torch.manual_seed(cfg.seed)
    model = MODELS[cfg.model].from_config(prep.n_items, cfg.hyperparameters())
    t0 = time.perf_counter()
    model.fit(train, rstar, seed=cfg.seed)
    return model.eval(), time.perf_counter() - t0, 1, None


@torch.no_grad()
def test_ndcg(model, rows) -> tuple[float, float, int]:
    """(mean, 95% CI half-width, users) of test NDCG: input train+valid, those excluded, top 50."""
    train, t_off = flat(rows.column(S.TRAIN_ITEMS))
    valid, v_off = flat(rows.column(S.VALID_ITEMS))
    test, x_off = flat(rows.column(S.TEST_ITEMS))
    ends = lambda off, n: np.append(off[1:], n)
    inputs, truth = [], []
    for a, b, c, d, e, f in zip(t_off, ends(t_off, len(train)), v_off, ends(v_off, len(valid)),
                                x_off, ends(x_off, len(test))):
        if f > e:
            inputs.append(np.concatenate([train[a:b], valid[c:d]]))
            truth.append(test[e:f])
    recs = []
    for lo in range(0, len(inputs), 1024):
        items, offsets = sparse_rows(inputs[lo:lo + 1024])
        recs.append(model.recommend(items, offsets, 50)[1].numpy())
    ndcg = per_user(hit_matrix(np.concatenate(recs), truth), np.array([len(t) for t in truth]))["NDCG"]
    return float(ndcg.mean()), float(1.96 * ndcg.std() / np.sqrt(len(ndcg))), len(ndcg)


def prepare(name: str, shared: Path, work: Path) -> Path:
    dataset, source = DATASETS[name]
    base, rel = source.split(":", 1)
    raw = (shared if base == "shared" else ROOT) / rel
    out = work / name
    cmd, env = spark_submit("etl/prepare.py", "--dataset", dataset, "--input", str(raw),
                            "--output", str(out), "--quiet", master="local[2]", driver_memory="3g")
    subprocess.run(cmd, env=env, cwd=ROOT, check=True)
    return out


def run_dataset(name: str, prepared: Path, models: list[str], stamp: dict) -> dict:
    prep = open_prepared(str(prepared))
    rows = read_rows(prep, [S.USER_INDEX, S.TRAIN_ITEMS, S.VALID_ITEMS, S.TEST_ITEMS])
    from benchmarks.tune_defaults import load

    _, table, valid = load(str(prepared))  # every column: what the gradient models' batches read
    out = {"users": rows.num_rows, "items": prep.n_items, "models": {}}
    for model in models:
        grid = OVERRIDES.get(name, {}).get(model, GRIDS[model])
        if grid is None:
            print(f"{name} {model}: skipped (see OVERRIDES)", flush=True)
            continue
        out.setdefault("grids", {})[model] = grid
        tried = []
        for hp in points(grid):
            cfg = TrainConfig(data=str(prepared), model=model, **hp)
            net, seconds, epoch, ndcg = fit(prep, cfg, rows, table, valid)
            if ndcg is None:
                ndcg, _, _ = validate(net, rows)
            tried.append({"hp": hp, "valid_ndcg": ndcg, "fit_seconds": seconds, "epochs": epoch})
            print(f"{name} {model} {hp}: validation NDCG {ndcg:.4f} (epoch {epoch}, {seconds:.1f}s)",
                  flush=True)
        best = max(tried, key=lambda t: t["valid_ndcg"])
        cfg = TrainConfig(data=str(prepared), model=model, train_splits="train,valid",
                          epochs=best["epochs"], **best["hp"])
        net, seconds, _, _ = fit(prep, cfg, rows, table, None)
        ndcg, ci, users = test_ndcg(net, rows)
        print(f"{name} {model} {best['hp']}: test NDCG {ndcg:.4f} ± {ci:.4f} ({users} users)",
              flush=True)
        out["models"][model] = {"best": best, "grid": tried, "test_ndcg": ndcg, "test_ci95": ci,
                                "test_users": users, "refit_seconds": seconds, **stamp}
    return out


def previous(out: Path) -> dict:
    """The committed results, each row stamped with the command and date that produced it."""
    path = out.with_suffix(".json")
    if not path.exists():
        return {}
    old = json.loads(path.read_text())
    for r in old["results"].values():
        for v in r["models"].values():
            v.setdefault("command", old.get("command", "?"))
            v.setdefault("date", old.get("date", "?"))
            v.setdefault("machine", old.get("machine", "?"))
    return old["results"]


def merge(results: dict, name: str, new: dict) -> None:
    into = results.setdefault(name, {"models": {}, "grids": {}})
    into.update(users=new["users"], items=new["items"])
    into["models"].update(new["models"])
    into.setdefault("grids", {}).update(new.get("grids", {}))


def write(results: dict, args) -> None:
    rows = [v for r in results.values() for v in r["models"].values()]
    commands = sorted({(v["command"], v["machine"], v["date"]) for v in rows})
    lines = ["# Baselines and the AutoRec family by the protocol: validation-chosen, retrained on "
             "train+valid, tested\n",
             "Produced by (each row by one of these; the JSON names which):\n",
             *[f"- `{c}` on {m}, {d}" for c, m, d in commands], "",
             "Protocol: the grid below on validation NDCG (model fitted on train), the best point "
             "refitted from scratch on train+valid, test NDCG (top 50, train+valid excluded, "
             "warm users with a test item) with its 95% CI. Fit time: the refit, one process "
             "(the AutoRec family: the retraining for the chosen epoch count); '-' where it was not "
             "recorded (rows whose JSON has a note).\n"]
    for name, r in results.items():
        lines += [f"## {name} ({r['users']:,} warm users, {r['items']:,} items)\n",
                  "| model | chosen | epochs | valid NDCG | test NDCG (95% CI) | fit s |",
                  "|---|---|---|---|---|---|"]
        ranked = sorted(r["models"].items(), key=lambda kv: -kv[1]["test_ndcg"])
        for m, v in ranked:
            hp = ", ".join(f"{k} {x:g}" for k, x in v["best"]["hp"].items()) or "-"
            epochs = v["best"]["epochs"] if MODELS[m].kind == "gradient" else "-"
            seconds = "-" if v["refit_seconds"] is None else f"{v['refit_seconds']:.1f}"
            lines.append(f"| {m} | {hp} | {epochs} | {v['best']['valid_ndcg']:.4f} | {v['test_ndcg']:.4f} ± "
                         f"{v['test_ci95']:.4f} | {seconds} |")
        lines.append("")
    lines.append("Grids: " + "; ".join(f"{m}: {g or 'none'}" for m, g in GRIDS.items()))
    lines.append("\nOn citeulike-a: " + "; ".join(f"{m}: {g if g is not None else CITEULIKE_AUTOREC}"
                                                 for m, g in OVERRIDES["citeulike-a"].items()))
    report.publish(Path(args.out), {"grids": GRIDS, "results": results}, lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", default=str(ROOT.parent / "shared" / "datasets"))
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "baselines"))
    p.add_argument("--models", default=",".join(GRIDS),
                   help="the models to measure; the other rows of the committed table stay")
    p.add_argument("--with-autorec-on-citeulike", action="store_true",
                   help="also train AutoRec and NCE-AutoRec on citeulike-a (about 25 more minutes "
                        "on 2 cores)")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite the .md from the committed .json without measuring")
    args = p.parse_args(argv)
    if args.report_only:
        write(previous(Path(args.out)), args)
        return 0
    torch.set_num_threads(os.cpu_count() or 1)
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="baselines-", dir=ROOT / "var"))
    models = args.models.split(",")
    unknown = sorted(set(models) - set(GRIDS))
    if unknown:
        p.error(f"--models: no grid for {', '.join(unknown)}; known: {', '.join(GRIDS)}")
    stamp = {"command": "python benchmarks/baselines.py " + " ".join(sys.argv[1:] if argv is None
                                                                       else argv),
             "machine": f"{platform.node()}, {os.cpu_count()} cores",
             "date": time.strftime("%Y-%m-%d")}
    results = previous(Path(args.out))
    if args.with_autorec_on_citeulike:
        OVERRIDES["citeulike-a"].update({m: CITEULIKE_AUTOREC for m in ("autorec", "nce-autorec")})
    for name in args.datasets.split(","):
        merge(results, name, run_dataset(name, prepare(name, Path(args.shared), work), models, stamp))
        write(results, args)  # after each dataset: a long run that stops keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
