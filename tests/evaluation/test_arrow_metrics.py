"""evaluation/spark_metrics.py's numpy face (``batch_metrics``, the body of the mapInArrow that
evaluate.py runs) against the numpy reference ``prepared.metrics.per_user``, on Arrow batches built
here: lists of every length up to 50, short lists, a user without a list, ids outside the
catalogue and a user whose truth set is empty; and, with Spark's NDCG discounts, bit for bit
against the Spark SQL expressions it replaced (tests/spark_reference.py)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from evaluation.spark_metrics import (
    NULL_ID,
    batch_metrics,
    encode_batch,
    inverse_logs,
    metric_key,
    metrics_for,
)
from prepared import metrics as M
from prepared.protocol import TOP_K


def random_batch(rng: np.random.Generator, users: int, items: int):
    """An Arrow batch of user_id, cold, item_ids (distinct ids, some lists short, one null) and
    truth (distinct, one empty), with the same data as (U, 50) index arrays for the reference."""
    ids = [f"i{j}" for j in range(items)]
    lists, truths = [], []
    for u in range(users):
        length = 50 if u % 3 else int(rng.integers(0, 50))
        lists.append([int(x) for x in rng.choice(items, length, replace=False)])
        size = 0 if u == 5 else int(rng.integers(1, 30))
        # a few users get some of their list's items (hits at known ranks), the rest chance
        pool = list(rng.choice(items, size, replace=False))
        if u % 2 and lists[-1]:
            pool = lists[-1][int(rng.integers(0, len(lists[-1]))):][:3] + pool
        truths.append([int(x) for x in dict.fromkeys(pool)][:max(size, 1)] if size else [])
    lists[7] = None  # a user with a truth set and no list
    batch = pa.RecordBatch.from_pydict({
        "user_id": pa.array([f"u{u}" for u in range(users)]),
        "cold": pa.array([u % 4 == 0 for u in range(users)]),
        "item_ids": pa.array([None if x is None else [ids[j] for j in x] + (["stray"] if u == 9
                                                                            else [])
                              for u, x in enumerate(lists)], pa.list_(pa.string())),
        "truth": pa.array([[ids[j] for j in t] for t in truths], pa.list_(pa.string()))})
    return batch, ids, lists, truths


@pytest.mark.parametrize("k", [50, 10])
def test_batch_metrics_equal_the_numpy_reference(k):
    rng = np.random.default_rng(0)
    batch, ids, lists, truths = random_batch(rng, 300, 2000)
    if k < 50:  # a top-k file: lists of at most k
        batch = batch.set_column(2, "item_ids", pa.array(
            [None if x is None else x[:k] for x in batch.column(2).to_pylist()],
            pa.list_(pa.string())))
        lists = [None if x is None else x[:k] for x in lists]
    encoded = encode_batch(batch, pa.array(ids))
    assert encoded.column("_stray").to_pylist() == [
        "stray" if u == 9 and k == 50 else None for u in range(batch.num_rows)]
    assert encoded.column("_repeat").null_count == batch.num_rows
    index = {x: i for i, x in enumerate(ids)}
    truth = pa.array([[index[x] for x in t] for t in batch.column("truth").to_pylist()],
                     pa.list_(pa.int32()))
    out = batch_metrics(pa.RecordBatch.from_pydict({
        "user_id": batch.column("user_id"), "cold": batch.column("cold"),
        "_items": encoded.column("_items"), "truth": truth}), k)
    keep = [u for u, t in enumerate(truths) if t]  # the empty truth set is dropped
    assert out.column("user_id").to_pylist() == [f"u{u}" for u in keep]
    listed = out.column("_listed").to_pylist()
    assert listed == [lists[u] is not None for u in keep]
    items = out.column("_items").to_pylist()
    for u, got in zip(keep, items):  # the lists as item indices, the stray id as -1
        want = None if lists[u] is None else lists[u] + ([-1] if u == 9 and k == 50 else [])
        assert got == want
    recs = np.full((len(keep), 50), -1)
    for row, u in enumerate(keep):
        if lists[u]:
            recs[row, :len(lists[u][:50])] = lists[u][:50]
    ref = M.per_user(M.hit_matrix(recs, [np.array(truths[u]) for u in keep]),
                     np.array([len(truths[u]) for u in keep]))
    hits = sum(ref["HR@50"])
    assert 20 < hits < len(keep) - 20  # hits and misses both common: the comparison is not trivial
    for m in metrics_for(k):
        got = np.array(out.column(metric_key(m)).to_pylist(), dtype=float)
        assert np.isnan(got[~np.array(listed)]).all(), m  # no list: null, not zeros
        np.testing.assert_allclose(got[np.array(listed)], ref[m][np.array(listed)], rtol=0,
                                   atol=1e-12, err_msg=m)
    assert set(out.schema.names) == {"user_id", "cold", "_items", "_listed"} | {
        metric_key(m) for m in metrics_for(k)}


@pytest.mark.spark
@pytest.mark.parametrize("k", [50, 10])
def test_batch_metrics_equal_the_spark_sql_reference_to_the_last_bit(spark, k):
    """The claim evaluate.py's numbers rest on: summing in aggregate's order with inverse_logs'
    discounts, the numpy pass gives the SQL expressions' doubles exactly (a last bit decides
    which users' differences tie in the Wilcoxon test)."""
    from tests.spark_reference import per_user as sql_per_user

    rng = np.random.default_rng(1)
    _, ids, lists, truths = random_batch(rng, 300, 2000)
    users = [u for u in range(len(lists)) if lists[u] is not None and truths[u]]
    recs = [lists[u][:k] + (["stray"] if u == 9 else []) for u in users]  # ids, a stray one
    sql = sql_per_user(spark.createDataFrame(
        [(f"u{u}", [ids[j] if isinstance(j, int) else j for j in r], [ids[j] for j in truths[u]])
         for u, r in zip(users, recs)],
        "user_id string, item_ids array<string>, truth array<string>"), k=k).toPandas()
    sql = sql.set_index("user_id").loc[[f"u{u}" for u in users]]
    out = batch_metrics(pa.RecordBatch.from_pydict({
        "user_id": pa.array([f"u{u}" for u in users]), "cold": pa.array([False] * len(users)),
        "_items": pa.array([[j if isinstance(j, int) else -1 for j in r] for r in recs],
                           pa.list_(pa.int32())),
        "truth": pa.array([truths[u] for u in users], pa.list_(pa.int32()))}), k,
        inverse_log=inverse_logs(spark, TOP_K + 1 + len(ids)))
    assert sql[metric_key("Recall@10")].between(0.01, 0.99).mean() > 0.1  # not all 0 or 1
    for m in metrics_for(k):
        np.testing.assert_array_equal(out.column(metric_key(m)).to_numpy(), sql[metric_key(m)],
                                      err_msg=m)


