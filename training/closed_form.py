"""Training of a closed-form model (``Recommender.kind == "closed-form"``): one Ray task reads the
warm users' rows, builds the training matrix, calls the model's ``fit`` and scores the validation
users exactly as the gradient loop does (``training.validate``), so both kinds report the same
validation NDCG and Recall@50 and return the same (summary, history, weights, arguments).

The task asks Ray for the CPUs the run would give its workers, so on a cluster it runs where they
are, not on the head that runs the driver. A model whose engine is Spark (WRMF on MLlib's ALS) is
fitted in the run's Spark session instead (``fit_on_spark``: ``spark-submit training/train.py``),
and validated the same way.
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow.dataset as pds
import torch

from models.batch import flat, to_csr
from models.registry import MODELS
from prepared import schema as S
from prepared.protocol import head_items
from prepared.uri import filesystem
from runtime import raycluster
from training.config import TrainConfig
from training.feed import in_valid_sample, union_sorted, valid_batch
from training.validate import head_mask, validation_sums

SCORE_USERS = 1024  # validation users scored at once: 1024 x n_items float32


def read_rows(prep, columns: list[str]):
    """The warm users' rows (a pyarrow Table with ``columns``), from local storage or a URI."""
    fs, path = filesystem(prep.rows_uri)
    ds = pds.dataset(path, filesystem=fs, format="parquet")
    return ds.to_table(columns=columns, filter=pds.field(S.COLD) == False)  # noqa: E712


def matrices(prep, cfg: TrainConfig, rows):
    """(R, R* or None): users x items CSR float32 of the training splits (train, or train+valid
    for the final retraining); R* holds the run's R* values on R's entries."""
    items, off = flat(rows.column(S.TRAIN_ITEMS))
    if cfg.final_retraining:  # each user's train and valid items, vectorised (millions of users)
        v_items, v_off = flat(rows.column(S.VALID_ITEMS))
        merged, m_off = union_sorted(items, off, v_items, v_off, rows.num_rows)
        t_items, t_off = torch.from_numpy(merged), torch.from_numpy(m_off)
    else:
        t_items, t_off = torch.from_numpy(items.astype(np.int64)), torch.from_numpy(off)
    train = to_csr(t_items, t_off, prep.n_items)
    rstar = None
    if "rstar" in MODELS[cfg.model].needs:
        beta = cfg.beta if cfg.beta is not None else prep.beta()
        table = prep.rstar_table(beta, cfg.final_retraining)
        rstar = to_csr(t_items, t_off, prep.n_items, table[t_items.numpy()])
    return train, rstar


@torch.no_grad()
def validate(model, rows, fraction: float = 1.0) -> tuple[float, float, int]:
    """(mean NDCG, mean Recall@50, users) over the users of ``rows`` with a validation item
    (those of the sample ``fraction`` keeps, as the gradient loop's, ``training.feed``)."""
    s = validation_stats(model, rows, fraction)
    return s["ndcg"], s["recall"], s["users"]


def validation_stats(model, rows, fraction: float = 1.0, head: np.ndarray | None = None) -> dict:
    """``validate``'s figures as a dict; with ``head`` (item indices: the most popular 10%) also
    ``head_share``, the mean share of the top-50 lists from those items, as the gradient loop
    logs beside NDCG (valid_head_share)."""
    if fraction < 1:
        rows = rows.filter(in_valid_sample(rows.column(S.USER_INDEX).to_numpy(), fraction))
    mask = head_mask(model.n_items, head) if head is not None else None
    batches = (vb for lo in range(0, rows.num_rows, SCORE_USERS)
               if (vb := valid_batch(rows.slice(lo, SCORE_USERS), 0, 1)) is not None)
    sums, _ = validation_sums(model, batches, head=mask)
    count, nan = int(sums["users"]), float("nan")
    out = {"ndcg": sums["ndcg"] / count if count else nan,
           "recall": sums["recall"] / count if count else nan, "users": count}
    if mask is not None:
        out["head_share"] = sums["head"] / count if count else nan
    return out


def finish(cfg: TrainConfig, model, rows, info: dict, fit_s: float, read_s: float, users: int,
           t0: float, head: np.ndarray | None = None) -> dict:
    """Validate a fitted model; the run's one history record, its weights and arguments
    (``head``: the most popular items, whose share of the lists validation reports)."""
    record = {"epoch": 1, "phase": 1, "train_seconds": fit_s, "read_seconds": read_s,
              "users_per_second": users / max(fit_s, 1e-9), **info}
    if not cfg.final_retraining:
        stats = validation_stats(model.eval(), rows, cfg.valid_sample, head)
        ndcg, recall, n = stats["ndcg"], stats["recall"], stats["users"]
        record.update({"valid_ndcg": ndcg, "valid_recall_at_50": recall})
        if "head_share" in stats:
            record["valid_head_share"] = stats["head_share"]
        print(f"{model.describe()}: fitted in {fit_s:.1f}s; validation NDCG {ndcg:.4f} "
              f"Recall@50 {recall:.4f} ({n:,} users)"
              + (f"; top-10% share {stats['head_share']:.2f}" if "head_share" in stats else ""),
              flush=True)
    record["epoch_seconds"] = time.perf_counter() - t0
    return {"record": record, "state_dict": {k: v.cpu() for k, v in model.state_dict().items()},
            "model_args": model.model_args()}


