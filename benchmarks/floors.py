"""A roofline per stage: the least time this machine needs for the work each stage must do, from
rates measured in the same run, so that every stage's benchmark can report its ratio to that floor.

    .venv/bin/python benchmarks/floors.py [--seconds 2] [--workers 2]

Rates, measured here with ``--workers`` processes of one thread each, side by side (the stages
run that way: Spark local[2] tasks of one core, 2 Ray Train workers x 1 thread), summed over them:

    peak        the physical fp32 peak (and AVX512_BF16's, where the CPU has it): independent
                FMAs in registers, compiled here for this CPU (benchmarks/peak.py); no kernel
                can beat it, so each product rate is also reported as a share of it, and each
                stage's floor also "at peak" (its products at this rate: the physical floor)
    matmul      float32 GFLOP/s at each product shape and layout the stages run (training's
                Gram W'W, W (h'h), and the batch's h G, h'h; scoring's users x width x items
                product at several blocks of users, ``SCORE_USERS``, and layouts,
                ``SCORE_LAYOUTS``) in each exact kernel the environment has (``EXACT_LIBS``:
                torch's, which is MKL on x86 and takes a slow generic path on AMD CPUs, and
                numpy's OpenBLAS, which dispatches on the CPU's features; for scoring's product
                also the project's fused AVX-512 kernel, ``models.stream_topk``, timed with its
                top 50 included, where the CPU has AVX-512), the best of them taken
                as its rate: a floor is what the machine can do for that work, not what the
                code's own kernel does, so a better kernel shows as headroom (every candidate is
                recorded, and which was best). torch's bf16 product (oneDNN; AMX where the CPU
                has it) is measured beside scoring's, never a floor: its sums are not float32's
    bandwidth   a triad a = b + s c over arrays far larger than the caches (bytes read + written)
    gather      an EmbeddingBag sum of random rows of an (items, width) matrix (bytes of the rows);
    scatter     index_add_ of rows into one (the backward of a gather)
    sort        numpy sort of random int64 keys (keys/s, scaled to n log n)
    parquet     pyarrow write and read (snappy, one thread) of a table like the ETL's split table
                (a row per positive) and one like its user rows (a row per user, list columns),
                in Arrow bytes/s

Work, counted from the shapes (``WORK`` functions below: pure arithmetic, tested in
tests/benchmarks/test_floors.py) and each part's floor = its work / its rate; a stage's floor is the sum of
its parts (the parts run one after another in the stages; none overlaps another's rate):

    score       products users x width x items (2 FLOPs each), one read of the score matrix for
                the top-k, the encoder's gather of the input items, reading the user rows and
                writing the top-k lists (Parquet)
    epoch       per step and worker: two heads' fast loss (models/autorec/losses.py: W'W and
                W (h'h) per head, the batch's h G, grad_h, h'h), their gathers and scatters
                (EmbeddingBag of W at the targets, index_add into W's gradient), the encoder's
                gather and dense gradient, the L2 terms, fused Adam (read p, g, m, v; write p, m,
                v) and DDP's all-reduce (read + write every gradient) over 3 (items, width)
                matrices; per epoch: reading the user rows
    validate    the training's validation: scoring of the sampled validation users, no write
    evaluate    read the top-k lists and the split table (Parquet), sort the list entries and
                the test pairs together by (user, item) once (the join), per-user sums streamed
    etl         read the positives once (Parquet), shuffle them once (each row written and read
                at the memory bandwidth), write the split table, the user rows and the users table

The rates belong to one CPU (recorded as ``cpu``: vendor, model, family/model numbers, vector
flags): the same host name has been an AVX-512 and an AVX2 machine, with float32 products 2-4x
apart, so a stage's ratio is read against floors measured on its own CPU (yahoo_scale's report
says when they are not). The top-k's read of the scores is
counted at the memory bandwidth though ``recommend``'s blocks may keep them in cache (this part
may err high; about 2% of scoring's floor).

What a floor leaves out, and so why a ratio of 1 is unreachable: process and JVM start-up, Spark's
and Ray's scheduling, serialisation, Python, compression beyond Parquet's snappy, the ETL's
deduplication and split window. Shapes: the paper's Yahoo! Music (benchmarks/yahoo_scale.py:
1,876,280 users x 44,865 items, 48.8M positives, width 200, global batch 8,192 over 2 workers,
10% validation sampling) and ML-20M (138,362 x 22,884, 12.2M positives, as score_throughput and
train_throughput use). Results: ``benchmarks/results/floors.{json,md}``; other benchmarks call
``ratio_to_floor`` (or ``floor_seconds``) with their stage's seconds and shape.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import multiprocessing as mp
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "benchmarks" / "results" / "floors"
F32 = 4
SCORE_BLOCK_FLOATS = 1 << 22  # models.base's: scores per block of Recommender.recommend


# scoring's product, the same FLOPs in each: users per block (besides the shape's own
# ``score_batch``) and layouts of ``_matmul`` (the code's F.linear, W as stored with no bias,
# W' stored contiguous, and the items x users product W h')
SCORE_USERS = (512, 2048, 4096)
SCORE_LAYOUTS = ("linear", "nt", "nn", "wt")
# the exact float32 kernels a floor is the best of (torch's is MKL on x86, which takes a slow
# path on AMD CPUs; numpy's is its OpenBLAS, which dispatches on the CPU's features); bf16 is
# measured beside them, never a floor: its products are not the float32 ones
LIBS = ("torch", "numpy", "torch-bf16")
EXACT_LIBS = ("torch", "numpy")


@dataclass(frozen=True)
class Shape:
    """A dataset and run shape: what the stages' work is counted from."""

    users: int
    items: int
    positives: int
    width: int = 200
    k: int = 50
    global_batch: int = 8192
    workers: int = 2
    cold_share: float = 0.05       # the ETL's --cold-users: not trained, scored and evaluated
    valid_sample: float = 0.1      # training's --valid-sample
    negatives_per_user: int = 500  # the ETL's --negatives (draws; stored as distinct items)
    heads: int = 2                 # NCE-AutoRec's predict and NCE heads, both fast MSE losses

    @property
    def per_user(self) -> float:
        return self.positives / self.users

    @property
    def score_batch(self) -> int:
        """Users per product in scoring: ``Recommender.recommend`` scores a batch in blocks of
        ``SCORE_BLOCK_FLOATS`` scores (93 users at the Yahoo shape)."""
        return max(1, SCORE_BLOCK_FLOATS // self.items)

    @property
    def worker_batch(self) -> int:
        return self.global_batch // self.workers

    @property
    def negative_items(self) -> float:
        """Distinct items among a user's ``negatives_per_user`` draws (the rows table stores
        (item, count) pairs): sum_j 1 - (1 - p_j)^N for the synthetic data's popularity
        p_j ~ rank^-ALPHA (etl/synthetic.py). 325 of 500 draws at the Yahoo shape."""
        return distinct_draws(self.items, self.negatives_per_user)


@functools.cache
def distinct_draws(items: int, draws: int) -> float:
    """Expected distinct items in ``draws`` draws with replacement from p_j ~ rank_j^-ALPHA."""
    from etl.synthetic import ALPHA
    w = [(r + 1.0) ** -ALPHA for r in range(items)]
    total = sum(w)
    return sum(1 - (1 - x / total) ** draws for x in w)


SHAPES = {
    "yahoo": Shape(users=1_876_280, items=44_865, positives=48_817_561),
    "ml-20m": Shape(users=138_362, items=22_884, positives=12_217_365),
}

# split shares of a user's positives (the authors' arithmetic: train n - floor(n/2), valid
# floor(n/2) - floor(0.3 n), test floor(0.3 n); a user's n is large enough that the means are
# these shares to a few percent, and the floors below err low)
TRAIN, VALID, TEST = 0.5, 0.2, 0.3


# -- work: pure arithmetic over a Shape ------------------------------------------------------------
#
# Each returns {part: {"kind": rate key, "amount": units of that rate}}; the rate keys are those
# ``measure`` writes (FLOPs for matmul_*, bytes for bandwidth/gather/scatter/parquet_*, keys for
# sort: amount = n, scaled by n log n against the measured block).

def score_work(s: Shape, users: int | None = None, write: bool = True) -> dict:
    """Top-k of ``users`` (default: all) over every item."""
    u = s.users if users is None else users
    inputs = u * s.per_user * (TRAIN + VALID)  # scoring test: the input is train + valid
    work = {
        "products": {"kind": "matmul_score", "amount": 2.0 * u * s.width * s.items},
        "top-k read of the scores": {"kind": "bandwidth", "amount": float(u) * s.items * F32},
        "encoder gather": {"kind": "gather", "amount": inputs * s.width * F32},
        "read user rows": {"kind": "parquet_read_rows",
                           "amount": u * rows_bytes_per_user(s, "score")},
    }
    if write:
        work["write top-k lists"] = {"kind": "parquet_write_rows",
                                     "amount": u * recs_bytes_per_user(s)}
    return work


def step_work(s: Shape) -> dict:
    """One training step of one worker: NCE-AutoRec's joint step with both heads' fast loss
    (``models.autorec.losses._LinearMSE``), the encoder, L2, fused Adam and DDP's all-reduce."""
    n, d, b, h = s.items, s.width, s.worker_batch, s.heads
    nnz = b * s.per_user * TRAIN
    nd = float(n) * d * F32  # bytes of one (items, width) float32 matrix
    matrices = h + 1         # the heads' weights and the encoder's
    return {
        # W'W (forward) and W (h'h) (backward), per head: 2 n d^2 FLOPs each
        "Gram W'W": {"kind": "matmul_gram", "amount": h * 2.0 * n * d * d},
        "W (h'h)": {"kind": "matmul_wgrad", "amount": h * 2.0 * n * d * d},
        # h G (forward), grad_h = h G + ..., h'h: 2 b d^2 each, per head
        "batch products": {"kind": "matmul_batch", "amount": h * 3 * 2.0 * b * d * d},
        # W'b and the bias gradient's W sum_i h_i read W; grad_w's addr_ reads and writes it
        "head vectors": {"kind": "bandwidth", "amount": h * 4 * nd},
        # the encoder's EmbeddingBag, each head's EmbeddingBag of W at the targets and its
        # h.index_select at the targets: 1 + 2h gathers of nnz rows
        "gathers": {"kind": "gather", "amount": (1 + 2 * h) * nnz * d * F32},
        # the encoder's and each head's gradient at the targets: 1 + h scatters of nnz rows
        "scatters": {"kind": "scatter", "amount": (1 + h) * nnz * d * F32},
        # the encoder's dense gradient zero-filled; per matrix the L2 forward read (1), its
        # gradient (read w, write: 2) and its accumulation into the loss's (read 2, write 1)
        "encoder grad + L2": {"kind": "bandwidth", "amount": (1 + 6 * matrices) * nd},
        "Adam (fused)": {"kind": "bandwidth", "amount": 7 * matrices * nd},
        "DDP all-reduce": {"kind": "bandwidth", "amount": 2 * matrices * nd},
    }


def epoch_work(s: Shape) -> dict:
    """One epoch over the warm users, every worker's steps: ``step_work`` times the steps of all
    workers, plus reading the user rows."""
    warm = s.users * (1 - s.cold_share)
    steps = math.ceil(warm / s.global_batch) * s.workers  # every worker steps every time
    work = {part: {**w, "amount": w["amount"] * steps} for part, w in step_work(s).items()}
    work["read user rows"] = {"kind": "parquet_read_rows",
                              "amount": warm * rows_bytes_per_user(s, "train")}
    return work


def validate_work(s: Shape) -> dict:
    """One epoch's validation: the top-k of the sampled warm validation users, nothing written."""
    users = round(s.users * (1 - s.cold_share) * s.valid_sample)
    return score_work(s, users=users, write=False)


def evaluate_work(s: Shape) -> dict:
    """Metrics of every user's top-k against the test pairs: read both, one sort of all of them
    by (user, item) (a sort-merge join), then per-user sums in one streaming pass."""
    entries = s.users * s.k
    tests = s.positives * TEST
    return {
        "read top-k lists": {"kind": "parquet_read_rows", "amount": s.users * recs_bytes_per_user(s)},
        "read split table": {"kind": "parquet_read_split", "amount": s.positives * SPLIT_ROW_BYTES},
        "join: sort entries and test pairs": {"kind": "sort", "amount": entries + tests},
        "per-user sums": {"kind": "bandwidth", "amount": (entries + tests) * 2 * 8.0},
    }


def etl_work(s: Shape) -> dict:
    """Read the positives once, shuffle them once by user, write the three tables."""
    return {
        "read positives": {"kind": "parquet_read_split", "amount": s.positives * SPLIT_ROW_BYTES},
        "shuffle (write + read)": {"kind": "bandwidth",
                                   "amount": 2.0 * s.positives * SHUFFLE_ROW_BYTES},
        "write split table": {"kind": "parquet_write_split",
                              "amount": s.positives * SPLIT_ROW_BYTES},
        "write user rows": {"kind": "parquet_write_rows", "amount": s.users * rows_bytes_per_user(s)},
        "write users table": {"kind": "parquet_write_split", "amount": s.users * USERS_ROW_BYTES},
    }


WORK = {"score": score_work, "epoch": epoch_work, "validate": validate_work,
        "evaluate": evaluate_work, "etl": etl_work}

# Arrow bytes per row (values + offsets), for ids printed as decimal strings of up to 7 digits:
# the split table's user_id (7 + 4), item_id (5 + 4), split (5 + 4), timestamp (8)
SPLIT_ROW_BYTES = 37
USERS_ROW_BYTES = 4 + 11 + 1          # user_index int32, user_id string, cold bool
SHUFFLE_ROW_BYTES = 8 + 3 * 8          # Spark's UnsafeRow: a null bitmap word + user, item, time


def rows_bytes_per_user(s: Shape, read: str = "all") -> float:
    """Arrow bytes of one user's row in the rows table (values and offsets), of the columns
    ``read``: "all" (as the ETL writes it: index, id, cold flag, the split's item lists, R*
    beside train, the negatives as distinct items + counts), "train" (training.feed's for
    NCE-AutoRec: index, cold, train items and R*), "score" (evaluation/score.py's: id, cold,
    train and valid items)."""
    p = s.per_user
    if read == "train":
        return 4 + 1 + 2 * 4 + F32 * 2 * p * TRAIN
    if read == "score":
        return 11 + 1 + 2 * 4 + F32 * p * (TRAIN + VALID)
    lists = p * (2 * TRAIN + VALID + TEST) + 2 * s.negative_items
    return 4 + 11 + 1 + 7 * 4 + F32 * lists


def recs_bytes_per_user(s: Shape) -> float:
    """Arrow bytes of one user's top-k list (evaluation/score.py: user_id, item_ids as strings,
    scores float32, two list offsets)."""
    return 11 + 2 * 4 + s.k * (5 + 4 + F32)


def floor_seconds(work: dict, rates: dict) -> dict:
    """Each part's floor in seconds (its amount / its rate; sorts scaled by n log n from the
    measured block) and their sum, ``total``."""
    out = {}
    for part, w in work.items():
        if w["kind"] == "sort":
            n, block = w["amount"], rates["sort_block"]
            out[part] = n * math.log2(n) / (block * math.log2(block)) * block / rates["sort"]
        else:
            out[part] = w["amount"] / rates[w["kind"]]
    out["total"] = sum(out.values())
    return out


def at_peak(rates: dict, peak_fp32: float) -> dict:
    """``rates`` with every product at the machine's fp32 peak (the physical floor: what no
    kernel can beat); memory, sort and Parquet rates are measured rates already."""
    return {k: (peak_fp32 if k.startswith("matmul") else v) for k, v in rates.items()}


def load(path: Path = RESULTS) -> dict:
    """The committed floors (``benchmarks/results/floors.json``)."""
    return json.loads(path.with_suffix(".json").read_text())


def stage_floor(stage: str, shape: str | Shape = "yahoo", floors: dict | None = None,
                rates: str | None = None) -> float:
    """Seconds: ``stage``'s floor at ``shape`` (a name of ``SHAPES``, or a Shape: another scale)
    from the measured rates in ``floors`` (default: the committed results), those measured at
    the product shapes of ``SHAPES[rates]`` (default: ``shape``'s name, else Yahoo's)."""
    floors = load() if floors is None else floors
    s = SHAPES[shape] if isinstance(shape, str) else shape
    name = rates or (shape if isinstance(shape, str) else "yahoo")
    measured = floors.get("rates_by_shape", {}).get(name, floors["rates"])
    return floor_seconds(WORK[stage](s), measured)["total"]


def measured_floor(stage: str, shape: str | Shape = "yahoo", floors: dict | None = None,
                   rates: str | None = None) -> float | None:
    """``stage_floor``, or None where no floors were measured yet (no floors.json)."""
    try:
        return stage_floor(stage, shape, floors, rates)
    except FileNotFoundError:
        return None


def ratio_to_floor(stage: str, seconds: float, shape: str | Shape = "yahoo",
                   floors: dict | None = None, rates: str | None = None) -> float | None:
    """A stage's seconds over its floor (1 = at the floor); None without committed floors."""
    floor = measured_floor(stage, shape, floors, rates)
    return None if floor is None else seconds / floor


def pipeline_floors(shape: Shape, epochs: int, floors: dict | None = None) -> dict | None:
    """Seconds: the floor of each stage of benchmarks/yahoo_scale.py's pipeline at ``shape``
    (its training: ``epochs`` epochs, each validating ``shape.valid_sample`` of the users), and
    one epoch's training pass; None without committed floors."""
    try:
        floors = load() if floors is None else floors
    except FileNotFoundError:
        return None
    floor = lambda stage: stage_floor(stage, shape, floors)
    epoch = floor("epoch")
    return {"etl": floor("etl"), "train": epochs * (epoch + floor("validate")),
            "score": floor("score"), "evaluate": floor("evaluate"), "epoch": epoch}


# -- measuring: several one-thread processes at once -----------------------------------------------

def _run_worker(kernels: list, seconds: float, barrier, queue) -> None:
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch
    torch.set_num_threads(1)
    for i, (kind, args) in enumerate(kernels):
        fn = KERNELS[kind](**args)
        fn()  # warm up: allocations, first-touch pages, library dispatch
        barrier.wait()
        done, t0 = 0.0, time.perf_counter()
        while True:
            done += fn()
            took = time.perf_counter() - t0
            if took >= seconds:
                break
        queue.put((i, done, took))
        del fn  # free this kernel's operands before the next one allocates


def measure_many(kernels: list, workers: int, seconds: float) -> list[float]:
    """The summed rate (units/s) of ``workers`` processes each running every ``(kind, args)`` of
    ``kernels`` in turn for ``seconds``, started together for each (one spawn for them all)."""
    ctx = mp.get_context("spawn")
    barrier, queue = ctx.Barrier(workers), ctx.Queue()
    procs = [ctx.Process(target=_run_worker, args=(kernels, seconds, barrier, queue))
             for _ in range(workers)]
    for p in procs:
        p.start()
    rates = [0.0] * len(kernels)
    for _ in range(workers * len(kernels)):
        i, done, took = queue.get(timeout=600)
        rates[i] += done / took
    for p in procs:
        p.join()
    return rates


def measure(kind: str, args: dict, workers: int, seconds: float) -> float:
    """The summed rate (units/s) of ``workers`` processes each running ``KERNELS[kind]`` for
    ``seconds``, started together."""
    return measure_many([(kind, args)], workers, seconds)[0]


def _matmul(m: int, k: int, n: int, layout: str = "nn", lib: str = "torch"):
    """(m, k) x (k, n) as the stage stores its operands: "linear" = F.linear(x, W, b) with W
    (n, k) (a head's scores), "nt" = x W' with the same W and no bias, "wt" = W x' (the (n, m)
    product of the same operands: items x users), "tn" = A' B with A (k, m) (the Gram W'W),
    "nn" = A B with B (k, n) contiguous. ``lib``: "torch" (float32: MKL on x86), "numpy"
    (float32: its OpenBLAS), "torch-bf16" (bfloat16 operands, float32 sums: oneDNN, AMX where
    the CPU has it; not exact, so never a floor)."""
    import torch
    import torch.nn.functional as F
    if layout not in ("linear", "nt", "wt", "tn", "nn"):
        raise ValueError(f"_matmul: unknown layout {layout!r}")
    if lib not in LIBS:
        raise ValueError(f"_matmul: unknown lib {lib!r}")
    dtype = torch.bfloat16 if lib == "torch-bf16" else torch.float32
    a = torch.randn(k, m, dtype=dtype) if layout == "tn" else torch.randn(m, k, dtype=dtype)
    b = (torch.randn(n, k, dtype=dtype) if layout in ("linear", "nt", "wt")
         else torch.randn(k, n, dtype=dtype))
    bias = torch.randn(n, dtype=dtype)
    if lib == "numpy":
        if layout == "linear":
            raise ValueError("_matmul: 'linear' is torch's F.linear")
        a, b = a.numpy(), b.numpy()

    def fn() -> float:
        if layout == "linear":
            F.linear(a, b, bias)
        elif layout == "nt":
            a @ b.T
        elif layout == "wt":
            b @ a.T
        elif layout == "tn":
            a.T @ b
        else:
            a @ b
        return 2.0 * m * k * n
    return fn


def _triad(mib: int):
    import torch
    n = mib * 2**20 // 4
    a, b, c = torch.empty(n), torch.rand(n), torch.rand(n)

    def fn() -> float:
        torch.add(b, c, alpha=3.0, out=a)
        return 3.0 * n * 4
    return fn


def _gather(rows: int, width: int, picks: int, per_bag: int, scatter: bool = False):
    """Rows of a (rows, width) matrix at random indices, as the encoder and the fast loss read
    them (an EmbeddingBag sum over bags of ``per_bag`` rows), or added into it (index_add_, the
    gradient of a gather); bytes of the rows moved."""
    import torch
    import torch.nn.functional as F
    w = torch.randn(rows, width)
    idx = torch.randint(0, rows, (picks,))
    offsets = torch.arange(0, picks, per_bag)
    src = torch.randn(picks, width)

    def fn() -> float:
        if scatter:
            w.index_add_(0, idx, src)
        else:
            F.embedding_bag(idx, w, offsets, mode="sum")
        return float(picks) * width * 4
    return fn


def _sort(n: int):
    import numpy as np
    keys = np.random.default_rng(0).integers(0, 2**62, n)

    def fn() -> float:
        np.sort(keys)
        return float(n)
    return fn


def _parquet(table: str, write: bool, rows: int, per_user: float, negatives: float):
    import tempfile

    import pyarrow as pa
    import pyarrow.parquet as pq
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)
    t = sample_table(table, rows, per_user, negatives)
    path = Path(tempfile.mkdtemp(prefix="floors-")) / "t.parquet"
    pq.write_table(t, path, compression="snappy")

    def fn() -> float:
        if write:
            pq.write_table(t, path, compression="snappy")
        else:
            pq.read_table(path, use_threads=False)
        return float(t.nbytes)
    return fn


