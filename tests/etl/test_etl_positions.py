"""The ETL's indices without a global window: ``etl.pipeline.positions`` (a sort's positions,
partition-parallel) against ``row_number()`` over an unpartitioned window, the one-task reference
it replaced, on data spread over several partitions."""

from __future__ import annotations

import random

import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

from etl import pipeline as P
from etl.config import ETLConfig


@pytest.fixture()
def many_partitions(spark):
    """Seven shuffle partitions that adaptive execution may not merge back into one."""
    keys = ("spark.sql.shuffle.partitions", "spark.sql.adaptive.coalescePartitions.enabled")
    old = {k: spark.conf.get(k) for k in keys}
    spark.conf.set(keys[0], "7")
    spark.conf.set(keys[1], "false")
    yield spark
    for k, v in old.items():
        spark.conf.set(k, v)


def reference(df, order, name):
    return df.withColumn(name, (F.row_number().over(Window.orderBy(*order)) - 1).cast("int"))


def test_positions_equal_a_global_row_number(many_partitions):
    spark = many_partitions
    rng = random.Random(0)
    # numeric ids as text, with '7' and '007' both present (the id order's tie-break)
    ids = rng.sample(range(100_000), 3000) + ["7", "007", "0"]
    df = spark.createDataFrame([(str(i), rng.random()) for i in ids], "user_id string, x double")
    df = df.repartition(5)
    for order in (P._order_key("user_id", True), P._order_key("user_id", False),
                  [F.xxhash64(F.lit(3), F.col("user_id")), "user_id"]):
        got = P.positions(df, order, "at")
        assert got.rdd.getNumPartitions() > 1
        want = {r["user_id"]: r["at"] for r in reference(df, order, "at").collect()}
        assert {r["user_id"]: r["at"] for r in got.collect()} == want
        assert sorted(want.values()) == list(range(len(ids)))
        got.unpersist()


def test_positions_of_an_empty_frame(spark):
    df = spark.createDataFrame([], "user_id string")
    assert P.positions(df, ["user_id"], "at").collect() == []


def test_user_index_and_cold_draw_as_before(many_partitions):
    """index_users gives every user the index and the cold flag the global windows gave."""
    spark = many_partitions
    rng = random.Random(1)
    rows = [(f"u{u}", f"i{rng.randrange(50)}", 0) for u in range(2000)
            for _ in range(rng.randrange(1, 4))]
    pos = spark.createDataFrame(rows, "user_id string, item_id string, timestamp long").distinct()
    base = pos.groupBy("user_id").agg(F.count(F.lit(1)).alias("n"))
    cfg = ETLConfig(dataset="csv", input=("x",), output="y", cold_users=0.05, seed=11)
    counts = {}
    # what user_lists gives index_users: a row per user with its positives (n_pos) and partition
    # (a user without positives, and a partition's item row, have no index)
    per_user = base.select("user_id", F.col("n").cast("int").alias("n_pos"), F.lit(0).alias("part"))
    per_user = per_user.union(spark.createDataFrame(
        [("u-none", 0, 0), (None, -1, 0)], "user_id string, n_pos int, part int"))
    users = P.index_users(per_user, cfg, P.Progress(), counts)
    want = reference(base, P._order_key("user_id", False), "user_index")
    draw = F.row_number().over(Window.orderBy(F.xxhash64(F.lit(11), P.as_str("user_id")),
                                              "user_index"))
    want = want.withColumn("cold", draw <= counts["cold_users"])
    assert counts["cold_users"] == 100
    assert sorted(map(tuple, users.select("user_id", "user_index", "cold", "n").collect())) == \
        sorted(map(tuple, want.select("user_id", "user_index", "cold", "n").collect()))
