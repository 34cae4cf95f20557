"""The paper's metrics and the common conventions beside them (``prepared/metrics.py`` states
the definitions) as evaluation/evaluate.py computes them on Spark: the metrics' names and column
keys, the lists encoded to item indices (``encode_lists``, a mapInArrow), and every metric of a
batch of users with numpy on the executors (``batch_metrics``); nothing per user reaches the
driver.

This is a second implementation of the same definitions: ``tests/evaluation/test_score_evaluate.py`` checks
evaluate.py's per-user values against the numpy reference (``prepared.metrics.per_user``) user by
user. The numpy here sums in the order Spark SQL's ``aggregate`` does and takes the NDCG
discounts from Spark SQL (``inverse_logs``), so it equals to the last bit the SQL expressions
evaluate.py used before, kept as a test reference in ``tests/spark_reference.py``
(``tests/evaluation/test_arrow_metrics.py`` compares the two).
"""

from __future__ import annotations

import re

import numpy as np

from prepared.protocol import KS, TOP_K

# one order for tables and files: R-Precision, NDCG, then per K; the common conventions last
METRICS = ("R-Precision", "NDCG") + tuple(
    f"{m}@{k}" for m in ("Precision", "Recall", "MAP", "F1") for k in KS) + tuple(
    f"NDCG@{k} (truncated)" for k in KS) + tuple(f"{m}@{k}" for m in ("HR", "MRR") for k in KS)


def metrics_for(k: int) -> tuple[str, ...]:
    """The metrics a file of top-``k`` lists supports: those at cut-offs K <= k, and NDCG and
    R-Precision (defined on the top-50 list) only when k reaches TOP_K."""
    return tuple(m for m in METRICS if (split_name(m)[1] or TOP_K) <= k)


def metric_key(name: str) -> str:
    """A column / MLflow-safe key: 'Recall@50' -> 'recall_at_50', 'NDCG@5 (truncated)' ->
    'ndcg_at_5_truncated'."""
    key = name.lower().replace("@", "_at_").replace("-", "_")
    return re.sub(r"[^a-z0-9_]+", "_", key).strip("_")


def split_name(name: str) -> tuple[str, int | None]:
    """('Recall', 50) for 'Recall@50'; ('NDCG', None) for 'NDCG'."""
    m = re.fullmatch(r"([A-Za-z1-]+)@(\d+)(.*)", name)
    return (m.group(1) + m.group(3), int(m.group(2))) if m else (name, None)


# ---- the metrics on Arrow batches (mapInArrow): one pass, numpy on the executors ---------------
#
# Not Spark SQL: its higher-order functions are interpreted row by row (no code generation), and
# at millions of users the SQL reference's (tests/spark_reference.py) O(L^2) hit counts and forty
# metric expressions cost minutes of CPU. The functions below compute the same values from the
# same arrays with numpy, a batch of users at a time, summing in the same (sequential) order as
# the SQL ``aggregate`` does. They also map the
# lists' raw item ids to item indices (Arrow's hash lookup, no Python strings), which the
# popularity analysis counts from the cached result instead of joining the lists again.

def _flat(col) -> tuple[object, np.ndarray, np.ndarray]:
    """(values Arrow array, lengths, owner row of each value) of an Arrow list column; a null
    list is empty. flatten() honours slices (apache/arrow#37733)."""
    import pyarrow as pa

    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    lengths = col.value_lengths().fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    owner = np.repeat(np.arange(len(col)), lengths)
    return col.flatten(), lengths, owner


