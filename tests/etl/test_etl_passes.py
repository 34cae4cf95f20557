"""The ETL's per-partition numpy passes (``etl.passes``) against slow references written from the
protocol: a row-by-row dedup, a per-user sort for the split. (The Spark ETL on real datasets is
checked against an independent pandas reference in test_etl_datasets.py and test_etl_given.py.)"""

from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from etl import passes
from etl.config import PositiveRule


def _ratings(rng, n=3000, string_ids=False, given=False, hashed=False):
    """Rating rows with duplicates, missing times and ratings, ties in time, shuffled."""
    user = rng.integers(0, 60, n)
    item = rng.integers(0, 40, n)
    ts = rng.integers(100, 110, n).astype(object)  # few distinct times: many ties
    ts[rng.random(n) < 0.1] = None
    rating = rng.integers(1, 6, n).astype(float).astype(object)
    rating[rng.random(n) < 0.05] = None
    cols = {"user_id": [f"u{u:02d}" for u in user] if string_ids else user.astype(np.int64),
            "item_id": [f"{i:03d}" for i in item] if string_ids else item.astype(np.int64),
            "rating": pa.array(rating.tolist(), pa.float64()),
            "timestamp": pa.array(ts.tolist(), pa.int64()),
            "gpos": np.arange(n, dtype=np.int64)[rng.permutation(n)],
            "given": pa.array(rng.integers(0, 3, n) if given else [None] * n, pa.int8())}
    if hashed:
        cols["rhash"] = rng.integers(-2**62, 2**62, n)
    return pa.table(cols)


def _reference_dedup(table: pa.Table, rule) -> dict:
    """Per (user, item): the row with the largest (time, input position), a missing time least."""
    best = {}
    for r in table.to_pylist():
        key = (r["user_id"], r["item_id"])
        rank = (-(2**63) if r["timestamp"] is None else r["timestamp"], r["gpos"])
        old = best.get(key)
        given = r["given"]
        if old is None:
            best[key] = {"rank": rank, "row": r, "copies": 1, "given": {given}}
        else:
            old["copies"] += 1
            old["given"].add(given)
            if rank > old["rank"]:
                old["rank"], old["row"] = rank, r
    for v in best.values():
        rating = v["row"]["rating"]
        v["positive"] = bool(passes.positive(rule, np.array([np.nan if rating is None else rating]))[0])
    return best


@pytest.mark.parametrize("string_ids", [False, True])
@pytest.mark.parametrize("given", [False, True])
def test_dedup_equals_a_row_by_row_reference(string_ids, given):
    rng = np.random.default_rng(7)
    table = _ratings(rng, string_ids=string_ids, given=given, hashed=True)
    id_type = pa.string() if string_ids else pa.int64()
    lists_s = passes.lists_schema(id_type, id_type, given, True)
    counts_s = passes.counts_schema(id_type, id_type)
    rule = PositiveRule.parse(">3")
    # Arrow batches of any cut: the partition arrives in pieces, shuffled
    lists, counts = passes.dedup(pa.Table.from_batches(table.to_batches(max_chunksize=700)), rule,
                                 lists_s, counts_s)
    ref = _reference_dedup(table, rule)

    got = {}
    for r in lists.to_pylist():
        assert r["n_pos"] == len(r["items"]) > 0
        assert r["items"] == sorted(r["items"])  # ascending by item id
        for k, item in enumerate(r["items"]):
            got[(r["user_id"], item)] = (r["ts"][k], r["rhash"][k], r["given"][k] if given else None)
    want = {}
    for key, v in ref.items():
        if v["positive"]:
            g = min(v["given"]) if given else None
            want[key] = (v["row"]["timestamp"], v["row"]["rhash"], g)
    assert got == want

    users = [r for r in counts.to_pylist() if r["n_pos"] >= 0]
    assert len({r["user_id"] for r in users}) == len(users) == len({u for u, _ in ref})
    for r in users:
        mine = {k: v for k, v in ref.items() if k[0] == r["user_id"]}
        assert r["rows"] == sum(v["copies"] for v in mine.values())
        assert r["pairs"] == len(mine)
        assert r["n_pos"] == sum(v["positive"] for v in mine.values())
        assert r["twice"] == (sum(len(v["given"]) > 1 for v in mine.values()) if given else 0)
        assert r["timed"] == sum(v["positive"] and v["row"]["timestamp"] is not None
                                 for v in mine.values())
        for k, s in enumerate(("train", "valid", "test")):
            assert r[f"given_{s}"] == (sum(v["positive"] and min(v["given"]) == k
                                           for v in mine.values()) if given else 0)
        assert r["items"] is None
    markers = {r["n_pos"]: sorted(r["items"]) for r in counts.to_pylist() if r["n_pos"] < 0}
    assert markers[passes.ALL_ITEMS] == sorted({i for _, i in ref})
    assert markers[passes.POSITIVE_ITEMS] == sorted({i for (_, i), v in ref.items() if v["positive"]})