def _recommend(users: int, items: int, per_user: int, width: int = 200, k: int = 50):
    """Scoring's whole kernel as a Spark task runs it: an NCE-AutoRec's ``recommend`` (encoder,
    the predict head's product in blocks, the mask of the input items, the top k) of ``users``
    random users with ``per_user`` input items each; counted in the product's FLOPs, so its rate
    over ``matmul_score``'s is the share of the best product the kernel reaches, top-k included
    (benchmarks/score_throughput.py)."""
    import numpy as np
    import torch

    from models.batch import sparse_rows
    from models.registry import build
    torch.manual_seed(0)
    model = build("nce-autorec", {"lam_units": "plain", "n_items": items, "width": width}).eval()
    rng = np.random.default_rng(0)
    rows, offsets = sparse_rows([rng.choice(items, per_user, replace=False)
                                 for _ in range(users)])

    def fn() -> float:
        model.recommend(rows, offsets, k)
        return 2.0 * users * width * items
    return fn


def _fused(m: int, k: int, n: int, layout: str = "fused", lib: str = "c", top: int = 50):
    """Scoring's product by the fused kernel (``models.stream_topk``'s ``fused`` path): (m, k)
    users times (n, k) item rows plus a bias, each row's heap of its ``top`` + 1 best kept as the
    scores are made (the top-k's work is in the time, so the rate errs low). Counted as the
    product's FLOPs. ``layout`` and ``lib``: its column in the report's candidate tables."""
    import torch

    from models import stream_topk
    a, w, bias = torch.randn(m, k), torch.randn(n, k), torch.randn(n)
    none = (torch.zeros(0, dtype=torch.long), torch.zeros(m, dtype=torch.long))

    def fn() -> float:
        stream_topk.heaps("fused", a, w.T, bias, none, top)
        return 2.0 * m * k * n
    return fn


