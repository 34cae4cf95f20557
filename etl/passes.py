"""The ETL's per-user work in numpy, one shuffle partition at a time (``etl.pipeline`` runs these
inside Spark's ``mapInArrow``, on the rows the shuffle by user, ``etl.shuffle``, brought together).

Three passes over a partition, each a plain function of Arrow data:

- ``dedup``: the partition's rating rows in, one row per user out: the user's positive items,
  their times (and given splits and seeded split hashes where the split needs them), and the
  counts the manifest reports; plus two rows naming the partition's distinct items.
- ``split_codes``: a user's positives labelled train, valid or test (by time, by a seeded
  permutation, or as the input gave them), from the lists ``dedup`` made.
- ``user_rows`` (via ``build_rows``) and the long split table, written by the last pass.

Before this module each step was a Spark action over every positive (a hash aggregate for the
dedup, a window sort for the split, a join per index): five passes over 49M rows at the Yahoo
scale, 5.8x the cost of generating, shuffling and writing the same data. A partition here holds
about 500k positives, so sorting it whole in Arrow is cheaper than Spark's sort and carries no
state across Arrow batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from etl.config import PositiveRule
from prepared.lists import list_offsets as offsets  # also etl.pipeline's passes.offsets

#: stands for a missing timestamp in sort keys: Spark orders nulls first, and so does this
NULL_TS = np.iinfo(np.int64).min
#: ``dedup``'s extra rows: ``n_pos`` marks them (a user has ``n_pos >= 0``); ``user_id`` is null
ALL_ITEMS, POSITIVE_ITEMS = -1, -2


def as_int(a: pa.Array | pa.ChunkedArray, fill: int = 0) -> np.ndarray:
    """An integer Arrow array as numpy, nulls as ``fill``."""
    return pc.fill_null(a, fill).to_numpy(zero_copy_only=False)


def _changes(a: pa.Array) -> np.ndarray:
    """``out[i]``: whether ``a[i + 1] != a[i]`` (ids are never null)."""
    if len(a) < 2:
        return np.zeros(0, bool)
    if pa.types.is_integer(a.type):
        x = a.to_numpy(zero_copy_only=False)
        return x[1:] != x[:-1]
    return pc.not_equal(a.slice(1), a.slice(0, len(a) - 1)).to_numpy(zero_copy_only=False)


def positive(rule: PositiveRule, rating: np.ndarray) -> np.ndarray:
    """``etl.pipeline.positive_condition`` on a float array (NaN: a missing rating)."""
    if rule.all_rows:
        return np.ones(len(rating), bool)
    ok = ~np.isnan(rating)
    with np.errstate(invalid="ignore"):
        if rule.low is not None:
            ok &= (rating >= rule.low) if rule.low_inclusive else (rating > rule.low)
        if rule.high is not None:
            ok &= (rating <= rule.high) if rule.high_inclusive else (rating < rule.high)
    return ok


def lists_schema(id_type: pa.DataType, item_type: pa.DataType, given: bool, hashed: bool) -> pa.Schema:
    """``dedup``'s lists: a user's positives (``items``, ``ts``, and where the split needs them
    ``given`` and ``rhash``, aligned, ascending by item id)."""
    fields = [("user_id", id_type), ("n_pos", pa.int32()), ("items", pa.list_(item_type)),
              ("ts", pa.list_(pa.int64()))]
    if given:
        fields.append(("given", pa.list_(pa.int8())))
    if hashed:
        fields.append(("rhash", pa.list_(pa.int64())))
    return pa.schema(fields)


#: ``dedup``'s counts per user (rows of the input, distinct pairs, positives, pairs rated 255,
#: pairs given in two splits, positives given to each split, positives with a time); ``items``
#: is null but on the two rows per partition that ``n_pos`` marks (``ALL_ITEMS``)
COUNTS = ("rows", "pairs", "r255", "twice", "given_train", "given_valid", "given_test", "timed")


def counts_schema(id_type: pa.DataType, item_type: pa.DataType) -> pa.Schema:
    return pa.schema([("user_id", id_type), ("n_pos", pa.int32()),
                      *[(c, pa.int64()) for c in COUNTS], ("items", pa.list_(item_type))])


def dedup(rows: pa.Table, rule: PositiveRule, lists: pa.Schema,
          counts: pa.Schema) -> tuple[pa.RecordBatch, pa.RecordBatch]:
    """One partition's rating rows (``user_id, item_id, rating, timestamp, gpos, given`` and,
    where the split is seeded, ``rhash``; at least one row) to each user's positives
    (``lists_schema``, users with any) and counts (``counts_schema``, every user).

    The latest row of a (user, item) pair decides (time, then input position; a missing time is
    the oldest), then the rule binarises it. A pair given in two splits keeps the earlier one.
    Two more rows of counts (``n_pos`` ``ALL_ITEMS`` and ``POSITIVE_ITEMS``) list the
    partition's distinct items of all pairs and of the positive ones.
    """
    given_col, hashed = "given" in lists.names, "rhash" in lists.names
    rows = rows.append_column("_t", pc.fill_null(rows.column("timestamp"), NULL_TS))
    rows = rows.take(pc.sort_indices(rows, sort_keys=[
        ("user_id", "ascending"), ("item_id", "ascending"), ("_t", "ascending"),
        ("gpos", "ascending")])).combine_chunks()
    n = rows.num_rows
    user, item = rows.column("user_id").chunk(0), rows.column("item_id").chunk(0)
    new_user = np.ones(n, bool)
    new_user[1:] = _changes(user)
    new_pair = new_user.copy()
    new_pair[1:] |= _changes(item)
    first = np.flatnonzero(new_pair)  # each pair's rows: [first, last]
    last = np.append(first[1:], n) - 1
    user_start = np.flatnonzero(new_user)
    pair_owner = np.cumsum(new_user)[first] - 1
    n_users = len(user_start)
    rating = pc.fill_null(pc.cast(rows.column("rating"), pa.float64()), np.nan).to_numpy(
        zero_copy_only=False)[last]
    is_pos = positive(rule, rating)
    g = as_int(rows.column("given"), -1).astype(np.int8)
    g_min = np.minimum.reduceat(g, first)
    twice = g_min != np.maximum.reduceat(g, first)
    ts = rows.column("timestamp").chunk(0)
    timed = pc.is_valid(ts).to_numpy(zero_copy_only=False)[last]

    per_user = lambda w=None: np.bincount(pair_owner, weights=w, minlength=n_users).astype(np.int64)
    n_pos = per_user(is_pos)
    ids = user.take(pa.array(user_start))
    per = {"rows": np.diff(np.append(user_start, n)), "pairs": per_user(),
           "r255": per_user(rating == 255), "twice": per_user(twice),
           "timed": per_user(is_pos & timed),
           **{f"given_{s}": per_user(is_pos & (g_min == k))
              for k, s in enumerate(("train", "valid", "test"))}}
    no_items = pa.nulls(n_users, counts.field("items").type)
    users = pa.RecordBatch.from_arrays(
        [ids, pa.array(n_pos, pa.int32()), *[pa.array(per[c], pa.int64()) for c in COUNTS],
         no_items], schema=counts)
    extra = []  # the partition's distinct items: two rows with a null user
    pos_rows = pa.array(last[is_pos])
    for marker, taken in ((ALL_ITEMS, pa.array(last)), (POSITIVE_ITEMS, pos_rows)):
        distinct = pc.unique(item.take(taken))
        extra.append(pa.RecordBatch.from_arrays(
            [pa.nulls(1, ids.type), pa.array([marker], pa.int32()),
             *[pa.array([0], pa.int64()) for _ in COUNTS],
             pa.ListArray.from_arrays(pa.array([0, len(distinct)], pa.int32()), distinct)],
            schema=counts))

    has = np.flatnonzero(n_pos > 0)
    off = offsets(n_pos[has])
    cols = [ids.take(pa.array(has)), pa.array(n_pos[has], pa.int32()),
            pa.ListArray.from_arrays(off, item.take(pos_rows)),
            pa.ListArray.from_arrays(off, ts.take(pos_rows))]
    if given_col:
        cols.append(pa.ListArray.from_arrays(off, pa.array(g_min[is_pos], pa.int8())))
    if hashed:
        cols.append(pa.ListArray.from_arrays(off, rows.column("rhash").chunk(0).take(pos_rows)))
    out = pa.RecordBatch.from_arrays(cols, schema=lists)
    return out, pa.Table.from_batches([users, *extra]).combine_chunks().to_batches()[0]


@dataclass(frozen=True)
class SplitRule:
    """How ``split_codes`` labels a user's positives (``etl.pipeline.split_rule`` builds it)."""

    mode: str                  # time | random | given
    test: tuple[int, int]      # test fraction t as (numerator, denominator)
    holdout: tuple[int, int]   # valid + test fraction h
    carve: tuple[int, int] | None = None  # given: the share of train carved into valid
    carve_by: str = "time"     # given: time | random


