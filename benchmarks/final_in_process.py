"""A closed form's final in this process: fitted on train + valid, scored once on test.

    .venv/bin/python benchmarks/final_in_process.py --data DIR model=ease lam=150 \
        --out DIR2 [--paired EXPERIMENT/evaluation/per_user LABEL [LABEL ...]] [--reuse]

For a model the experiment's pipeline cannot carry on this machine: EASE's dense B on Gowalla
(6.3 GiB) would travel through Ray's object store, a checkpoint and every Spark executor. The
point is the one validation chose (``benchmarks/probe.py``'s lines; this script never chooses).
The model is fitted on each user's train + valid items, ranks every item with those left out,
and is scored on the user's test items, over every warm user with one: the paper's NDCG and
Recall@20 / NDCG@20 (truncated: LightGCN's) by evaluation's own per-user metrics, mean ± 95% CI
(1.96 sd / sqrt(users), as evaluation/evaluate.py). ``--out``: the per-user metrics as Parquet
and the summary as JSON. ``--paired``: an experiment's per-user metrics and one of its labels,
for the paired difference (this model minus that one) over the users both scored; several labels
(a model's seeds) are pooled as the experiment pools seeds. ``--reuse``: the pairs again from an
earlier run's per-user metrics, without a refit.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

from benchmarks.probe import BLOCK, parse, user_metrics  # noqa: E402
from benchmarks.tune_defaults import load  # noqa: E402
from models.batch import flat  # noqa: E402
from prepared import schema as S  # noqa: E402
from prepared.protocol import TOP_K  # noqa: E402
from training.config import TrainConfig  # noqa: E402
from training.feed import union_sorted  # noqa: E402

COLUMNS = {"ndcg": "NDCG", "recall_at_20": "Recall@20", "ndcg_at_20_truncated": "NDCG@20 (truncated)"}


def test_metrics(net, rows) -> pd.DataFrame:
    """Per warm user with a test item: ``COLUMNS``' metrics of ``net``'s top-``TOP_K`` from the
    user's train + valid items (those left out of the ranking), against the test items."""
    items, off = flat(rows.column(S.TRAIN_ITEMS))
    v_items, v_off = flat(rows.column(S.VALID_ITEMS))
    merged, m_off = union_sorted(items, off, v_items, v_off, rows.num_rows)
    t_items, t_off = flat(rows.column(S.TEST_ITEMS))
    t_end = np.append(t_off[1:], len(t_items))
    ids = rows.column(S.USER_ID).to_pylist()
    m_end = np.append(m_off[1:], len(merged))
    tops, truths, users = [], [], []
    for s in range(0, rows.num_rows, BLOCK):
        e = min(s + BLOCK, rows.num_rows)
        with torch.no_grad():
            _, top = net.recommend(torch.from_numpy(merged[m_off[s]:m_end[e - 1]].astype(np.int64)),
                                   torch.from_numpy(m_off[s:e] - m_off[s]), TOP_K)
        for u, row in zip(range(s, e), top.numpy()):
            truth = set(t_items[t_off[u]:t_end[u]].tolist())
            if truth:
                tops.append(row)
                truths.append(truth)
                users.append(ids[u])
    m = user_metrics(np.array(tops), truths, TOP_K)
    return pd.DataFrame({"user_id": users, **{c: m[name] for c, name in COLUMNS.items()}})


def summary(per_user: pd.DataFrame) -> dict:
    """Each metric's mean and 95% CI half-width over the users."""
    root = np.sqrt(len(per_user))
    return {c: {"mean": float(per_user[c].mean()), "ci95": float(1.96 * per_user[c].std(ddof=0) / root)}
            for c in COLUMNS}