def _peak(path: str, kind: str):
    """The physical peak's FMA loop (benchmarks/peak.py), compiled at ``path``."""
    from benchmarks import peak
    return peak.kernel(path, kind)


KERNELS = {"matmul": _matmul, "recommend": _recommend, "triad": _triad, "gather": _gather, "sort": _sort,
           "parquet": _parquet, "peak": _peak, "fused": _fused}


def sample_table(kind: str, rows: int, per_user: float, negatives: float):
    """A table like the ETL's split table (``split``: a row per positive) or its user rows
    (``rows``: a row per user with the shape's list lengths), random ids as decimal strings."""
    import numpy as np
    import pyarrow as pa
    rng = np.random.default_rng(1)
    if kind == "split":
        users = np.sort(rng.integers(0, 1_876_280, rows))
        return pa.table({
            "user_id": pa.array(users.astype(str)),
            "item_id": pa.array(rng.integers(0, 44_865, rows).astype(str)),
            "split": pa.array(np.array(["train", "valid", "test"])[rng.integers(0, 3, rows)]),
            "timestamp": pa.array(rng.integers(10**9, 2 * 10**9, rows))})

    def lists(mean: float, dtype):
        lengths = rng.poisson(mean, rows)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
        values = (rng.random(offsets[-1]) if dtype == "float32"
                  else rng.integers(0, 44_865, offsets[-1])).astype(dtype)
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values)), lengths

    train, lengths = lists(per_user * TRAIN, "int32")
    rstar = pa.ListArray.from_arrays(train.offsets, pa.array(rng.random(lengths.sum()).astype("float32")))
    return pa.table({"user_index": pa.array(np.arange(rows, dtype=np.int32)),
                     "user_id": pa.array(np.arange(rows).astype(str)),
                     "cold": pa.array(np.zeros(rows, bool)),
                     "train_items": train, "train_rstar": rstar,
                     "valid_items": lists(per_user * VALID, "int32")[0],
                     "test_items": lists(per_user * TEST, "int32")[0],
                     "neg_items": lists(negatives, "int32")[0],
                     "neg_counts": lists(negatives, "int32")[0]})