def as_read(batch: pa.RecordBatch, dictionary: bool) -> pa.RecordBatch:
    """``batch`` as is, or through a Parquet file read back with its ids as a dictionary (as
    ``sharded_user_table`` reads the recommendation files)."""
    if not dictionary:
        return batch
    import pyarrow.parquet as pq

    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_batches([batch]), sink)
    table = pq.read_table(pa.BufferReader(sink.getvalue()),
                          read_dictionary=["item_ids.list.element"])
    assert pa.types.is_dictionary(table.schema.field("item_ids").type.value_type)
    return table.combine_chunks().to_batches()[0]


@pytest.mark.parametrize("dictionary", [False, True], ids=["strings", "dictionary"])
def test_encoding_finds_each_lists_first_repeat_and_smallest_stray(dictionary):
    batch = as_read(pa.RecordBatch.from_pydict({
        "user_id": pa.array(["a", "b", "c", "d"]),
        "item_ids": pa.array([["x", "y", "x", "z", "y"], ["q", "x", "p"], None, ["y", "z"]],
                             pa.list_(pa.string()))}), dictionary)
    out = encode_batch(batch, pa.array(["x", "y", "z"]))
    assert out.column("_items").to_pylist() == [[0, 1, 0, 2, 1], [-1, 0, -1], None, [1, 2]]
    assert out.column("_repeat").to_pylist() == ["x", None, None, None]  # x comes back first
    assert out.column("_stray").to_pylist() == [None, "p", None, None]  # the smallest of q, p
    # ids outside the catalogue repeat by their own value: distinct ones are no repeat
    strays = as_read(pa.RecordBatch.from_pydict({
        "user_id": pa.array(["e", "f", "g"]),
        "item_ids": pa.array([["q", "p", "y", "q"], ["q", "p", "x"], [None, "z", None]],
                             pa.list_(pa.string()))}), dictionary)
    out = encode_batch(strays, pa.array(["x", "y", "z"]))
    assert out.column("_repeat").to_pylist() == ["q", None, None]
    assert out.column("_stray").to_pylist() == ["p", "p", NULL_ID]
    # a repeat in a file with no stray id (the ids are then decoded only to name it)
    clean = as_read(pa.RecordBatch.from_pydict({
        "user_id": pa.array(["h"]), "item_ids": pa.array([["z", "x", "z"]], pa.list_(pa.string()))}),
        dictionary)
    out = encode_batch(clean, pa.array(["x", "y", "z"]))
    assert out.column("_repeat").to_pylist() == ["z"] and out.column("_items").to_pylist() == [[2, 0, 2]]


@pytest.mark.parametrize("dictionary", [False, True], ids=["strings", "dictionary"])
def test_a_null_id_inside_a_list_is_refused_as_outside_the_catalogue(dictionary):
    batch = as_read(pa.RecordBatch.from_pydict({
        "user_id": pa.array(["a", "b"]),
        "item_ids": pa.array([["x", None, "y"], ["y"]], pa.list_(pa.string()))}), dictionary)
    out = encode_batch(batch, pa.array(["x", "y", "z"]))
    assert out.column("_items").to_pylist() == [[0, -1, 1], [1]]  # never a hit
    assert out.column("_stray").to_pylist() == [NULL_ID, None]
