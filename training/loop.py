"""The per-worker training function that Ray Train's ``TorchTrainer`` runs on every rank.

One epoch = one pass over this worker's share of the warm users (Ray Data's equal streaming split,
so every rank runs the same number of DDP steps), then validation over all validation users (each
rank reads and scores its own share, ``training.ingest``; sums are all-reduced), then a checkpoint
from rank 0 and a ``ray.train.report`` on every rank (it is a barrier).

Progress lives in a plain dict saved with each checkpoint, so that a restarted worker group (a
killed worker, ``FailureConfig``) or a rerun with the same run name resumes at the next epoch with
the optimizer state, the best model so far and the early-stopping counters.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from models.base import Recommender
from models.registry import MODELS, load_weights_only
from models.training import Training
from runtime.runs import CHECKPOINT_BEST, CHECKPOINT_STATE
from training import hooks
from training.config import TrainConfig
from training.feed import BatchMaker, FeedPlan, valid_batch
from training.step import phase_optimizers, train_epoch, unwrap
from training.validate import COLLAPSED_RANK, head_mask, popularity_order, validation_sums

STATE, BEST = CHECKPOINT_STATE, CHECKPOINT_BEST
CONVERGED = 1e-3  # fine-tune phase 1 ends when its loss improves by less than this (relative)


def say(line: str) -> None:
    """One line to the worker's stdout, which Ray forwards to the driver once (Ray Train patches
    print() into a logger that the driver shows twice)."""
    os.write(1, (line + "\n").encode())


def quiet_ray_logs() -> None:
    """Keep the driver's console to our epoch lines: no per-report INFO lines, no progress bars."""
    import logging

    import ray.data
    from ray.train.v2._internal.execution import context as train_context

    # Ray Train logs every report at INFO through a logger named after its file
    for name in ("ray.train", "ray.data", train_context.__file__):
        logging.getLogger(name).setLevel(logging.WARNING)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    ctx.print_on_execution_start = False


def new_progress() -> dict:
    return {"epoch": 0, "phase": 0, "phase_epoch": 0, "best_ndcg": -1.0, "best_epoch": -1,
            "bad_epochs": 0, "last_loss": None, "phase_epochs": [], "done": False,
            "diverged": None, "history": []}


def allreduce_bytes(policy, phases: list) -> int:
    """The gradient bytes one optimisation step all-reduces (the largest step of any phase, of
    the model's training ``policy``; a per-user model's user vectors included: they are dense
    parameters)."""
    return max(sum(p.numel() * p.element_size() for p in policy.step_parameters(s)
                   if p.requires_grad) for steps in phases for s in steps)


def snapshot(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The best weights so far, copied off the device (training goes on changing ``net``)."""
    return {k: v.detach().cpu().clone() for k, v in unwrap(net).state_dict().items()}


def all_sum(values: list[float], device: torch.device, op=dist.ReduceOp.SUM) -> list[float]:
    """Sum (or ``op``) of each value over the ranks (float64: sums of per-user metrics over
    millions of users)."""
    t = torch.tensor(values, dtype=torch.float64, device=device)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, op=op)
    return t.tolist()


def next_state(p: dict, cfg: TrainConfig, n_phases: int, phase_loss: float | None,
               ndcg: float | None, phase_length: int = 0) -> tuple[bool, bool]:
    """Advance ``p`` after an epoch; returns (new best model, phase changed). ``phase_length``:
    the policy's length of this phase when it is not the last (``Training.phase_epochs``; 0:
    until its loss converges), which ``--pretrain-epochs`` overrides."""
    last_phase = p["phase"] == n_phases - 1
    p["epoch"] += 1
    p["phase_epoch"] += 1
    improved = switched = False
    if not last_phase:  # fine-tune phase 1: a fixed length, or until its loss stops falling
        prev = p["last_loss"]
        p["last_loss"] = phase_loss
        fixed = cfg.pretrain_epochs or phase_length
        converged = prev is not None and prev - phase_loss < CONVERGED * abs(prev)
        if (fixed and p["phase_epoch"] >= fixed) or (not fixed and (converged
                                                                    or p["phase_epoch"] >= cfg.epochs)):
            p["phase_epochs"].append(p["phase_epoch"])
            p["phase"] += 1
            p["phase_epoch"] = 0
            switched = True
        return improved, switched
    if ndcg is None:  # final retraining: a fixed number of epochs; the last one is returned
        improved = True
        p["best_epoch"] = p["epoch"]
    elif ndcg > p["best_ndcg"]:
        improved = True
        p["best_ndcg"], p["best_epoch"], p["bad_epochs"] = ndcg, p["epoch"], 0
    else:
        p["bad_epochs"] += 1
    if p["phase_epoch"] >= cfg.epochs or (ndcg is not None and p["bad_epochs"] >= cfg.stop_patience):
        p["phase_epochs"].append(p["phase_epoch"])
        p["done"] = True
    return improved, switched


class Ranks:
    """In-place collectives over the training ranks for a policy's ``between_phases``
    (no-ops in one process)."""

    @staticmethod
    def sum_(t: torch.Tensor) -> torch.Tensor:
        if dist.is_available() and dist.is_initialized():
            dist.all_reduce(t)
        return t

    @staticmethod
    def broadcast_(t: torch.Tensor) -> torch.Tensor:
        """Rank 0's value on every rank."""
        if dist.is_available() and dist.is_initialized():
            dist.broadcast(t, 0)
        return t


