"""The ETL's indices without a global window: ``etl.pipeline.positions`` (a sort's positions,
partition-parallel) against ``row_number()`` over an unpartitioned window, the one-task reference
it replaced, on data spread over several partitions."""

from __future__ import annotations

import random

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from pyspark.sql import Window
from pyspark.sql import functions as F

from etl import pipeline as P
from etl.config import ETLConfig
from tests.etl_helpers import prepare


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


def _ids(kind: str, rng: random.Random) -> list:
    if kind == "text":
        return [f"u{u}" for u in range(2000)]
    if kind == "numeric text":  # ordered as numbers, '7' before '007' by their text
        return [str(u) for u in rng.sample(range(-500, 100_000), 1997)] + ["007", "0007", "-0"]
    return rng.sample(range(-500, 100_000), 2000)  # carried as longs


def _rows(users) -> list[tuple]:
    """``index_users``' result, either form, as sorted (user_id, user_index, cold, n) tuples."""
    cols = ["user_id", "user_index", "cold", "n"]
    if isinstance(users, pa.Table):
        return sorted(zip(*(users.column(c).to_pylist() for c in cols)))
    return sorted(map(tuple, users.select(*cols).collect()))


@pytest.mark.parametrize("kind", ["text", "numeric text", "long"])
@pytest.mark.parametrize("driver_users", [0, None], ids=["spark sorts", "driver"])
def test_user_index_and_cold_draw_as_before(many_partitions, kind, driver_users):
    """index_users gives every user the index and the cold flag the global windows gave, by
    Spark sorts and on the driver alike."""
    spark = many_partitions
    rng = random.Random(1)
    id_type = "long" if kind == "long" else "string"
    rows = [(u, f"i{rng.randrange(50)}", 0) for u in _ids(kind, rng)
            for _ in range(rng.randrange(1, 4))]
    pos = spark.createDataFrame(rows, f"user_id {id_type}, item_id string, timestamp long").distinct()
    base = pos.groupBy("user_id").agg(F.count(F.lit(1)).alias("n"))
    cfg = ETLConfig(dataset="csv", input=("x",), output="y", cold_users=0.05, seed=11)
    counts = {}
    # what user_lists gives index_users: a row per user with its positives (n_pos) and partition
    # (a user without positives, and a partition's item row, have no index)
    per_user = base.select("user_id", F.col("n").cast("int").alias("n_pos"),
                           (F.abs(F.hash("user_id")) % 5).alias("part"))
    none = -999_999 if kind == "long" else "u-none"
    per_user = per_user.union(spark.createDataFrame(
        [(none, 0, 0), (None, -1, 0)], f"user_id {id_type}, n_pos int, part int"))
    users = P.index_users(per_user, cfg, P.Progress(), counts, driver_users=driver_users)
    assert isinstance(users, pa.Table) == (driver_users is None)
    want = reference(base, P._order_key("user_id", kind != "text"), "user_index")
    draw = F.row_number().over(Window.orderBy(F.xxhash64(F.lit(11), P.as_str("user_id")),
                                              "user_index"))
    want = want.withColumn("cold", draw <= counts["cold_users"])
    assert counts["cold_users"] == 100
    assert counts["users_numeric_ids"] == (kind != "text")
    assert _rows(users) == sorted(map(tuple, want.select("user_id", "user_index", "cold", "n").collect()))
    assert counts["users_single_positive"] == base.where("n = 1").count()


def test_both_ways_of_ranking_users_prepare_the_same_output(spark, tmp_path, monkeypatch):
    """The whole ETL with users ranked on the driver and by Spark sorts: the same files' data
    (users table, rows, split, items) and counts, on ids that are numeric text ('7', '007')."""
    rng = random.Random(2)
    ratings = tmp_path / "r.csv"
    users = [str(u) for u in rng.sample(range(10, 5000), 600)] + ["7", "007", "07"]
    ratings.write_text("user,item\n" + "".join(  # every row a positive
        f"{u},i{rng.randrange(300)}\n" for u in users for _ in range(rng.randrange(2, 30))))
    kw = dict(dataset="csv", input=(str(ratings),), rating_col="", time_col="", cold_users=0.1,
              negatives=5, seed=4)
    driver = prepare(spark, tmp_path / "driver", **kw)
    monkeypatch.setattr(P, "DRIVER_USERS", 0)
    sorts = prepare(spark, tmp_path / "sorts", **kw)
    for name in ("users", "rows", "split", "items"):
        a, b = getattr(driver, name), getattr(sorts, name)
        key = [c for c in ("user_index", "item_index", "user_id", "item_id") if c in a][:2]
        pd.testing.assert_frame_equal(a.sort_values(key).reset_index(drop=True),
                                      b.sort_values(key).reset_index(drop=True), check_like=False)
    # the shards' rows in the same order too (by the users' uhash)
    in_files = lambda p: pq.read_table(p.path / "rows", columns=["user_index"]).column(0).to_pylist()
    assert in_files(driver) == in_files(sorts)
    assert driver.users.user_index.tolist() == list(range(603))  # in file-name order
    assert driver.users.user_id.tolist()[:3] == ["007", "07", "7"]  # as numbers, ties by text
    assert driver.manifest["counts"] == sorts.manifest["counts"]
    assert driver.manifest["counts"]["users_numeric_ids"]
    assert driver.manifest["counts"]["cold_users"] == 60
