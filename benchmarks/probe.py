"""One configuration trained in this process, its validation curve and LightGCN's metrics on valid.

    .venv/bin/python benchmarks/probe.py --data DIR model=nce-autorec width=500 pos_weight=10 \
        epochs=20 patience=3 valid_sample=0.3 [--out probes.jsonl]

A probe sizes a search before it runs (issue 57: which lever moves validation on a new set, and
what an epoch costs): any ``training/train.py`` field as KEY=VALUE (hyperparameters included),
trained through the trainer's own epochs in one process without Ray (``tune_defaults.train_one``:
the maths of a one-worker Ray run); a closed form (nce-plrec, ease, puresvd, popularity) is
fitted in this process on the train split, as its Ray task would. Printed, one JSON line: the
configuration, the best validation NDCG (the trainer's, on ``valid_sample`` of the users) and
its epoch, the seconds, the curve, and Recall@20 and NDCG@20 (truncated: LightGCN's, over
min(|T|, 20)) of the model as it is at the end, on every validation user. Validation only: a
probe never reads test.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from benchmarks.tune_defaults import load, train_one  # noqa: E402
from evaluation.spark_metrics import metric_arrays  # noqa: E402
from training.config import TrainConfig, data_shape, with_preset  # noqa: E402

K = 20
BLOCK = 2048  # users scored at once


def user_metrics(top: np.ndarray, truth: list[set], k: int) -> dict[str, np.ndarray]:
    """Evaluation's own per-user metrics (``metric_arrays``; k one of ``prepared.protocol.KS``)
    of the ranked lists ``top`` (users, k) against each user's non-empty ``truth``."""
    hits = np.array([[i in t for i in row[:k]] for row, t in zip(top, truth)], dtype=np.float64)
    with np.errstate(divide="ignore"):  # its 1 / log2(1) at rank 0, never read
        return metric_arrays(hits, np.array([len(t) for t in truth], dtype=np.float64), k)


def at_k(top: np.ndarray, truth: list[set], k: int = K) -> tuple[float, float]:
    """Mean Recall@k and truncated NDCG@k (``user_metrics``')."""
    m = user_metrics(top, truth, k)
    return float(m[f"Recall@{k}"].mean()), float(m[f"NDCG@{k} (truncated)"].mean())


def valid_metrics(net, valid, k: int = K) -> tuple[float, float]:
    """``at_k`` of ``net``'s top-k (training items left out) on every user of ``valid``
    (``training.feed.ValidBatch``: offsets are each user's start)."""
    starts = valid.train_offsets.numpy()
    ends = np.append(starts[1:], len(valid.train_items))
    v_starts = valid.valid_offsets.numpy()
    v_ends = np.append(v_starts[1:], len(valid.valid_items))
    v_items = valid.valid_items.numpy()
    tops, truth = [], []
    for s in range(0, len(starts), BLOCK):
        e = min(s + BLOCK, len(starts))
        items = valid.train_items[starts[s]:ends[e - 1]]
        with torch.no_grad():
            _, top = net.recommend(items, valid.train_offsets[s:e] - starts[s], k)
        tops.append(top.numpy())
        truth += [set(v_items[a:b].tolist()) for a, b in zip(v_starts[s:e], v_ends[s:e])]
    return at_k(np.concatenate(tops), truth, k)


def fit_one(cfg: TrainConfig, prep, rows) -> dict:
    """A closed form fitted in this process on the train split (``training.closed_form``'s own
    matrices and validation), in ``train_one``'s shape."""
    from models.registry import MODELS
    from training.closed_form import matrices, validate

    cls = MODELS[cfg.model]
    if getattr(cls, "engine", None) == "spark":
        raise SystemExit(f"model={cfg.model}: it fits on Spark, not in this process; search it with "
                         "experiment/run.py")
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    model = cls.from_config(prep.n_items, cfg.hyperparameters())
    info = model.fit(*matrices(prep, cfg, rows), seed=cfg.seed)
    fit_s = time.perf_counter() - t0
    ndcg, _, _ = validate(model.eval(), rows, cfg.valid_sample)
    return {"net": model, "best_ndcg": ndcg, "best_epoch": 1, "epochs": 1,
            "curve": [(fit_s, ndcg)], "info": info}


def parse(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise SystemExit(f"{pair!r}: give settings as KEY=VALUE, e.g. width=500")
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a string: model=autorec, mode=joint
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="a prepared directory (etl/prepare.py --output)")
    p.add_argument("settings", nargs="*", help="training/train.py fields as KEY=VALUE")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: all)")
    p.add_argument("--out", help="also append the JSON line to this file")
    p.add_argument("--save", metavar="MODEL_PT",
                   help="also write the model as a model.pt (what evaluation/score.py, "
                        "experiment/ensemble.py and benchmarks/scoring_exact.py read): the "
                        "best validated epoch's weights, as a run's model.pt holds")
    args = p.parse_args(argv)
    settings = parse(args.settings)
    if args.threads:
        torch.set_num_threads(args.threads)
    prep, rows, valid = load(args.data)
    first = {k: settings.pop(k) for k in ("model", "batch_size") if k in settings}
    cfg = replace(TrainConfig(data=args.data, **first), **settings)
    said = ""
    if cfg.preset is not None:  # as train.py applies it: under the settings given
        resolved, said = with_preset(cfg.to_dict(), frozenset(settings) | frozenset(first),
                                     data_shape(prep))
        cfg = TrainConfig(**resolved)
        print(said, file=sys.stderr, flush=True)
    t0 = time.perf_counter()
    from models.registry import MODELS

    closed = MODELS[cfg.model].kind == "closed-form"
    r = fit_one(cfg, prep, rows) if closed else train_one(cfg, prep, rows, valid)
    recall, ndcg = valid_metrics(r["net"], valid)
    line = json.dumps({"data": prep.dataset, "settings": {**first, **settings},
                       **({"preset": said} if said else {}),
                       "best_valid_ndcg": round(r["best_ndcg"], 4), "best_epoch": r["best_epoch"],
                       "epochs": r["epochs"], "seconds": round(time.perf_counter() - t0),
                       "curve": [(round(s), round(x, 4)) for s, x in r["curve"]],
                       f"valid_recall@{K}": round(recall, 4), f"valid_ndcg@{K}": round(ndcg, 4)})
    print(line, flush=True)
    if args.save:
        from models.registry import save
        from runtime.atomic import write_bytes

        # the best epoch's, not the last's, as a run's model.pt; a final retraining (train,valid)
        # keeps its last epoch, as the protocol's final does (its validation has seen the items)
        if r.get("best") is not None and not cfg.final_retraining:
            r["net"].load_state_dict(r["best"])
        buffer = io.BytesIO()
        # the splits it trained on, as a run's model.pt says them: scoring reads a final
        # (train,valid) with its validation items as input, never as candidates
        torch.save(save(r["net"], config={"model": cfg.model, "train_splits": cfg.train_splits}),
                   buffer)
        write_bytes(Path(args.save), buffer.getvalue())
    if args.out:
        with open(args.out, "a") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
