"""Synthetic data: generated in Spark, deterministic, power-law popularity, learnable topics."""

import numpy as np
import pyarrow.parquet as pq
import pytest

from etl import synthetic
from tests.etl_helpers import prepare


def test_blocks_are_deterministic_and_sized():
    cat = synthetic.Catalog(500, seed=1)
    a = synthetic.generate_block(0, 3000, 500, 20.0, 1, cat)
    b = synthetic.generate_block(0, 3000, 500, 20.0, 1, synthetic.Catalog(500, seed=1))
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
    users, items, ts = a
    assert len(np.unique(users)) == min(3000, synthetic.BLOCK)
    assert len(set(zip(users.tolist(), items.tolist()))) == len(users)  # no duplicate pairs
    assert abs(len(users) / 3000 - 20.0) < 2.0
    # timestamps increase along each user's history
    for u in np.unique(users)[:50]:
        assert np.all(np.diff(ts[users == u]) >= 0)


def test_first_occurrences_is_uniques_first_index():
    rng = np.random.default_rng(4)
    cases = [np.zeros(0, np.int64), np.array([7]), np.array([5, 5, 5]), rng.integers(0, 50, 1000),
             rng.integers(0, 2**40, 3000), np.repeat(rng.integers(0, 9, 40), 7)[::-1].copy(),
             np.array([2**62, 3, 2**62, 3])]  # keys too large to pack: np.unique itself
    for keys in cases:
        keys = keys.astype(np.int64)
        want = np.unique(keys, return_index=True)[1]
        assert synthetic.first_occurrences(keys).tolist() == want.tolist()


def test_popularity_is_power_law_and_topics_are_learnable():
    cat = synthetic.Catalog(2000, seed=4)
    users, items, _ = synthetic.generate_block(0, 4000, 2000, 30.0, 4, cat)
    pop = np.sort(np.bincount(items, minlength=2000))[::-1]
    assert pop[:200].sum() / pop.sum() > 0.35    # top 10% of items: > 3.5x their uniform share
    assert pop[0] > 20 * max(np.median(pop), 1)  # a heavy head
    # each user's items concentrate in one topic (chance would be 1/K)
    topics = cat.topic[items]
    shares = [np.bincount(topics[users == u]).max() / (users == u).sum()
              for u in np.unique(users) if (users == u).sum() >= 10]
    assert np.mean(shares) > 0.5 > 10.0 / cat.k  # over 10x what topic-blind users would show


def test_a_hard_set_has_weaker_popularity_and_many_small_topics():
    """--topics/--affinity/--zipf (issue 32's collapse study): the defaults draw exactly as
    before; many small topics, a low affinity and a flat Zipf weaken popularity's head and a
    user's concentration, yet users still draw from their topic above chance."""
    easy = synthetic.generate_block(0, 4000, 2000, 30.0, 4, synthetic.Catalog(2000, seed=4))
    same = synthetic.generate_block(0, 4000, 2000, 30.0, 4, synthetic.Catalog(
        2000, seed=4, topics=0, affinity=synthetic.AFFINITY, zipf=synthetic.ALPHA))
    for x, y in zip(easy, same):
        np.testing.assert_array_equal(x, y)
    cat = synthetic.Catalog(2000, seed=4, topics=200, affinity=0.5, zipf=0.6)
    assert cat.k == 200 and synthetic.Catalog(50, seed=4, topics=200).k == 50
    users, items, _ = synthetic.generate_block(0, 4000, 2000, 30.0, 4, cat)

    def head_share(it):
        pop = np.sort(np.bincount(it, minlength=2000))[::-1]
        return pop[:200].sum() / pop.sum()

    assert head_share(items) < head_share(easy[1]) - 0.1
    topics = cat.topic[items]
    shares = [np.bincount(topics[users == u]).max() / (users == u).sum()
              for u in np.unique(users) if (users == u).sum() >= 10]
    # a topic of 10 items caps a user's in-topic share of 30 positives below the affinity: still
    # 30x chance (1/200), and far below the easy set's
    assert 0.15 < np.mean(shares) < 0.5


