"""The ETL's shuffle through the work directory (etl.shuffle): Spark's partition of every user,
rows kept whole and in order, and synthetic rows written by their own tasks as the JVM path
would write them."""

import numpy as np
import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from etl import shuffle, synthetic

EDGES = [0, 1, -1, 42, 2**31 - 1, 2**31, -(2**31), 2**32 - 1, 2**32, 2**62 + 12345,
         2**63 - 1, -(2**63), 1_876_279, -987_654_321_012]


@pytest.mark.spark
def test_the_partition_of_a_user_is_sparks_hash_partitioning(spark):
    ids = EDGES + np.random.default_rng(0).integers(-(2**63), 2**63 - 1, 500).tolist()
    df = spark.createDataFrame([(i,) for i in ids], "user_id long")
    got = df.select(F.hash("user_id").alias("h"),
                    F.pmod(F.hash("user_id"), F.lit(98)).alias("p")).toPandas()
    assert shuffle.spark_hash_long(np.array(ids)).tolist() == got.h.tolist()
    assert shuffle.partition_of(np.array(ids), 98).tolist() == got.p.tolist()
    # and that is where repartition(n, "user_id") sends a row
    placed = (df.repartition(7, "user_id").select("user_id", F.spark_partition_id().alias("pid"))
              .toPandas())
    assert shuffle.partition_of(placed.user_id.to_numpy(), 7).tolist() == placed.pid.tolist()


def test_map_files_hold_each_partitions_rows_in_order(tmp_path):
    root = str(tmp_path)
    rng = np.random.default_rng(1)
    tables, parts = [], []
    for m in range(3):
        n = [50, 0, 7][m]  # a map with no rows writes empty batches
        tables.append(pa.table({"user_id": pa.array(rng.integers(0, 20, n), pa.int64()),
                                "x": pa.array(np.arange(n) + 1000 * m, pa.int64()),
                                "s": pa.array([f"r{m}-{i}" for i in range(n)], pa.string())}))
        parts.append(rng.integers(0, 5, n))
        shuffle.write_map(root, 5, m, 0, tables[-1], parts[-1])
    assert not list((tmp_path / "shuffle").glob("*.tmp"))
    for k in range(5):
        want = [t.filter(pa.array(p == k)) for t, p in zip(tables, parts)]
        want = pa.concat_tables(want).combine_chunks()
        got = shuffle.read_partition(root, [0, 1, 2], k)
        if want.num_rows == 0:
            assert got is None
        else:
            assert got.equals(want)  # each map's rows in their order, maps in the order given
    assert shuffle.read_partition(root, [], 0) is None


def test_a_retried_map_task_replaces_its_file(tmp_path):
    root = str(tmp_path)
    t = pa.table({"user_id": pa.array([1, 2, 3], pa.int64())})
    shuffle.write_map(root, 2, 0, 0, t, np.array([0, 1, 0]))
    shuffle.write_map(root, 2, 0, 1, t.slice(0, 1), np.array([1]))
    assert shuffle.read_partition(root, [0], 0) is None
    assert shuffle.read_partition(root, [0], 1).column("user_id").to_pylist() == [1]


@pytest.mark.spark
def test_synthetic_rows_written_by_their_tasks_match_the_jvm_path(spark, tmp_path):
    kw = dict(n_users=9000, n_items=300, n_positives=90_000, seed=3)
    direct = synthetic.synthetic_maps(spark, str(tmp_path / "a"), 6, **kw)
    rows = synthetic.synthetic_rows(spark, **kw).select(
        "*", F.lit(0).cast("long").alias("gpos"), F.lit(None).cast("byte").alias("given"))
    via_jvm = shuffle.by_user(rows, str(tmp_path / "b"), 6)
    assert direct == via_jvm and len(direct) > 1
    total = 0
    for k in range(6):
        a = shuffle.read_partition(str(tmp_path / "a"), direct, k)
        b = shuffle.read_partition(str(tmp_path / "b"), via_jvm, k)
        assert a.select(b.column_names).cast(b.schema).equals(b)
        assert set(shuffle.partition_of(a.column("user_id").to_numpy(), 6)) == {k}
        total += a.num_rows
    assert total == rows.count()
