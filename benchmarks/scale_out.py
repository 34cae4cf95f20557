"""What data-parallel training reaches at 10x and 100x the Yahoo users, and what would go further.

    .venv/bin/python benchmarks/scale_out.py [--work DIR] [--bandwidth-gbps 10 100]

A training step of NCE-AutoRec (the fast loss) costs each data-parallel rank

    T(N, b) = F + b·u + A(N)

F the work that does not shrink with the batch (the O(n·d²) Gram products of both heads, Adam over
every parameter), u the work per user, A(N) the all-reduce of every gradient (S bytes) over N
ranks. An epoch of U users at a global batch B = N·b is ceil(U / B) steps. Measured here, in one
run, at the Yahoo shape (44,865 items, 13 training positives a user, width 200):

- F and u: the bare step (``train_throughput``'s reference: forward, backward, Adam; one process
  with all the cores, on rows prepared by the real ETL) at several batches, and a least-squares
  line through step seconds against the batch;
- S: the bytes DDP sums a step (every trained parameter's gradient, float32);
- A's floor on this machine: ``torch.distributed``'s gloo all-reduce of S bytes between two
  processes over loopback (what the collective's software costs before any network).

Modelled from those, not measured (no cluster is at hand): A(N) on a ring is the larger of the
loopback floor and 2(N-1)/N·S over the network's bandwidth; nodes are like this one. Designs:

- ``dp``: today's data parallelism at a fixed global batch (per-worker batch B/N);
- ``dp-large``: a per-worker batch of 8192, so the global batch grows with the nodes;
- ``dp-large-bf16``: the same with gradients all-reduced in bf16 (half of S);
- ``item-sharded``: the catalogue split over the N ranks (not built; ``docs/scaling.md``): F and
  the per-user work divide by N and a step all-reduces the (B, d) partial codes forward and their
  gradient backward (2·B·d·4 bytes) instead of S: a lower bound on its time.

Each design's epoch at 10x and 100x the Yahoo users on N nodes, its efficiency (one node's epoch
at the same global batch over N times this one) and its floor over any number of nodes (steps
times the per-step work that does not divide: its limit as N grows, which for data parallelism at a
fixed batch can be slower than one node, whose step has no all-reduce). Results:
``benchmarks/results/scale_out.{json,md}``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks import report  # noqa: E402
from benchmarks.yahoo_scale import YAHOO  # noqa: E402

BATCHES = (1024, 2048, 4096, 8192)
WIDTH = 200
LARGE_BATCH = 8192  # per worker, for the dp-large designs
FIXED_GLOBAL_BATCH = 8192  # the dp design's global batch (the largest this project has timed)
NODES = (1, 8, 32, 128)
FACTORS = (10, 100)
DESIGNS = ("dp", "dp-large", "dp-large-bf16", "item-sharded")


def ring_seconds(nbytes: float, nodes: int, gbps: float, floor_s: float) -> float:
    """One ring all-reduce of ``nbytes`` over ``nodes`` ranks: each sends 2(N-1)/N of it over a
    link of ``gbps``, and never faster than this machine's software floor for those bytes
    (``floor_s``, measured for two ranks; 0 on one node)."""
    if nodes == 1:
        return 0.0
    return max(floor_s, 2 * (nodes - 1) / nodes * nbytes * 8 / (gbps * 1e9))


def design_epoch(design: str, users: float, nodes: int, c: dict, gbps: float) -> dict:
    """Seconds of an epoch of ``users`` on ``nodes`` under ``design``, from the measured step
    model ``c`` (F, u in seconds on one node; S bytes; loopback floor seconds per byte)."""
    F, u, S = c["fixed_s"], c["per_user_s"], c["allreduce_bytes"]
    floor = c["loopback_s_per_byte"]
    if design == "dp":
        batch = FIXED_GLOBAL_BATCH
        per_rank = batch / nodes
        step = F + per_rank * u + ring_seconds(S, nodes, gbps, floor * S)
    elif design in ("dp-large", "dp-large-bf16"):
        batch = LARGE_BATCH * nodes
        s = S / 2 if design == "dp-large-bf16" else S
        step = F + LARGE_BATCH * u + ring_seconds(s, nodes, gbps, floor * s)
    elif design == "item-sharded":
        batch = FIXED_GLOBAL_BATCH
        codes = code_bytes(batch)
        step = (F + batch * u) / nodes + ring_seconds(codes, nodes, gbps, floor * codes)
    else:
        raise ValueError(design)
    steps = math.ceil(users / batch)
    one_node = steps * (F + batch * u)  # the same global batch on one node
    return {"design": design, "nodes": nodes, "global_batch": batch, "step_s": step,
            "epoch_s": steps * step, "efficiency": one_node / (nodes * steps * step)}


def code_bytes(batch: int) -> int:
    """What item sharding sums each step: the batch's codes, forward and their gradients back
    (float32, WIDTH wide)."""
    return 2 * batch * WIDTH * 4


def floor_epoch(design: str, users: float, c: dict, gbps: float) -> float:
    """The epoch's limit as the nodes grow: at a fixed global batch, data parallelism still pays F
    and the whole ring all-reduce every step (item sharding divides both; its limit is the codes'
    all-reduce alone). 0 for a batch that grows with the nodes: it has no limit, only fewer
    steps."""
    if design == "dp":
        steps = math.ceil(users / FIXED_GLOBAL_BATCH)
        return steps * (c["fixed_s"] + ring_seconds(c["allreduce_bytes"], 10**6, gbps,
                                                     c["loopback_s_per_byte"]
                                                     * c["allreduce_bytes"]))
    if design == "item-sharded":
        codes = code_bytes(FIXED_GLOBAL_BATCH)
        return math.ceil(users / FIXED_GLOBAL_BATCH) * ring_seconds(
            codes, 10**6, gbps, c["loopback_s_per_byte"] * codes)
    return 0.0  # a batch that grows with the nodes has no floor, only fewer steps


def fit_step(batches: list[int], seconds: list[float]) -> tuple[float, float, float]:
    """Least-squares step seconds = F + b·u; returns F, u and the largest relative residual."""
    u, F = np.polyfit(np.asarray(batches, float), np.asarray(seconds, float), 1)
    resid = max(abs(F + u * b - s) / s for b, s in zip(batches, seconds))
    return float(F), float(u), float(resid)


# -- measurements ------------------------------------------------------------------------------

def step_seconds(data: Path, batches: tuple[int, ...], steps: int) -> list[float]:
    from benchmarks.train_throughput import reference_users_per_second

    return [b / reference_users_per_second(data, "nce-autorec", b, "auto", steps) for b in batches]


def allreduce_bytes(data: Path) -> int:
    """What DDP sums a step for NCE-AutoRec at width 200 on ``data``: every trained parameter."""
    from models.registry import MODELS
    from prepared.reader import open_prepared
    from training.config import TrainConfig
    from training.loop import build_model

    prep = open_prepared(str(data))
    cfg = TrainConfig(data=str(data), model="nce-autorec", width=WIDTH)
    net, _ = build_model(cfg, prep.n_items, prep.n_users,
                         MODELS["nce-autorec"].trainer.data_statistics(prep))
    return sum(p.numel() * p.element_size() for p in net.parameters() if p.requires_grad)


def _allreduce_worker(rank: int, nbytes: int, store: str, repeats: int, out: str) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    t = torch.ones(nbytes // 4)
    for _ in range(2):
        dist.all_reduce(t)
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(repeats):
        dist.all_reduce(t)
    seconds = (time.perf_counter() - t0) / repeats
    if rank == 0:
        Path(out).write_text(str(seconds))
    dist.destroy_process_group()


def loopback_allreduce_seconds(nbytes: int, repeats: int = 10) -> float:
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        out = os.path.join(d, "seconds")
        mp.spawn(_allreduce_worker, args=(nbytes, os.path.join(d, "store"), repeats, out),
                 nprocs=2, join=True)
        return float(Path(out).read_text())


def measure(work: Path, users: int, steps: int) -> dict:
    from benchmarks.train_throughput import prepare

    data = prepare("yahoo", users, work)
    seconds = step_seconds(data, BATCHES, steps)
    F, u, resid = fit_step(list(BATCHES), seconds)
    S = allreduce_bytes(data)
    loop = loopback_allreduce_seconds(S)
    return {"batches": list(BATCHES), "step_seconds": seconds, "fixed_s": F, "per_user_s": u,
            "fit_max_rel_residual": resid, "allreduce_bytes": S, "loopback_allreduce_s": loop,
            "loopback_s_per_byte": loop / S}


# -- report ------------------------------------------------------------------------------------

def tables(c: dict, bandwidths: list[float]) -> list[dict]:
    rows = []
    for gbps in bandwidths:
        for factor in FACTORS:
            users = YAHOO["users"] * factor
            for design in DESIGNS:
                for nodes in NODES:
                    rows.append({"gbps": gbps, "factor": factor,
                                 **design_epoch(design, users, nodes, c, gbps),
                                 "floor_epoch_s": floor_epoch(design, users, c, gbps)})
    return rows


def markdown(stamp: dict, c: dict, rows: list[dict]) -> list[str]:
    lines = ["# Scale-out: what data-parallel training reaches at 10x and 100x the Yahoo users", "",
             f"Command: `{stamp['command']}`  ", f"Machine: {stamp['machine']}; {stamp['date']}.",
             "", "Measured (NCE-AutoRec, the fast loss, width 200, the Yahoo shape; the bare step, "
             "one process with both cores):", "",
             "| batch | step s |", "|---|---|"]
    lines += [f"| {b:,} | {s:.3f} |" for b, s in zip(c["batches"], c["step_seconds"])]
    lines += ["", f"A line through them: **F = {c['fixed_s']:.3f} s** a step whatever the batch, "
              f"**u = {c['per_user_s'] * 1e6:.1f} µs** a user (largest residual "
              f"{c['fit_max_rel_residual']:.1%}). DDP all-reduces **S = "
              f"{c['allreduce_bytes'] / 2**20:.0f} MiB** a step; gloo over loopback between two "
              f"processes takes {c['loopback_allreduce_s']:.3f} s for it (the floor of A).", "",
              "Modelled (benchmarks/scale_out.py says how): an epoch in minutes on N nodes like "
              "this one, its efficiency against one node at the same global batch, and its "
              "limit as the nodes grow (at a fixed batch, data parallelism pays F and a whole "
              "ring every step however many nodes share the users).", ""]
    for gbps in sorted({r["gbps"] for r in rows}):
        lines += [f"Network {gbps:g} Gb/s:", "",
                  "| users | design | nodes | global batch | step s | epoch min | efficiency "
                  "| limit min (N → ∞) |", "|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if r["gbps"] != gbps:
                continue
            floor = f"{r['floor_epoch_s'] / 60:.1f}" if r["floor_epoch_s"] else "–"
            lines.append(f"| {r['factor']}x | {r['design']} | {r['nodes']} | "
                         f"{r['global_batch']:,} | {r['step_s']:.3f} | {r['epoch_s'] / 60:.1f} | "
                         f"{r['efficiency']:.0%} | {floor} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--work", default=None,
                   help="where the synthetic Yahoo-shaped rows go (default: a new /tmp folder)")
    p.add_argument("--users", type=int, default=100_000,
                   help="users of the synthetic rows (default 100000: 12 batches of 8192)")
    p.add_argument("--steps", type=int, default=8,
                   help="timed steps per batch size, after two warm-up steps (default 8)")
    p.add_argument("--bandwidth-gbps", type=float, nargs="+", default=[10.0, 100.0],
                   help="network bandwidths to model (default 10 and 100 Gb/s)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "scale_out"),
                   help="result path without suffix (default: benchmarks/results/scale_out)")
    a = p.parse_args(argv)
    stamp = report.stamp("scale_out.py", argv)
    work = Path(a.work or tempfile.mkdtemp(prefix="scale-out-")).resolve()
    c = measure(work, a.users, a.steps)
    rows = tables(c, a.bandwidth_gbps)
    lines = markdown(stamp, c, rows)
    report.publish(Path(a.out), {**stamp, "measured": c, "rows": rows}, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