def test_a_synthetic_shape_out_of_range_is_refused():
    from etl.config import ETLConfig
    from prepared.errors import UsageError

    for bad in (dict(topics=-1), dict(affinity=1.5), dict(zipf=-0.1)):
        with pytest.raises(UsageError, match="--topics .*--affinity .*--zipf"):
            ETLConfig(dataset="synthetic", output="/tmp/x", **bad)


@pytest.mark.spark
def test_synthetic_etl_in_spark_does_not_depend_on_partitioning(spark, tmp_path):
    kw = dict(dataset="synthetic", users=3000, items=400, positives=60_000, negatives=10, seed=2)
    a = prepare(spark, tmp_path / "a", **kw)
    c = a.manifest["counts"]
    assert abs(sum(c["positives"].values()) / 60_000 - 1) < 0.1
    assert c["users"] == 3000 and c["items"] <= 400
    # the same data whatever the partitioning (users generated in fixed id blocks)
    spark.conf.set("spark.sql.shuffle.partitions", "3")
    b = prepare(spark, tmp_path / "b", shards=3, **kw)
    key = lambda p: sorted(zip(p.split.user_id, p.split.item_id, p.split.split, p.split.timestamp))
    assert key(a) == key(b)
    assert a.rows.neg_items.map(list).tolist() == b.rows.neg_items.map(list).tolist()
    assert len(list((tmp_path / "b" / "rows").glob("*.parquet"))) == 3


def test_users_table_files_grow_with_users_up_to_the_partitions():
    from etl.write import USERS_PER_FILE, users_files

    assert users_files(10, 8) == 1 and users_files(10**9, 8) == 8
    assert users_files(USERS_PER_FILE, 8) == 1 and users_files(USERS_PER_FILE + 1, 8) == 2
    assert users_files(1_876_280, 98) == 8  # the Yahoo scale: 8 files, not 98 or 1


@pytest.mark.spark
def test_users_table_is_written_in_several_sorted_files(spark, tmp_path, monkeypatch):
    """The users table is written by several tasks (a range of user indices per file) once
    there are more users than ``USERS_PER_FILE`` and more than one shuffle partition; read in
    file-name order the rows are still sorted by user index, and the manifest lists each file."""
    from etl import write
    from prepared import schema as S
    from prepared.reader import open_prepared

    monkeypatch.setattr(write, "USERS_PER_FILE", 1000)
    p = prepare(spark, tmp_path / "d", dataset="synthetic", users=2500, items=300,
                positives=25_000, negatives=5, seed=3, shards=4)
    files = sorted((tmp_path / "d" / S.USERS_DIR).glob("*.parquet"))
    assert len(files) == 3  # ceil(2500 / 1000), fewer than the 4 partitions
    parts = [pq.read_table(f).column(S.USER_INDEX).to_pylist() for f in files]
    assert all(len(x) > 0 and x == sorted(x) for x in parts)
    assert sum(parts, []) == list(range(2500))  # ranges in file-name order, every user once
    assert p.users.user_index.tolist() == list(range(2500))  # the directory as readers see it
    assert {f"{S.USERS_DIR}/{f.name}" for f in files} <= set(p.manifest["files"])
    assert open_prepared(str(tmp_path / "d")).n_users == 2500


def test_the_collapse_study_tells_an_easy_generated_set_from_a_hard_one():
    """benchmarks/collapse.py keys its results by set: two generated sets of different shape
    must not share a key (the second's runs would be skipped as done)."""
    from types import SimpleNamespace

    from benchmarks.collapse import dataset_label

    def prep(dataset, **params):
        return SimpleNamespace(dataset=dataset, manifest={"parameters": params})

    assert dataset_label(prep("synthetic")) == "synthetic"  # made before the shape options
    assert dataset_label(prep("synthetic", topics=0, affinity=0.8, zipf=1.0)) == "synthetic"
    assert dataset_label(prep("synthetic", topics=1000, affinity=0.7, zipf=1.0)) == \
        "synthetic(topics=1000,affinity=0.7)"
    assert dataset_label(prep("citeulike", topics=0)) == "citeulike"