def split_codes(lengths: np.ndarray, item_index: np.ndarray, ts: np.ndarray,
                given: np.ndarray | None, rhash: np.ndarray | None, rule: SplitRule) -> np.ndarray:
    """Split code (0 train, 1 valid, 2 test) of each positive of users whose positives lie
    contiguous (``lengths`` per user): what the Spark window over a user's positives gave.

    Time: oldest first (a missing time first; ties by item index); of n positives the newest
    floor(n t) are test and the floor(n (h - t)) before them valid. Random: the same cut in a
    seeded per-user order (``rhash``, ties by item index). Given: as given; where the input gave
    no validation, of each user's m train positives the newest (or last in the seeded order)
    floor(m * carve) become valid.
    """
    n_users = len(lengths)
    owner = np.repeat(np.arange(n_users), lengths)

    def ranks(sel: np.ndarray, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Each selected positive's 0-based place in its user's order, and the users' counts."""
        o = sel[lexorder(owner[sel], key[sel], item_index[sel])]
        count = np.bincount(owner[sel], minlength=n_users)
        start = np.zeros(n_users, np.int64)
        np.cumsum(count[:-1], out=start[1:])
        k = np.empty(len(owner), np.int64)
        k[o] = np.arange(len(o)) - start[owner[o]]
        return k, count

    everyone = np.arange(len(owner))
    if rule.mode in ("time", "random"):
        k, _ = ranks(everyone, ts if rule.mode == "time" else rhash)
        n = lengths[owner].astype(np.int64)
        n_test = n * rule.test[0] // rule.test[1]
        n_hold = n * rule.holdout[0] // rule.holdout[1]
        return np.where(k < n - n_hold, 0, np.where(k < n - n_test, 1, 2)).astype(np.int8)
    code = given.astype(np.int8).copy()
    if rule.carve is not None:
        train = np.flatnonzero(code == 0)
        k, m = ranks(train, ts if rule.carve_by == "time" else rhash)
        m = m[owner[train]].astype(np.int64)
        n_valid = m * rule.carve[0] // rule.carve[1]
        code[train[k[train] >= m - n_valid]] = 1
    return code


def lexorder(owner: np.ndarray, key: np.ndarray, item: np.ndarray) -> np.ndarray:
    """The permutation sorting positives by (owner, key, item), a total order (a user's items are
    distinct). One argsort of a packed int64 where the three fit in 63 bits (the key as its rank
    among the keys): three times faster than ``np.lexsort``'s three passes, which it falls back
    to otherwise."""
    if len(owner) == 0:
        return np.zeros(0, np.int64)
    _, rank = np.unique(key, return_inverse=True)
    bits = [int(x.max()).bit_length() for x in (owner, rank, item)]
    if sum(bits) > 63 or item.min() < 0:
        return np.lexsort((item, key, owner))
    packed = ((owner.astype(np.int64) << (bits[1] + bits[2])) | (rank.astype(np.int64) << bits[2])
              | item.astype(np.int64))
    return np.argsort(packed)


def flat(batch: pa.RecordBatch, name: str, fill: int = 0) -> np.ndarray:
    """The values of list column ``name`` as one numpy array (nulls as ``fill``)."""
    return as_int(batch.column(name).flatten(), fill)


class IdLookup:
    """Positions of raw ids (longs or strings) in a table's id column; every id must be there."""

    def __init__(self, ids: pa.Array, what: str):
        self.what = what
        self.numeric = pa.types.is_integer(ids.type)
        if self.numeric:
            values = ids.to_numpy(zero_copy_only=False)
            self.order = np.argsort(values, kind="stable")
            self.sorted = values[self.order]
        else:
            self.ids = ids

    def __call__(self, raw: pa.Array) -> np.ndarray:
        if self.numeric:
            values = raw.to_numpy(zero_copy_only=False)
            at = np.minimum(np.searchsorted(self.sorted, values), max(len(self.sorted) - 1, 0))
            found = self.sorted[at] == values if len(self.sorted) else np.zeros(len(values), bool)
            at = self.order[at] if len(self.sorted) else at
        else:
            at = as_int(pc.index_in(raw, value_set=self.ids), -1)
            found = at >= 0
        if not found.all():  # the tables are built from these very lists: a bug, not bad input
            raise RuntimeError(f"{int((~found).sum())} ids missing from the {self.what} table")
        return at