def build_model(cfg: TrainConfig, n_items: int, n_users: int | None, data: dict | None = None,
                popularity: np.ndarray | None = None) -> tuple[Recommender, Training]:
    """The model to train and its training policy for this run (``Recommender.trainer``, given
    the run's flags); ``data``: the policy's ``data_statistics``; ``popularity``: the train
    split's positives per item, for the policy's ``prepare``."""
    model = MODELS[cfg.model].from_config(n_items, cfg.hyperparameters(), n_users, data)
    policy = type(model).trainer(model, cfg)
    policy.prepare(popularity)
    return model, policy


@dataclass(frozen=True)
class WorkerPlan:
    """What the driver hands every Ray Train worker: the run's configuration and what the driver
    read from the prepared data once, so that no worker reads it again."""

    cfg: TrainConfig
    feed: FeedPlan
    n_items: int
    n_users: int
    data: dict  # the model's data_statistics of the rows it trains on (e.g. a unit of lambda)
    head_items: np.ndarray  # the 10% most popular items, whose share of the lists validation reports
    # (n_items,) training positives per item: the popularity baseline validation compares with
    popularity: np.ndarray | None = None
    threads: int = 1  # torch threads per worker
    mlflow: dict | None = None  # rank 0's per-epoch logger (runtime.tracking.EpochLogger's kwargs)
    run_dir: str = ""
    epoch_hooks: tuple[str, ...] = ()  # training.hooks specs, called at the start of every epoch
    # the weights the run starts from (``Training.starts_from_data``): a state dict, or Ray's
    # reference to one in the object store; None: the model's random initialisation
    start: object | None = None


@dataclass
class LoopState:
    """What a run carries from one epoch to the next, and what a checkpoint keeps of it."""

    progress: dict
    optimizers: list
    best: dict | None = None  # the best weights so far (rank 0's)


@dataclass(frozen=True)
class Shards:
    """What one rank reads (Arrow batches of user rows): ``train(epoch)`` that epoch's pass
    over its training rows (shuffled), ``in_order(epoch)`` a pass in order (a policy's
    between-phase steps), ``valid`` its validation rows (``iter_batches``; None for the final
    retraining). Ray Data's shards in a Ray Train worker; a table in one process
    (``table_shards``)."""

    train: Callable[[int], Iterable]
    in_order: Callable[[int], Iterable]
    valid: object | None


class TableRows:
    """A table's rows as validation reads a Ray Data shard (``iter_batches``), in one process."""

    def __init__(self, table):
        self.table = table

    def iter_batches(self, batch_size: int, batch_format: str = "pyarrow", **_):
        for lo in range(0, self.table.num_rows, batch_size):
            yield self.table.slice(lo, batch_size)


def table_shards(rows, batch_size: int, seed: int, valid=None) -> Shards:
    """The shards of one process training on the Arrow table ``rows`` (warm users): each epoch
    a permutation of its rows seeded by the epoch (so that a rerun is the same run), batches of
    ``batch_size``; ``valid``: the validation users' rows (None: the final retraining)."""
    def train(epoch: int):
        order = np.random.default_rng(seed + epoch + 1).permutation(rows.num_rows)
        for lo in range(0, rows.num_rows, batch_size):
            yield rows.take(order[lo:lo + batch_size])

    return Shards(train=train, in_order=lambda epoch: TableRows(rows).iter_batches(batch_size),
                  valid=None if valid is None else TableRows(valid))