def test_dedup_counts_ratings_of_255():
    table = pa.table({"user_id": [1, 1, 2], "item_id": [5, 6, 5], "rating": [255.0, 90.0, 255.0],
                      "timestamp": pa.nulls(3, pa.int64()), "gpos": [0, 1, 2],
                      "given": pa.nulls(3, pa.int8())})
    s = pa.int64()
    lists, counts = passes.dedup(table, PositiveRule.parse("80..100"),
                                 passes.lists_schema(s, s, False, False), passes.counts_schema(s, s))
    by_user = {r["user_id"]: r for r in counts.to_pylist() if r["n_pos"] >= 0}
    assert by_user[1]["r255"] == 1 and by_user[2]["r255"] == 1
    assert lists.to_pydict()["user_id"] == [1] and lists.to_pydict()["items"] == [[6]]
    assert by_user[2]["n_pos"] == 0  # counted (users_raw) though it has no positive


def test_positive_rules():
    r = np.array([np.nan, 1.0, 3.0, 3.5, 5.0])
    assert passes.positive(PositiveRule.parse(">3"), r).tolist() == [False, False, False, True, True]
    assert passes.positive(PositiveRule.parse(">=3"), r).tolist() == [False, False, True, True, True]
    assert passes.positive(PositiveRule.parse("1..3"), r).tolist() == [False, True, True, False, False]
    assert passes.positive(PositiveRule.parse("<3"), r).tolist() == [False, True, False, False, False]
    assert passes.positive(PositiveRule.parse("all"), r).all()


def _reference_split(users, mode, t, h, carve=None, carve_by="time"):
    """Per user: sort by (key, item index); the newest floor(n t) test, floor(n (h - t)) before
    them valid; given: as given, or the last floor(m * carve) of the m train ones valid."""
    out = []
    for items, ts, given, rhash in users:
        key = ts if (mode == "time" or (mode == "given" and carve_by == "time")) else rhash
        n = len(items)
        code = [0] * n
        if mode in ("time", "random"):
            order = sorted(range(n), key=lambda k: (key[k], items[k]))
            n_test, n_hold = int(Fraction(n) * t), int(Fraction(n) * h)
            for rank, k in enumerate(order):
                code[k] = 0 if rank < n - n_hold else 1 if rank < n - n_test else 2
        else:
            code = list(given)
            if carve is not None:
                train = sorted((k for k in range(n) if given[k] == 0), key=lambda k: (key[k], items[k]))
                n_valid = int(Fraction(len(train)) * carve)
                for k in train[len(train) - n_valid:]:
                    code[k] = 1
        out += code
    return out


@pytest.mark.parametrize("mode,carve_by", [("time", None), ("random", None), ("given", None),
                                           ("given", "time"), ("given", "random")])
