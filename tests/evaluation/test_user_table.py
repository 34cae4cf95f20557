"""evaluation/user_table.py's partition pass (``partition_rows``, the body of the mapInArrow that
evaluate.py runs over each hash partition of users) against the per-batch path it replaces
(``batch_metrics`` on the protocol's truth sets, bit for bit) and against hand-counted check facts
and popularity counts, on a partition built here with its rows in shuffled order."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pytest

from evaluation.spark_metrics import batch_metrics, metric_key, metrics_for
from evaluation.user_table import column, long_metric_names, long_rows, partition_rows, summary_rows

N_ITEMS = 300
INVERSE_LOG = np.concatenate([[np.inf], 1.0 / np.log2(np.arange(1, N_ITEMS + 52) + 1.0)])


def make_partition(rng: np.random.Generator, users: int, ks: list[int]):
    """A partition table (user rows, then each file's rows, shuffled together) and what it holds:
    per user cold, valid, test; per file the lists by user (an unknown user "zz" in file 0, user
    u3 on two rows of file 0, u4 without a list in file 1)."""
    cold = {f"u{u}": u % 4 == 0 for u in range(users)}
    valid = {f"u{u}": [] if u % 7 == 1 else
             sorted(rng.choice(N_ITEMS, int(rng.integers(1, 6)), replace=False).tolist())
             for u in range(users)}
    test = {f"u{u}": [] if u % 5 == 2 else
            sorted(rng.choice(N_ITEMS, int(rng.integers(1, 9)), replace=False).tolist())
            for u in range(users)}
    rows = [{"user_id": u, "_src": 0, "cold": cold[u], "_a": valid[u], "_b": test[u],
             "_stray": None, "_repeat": None} for u in cold]
    lists = []
    for i, k in enumerate(ks):
        mine = {}
        for u in cold:
            if i == 1 and u == "u4":
                continue
            pool = valid[u] + test[u]
            head = [int(x) for x in pool[:int(rng.integers(0, len(pool) + 1))]]
            rest = [int(x) for x in rng.permutation(N_ITEMS) if x not in head]
            mine[u] = (head + rest)[:k]
            rng.shuffle(mine[u])
        mine["zz"] = list(range(k))
        lists.append(mine)
        for u, items in mine.items():
            rows.append({"user_id": u, "_src": i + 1, "cold": None, "_a": items, "_b": None,
                         "_stray": "s9" if (i, u) == (0, "u6") else None,
                         "_repeat": None})
        if i == 0:  # u3 again, with a stray and a repeat of its own
            rows.append({"user_id": "u3", "_src": 1, "cold": None, "_a": list(range(k)),
                         "_b": None, "_stray": "s1", "_repeat": "7"})
    order = rng.permutation(len(rows))
    table = pa.Table.from_pylist([rows[j] for j in order], schema=pa.schema([
        ("user_id", pa.string()), ("_src", pa.int32()), ("cold", pa.bool_()),
        ("_a", pa.list_(pa.int32())), ("_b", pa.list_(pa.int32())), ("_stray", pa.string()),
        ("_repeat", pa.string())]))
    return table, cold, valid, test, lists


@pytest.mark.parametrize("target", ["test", "valid"])
def test_partition_rows_equal_the_batch_path_and_count_the_checks(target):
    rng = np.random.default_rng(1)
    ks = [50, 12]
    table, cold, valid, test, lists = make_partition(rng, 120, ks)
    out = partition_rows(table, ks, target, INVERSE_LOG, N_ITEMS)
    users = out["user_id"].to_pylist()
    assert sorted(users) == sorted([*cold, "zz"])
    at = {u: j for j, u in enumerate(users)}
    truth = {u: sorted(set(valid[u] + test[u])) if cold[u] else
             (valid[u] if target == "valid" else test[u]) for u in cold}
    evaluated = [u for u in cold if truth[u]]
    assert 20 < len(evaluated) < len(cold)  # some users have no truth set: not evaluated
    assert out["truth"].to_pylist() == [u in evaluated for u in users]
    assert out["known"].to_pylist() == [u != "zz" for u in users]
    assert out["cold"].to_pylist()[at["zz"]] is None
    # the check facts: rows per user, the smallest stray and repeat over a user's rows
    rows0 = out[column(0, "rows")].to_pylist()
    assert rows0[at["u3"]] == 2 and rows0[at["zz"]] == 1 and rows0[at["u5"]] == 1
    assert out[column(1, "rows")].to_pylist()[at["u4"]] == 0
    assert [u for u, s in zip(users, out[column(0, "stray")].to_pylist()) if s] == ["u3", "u6"]
    assert out[column(0, "stray")].to_pylist()[at["u3"]] == "s1"
    assert [(u, r) for u, r in zip(users, out[column(0, "repeat")].to_pylist()) if r] == \
        [("u3", "7")]
    for i, k in enumerate(ks):
        # the same users through batch_metrics, each with their first list in table order
        first = {}
        for u, src, items in zip(table.column("user_id").to_pylist(),
                                 table.column("_src").to_pylist(), table.column("_a").to_pylist()):
            if src == i + 1 and u not in first:
                first[u] = items
        ref = batch_metrics(pa.RecordBatch.from_pydict({
            "user_id": pa.array(evaluated), "cold": pa.array([cold[u] for u in evaluated]),
            "_items": pa.array([first.get(u) for u in evaluated], pa.list_(pa.int32())),
            "truth": pa.array([truth[u] for u in evaluated], pa.list_(pa.int32()))}),
            k, inverse_log=INVERSE_LOG)
        rows = [at[u] for u in evaluated]
        listed = np.array(out[column(i, "listed")].to_pylist())
        assert listed[rows].tolist() == ref.column("_listed").to_pylist()
        assert not listed[[at["zz"]]].any()  # an unknown user is never evaluated
        assert listed[at["u4"]] == (i == 0)  # u4 (evaluated) has no list in file 1
        for m in metrics_for(k):
            got = np.array(out[column(i, metric_key(m))].to_pylist(), dtype=float)
            want = np.array(ref.column(metric_key(m)).to_pylist(), dtype=float)
            np.testing.assert_array_equal(got[rows], want, err_msg=m)  # bit for bit, nulls too
            assert np.isnan(np.delete(got, rows)).all(), m  # not evaluated: null
        # popularity: each listed warm user's whole list, hand-counted
        want = np.zeros(N_ITEMS, np.int64)
        for u in evaluated:
            if not cold[u] and first.get(u) is not None:
                np.add.at(want, first[u], 1)
        pop = out[column(i, "pop")].to_pylist()
        assert pop[0] == want.tolist() and want.sum() > 0
        assert all(p is None for p in pop[1:])  # one row per partition carries the counts


def test_long_rows_are_each_files_listed_users_with_their_metrics():
    """The per-user rows a shard task writes (``per_user/``): per file in order, its listed users
    only, labelled, grouped warm/cold, every metric of the longest list; a file of shorter lists
    has null in the metrics it lacks, as Spark's unionByName(allowMissingColumns) gives."""
    ks = [50, 12]
    table, cold, _, _, _ = make_partition(np.random.default_rng(2), 60, ks)
    out = partition_rows(table, ks, "test", INVERSE_LOG, N_ITEMS)
    got = long_rows(out, ["A", "B"], ks).to_pylist()
    names = long_metric_names(ks)
    assert names == [metric_key(m) for m in metrics_for(50)]  # 12's metrics are a subset
    assert set(metric_key(m) for m in metrics_for(12)) < set(names)
    users = out["user_id"].to_pylist()
    want = []
    for i, (label, k) in enumerate(zip("AB", ks)):
        own = {metric_key(m) for m in metrics_for(k)}
        for j, u in enumerate(users):
            if out[column(i, "listed")][j].as_py():
                want.append({"label": label, "group": "cold" if cold[u] else "warm",
                             "user_id": u, **{m: out[column(i, m)][j].as_py() if m in own else None
                                              for m in names}})
    assert got == want and len(want) > 40
    assert {r["label"] for r in got} == {"A", "B"} and {r["group"] for r in got} == {"warm", "cold"}
    assert all(r["ndcg"] is None for r in got if r["label"] == "B")  # NDCG needs the top 50
    assert all(r["ndcg"] is not None for r in got if r["label"] == "A")


def test_the_partitions_moments_merge_to_each_groups_mean_and_ci():
    """Three partitions' moments, merged, against numpy's mean and std over all their users."""
    rng = np.random.default_rng(2)
    ks = [50, 12]
    outs = [partition_rows(make_partition(rng, users, ks)[0], ks, "test", INVERSE_LOG, N_ITEMS)
            for users in (40, 90, 7)]
    parts = [[o[column(i, "moments")].to_pylist()[0] for i in range(len(ks))] for o in outs]
    got = {(r["label"], r["group"], r["metric"]): r
           for r in summary_rows(parts + [[None, None]], ["a", "b"], ks)}
    for i, (label, k) in enumerate(zip(["a", "b"], ks)):
        for group in ("warm", "cold"):
            for m in metrics_for(k):
                x = np.concatenate([np.array(o[column(i, metric_key(m))].to_pylist(), float)[
                    np.array(o[column(i, "listed")].to_pylist())
                    & (np.array(o["cold"].to_pylist()) == (group == "cold"))] for o in outs])
                r = got.pop((label, group, m))
                assert r["users"] == len(x) > 10
                assert abs(r["mean"] - x.mean()) < 1e-12, (label, group, m)
                assert abs(r["ci95"] - 1.96 * x.std() / len(x) ** 0.5) < 1e-12, (label, group, m)
    assert not got  # nothing beyond the groups and metrics of each file's k


def test_co_sharded_needs_the_same_rows_shards_by_name_and_checksum():
    """evaluate.py reads a file beside the rows shards only when its manifest names exactly the
    prepared rows' files with their CRC-32s and the file has one file per shard; anything else
    (lists written elsewhere, the data re-prepared or edited since scoring) takes the shuffle."""
    from evaluation.user_table import co_sharded
    from prepared.reader import Prepared

    def prepared(files: dict, sums: dict) -> Prepared:
        return Prepared(uri="x", manifest={"layout": {"rows": "rows"}, "files": files,
                                           "crc32": sums},
                        pop_train=np.zeros(1), pop_train_valid=np.zeros(1))

    files = {"rows/part-00000.parquet": 10, "rows/part-00001.parquet": 12, "items/a.parquet": 3,
             "rows/_SUCCESS": 0}
    sums = {"rows/part-00000.parquet": "0000abcd", "rows/part-00001.parquet": "1234beef",
            "items/a.parquet": "00000001"}
    prep = prepared(files, sums)
    rows = {"part-00000.parquet": "0000abcd", "part-00001.parquet": "1234beef"}
    assert prep.row_shards() == rows
    recs = {"part-00000.parquet": 10, "part-00001.parquet": 12}
    assert co_sharded({"row_shards": rows, "files": recs}, prep)
    assert not co_sharded({}, prep)  # a file without a scoring manifest
    assert not co_sharded({"row_shards": {**rows, "part-00001.parquet": "ffffffff"},
                           "files": recs}, prep)  # the rows changed since scoring
    assert not co_sharded({"row_shards": rows, "files": {"part-00000.parquet": 10}}, prep)
    # rows edited by hand into one file, the manifest relisted without checksums
    edited = prepared({"rows/part-0.parquet": 30}, sums)
    assert edited.row_shards() == {"part-0.parquet": None}
    assert not co_sharded({"row_shards": {"part-0.parquet": None},
                           "files": {"part-0.parquet": 4}}, edited)


# -- the input checks' facts and refusals, without Spark ----------------------------------------

CATALOGUE = [f"i{j}" for j in range(10)]


def checked_table(lists: list[list[tuple[str, list[str]]]], users=("u1", "u2", "u3")):
    """The wide rows evaluate.py checks, built as a shard task builds them: the dataset's rows of
    ``users`` (warm, one test item each), each file's (user_id, raw ids) rows encoded by
    ``encode_batch`` (which finds the repeats and strays), ``shard_table``, ``partition_rows``;
    returned as Arrow columns and as tests/fake_spark.py's frame of their rows."""
    from evaluation.spark_metrics import encode_batch
    from evaluation.user_table import shard_table
    from prepared import schema as S
    from tests import fake_spark

    ints = pa.list_(pa.int32())
    rows = pa.table({S.USER_ID: pa.array(list(users)), S.COLD: pa.array([False] * len(users)),
                     S.VALID_ITEMS: pa.array([[] for _ in users], ints),
                     S.TEST_ITEMS: pa.array([[j] for j in range(len(users))], ints)})
    encoded = [encode_batch(pa.RecordBatch.from_pydict({
        "user_id": pa.array([u for u, _ in f], pa.string()),
        "item_ids": pa.array([ids for _, ids in f], pa.list_(pa.string()))}),
        pa.array(CATALOGUE)) for f in lists]
    ks = [5] * len(lists)
    out = partition_rows(shard_table(rows, encoded), ks, "test", INVERSE_LOG, len(CATALOGUE))
    n = len(out["user_id"])
    frame = fake_spark.DataFrame([{c: out[c][j].as_py() for c in out} for j in range(n)])
    return out, frame


def recs(*paths: str):
    return [SimpleNamespace(path=p, label=p, manifest={}, df=None, k=5) for p in paths]


PREP = SimpleNamespace(uri="/data/ds")  # check_recs reads its uri only
CLEAN = [("u1", ["i0", "i1", "i2"]), ("u2", ["i3", "i1"]), ("u3", ["i2", "i5", "i7"])]


def facts(out, i: int, name: str) -> dict:
    return dict(zip(out["user_id"].to_pylist(), out[column(i, name)].to_pylist()))


def test_a_repeated_item_and_a_second_row_are_facts_of_the_user():
    """The per-user facts ``check_recs`` refuses on: u3's list repeats i5 (non-null ``repeat``:
    the item), u2 has two rows (``rows`` 2); the others have neither."""
    twice = [*CLEAN, ("u2", ["i4"])]
    repeats = [CLEAN[0], CLEAN[1], ("u3", ["i5", "i2", "i5", "i9"])]
    out, _ = checked_table([CLEAN, twice, repeats])
    assert facts(out, 0, "rows") == {"u1": 1, "u2": 1, "u3": 1}
    assert facts(out, 1, "rows") == {"u1": 1, "u2": 2, "u3": 1}
    assert facts(out, 2, "repeat") == {"u1": None, "u2": None, "u3": "i5"}
    assert facts(out, 0, "repeat") == facts(out, 1, "repeat") == {"u1": None, "u2": None,
                                                                   "u3": None}
    assert set(facts(out, 0, "stray").values()) == {None}


@pytest.mark.parametrize("lists, message", [
    ([[*CLEAN, ("u2", ["i4"])]],
     "--recs b: 1 user(s) have more than one row (each row would count in every mean), first "
     "user u2"),
    ([[CLEAN[0], CLEAN[1], ("u3", ["i5", "i2", "i5", "i9"])]],
     "--recs b: 1 user(s) have a list that repeats an item (a repeated true item would count as "
     "a hit at each position), first user u3 repeats item i5"),
    ([[("u3", ["i2", "i2"]), ("u1", ["i3", "i4", "i3"]), ("u2", ["i1"])]],
     "--recs b: 2 user(s) have a list that repeats an item (a repeated true item would count as "
     "a hit at each position), first user u1 repeats item i3"),
    ([[*CLEAN, ("zz", ["i1"])]], "--recs b: 1 user(s) are not users of --data /data/ds, e.g. zz"),
    ([[CLEAN[0], ("u2", ["i1", "x9"]), CLEAN[2]]],
     "--recs b: 1 user(s) have items outside the catalogue of --data /data/ds, first user u2 "
     "with item x9"),
], ids=["twice", "repeat", "two-repeats", "unknown", "stray"])
def test_check_recs_refuses_each_fault_naming_the_first_user(monkeypatch, lists, message):
    """evaluate.py's ``check_recs`` on those facts (its Spark aggregation run on fake_spark's
    rows): each fault refused, naming the file, the number of users and the first by user_id."""
    from evaluation.recs import check_recs
    from prepared.errors import UsageError
    from tests import fake_spark

    fake_spark.install(monkeypatch)
    _, frame = checked_table([CLEAN, *lists])
    with pytest.raises(UsageError) as e:
        check_recs(frame, recs("a", "b"), PREP)
    assert str(e.value).startswith(message)


def test_check_recs_passes_clean_lists(monkeypatch):
    from evaluation.recs import check_recs
    from tests import fake_spark

    fake_spark.install(monkeypatch)
    _, frame = checked_table([CLEAN, list(reversed(CLEAN))])
    check_recs(frame, recs("a", "b"), PREP)  # nothing to refuse