def score_candidates(s: Shape) -> list[tuple[str, dict]]:
    """Scoring's product at ``s``'s shape in every block of users, layout and library measured,
    and by the fused kernel where it is built here: the same work (2 x users x width x items
    FLOPs), of which the fastest exact one is the floor's rate (F.linear is torch's alone)."""
    from models import stream_topk

    users = sorted({s.score_batch, *SCORE_USERS})
    fused = [("fused", {"m": m, "k": s.width, "n": s.items, "layout": "fused", "lib": "c"})
             for m in users if stream_topk.fused_here()]
    return [("matmul", {"m": m, "k": s.width, "n": s.items, "layout": layout, "lib": lib})
            for m in users for layout in SCORE_LAYOUTS for lib in EXACT_LIBS
            if not (layout == "linear" and lib == "numpy")] + fused


def product_candidates(m: int, k: int, n: int, layout: str = "nn") -> list[tuple[str, dict]]:
    """One product shape in each library: the floor's rate is the fastest exact one."""
    return [("matmul", {"m": m, "k": k, "n": n, "layout": layout, "lib": lib})
            for lib in EXACT_LIBS]


def best_of(candidates: list[tuple[str, dict]], rates: list[float]) -> tuple[float, dict]:
    """The highest rate and the arguments it was measured at."""
    i = max(range(len(rates)), key=rates.__getitem__)
    return rates[i], candidates[i][1]