def metric_arrays(hits: np.ndarray, n: np.ndarray, k: int,
                  inverse_log: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Every metric of ``metrics_for(k)`` per user, as the SQL reference computes it: ``hits``
    (U, L) float64 (L = the largest K <= k; 1 where the list's item at that rank is in the truth
    set, 0 past the list's end), ``n`` (U,) float64 truth set sizes, all >= 1.

    ``inverse_log[j]`` = 1 / log2(j + 1) for j = 0.. at least max(L, max(n)), as Spark computes
    it (``inverse_logs``): the SQL's log2 and numpy's can differ in the last bit, and a last bit
    decides which users' differences tie in the Wilcoxon test. None: numpy's."""
    ks = [K for K in KS if K <= k]
    length = hits.shape[1]
    ranks = np.arange(1, length + 1, dtype=np.float64)
    top = int(n.max(initial=1))
    if inverse_log is None:
        inverse_log = 1.0 / np.log2(np.arange(0, max(top, length) + 1, dtype=np.float64) + 1)
    gains = hits * inverse_log[1:length + 1]  # x / log2(i + 2), x 0 or 1, i 0-based
    ideal = np.cumsum(inverse_log[1:top + 1])  # idcg(1..top), added in order
    cum = np.cumsum(hits, axis=1)  # hits@i, exact integers
    rows = np.arange(len(n))
    found = hits.any(axis=1)
    first = np.where(found, hits.argmax(axis=1) + 1, 0)  # array_position: 0 when none
    # running sums added left to right, as SQL ``aggregate(..., 0D, acc + v)`` adds (numpy's
    # ``sum`` adds pairwise: a different rounding); column K - 1 is the sum of the first K
    # entries, so one pass serves every K
    gain_sums = np.cumsum(gains, axis=1)
    precision_sums = np.cumsum(cum / ranks, axis=1)
    out = {"NDCG": gain_sums[:, -1] / ideal[n.astype(np.int64) - 1],
           "R-Precision": cum[rows, np.minimum(n, length).astype(np.int64) - 1] / n}
    for K in ks:
        h = cum[:, K - 1]
        p, r = h / K, h / n
        out[f"Precision@{K}"] = p
        out[f"Recall@{K}"] = r
        out[f"MAP@{K}"] = precision_sums[:, K - 1] / K
        s = p + r
        out[f"F1@{K}"] = np.where(s > 0, 2 * p * r / np.where(s > 0, s, 1.0), 0.0)
        out[f"NDCG@{K} (truncated)"] = (gain_sums[:, K - 1]
                                        / ideal[np.minimum(n, K).astype(np.int64) - 1])
        out[f"HR@{K}"] = (h > 0).astype(np.float64)
        out[f"MRR@{K}"] = np.where((first > 0) & (first <= K), 1.0 / np.maximum(first, 1), 0.0)
    return {m: out[m] for m in metrics_for(k)}


NULL_ID = "<null>"  # how a null id inside a list is named where it is refused


def encode_batch(batch, catalogue, recs_col: str = "item_ids"):
    """One Arrow batch of (user_id, ``recs_col`` raw ids best first) -> user_id, ``_items`` (the
    ids as item indices: positions in ``catalogue``, -1 for an id outside it), ``_stray`` (the
    smallest id of the list outside the catalogue, else null) and ``_repeat`` (the first item,
    in list order, that the list already held, else null): what ``check_recs`` refuses, found
    in the same pass that encodes the lists."""
    import pyarrow as pa
    import pyarrow.compute as pc

    lists = batch.column(recs_col)
    n_rows = batch.num_rows
    values, lengths, owner = _flat(lists)
    if pa.types.is_dictionary(values.type):  # read so (sharded_user_table): look up each id once
        index = pc.index_in(values.dictionary, value_set=catalogue).fill_null(-1) \
            .to_numpy(zero_copy_only=False).astype(np.int64)
        index = np.where(values.is_valid().to_numpy(zero_copy_only=False),
                         index[values.indices.fill_null(0).to_numpy(zero_copy_only=False)], -1)
    else:
        index = pc.index_in(values.cast(pa.string()), value_set=catalogue).fill_null(-1) \
            .to_numpy(zero_copy_only=False).astype(np.int64)
    if (index < 0).any():  # ids named in errors, as strings (rare: decoded only then)
        values = values.cast(pa.string())
    offsets = np.zeros(n_rows + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    items = pa.ListArray.from_arrays(pa.array(offsets), pa.array(index, pa.int32()),
                                     mask=pc.invert(lists.is_valid()))
    stray = [None] * n_rows
    for i in np.flatnonzero(index < 0):  # a null id is no item of the catalogue either
        u, v = owner[i], values[i].as_py()
        v = NULL_ID if v is None else v
        stray[u] = v if stray[u] is None else min(stray[u], v)
    repeat = [None] * n_rows
    if len(index):  # a repeat: a (row, id) key seen at an earlier position of its row
        # an id's code: its item index, and past the catalogue a code per distinct stray id
        # (null ids share one): no hashing of the strings of the catalogue's ids
        code = index.copy()
        outside = np.flatnonzero(index < 0)
        if len(outside):
            strays = pc.dictionary_encode(values.take(pa.array(outside))).indices \
                .fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
            code[outside] = len(catalogue) + 1 + strays
        keys = owner * (int(code.max()) + 2) + code
        ordered = np.sort(keys)  # whether any key repeats: 5x faster than _first_repeats' argsort
        if (ordered[1:] == ordered[:-1]).any():  # rare: most files repeat no item
            repeat = _first_repeats(keys, owner, values.cast(pa.string()), n_rows)
    return pa.RecordBatch.from_pydict({"user_id": batch.column("user_id"), "_items": items,
                                       "_stray": pa.array(stray, pa.string()),
                                       "_repeat": pa.array(repeat, pa.string())})


def _first_repeats(keys: np.ndarray, owner: np.ndarray, values, n_rows: int) -> list:
    """Per row, the id (from ``values``) of its first entry, in list order, whose (row, id)
    ``keys`` an earlier entry of the row already had; None for a row without one."""
    order = np.argsort(keys, kind="stable")  # equal keys keep their list order
    later = np.zeros(len(keys), bool)
    later[order[1:]] = keys[order[1:]] == keys[order[:-1]]
    first = [None] * n_rows
    for i in np.flatnonzero(later):
        if first[owner[i]] is None or i < first[owner[i]][0]:
            first[owner[i]] = (i, values[i].as_py())
    return [None if r is None else r[1] for r in first]


def encode_lists(df, item_ids: list[str], recs_col: str = "item_ids"):
    """``df``'s (user_id, ``recs_col``) as (user_id, ``_items`` array<int> item indices into
    ``item_ids`` (the catalogue in item-index order; -1 outside it), ``_stray``, ``_repeat``),
    by ``encode_batch`` in a mapInArrow: integer lists are what the joins then move, a quarter
    of the bytes of the raw ids and no string hashing."""
    import pyarrow as pa
    from pyspark.sql.types import ArrayType, IntegerType, StringType, StructField, StructType

    schema = StructType([df.schema["user_id"], StructField("_items", ArrayType(IntegerType())),
                         StructField("_stray", StringType()), StructField("_repeat", StringType())])
    ids = list(item_ids)

    def run(batches):
        catalogue = pa.array(ids, pa.string())
        for b in batches:
            yield encode_batch(b, catalogue, recs_col)

    return df.select("user_id", recs_col).mapInArrow(run, schema)


def inverse_logs(spark, top: int) -> np.ndarray:
    """1 / log2(j + 1) for j = 0..``top`` computed by Spark SQL (the SQL reference's expression,
    tests/spark_reference.py), so that the numpy metrics equal the SQL ones to the last bit. One
    small job."""
    from pyspark.sql import functions as F

    table = spark.range(1, top + 1).select(  # from 1: 1 / log2(1) divides by zero (ANSI: fails)
        "id", (F.lit(1.0) / F.log2(F.col("id") + 1)).alias("v")).toArrow()  # not 45k Row objects
    out = np.full(top + 1, np.inf)  # j = 0 is never read
    out[table.column("id").to_numpy()] = table.column("v").to_numpy()
    return out


def batch_metrics(batch, k: int, recs_col: str = "_items", truth_col: str = "truth",
                  keep: tuple[str, ...] = ("user_id", "cold"), inverse_log: np.ndarray | None = None):
    """One Arrow batch of (``keep`` columns, ``recs_col`` item indices best first, ``truth_col``
    item indices) rows -> ``keep``, ``recs_col`` as it came, whether the user has a list
    (``_listed``; a row without one has null metrics) and the metrics of ``metrics_for(k)``.
    Rows whose truth set is empty are dropped (no metric is defined for them); a negative index
    (an id outside the catalogue) is never a hit."""
    import pyarrow as pa

    truth_len = batch.column(truth_col).value_lengths().fill_null(0) \
        .to_numpy(zero_copy_only=False)
    if not (truth_len > 0).all():
        batch = batch.filter(pa.array(truth_len > 0))
    lists = batch.column(recs_col)
    listed = lists.is_valid().to_numpy(zero_copy_only=False)
    length = max(K for K in KS if K <= k)
    n_rows = batch.num_rows
    values, lengths, owner = _flat(lists)
    index = values.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    starts = np.zeros(n_rows, np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    position = np.arange(len(index)) - starts[owner]
    t_values, t_lengths, t_owner = _flat(batch.column(truth_col))
    t_index = t_values.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    # (row, item) keys: a recommended item is a hit where its key is among its row's truth keys
    width = int(max(index.max(initial=0), t_index.max(initial=0))) + 1
    truth_keys = (t_owner * width + t_index)[t_index >= 0]
    hit = (index >= 0) & np.isin(owner * width + index, truth_keys)
    hits = np.zeros((n_rows, length))
    inside = position < length
    hits[owner[inside], position[inside]] = hit[inside]
    metrics = metric_arrays(hits, t_lengths.astype(np.float64), k, inverse_log)
    columns = {c: batch.column(c) for c in keep}
    columns[recs_col] = lists
    columns["_listed"] = pa.array(listed)
    for m, v in metrics.items():
        columns[metric_key(m)] = pa.array(v, pa.float64(), mask=~listed)
    return pa.RecordBatch.from_pydict(columns)