def fit_task(cfg_dict: dict, prep, threads: int) -> dict:
    """The body of the Ray task: fit, validate; plain data and tensors back to the driver."""
    cfg = TrainConfig.from_dict(cfg_dict)
    torch.set_num_threads(max(1, threads))
    t0 = time.perf_counter()
    rows = read_rows(prep, [S.USER_INDEX, S.TRAIN_ITEMS, S.VALID_ITEMS])
    train, rstar = matrices(prep, cfg, rows)
    read_s = time.perf_counter() - t0
    print(f"{cfg.model}: fitting on {train.shape[0]:,} users x {train.shape[1]:,} items "
          f"({train.nnz:,} positives; read in {read_s:.1f}s)", flush=True)
    torch.manual_seed(cfg.seed)
    model = MODELS[cfg.model].from_config(prep.n_items, cfg.hyperparameters())
    info = model.fit(train, rstar, seed=cfg.seed)
    return finish(cfg, model, rows, info, time.perf_counter() - t0 - read_s, read_s,
                  train.shape[0], t0, head_items(prep.pop_train))


def summarise(out: dict, t0: float) -> tuple[dict, list[dict], dict, dict]:
    rec = out["record"]
    summary = {"best_epoch": 1, "epochs_run": 1, "phase_epochs": [1],
               "best_valid_ndcg": rec.get("valid_ndcg"),
               "best_valid_recall_at_50": rec.get("valid_recall_at_50"),
               "mean_users_per_second": rec["users_per_second"],
               "wall_seconds": time.perf_counter() - t0}
    return summary, [rec], out["state_dict"], out["model_args"]


def fit(cfg: TrainConfig, prep, cpus: float) -> tuple[dict, list[dict], dict, dict]:
    """Fit on Ray; returns (summary, history, weights, model arguments) like a gradient run."""
    import ray

    t0 = time.perf_counter()
    # "DEFAULT": scheduled on the cluster, not inside the placement group of a caller that has
    # one (a Ray Tune trial's, which holds no CPU: experiment/run.py)
    task = ray.remote(fit_task).options(num_cpus=cpus, max_retries=0,
                                        scheduling_strategy="DEFAULT")
    ref = task.remote(cfg.to_dict(), prep, int(cpus))
    # a busy cluster: the fit waits for its CPUs, and says so as a Ray Train run does
    with raycluster.watch_start(
            lambda waited: raycluster.stall_message(f"run {cfg.run_name}", 1, cpus, False, waited,
                                                    reading=False, task=True),
            lambda: raycluster.task_started(ref), after=raycluster.STALL_SECONDS,
            say=lambda line: print(line, flush=True)):
        out = ray.get(ref)
    return summarise(out, t0)


def fit_on_spark(cfg: TrainConfig, prep) -> tuple[dict, list[dict], dict, dict]:
    """Fit a model whose engine is Spark (``Recommender.engine``) in this process's Spark session
    (spark-submit's, or a local one under plain python): the training pairs are read and exploded
    on the executors; validation scores on the driver, as the Ray task does."""
    from pyspark.sql import functions as F

    from runtime.spark import get_spark

    t0 = time.perf_counter()
    spark = get_spark(f"train-{cfg.model}")
    rows_df = spark.read.parquet(prep.rows_uri).filter(~F.col(S.COLD))
    items = F.col(S.TRAIN_ITEMS)
    if cfg.final_retraining:
        items = F.concat(items, F.coalesce(F.col(S.VALID_ITEMS), F.array().cast("array<int>")))
    pairs = rows_df.select(S.USER_INDEX, F.explode(items).alias(S.ITEM_INDEX))
    model = MODELS[cfg.model].from_config(prep.n_items, cfg.hyperparameters())
    print(f"{model.describe()}: fitting on Spark ({spark.sparkContext.master})", flush=True)
    info = model.fit(pairs, seed=cfg.seed)
    fit_s = time.perf_counter() - t0
    rows = read_rows(prep, [S.USER_INDEX, S.TRAIN_ITEMS, S.VALID_ITEMS])
    out = finish(cfg, model, rows, info, fit_s, 0.0, rows.num_rows, t0, head_items(prep.pop_train))
    return summarise(out, t0)