def rate_plan(workers: int) -> dict:
    """(kernel, arguments) of every rate measured: the product shapes of both shapes' stages; a
    list of them where the best is taken (scoring's product)."""
    plan = {}
    for name, s in SHAPES.items():
        plan[f"matmul_score@{name}"] = score_candidates(s)
        plan[f"matmul_gram@{name}"] = product_candidates(s.width, s.items, s.width, "tn")
        plan[f"matmul_wgrad@{name}"] = product_candidates(s.items, s.width, s.width)
        plan[f"matmul_batch@{name}"] = product_candidates(s.worker_batch, s.width, s.width)
        # beside the floors, not one: the bf16 product at scoring's best fp32 block and layout
        plan[f"bf16_score@{name}"] = ("matmul", {"m": 2048, "k": s.width, "n": s.items,
                                                 "layout": "wt", "lib": "torch-bf16"})
    y = SHAPES["yahoo"]
    plan["bandwidth"] = ("triad", {"mib": 256})
    bag = round(y.per_user * TRAIN)  # a user's training items
    plan["gather"] = ("gather", {"rows": y.items, "width": y.width, "picks": 50_000,
                                 "per_bag": bag})
    plan["scatter"] = ("gather", {"rows": y.items, "width": y.width, "picks": 50_000,
                                  "per_bag": bag, "scatter": True})
    plan["sort"] = ("sort", {"n": SORT_BLOCK})
    for table, rows in (("split", 1_000_000), ("rows", 20_000)):
        for op in ("write", "read"):
            plan[f"parquet_{op}_{table}"] = ("parquet", {
                "table": table, "write": op == "write", "rows": rows,
                "per_user": y.per_user, "negatives": y.negative_items})
    return plan


