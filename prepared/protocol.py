"""The paper's data arithmetic as plain numpy functions: split sizes, R*, negative draws.

These are the reference definitions (see ``shared/notes/protocol.md``). The Spark job computes the
same quantities with SQL expressions built from the same constants; the tests tie the two together.
Nothing here imports pyspark.
"""

from __future__ import annotations

from fractions import Fraction

import numpy as np

# splitmix64 constants (Steele, Lea, Flood 2014): a counter-based generator, so a user's draws depend
# only on (seed, user index, draw number) and never on how Spark partitioned the users.
# Evaluation (protocol.md): every stage ranks a top list of TOP_K items, and the metrics' cut-offs
TOP_K = 50
KS = (5, 10, 15, 20, 50)
# the paper's table columns, in its order: what the evaluation and the experiment tabulate
TABLE = ("R-Precision", "NDCG", "MAP@5", "MAP@50", "Precision@5", "Precision@50", "Recall@5",
         "Recall@50")
# the common conventions beside them (an extension: issue 31), that a number may be set beside a
# published table that uses them: NDCG@K with the ideal over min(|T|, K), Recall@K, HR@K and MRR@K
# at K 20 and 50 (Recall@50 is the paper's too). The experiment tabulates them after TABLE.
STANDARD = ("NDCG@20 (truncated)", "Recall@20", "HR@20", "MRR@20", "NDCG@50 (truncated)", "HR@50",
            "MRR@50")

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def as_fraction(value: float | str) -> Fraction:
    """The exact rational a flag like ``0.3`` means (not the nearest binary float)."""
    return Fraction(str(value))


def split_sizes(n: np.ndarray | int, test_fraction: float = 0.3,
                holdout_fraction: float = 0.5) -> tuple:
    """(n_train, n_valid, n_test) for users with ``n`` positives, the authors' arithmetic.

    n_test = floor(0.3 n), n_valid = floor(0.5 n) - floor(0.3 n), n_train = n - floor(0.5 n).
    Floors are taken in exact rational arithmetic; for every n < 2,000,000 this equals the
    authors' ``int(0.3 * n)`` in binary floating point (checked once, exhaustively).
    """
    t, h = as_fraction(test_fraction), as_fraction(holdout_fraction)
    n = np.asarray(n, dtype=np.int64)
    n_test = n * t.numerator // t.denominator
    n_holdout = n * h.numerator // h.denominator
    return n - n_holdout, n_holdout - n_test, n_test


def split_labels(n: int, test_fraction: float = 0.3, holdout_fraction: float = 0.5) -> list[str]:
    """Split label of each of a user's ``n`` positives, ordered oldest first."""
    n_train, n_valid, n_test = (int(x) for x in split_sizes(n, test_fraction, holdout_fraction))
    return ["train"] * n_train + ["valid"] * n_valid + ["test"] * n_test


def r_star(popularity: np.ndarray, z: float, beta: float) -> np.ndarray:
    """Closed-form NCE target of an observed entry: max(log Z - beta * log pop_j, 0).

    ``popularity`` (n,) int counts >= 1; natural log, as in the paper's eq. 11.
    """
    pop = np.asarray(popularity, dtype=np.float64)
    if np.any(pop < 1):
        raise ValueError("R* is defined for observed training entries only, whose popularity is >= 1")
    return np.maximum(np.log(z) - beta * np.log(pop), 0.0)


def rstar_z(rule: str, users: int, positives: int) -> float:
    """Z of R*'s log Z: the number of training users (``users``, the authors' code and our
    default) or the number of training positives (``positives``, the paper's formula)."""
    if rule == "users":
        return float(users)
    if rule == "positives":
        return float(positives)
    raise ValueError(f"unknown Z rule {rule!r}; choose users or positives")