def train_loop(config: dict) -> None:
    """Ray Train's per-worker function: the run's model, its checkpoint if it resumes, DDP,
    Ray Data's shards, then ``epochs`` with a checkpoint and a report after each."""
    import ray
    import ray.train
    import ray.train.torch

    quiet_ray_logs()
    plan: WorkerPlan = config["plan"]  # Ray Train passes a dict; the plan is its one entry
    cfg = plan.cfg
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    logger = None
    if rank == 0 and plan.mlflow:
        from concurrent.futures import ThreadPoolExecutor

        from runtime.tracking import EpochLogger

        # made beside the model and the first epoch: MLflow's import is ~1.5 s of rank 0's start,
        # which every rank would wait for at the first all-reduce
        logger = ThreadPoolExecutor(1, thread_name_prefix="mlflow").submit(
            EpochLogger, **plan.mlflow)
    torch.set_num_threads(max(1, plan.threads))
    torch.manual_seed(cfg.seed)  # the same initial weights on every rank
    model, policy = build_model(cfg, plan.n_items, plan.n_users, plan.data, plan.popularity)
    progress, best_state, opt_states = new_progress(), None, None
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            saved = load_weights_only(Path(d) / STATE, f"checkpoint {Path(d) / STATE}")
            model.load_state_dict(saved["model"])
            progress, opt_states = saved["progress"], saved["optimizers"]
            policy.load_state_dict(saved["training"])
            if (Path(d) / BEST).exists():
                best_state = load_weights_only(Path(d) / BEST, f"checkpoint {Path(d) / BEST}")
        if rank == 0:
            say(f"resuming after epoch {progress['epoch']} (phase {progress['phase'] + 1})")
    elif plan.start is not None:
        model.load_state_dict(plan.start if isinstance(plan.start, dict) else ray.get(plan.start))
    device = ray.train.torch.get_device()
    # where each rank runs: on a cluster, the first thing to check when placement matters
    say(f"rank {rank}/{world} on node {ray.get_runtime_context().get_node_id()[:12]} "
        f"({ray.util.get_node_ip_address()}), device {device}")
    net = ray.train.torch.prepare_model(model, parallel_strategy_kwargs={
        "find_unused_parameters": not policy.uses_every_parameter()})
    optimizers = phase_optimizers(policy, policy.phases(), progress["phase"], cfg.learning_rate)
    for opt, st in zip(optimizers, opt_states or []):
        opt.load_state_dict(st)
    state = LoopState(progress, optimizers, best_state)
    per_worker = max(1, cfg.batch_size // world)
    if rank == 0 and world > 1:
        say(f"DDP: {per_worker} users per worker per step; each step all-reduces "
            f"{allreduce_bytes(policy, policy.phases()) / 2**20:,.1f} MiB of gradients")
    train_shard = ray.train.get_dataset_shard("train")
    shards = Shards(
        train=lambda epoch: train_shard.iter_batches(
            batch_size=per_worker, batch_format="pyarrow",
            local_shuffle_buffer_size=16 * per_worker, local_shuffle_seed=cfg.seed + epoch + 1,
            prefetch_batches=2),
        in_order=lambda epoch: train_shard.iter_batches(
            batch_size=per_worker, batch_format="pyarrow", prefetch_batches=2),
        valid=ray.train.get_dataset_shard("valid") if not cfg.final_retraining else None)
    for record, metrics in epochs(plan, net, policy, state, shards, device, rank, world):
        if rank != 0:
            ray.train.report(metrics)
            continue
        if logger is not None:
            logger.result().log(record, step=record["epoch"])
        with tempfile.TemporaryDirectory() as d:
            torch.save({"model": unwrap(net).state_dict(), "progress": state.progress,
                        "optimizers": [o.state_dict() for o in state.optimizers],
                        "training": policy.state_dict(),
                        "config": cfg.to_dict(), "model_args": unwrap(net).model_args()},
                       Path(d) / STATE)
            if state.best is not None:
                torch.save(state.best, Path(d) / BEST)
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


def epochs(plan: WorkerPlan, net, policy: Training, state: LoopState, shards: Shards,
           device: torch.device, rank: int = 0, world: int = 1,
           quiet: bool = False) -> Iterator[tuple[dict, dict]]:
    """The epochs of a run from ``state`` until it is done (``state`` advanced in place): train
    one pass over ``shards.train``, validate on ``shards.valid`` (every rank its share, sums
    all-reduced), early stopping and the policy's phases; after each epoch, its record and the
    metrics Ray Train reports are yielded (rank 0 checkpoints there). Knows nothing of Ray: the
    same epochs run in one process (``benchmarks/tune_defaults.py``). ``quiet``: no progress
    lines. One function although long: training, validation, early stopping and the phase
    changes read and write the same progress and optimizer state in one order, which a split
    would pass through every part."""
    cfg, progress = plan.cfg, state.progress
    all_phases = policy.phases()
    make = BatchMaker(plan.feed)
    per_worker = max(1, cfg.batch_size // world)
    head = head_mask(plan.n_items, plan.head_items, device)  # the 10% most popular items
    pop_order = popularity_order(plan.popularity).to(device) if plan.popularity is not None \
        else None
    times: list[float] = []
    epoch_hooks = hooks.resolve(list(plan.epoch_hooks))  # tests' (training.hooks)

    def in_order(epoch: int):
        """One pass over this rank's training rows in order, for ``between_phases``."""
        for rows in shards.in_order(epoch):
            yield make(rows, epoch).to(device)

    if (plan.start is not None and "start" not in progress and shards.valid is not None
            and len(all_phases) == 1):
        # epoch 0: the start is validated like an epoch and is the best until one beats it, so
        # a run never ends below where it started
        t0 = time.perf_counter()
        (ndcg, recall), valid_share, valid_users, diagnostics = evaluate(
            net, shards.valid, device, batch_size=max(per_worker, 256), head=head,
            popularity=pop_order)
        pop = diagnostics.pop("popularity", None)
        if pop is not None:
            progress["popularity"] = {"ndcg": pop[0], "recall_at_50": pop[1]}
        record = {"epoch": 0, "phase": 1, "valid_ndcg": ndcg, "valid_recall_at_50": recall,
                  "valid_seconds": time.perf_counter() - t0,
                  "valid_largest_rank_share": valid_share, "valid_users": valid_users,
                  **diagnostics}
        record["epoch_seconds"] = time.perf_counter() - t0  # no training: its validation
        progress.update(start=record, best_ndcg=ndcg, best_epoch=0)
        if rank == 0:
            state.best = snapshot(net)
            if not quiet:
                say(f"epoch   0 | the start: valid NDCG {ndcg:.4f} Recall@50 {recall:.4f}")
        yield record, {**record, "best_epoch": 0, "best_valid_ndcg": ndcg, "done": False,
                       "diverged_epoch": 0}

    if plan.start is not None and cfg.epochs == 0 and not progress["done"]:
        # a final retraining whose chosen epoch was the start's: the start is the model; one
        # record, so that rank 0 checkpoints it as it would any last epoch
        progress.update(done=True, best_epoch=0)
        if rank == 0:
            state.best = snapshot(net)
            if not quiet:
                say("epoch   0 | the start, untrained (--epochs 0)")
        record = {"epoch": 0, "phase": 1, "epoch_seconds": 0.0}
        yield record, {**record, "best_epoch": 0, "best_valid_ndcg": progress["best_ndcg"],
                       "done": True, "diverged_epoch": 0}

    while not progress["done"]:
        epoch, phase = progress["epoch"], progress["phase"]
        steps, last_phase = all_phases[phase], phase == len(all_phases) - 1
        hooks.call_all(epoch_hooks, {"epoch": epoch, "rank": rank, "world": world,
                                     "run_dir": plan.run_dir})
        torch.manual_seed(cfg.seed + 1000003 * (epoch + 1) + rank)
        t0 = time.perf_counter()
        net.train()
        sums, users = train_epoch(
            net, (make(rows, epoch).to(device) for rows in shards.train(epoch)), steps,
            state.optimizers, bf16=cfg.bf16)
        # every rank runs the same steps, so every rank has the same term names (sorted alike)
        names = sorted(sums)
        totals = all_sum([float(sums[n]) for n in names] + [users], device)
        n_users = totals[-1]
        loss = {n: v / max(n_users, 1) for n, v in zip(names, totals[:-1])}
        train_s = time.perf_counter() - t0

        # before validation: a diverged model's codes are NaN too, and scoring them fails (the
        # SVD of the effective rank) with a traceback instead of the run's message. The loss is
        # all-reduced, so every rank skips validation alike
        diverged = not all(math.isfinite(v) for v in loss.values())
        ndcg = recall = None
        t_valid = time.perf_counter()
        if shards.valid is not None and last_phase and not diverged:
            (ndcg, recall), valid_share, valid_users, diagnostics = evaluate(
                net, shards.valid, device, batch_size=max(per_worker, 256), head=head,
                trained_users=cfg.valid_by == "trained",
                # once a run (the users and the counts never change between epochs)
                popularity=pop_order if "popularity" not in progress else None)
            pop = diagnostics.pop("popularity", None)
            if pop is not None:
                progress["popularity"] = {"ndcg": pop[0], "recall_at_50": pop[1]}
        valid_s = time.perf_counter() - t_valid
        phase_loss = None if last_phase else policy.monitor(phase, loss)
        record = {"epoch": epoch + 1, "phase": phase + 1, "train_seconds": train_s,
                  "users_per_second": n_users / train_s if train_s > 0 else 0.0,
                  **{f"loss_{h}": v for h, v in loss.items()}}
        if ndcg is not None:
            record.update({"valid_ndcg": ndcg, "valid_recall_at_50": recall,
                           "valid_seconds": valid_s, "valid_largest_rank_share": valid_share,
                           "valid_users": valid_users, **diagnostics})
        if diverged:
            progress["epoch"] += 1
            progress["diverged"] = progress["epoch"]
            progress["done"] = True
            improved = switched = False
        else:
            improved, switched = next_state(progress, cfg, len(all_phases), phase_loss, ndcg,
                                            policy.phase_epochs(phase))
        record["epoch_seconds"] = time.perf_counter() - t0
        progress["history"].append(record)
        times.append(record["epoch_seconds"])
        if improved and rank == 0:
            state.best = snapshot(net)
        if switched:
            t_hook = time.perf_counter()
            done = policy.between_phases(phase, partial(in_order, epoch), Ranks)
            if done and rank == 0 and not quiet:
                say(f"{done}, {time.perf_counter() - t_hook:.1f}s)")
            state.optimizers = phase_optimizers(policy, all_phases, progress["phase"],
                                                cfg.learning_rate)

        warnings = health_warnings(record, progress, grace=cfg.stop_patience)
        metrics = {**record, "best_epoch": progress["best_epoch"],
                   "best_valid_ndcg": progress["best_ndcg"], "done": progress["done"],
                   "diverged_epoch": progress["diverged"] or 0}
        if rank == 0 and not quiet:
            say(progress_line(record, progress, cfg, len(all_phases), times))
            for line in warnings:
                say(line)
        yield record, metrics


@torch.no_grad()
def evaluate(net, valid_rows, device: torch.device, batch_size: int, head: torch.Tensor,
             trained_users: bool = False, popularity: torch.Tensor | None = None
             ) -> tuple[tuple[float, float], float, int, dict]:
    """(mean validation NDCG, Recall@50) over all validation users (all ranks together), the
    largest share of them one rank scored, how many there were, and what else the lists and
    codes say (``diagnostics``): the share of the recommendations from the ``head`` items (the
    10% most popular), and the effective rank of the user codes where the model has them.
    ``trained_users``: a per-user model scores from its trained user vectors (``--valid-by``).
    ``popularity`` (``popularity_order``): also the popularity baseline's (NDCG, Recall@50) on
    the same users with the same metric code, as ``diagnostics["popularity"]``."""
    net.eval()
    model = unwrap(net)  # the wrapped module, not DDP: scoring needs no gradient synchronisation
    # this rank's share already (training.ingest)
    batches = (vb.to(device) for rows in valid_rows.iter_batches(
        batch_size=batch_size, batch_format="pyarrow") if (vb := valid_batch(rows, 0, 1)) is not None)
    sums, sample = validation_sums(model, batches, head, popularity, trained_users)
    ndcg_sum, recall_sum, head_sum = sums["ndcg"], sums["recall"], sums["head"]
    pop_ndcg, pop_recall, count = sums["pop_ndcg"], sums["pop_recall"], int(sums["users"])
    # a sample of the codes: this rank's first batch (None: the model has no codes)
    codes = model.user_codes(sample.train_items, sample.train_offsets) if sample else None
    mine = count
    erank = effective_rank(codes) if codes is not None else float("nan")
    ndcg_sum, recall_sum, head_sum, count, erank_sum, ranks, pop_ndcg, pop_recall = all_sum(
        [ndcg_sum, recall_sum, head_sum, count, 0.0 if math.isnan(erank) else erank,
         0.0 if math.isnan(erank) else 1.0, pop_ndcg, pop_recall], device)
    # the largest rank's share of the users (1 / world when balanced): validation runs at the
    # pace of the rank with the most
    share, = all_sum([mine / count if count else 0.0], device, op=dist.ReduceOp.MAX)
    means = (ndcg_sum / count, recall_sum / count) if count else (float("nan"), float("nan"))
    diagnostics = {"valid_head_share": head_sum / count if count else float("nan")}
    if ranks:
        diagnostics["code_effective_rank"] = erank_sum / ranks
    if popularity is not None:
        diagnostics["popularity"] = ((pop_ndcg / count, pop_recall / count) if count
                                     else (float("nan"), float("nan")))
    return means, share, int(count), diagnostics


def effective_rank(codes: torch.Tensor) -> float:
    """exp of the entropy of the normalised singular values of (users, d) codes (Roy & Vetterli
    2007): d when every direction is used alike, 1 when the codes lie on one line, and how far
    between a collapse onto few directions (popularity) has gone."""
    s = torch.linalg.svdvals(codes.double())
    if float(s.sum()) == 0.0:
        return 0.0
    p = s / s.sum()
    p = p[p > 0]
    return float(torch.exp(-(p * p.log()).sum()))


def health_warnings(record: dict, p: dict, grace: int = 0) -> list[str]:
    """The WARNING lines of this epoch: each problem of ``training.validate.health`` the first
    time it shows (noted in ``p["warned"]``, which the checkpoint keeps): the best validation
    NDCG so far not above popularity's once ``grace`` epochs have run and it has stopped
    rising (every run starts below popularity and a healthy one climbs past it, on MovieLens after
    about a dozen epochs; a warning while it still climbs would cry wolf), and the code's
    effective rank below ``COLLAPSED_RANK``. The run's verdict, at its best epoch, is the
    driver's (``training.train``)."""
    warned = p.setdefault("warned", [])
    pop = p.get("popularity")
    out = []
    if ("valid_ndcg" in record and pop is not None and "below-popularity" not in warned
            and record["epoch"] > grace and p.get("bad_epochs", 0) > 0
            and not p["best_ndcg"] > pop["ndcg"]):
        warned.append("below-popularity")
        out.append(f"WARNING: epoch {record['epoch']}: below popularity: the best validation "
                   f"NDCG so far, {p['best_ndcg']:.4f}, is not above the popularity baseline's "
                   f"{pop['ndcg']:.4f} on the same users")
    rank = record.get("code_effective_rank")
    if rank is not None and rank < COLLAPSED_RANK and "collapsed" not in warned:
        warned.append("collapsed")
        out.append(f"WARNING: epoch {record['epoch']}: code collapsed: the encoder's code has "
                   f"effective rank {rank:.2f} (< {COLLAPSED_RANK:g}): every user gets nearly "
                   "the same list")
    return out


def progress_line(record: dict, p: dict, cfg: TrainConfig, n_phases: int, times: list[float]) -> str:
    losses = " ".join(f"{k[5:]} {v:.5g}" for k, v in record.items() if k.startswith("loss_"))
    parts = [f"epoch {record['epoch']:>3}", f"phase {record['phase']}/{n_phases}" if n_phases > 1
             else "", f"loss {losses}"]
    if "valid_ndcg" in record:
        pop = p.get("popularity")
        parts.append(f"valid NDCG {record['valid_ndcg']:.4f}"
                     + (f" (pop {pop['ndcg']:.4f})" if pop is not None else "") + " Recall@50 "
                     f"{record['valid_recall_at_50']:.4f} (best {p['best_ndcg']:.4f} @ "
                     f"{p['best_epoch']}) top-10% share {record['valid_head_share']:.2f}"
                     + (f" code rank {record['code_effective_rank']:.1f}"
                        if "code_effective_rank" in record else ""))
    parts.append(f"{record['users_per_second']:,.0f} users/s {record['epoch_seconds']:.1f}s"
                 + (f" (validation {record['valid_seconds']:.1f}s, {record['valid_users']:,} "
                    "users)" if "valid_seconds" in record else ""))
    if p["diverged"]:
        parts.append("loss is not finite: stopping")
    elif p["done"]:
        parts.append("done")
    else:
        left = cfg.epochs - p["phase_epoch"] if p["phase"] == n_phases - 1 else cfg.epochs
        mean = sum(times[-5:]) / len(times[-5:])
        parts.append(f"<= {fmt_seconds(left * mean)} left")
    return " | ".join(x for x in parts if x)


def fmt_seconds(s: float) -> str:
    return f"{s:.0f}s" if s < 90 else f"{s / 60:.0f}m" if s < 5400 else f"{s / 3600:.1f}h"