SORT_BLOCK = 4_000_000


def rates_for(shape: str, measured: dict) -> dict:
    """The rates a shape's work uses: its own product shapes, the rest shared."""
    out = {k.split("@")[0]: v for k, v in measured.items()
           if k.endswith(f"@{shape}") and k.startswith("matmul_")}
    out.update({k: v for k, v in measured.items() if "@" not in k})
    out["sort_block"] = SORT_BLOCK
    return out


def cpu() -> str:
    """The CPU the rates belong to: vendor, model, family/model numbers, cores, vector flags and
    the kernels torch dispatches to (the same 'vm' and 'AMD EPYC' names have meant an AVX-512
    Zen 4 and an AVX2 Zen 3: a floor from another CPU is no floor)."""
    import torch

    from runtime.machine import cpu as cpu_info
    from runtime.machine import describe_cpu
    info = cpu_info()
    return (f"{info.get('vendor') or 'unknown vendor'}: {describe_cpu(info)}; "
            f"torch {torch.backends.cpu.get_cpu_capability()}")


def same_cpu(floors: dict | None = None) -> bool | None:
    """Whether the committed floors were measured on this CPU (None: no floors yet)."""
    try:
        floors = load() if floors is None else floors
    except FileNotFoundError:
        return None
    return floors.get("cpu") == cpu()