def rstar_per_item(pop_train: np.ndarray, z: float, beta: float) -> np.ndarray:
    """(n_items,) R* of an observed training entry of each item; 0 where an item has no training
    positive (no training entry of it exists). Training recomputes R* for another beta from the
    stored popularity with this same function."""
    pop_train = np.asarray(pop_train)
    out = np.zeros(len(pop_train), np.float64)
    seen = pop_train > 0
    out[seen] = r_star(pop_train[seen], z, beta)
    return out


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finaliser, elementwise on uint64 (wrapping arithmetic)."""
    return _mix_inplace(np.array(x, dtype=np.uint64))  # a copy: the caller's array is kept


def _mix_inplace(z: np.ndarray) -> np.ndarray:
    """``splitmix64`` of a uint64 array, in place: each step reuses ``z`` and one scratch array
    where the expression form allocates a fresh array per operator (eight of them, each as large
    as ``z``, page-faulted in anew when large); ``z`` is returned."""
    t = np.empty_like(z)
    with np.errstate(over="ignore"):
        z += _GOLDEN
        for shift, mult in ((30, _MIX1), (27, _MIX2)):
            np.right_shift(z, np.uint64(shift), out=t)
            z ^= t
            z *= mult
        np.right_shift(z, np.uint64(31), out=t)
        z ^= t
    return z


def _user_keys(seed: int, users: np.ndarray) -> np.ndarray:
    """Each user's counter base: draw d of user u is ``splitmix64(key[u] + d)``."""
    with np.errstate(over="ignore"):
        return splitmix64(splitmix64(np.uint64(seed) ^ _GOLDEN) ^ np.asarray(users, np.uint64))


def _bits_of(keys: np.ndarray, draws: int) -> np.ndarray:
    """(len(keys), draws) uint64: ``splitmix64(keys[:, None] + arange(draws))``."""
    with np.errstate(over="ignore"):
        z = keys[:, None] + np.arange(draws, dtype=np.uint64)[None, :]
    return _mix_inplace(z)


def random_bits(seed: int, users: np.ndarray, draws: int) -> np.ndarray:
    """(len(users), draws) uint64 random bits, a pure function of (seed, user, draw)."""
    return _bits_of(_user_keys(seed, users), draws)