def test_split_codes_equal_a_per_user_sort(mode, carve_by):
    rng = np.random.default_rng(3)
    users = []
    for _ in range(200):
        n = int(rng.integers(1, 25))
        items = rng.choice(1000, n, replace=False)
        ts = rng.integers(0, 5, n)  # ties in time
        ts[rng.random(n) < 0.2] = passes.NULL_TS  # missing times sort first
        users.append((items, ts, rng.integers(0, 3, n), rng.integers(-2**40, 2**40, n)))
    t, h = Fraction(3, 10), Fraction(1, 2)
    carve = (h - t) / (1 - t) if carve_by else None
    rule = passes.SplitRule(mode, (3, 10), (1, 2),
                            carve=(carve.numerator, carve.denominator) if carve else None,
                            carve_by=carve_by or "time")
    cat = lambda k: np.concatenate([u[k] for u in users])
    got = passes.split_codes(np.array([len(u[0]) for u in users]), cat(0), cat(1), cat(2), cat(3),
                             rule)
    assert got.tolist() == _reference_split(users, mode, t, h, carve, carve_by or "time")
    if mode == "time":  # the protocol's 50/20/30 for a user of 10
        one = passes.split_codes(np.array([10]), np.arange(10), np.arange(10), None, None, rule)
        assert one.tolist() == [0] * 5 + [1] * 2 + [2] * 3


@pytest.mark.parametrize("ids", [pa.array([40, 7, -3, 1000], pa.int64()),
                                 pa.array(["b", "007", "7", "a"])])
def test_id_lookup_finds_positions_and_refuses_unknown_ids(ids):
    lookup = passes.IdLookup(ids, "items")
    query = ids.take(pa.array([3, 0, 0, 2, 1]))
    assert lookup(query).tolist() == [3, 0, 0, 2, 1]
    unknown = pa.array([5], ids.type) if pa.types.is_integer(ids.type) else pa.array(["x"])
    with pytest.raises(RuntimeError, match="1 ids missing from the items table"):
        lookup(pa.concat_arrays([query, unknown]))


@pytest.mark.parametrize("wide", [False, True])  # packed in one int64, or too wide for it
def test_order_is_a_lexsort_of_user_key_item(wide):
    rng = np.random.default_rng(5)
    owner = np.sort(rng.integers(0, 300, 5000))
    key = rng.integers(-3, 3, 5000) * 2**61  # few distinct keys, far apart: ranks pack them
    item = rng.choice(2**60, 5000, replace=False) if wide else rng.permutation(5000)
    assert passes.lexorder(owner, key, item).tolist() == np.lexsort((item, key, owner)).tolist()


@pytest.mark.parametrize("string_ids", [False, True])
def test_the_split_kept_for_the_write_pass_gives_back_the_positives(string_ids):
    """The write pass rebuilds ``positives_of``'s result from the lists and what the split pass
    kept (``kept_split``), instead of looking ids up and splitting again: the same, field by
    field, and in the shards' order (by the users' hash, then id)."""
    from etl import pipeline

    rng = np.random.default_rng(3)
    table = _ratings(rng, string_ids=string_ids)
    id_type = pa.string() if string_ids else pa.int64()
    lists, _ = passes.dedup(table, PositiveRule.parse(">3"), passes.lists_schema(
        id_type, id_type, False, False), passes.counts_schema(id_type, id_type))
    lists = pa.Table.from_batches([lists])
    users = lists.column("user_id")
    side = pa.table({"user_id": users, "user_index": np.arange(len(users), dtype=np.int32)[::-1],
                     "cold": np.arange(len(users)) % 4 == 0,
                     "uhash": rng.integers(-3, 3, len(users))})  # ties: then by id
    items = pa.array(sorted(set(pc.list_flatten(lists.column("items")).to_pylist())))
    rule = passes.SplitRule("time", (3, 10), (1, 2))
    p = pipeline.positives_of(lists, side, passes.IdLookup(items, "items"),
                              np.arange(len(items))[::-1].copy(), rule)
    back = pipeline.kept_positives(lists, pipeline.kept_split(p))
    assert set(back) == set(p)
    for k in p:
        want, got = p[k], back[k]
        if isinstance(want, (pa.Array, pa.ChunkedArray)):
            assert got.to_pylist() == want.to_pylist(), k
        else:
            np.testing.assert_array_equal(got, want, err_msg=k)
    order = sorted(range(len(users)), key=lambda r: (side["uhash"][r].as_py(), users[r].as_py()))
    assert p["row"].tolist() == order