UNITS = {"matmul": (1e9, "GFLOP/s"), "bf16": (1e9, "GFLOP/s"), "sort": (1e6, "M keys/s")}


def unit(kind: str) -> tuple[float, str]:
    return UNITS.get(kind.split("_")[0].split("@")[0], (2**30, "GiB/s"))


def peak_lines(peaks: dict, workers: int) -> list[str]:
    """The report's paragraph on the physical peak."""
    if not peaks["fp32"]:
        return [f"Physical peak: not measured ({peaks['compiled']})."]
    bf16 = (f"; AVX512_BF16 dot products {peaks['bf16'] / 1e9:,.1f} GFLOP/s "
            f"({peaks['bf16'] / peaks['fp32']:.2f} of the fp32 peak: a bf16 product without AMX "
            "gains nothing here)" if peaks["bf16"] and peaks["bf16"] < peaks["fp32"] else
            f"; AVX512_BF16 dot products {peaks['bf16'] / 1e9:,.1f} GFLOP/s" if peaks["bf16"]
            else "")
    return [f"Physical peak (benchmarks/peak.py: independent FMAs in registers, `"
            f"{peaks['compiled']}`, {workers} one-thread processes): fp32 "
            f"**{peaks['fp32'] / 1e9:,.1f} GFLOP/s** ({peaks['fp32'] / workers / 1e9:,.1f} per "
            f"core){bf16}. A product's share of it is in the table's third column."]


def candidate_table(rows: list[dict]) -> list[str]:
    """GFLOP/s by (users or rows) x (layout, library), blank where not measured."""
    order = SCORE_LAYOUTS + ("tn", "fused")
    columns = sorted({(r.get("layout", "nn"), r.get("lib", "torch")) for r in rows},
                     key=lambda c: (order.index(c[0]), LIBS.index(c[1]) if c[1] in LIBS else 9))
    out = ["| m | " + " | ".join(f"{layout} {lib}" for layout, lib in columns) + " |",
           "|---" * (1 + len(columns)) + "|"]
    for m in sorted({r["m"] for r in rows}):
        cells = {(r.get("layout", "nn"), r.get("lib", "torch")): r["rate"]
                 for r in rows if r["m"] == m}
        out.append(f"| {m} | " + " | ".join(f"{cells[c] / 1e9:,.1f}" if c in cells else ""
                                             for c in columns) + " |")
    return out