def uniform01(seed: int, users: np.ndarray, draws: int) -> np.ndarray:
    """(len(users), draws) float64 uniforms in [0, 1), a pure function of (seed, user, draw)."""
    return (random_bits(seed, users, draws) >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def alias_table(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Walker/Vose alias table of ``weights``: (prob float64, alias int64), both of length n.

    Draw k uniformly, keep k with probability prob[k], else take alias[k]: p(j) = w_j / sum(w),
    exact up to floating-point rounding of ``prob``.
    """
    w = np.asarray(weights, dtype=np.float64)
    n = len(w)
    if n == 0 or w.sum() <= 0:
        raise ValueError("an alias table needs at least one positive weight")
    scaled = w * (n / w.sum())
    prob = np.ones(n)
    alias = np.arange(n, dtype=np.int64)
    small = [i for i in range(n) if scaled[i] < 1.0]
    large = [i for i in range(n) if scaled[i] >= 1.0]
    while small and large:
        s, g = small.pop(), large.pop()
        prob[s], alias[s] = scaled[s], g
        scaled[g] -= 1.0 - scaled[s]
        (small if scaled[g] < 1.0 else large).append(g)
    for i in small + large:  # leftovers are 1 up to rounding
        prob[i] = 1.0
    return prob, alias


def draw_alias(bits: np.ndarray, prob: np.ndarray, alias: np.ndarray) -> np.ndarray:
    """Items for 64-bit random ``bits``: the high 32 bits pick a slot, the low 32 bits accept it."""
    n = np.uint64(len(prob))
    slot = ((bits >> np.uint64(32)) * n >> np.uint64(32)).astype(np.int64)
    accept = (bits & np.uint64(0xFFFFFFFF)).astype(np.float64) * (1.0 / 2**32) < prob[slot]
    return np.where(accept, slot, alias[slot])


#: draws per block of ``negative_counts``: 128k (1 MiB of bits, 262 users of the ETL's 500
#: draws), within 7% of the fastest of 16k-2M for calls of 8k and 40k users on the 2-core VM,
#: 15% for calls of 400 (5 ms each) (negative_draws.md)
DRAW_BLOCK = 1 << 17


def negative_counts(users: np.ndarray, popularity: np.ndarray, draws: int, seed: int,
                    table: tuple[np.ndarray, np.ndarray] | None = None
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per user, ``draws`` items drawn with replacement from p(j) = pop_j / sum(pop), aggregated.

    Positives are not excluded (NS approximates NCE's expectation over all items). Draw d of
    user u depends only on (seed, u, d), never on batching. ``table`` is ``alias_table(popularity)``
    when the caller reuses it across batches. Probabilities are exact up to 2^-32 (the alias
    acceptance test's resolution), far below any sampling noise.

    Returns CSR-style arrays: ``offsets`` (len(users) + 1,) int64, ``items`` int32 ascending within
    each user, ``counts`` int32 (summing to ``draws`` per user).
    """
    users = np.asarray(users, dtype=np.int64)
    if draws == 0 or len(users) == 0:
        return np.zeros(len(users) + 1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32)
    prob, alias = table if table is not None else alias_table(popularity)
    keys = _user_keys(seed, users)
    # Users in blocks of about DRAW_BLOCK draws: a block's bits, slots and sort stay in cache,
    # where drawing every user's at once streams each intermediate through memory: 1.6x slower
    # for a training batch of 8,192 users, 2.4x for 40,000; the same for the ETL's calls of a few
    # hundred users (benchmarks/results/negative_draws.md). Same draws either way.
    step = max(1, DRAW_BLOCK // draws)
    per_user = np.zeros(len(users), np.int64)
    items_out, counts_out = [], []
    for lo in range(0, len(users), step):
        block = keys[lo:lo + step]
        items = draw_alias(_bits_of(block, draws), prob, alias).astype(np.int32)
        items.sort(axis=1)
        # run-length encode each user's sorted draws, per row: a run starts at a row's first
        # draw or where the item changes (2.6x faster than flat with the counts' owner divided out)
        new = np.empty(items.shape, bool)
        new[:, 0] = True
        np.not_equal(items[:, 1:], items[:, :-1], out=new[:, 1:])
        per_user[lo:lo + len(block)] = np.count_nonzero(new, axis=1)
        starts = np.flatnonzero(new)
        ends = np.empty_like(starts)
        ends[:-1], ends[-1] = starts[1:], items.size
        items_out.append(items.ravel()[starts])
        counts_out.append((ends - starts).astype(np.int32))
    offsets = np.zeros(len(users) + 1, np.int64)
    np.cumsum(per_user, out=offsets[1:])
    return offsets, np.concatenate(items_out), np.concatenate(counts_out)


def head_items(popularity: np.ndarray, fraction: float = 0.1) -> np.ndarray:
    """(m,) indices of the ``fraction`` most popular items, m = max(1, floor(fraction * n)).
    Ties at the boundary go to the lower item index (a stable sort), so the set is deterministic."""
    m = max(1, int(len(popularity) * fraction))
    return np.argsort(-np.asarray(popularity), kind="stable")[:m]


def user_overlap(popularity: np.ndarray, users: int) -> float:
    """omega = sum_i c_i^2 / U^2: the mean number of training items two of the U users share (a
    user paired with herself included), i.e. the mean entry of the user Gram R R' (c_i: item i's
    training positives; R' 1 = c).

    The unit of the AutoRec family's lambda (``--lam-units overlap``). Linearised, the model
    predicts R E W' and its L2 on the factors E, W is a nuclear-norm penalty on E W', which is
    weighed against the spectrum of R'R: the same as that of R R', whose leading eigenvalue is
    about U * omega (exactly so for a constant R R'). The loss is a mean over U x n entries and the
    L2 a mean over the n x d weights, so the lambda that balances them scales with omega.
    Measured, the best lambda in plain units moved about 100x from ml-100k (omega 2.9) to
    citeulike-a (omega 0.04); in units of omega the best values of four datasets lie within a
    few-fold (benchmarks/results/tune_defaults.md)."""
    c = np.asarray(popularity, dtype=np.float64)
    if users < 1 or c.sum() <= 0:
        raise ValueError(f"need users >= 1 and some positives; got {users} users, {c.sum():g} positives")
    return float((c * c).sum() / (users * users))