def paired(per_user: pd.DataFrame, *others: pd.DataFrame) -> dict:
    """This model minus the other's per-user metrics (user_id and ``COLUMNS``), over the users
    every one scored. Several ``others`` are the other model's seeds: per user the mean over them
    of the difference, pooled as the experiment's table pools seeds (``evaluation.seeds``: the
    users' variance of the per-user seed means plus the seeds' variance of the per-seed means, a
    t quantile on Satterthwaite's degrees of freedom); one is evaluate.py's paired CI exactly."""
    from evaluation.seeds import pooled_interval

    j = per_user
    for s, other in enumerate(others):
        j = j.merge(other[["user_id", *COLUMNS]].rename(columns={c: f"{c}_{s}" for c in COLUMNS}),
                    on="user_id")
    out = {"users": len(j), "seeds": len(others)}
    for c in COLUMNS:
        d = pd.concat([j[c] - j[f"{c}_{s}"] for s in range(len(others))], axis=1)
        pooled = pooled_interval(d.mean().tolist(), float(d.mean(axis=1).var(ddof=0)), len(j))
        out[c] = {"mean": pooled["mean"], "ci95": pooled["ci95"]}
        if len(others) > 1:
            out[c]["per_seed"] = d.mean().tolist()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a prepared directory (etl/prepare.py --output)")
    p.add_argument("settings", nargs="*", help="training/train.py fields as KEY=VALUE (the model "
                                               "and the point validation chose)")
    p.add_argument("--out", required=True, help="a directory for per_user.parquet and final.json")
    p.add_argument("--paired", nargs="+", metavar="PER_USER LABEL",
                   help="an experiment's evaluation/per_user and one of its labels, or several "
                        "(one model's seeds, e.g. nce-autorec 'nce-autorec seed 1'): pooled")
    p.add_argument("--reuse", action="store_true",
                   help="take the model's per-user metrics from --out's per_user.parquet (an "
                        "earlier run of the same settings) instead of fitting again; the pairs "
                        "are computed anew")
    args = p.parse_args(argv)
    from models.registry import MODELS
    from training.closed_form import matrices

    settings = parse(args.settings)
    model_name = settings.pop("model", None)
    if model_name not in MODELS or MODELS[model_name].kind != "closed-form":
        raise SystemExit(f"model={model_name}: give a closed form, e.g. model=ease lam=150")
    if args.paired is not None and len(args.paired) < 2:
        raise SystemExit("--paired PER_USER LABEL [LABEL ...]: give the per-user folder and a label")
    saved = Path(args.out) / "final.json"
    if args.reuse:
        out = json.loads(saved.read_text())
        if out["settings"] != settings or out["model"] != model_name:
            raise SystemExit(f"--reuse: {saved} holds {out['model']} {out['settings']}, not "
                             f"{model_name} {settings}; drop --reuse to fit these settings")
        users = pd.read_parquet(Path(args.out) / "per_user.parquet")
    else:
        prep, rows, _ = load(args.data)
        cfg = TrainConfig(data=args.data, model=model_name, train_splits="train,valid", **settings)
        t0 = time.perf_counter()
        net = MODELS[model_name].from_config(prep.n_items, cfg.hyperparameters())
        info = net.fit(*matrices(prep, cfg, rows), seed=cfg.seed)
        fit_s = time.perf_counter() - t0
        users = test_metrics(net.eval(), rows)
        out = {"data": prep.dataset, "model": model_name, "settings": settings, "fit": info,
               "fit_seconds": round(fit_s), "users": len(users), "test": summary(users)}
    if args.paired:
        table = pd.read_parquet(args.paired[0])
        others = []
        for label in args.paired[1:]:
            other = table[(table["label"] == label) & (table["group"] == "warm")]
            if other.empty:
                raise SystemExit(f"--paired: no warm users labelled {label!r} in {args.paired[0]} "
                                 f"(labels: {', '.join(sorted(table['label'].unique()))})")
            others.append(other)
        out["paired"] = {"label": " + ".join(args.paired[1:]), **paired(users, *others)}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    users.to_parquet(Path(args.out) / "per_user.parquet")
    (Path(args.out) / "final.json").write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