def main(argv: list[str] | None = None) -> int:
    """The benchmark's steps in the order they run and are reported: a script's main, read top
    to bottom, each measurement's setup beside it."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--seconds", type=float, default=2.0, help="seconds per rate measured")
    p.add_argument("--workers", type=int, default=2,
                   help="one-thread processes run side by side (the stages' parallelism)")
    p.add_argument("--out", default=str(RESULTS))
    a = p.parse_args(argv)
    from benchmarks import peak, report
    stamp = {**report.stamp("floors.py", argv), "cpu": cpu()}
    measured, at, candidates = {}, {}, {}
    # the physical peak first: the FMA loop compiled for this CPU, in the same processes' setup
    lib, built = peak.build()
    peaks = {"compiled": built, "fp32": None, "bf16": None}
    if lib:
        for kind in ("fp32", "bf16") if peak.has_bf16(lib) else ("fp32",):
            peaks[kind] = measure("peak", {"path": lib, "kind": kind}, a.workers, a.seconds)
            print(f"{'peak ' + kind:28s} {peaks[kind] / 1e9:10.2f} GFLOP/s  ({built})", flush=True)
    else:
        print(f"peak: not measured: {built}", flush=True)
    for name, planned in rate_plan(a.workers).items():
        if isinstance(planned, list):  # several ways to do the same work: the best is the rate
            rates = measure_many(planned, a.workers, a.seconds)
            candidates[name] = [{**args, "rate": r} for (_, args), r in zip(planned, rates)]
            measured[name], at[name] = best_of(planned, rates)
        else:
            kernel, at[name] = planned
            measured[name] = measure(kernel, at[name], a.workers, a.seconds)
        scale, label = unit(name)
        print(f"{name:28s} {measured[name] / scale:10.2f} {label}  {at[name]}", flush=True)

    stages = {}
    for shape in SHAPES:
        rates = rates_for(shape, measured)
        for stage, fn in WORK.items():
            work = fn(SHAPES[shape])
            stages.setdefault(shape, {})[stage] = {
                "work": work, "floor_s": floor_seconds(work, rates),
                "peak_floor_s": (floor_seconds(work, at_peak(rates, peaks["fp32"]))
                                 if peaks["fp32"] else None)}
    payload = {**stamp, "workers": a.workers, "seconds_per_rate": a.seconds, "peak": peaks,
               "shapes": {k: asdict(v) for k, v in SHAPES.items()},
               "measured": measured, "measured_at": at, "candidates": candidates,
               "rates": rates_for("yahoo", measured),
               "rates_by_shape": {s: rates_for(s, measured) for s in SHAPES}, "stages": stages}
    lines = ["# A roofline per stage: each stage's floor on this machine", "",
             f"Command: `{stamp['command']}`  ",
             f"Commit: {stamp['commit']}; machine: {stamp['machine']}; CPU: {stamp['cpu']}; "
             f"{stamp['date']}.  ",
             f"Rates measured in this run with {a.workers} one-thread processes side by side "
             f"(the stages' parallelism), summed, {a.seconds:g} s each; a stage's floor is the "
             "sum over its parts of work / rate (benchmarks/floors.py says what each part "
             "counts and leaves out).", ""]
    lines += peak_lines(peaks, a.workers)
    lines += ["", "| rate | measured | of the fp32 peak | at |", "|---|---|---|---|"]
    for name, value in measured.items():
        scale, label = unit(name)
        best = " (best of the candidates below)" if name in candidates else ""
        share = (f"{value / peaks['fp32']:.2f}" if peaks["fp32"] and name.startswith(
            ("matmul", "bf16")) else "")
        lines.append(f"| {name} | {value / scale:,.2f} {label} | {share} | {at[name]}{best} |")
    lines += ["", "Each product's candidates below: GFLOP/s of each exact kernel measured for the "
              "same work, by layout and library (linear = F.linear(h, W, b), W (items, width) as "
              "nn.Linear stores it, the scoring code's kernel; nt = h W' without the bias; nn = "
              "h W' with W' stored contiguous; wt = W h', items x users; tn = A' B, the Gram "
              "W'W; torch is MKL on x86, numpy its OpenBLAS; fused c = models.stream_topk's "
              "fused kernel, the top 50 included); m is the users (or rows) of the product."]
    for name, rows in candidates.items():
        lines += ["", f"{name}:", ""] + candidate_table(rows)
    for shape, s in SHAPES.items():
        lines += ["", f"## {shape}: {s.users:,} users x {s.items:,} items, "
                  f"{s.positives:,} positives, width {s.width}, global batch {s.global_batch} "
                  f"over {s.workers} workers", "",
                  "Floor s: at the fastest exact kernel measured; at peak s: the products at the "
                  "fp32 peak instead (the physical floor), the other parts as measured.", "",
                  "| stage | part | work | floor s | at peak s |", "|---|---|---|---|---|"]
        for stage, r in stages[shape].items():
            physical = r["peak_floor_s"] or {}
            cell = lambda part, p=physical: (f"{p[part]:,.1f}" if part == "total" else
                                             f"{p[part]:,.2f}") if part in p else "–"
            for part, w in r["work"].items():
                scale, label = unit(w["kind"])
                amount = (f"{w['amount'] / 1e12:,.2f} TFLOP" if w["kind"].startswith("matmul")
                          else f"{w['amount'] / 1e6:,.1f} M keys" if w["kind"] == "sort"
                          else f"{w['amount'] / 2**30:,.2f} GiB")
                lines.append(f"| {stage} | {part} ({w['kind']}) | {amount} | "
                             f"{r['floor_s'][part]:,.2f} | {cell(part)} |")
            lines.append(f"| **{stage}** | **floor** | | **{r['floor_s']['total']:,.1f}** | "
                         f"**{cell('total')}** |")
    report.publish(Path(a.out), payload, lines)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
