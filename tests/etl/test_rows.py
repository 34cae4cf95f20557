"""The user-row builder (``etl.write.build_rows``): the rows of any cut of a partition's users are
the rows of the whole, and the row groups of a shard hold every row once, in order."""

import numpy as np
import pyarrow as pa

from etl.write import _row_groups, build_rows
from prepared.protocol import alias_table


def _positives(seed=0):
    rng = np.random.default_rng(seed)
    user, item, code = [], [], []
    for u in range(30):
        n = int(rng.integers(1, 12))
        user += [u] * n
        item += rng.choice(50, n, replace=False).tolist()
        code += rng.integers(0, 3, n).tolist()
    n = len(user)
    return pa.RecordBatch.from_arrays(
        [pa.array(user, pa.int32()), pa.array([f"u{u}" for u in user]),
         pa.array([u % 7 == 0 for u in user]), pa.array(item, pa.int32()), pa.array(code, pa.int8())],
        names=["user_index", "user_id", "cold", "item_index", "split_code"]), n


def _run(batches):
    pop = np.arange(1, 51)
    rstar = np.log(pop.astype(float))
    out = [build_rows(b, rstar, pop, 20, 3, alias_table(pop)) for b in batches]
    return pa.Table.from_batches(out).to_pylist()


def test_rows_do_not_depend_on_how_users_are_cut():
    """A user's negatives depend on (seed, user), never on the other users of its batch."""
    batch, n = _positives()
    whole = _run([batch])
    users = batch.column("user_index").to_numpy()
    starts = np.flatnonzero(np.diff(users)) + 1
    cuts = [0, *starts[[0, 5, 6, 20]].tolist(), n]
    pieces = [batch.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]
    assert _run(pieces) == whole
    assert [r["user_index"] for r in whole] == list(range(30))


def test_row_groups_cut_a_shard_by_size_and_keep_every_row(monkeypatch):
    import etl.write as P

    pop = np.arange(1, 51)
    batch, _ = _positives()
    rows = build_rows(batch, np.log(pop.astype(float)), pop, 20, 3, alias_table(pop))
    monkeypatch.setattr(P, "ROW_GROUP_BYTES", 400)
    groups = _row_groups(rows)
    assert len(groups) > 3
    assert pa.Table.from_batches(groups).to_pylist() == pa.Table.from_batches([rows]).to_pylist()
    monkeypatch.setattr(P, "ROW_GROUP_BYTES", 64 << 20)
    assert len(_row_groups(rows)) == 1


def test_rows_content():
    batch, _ = _positives()
    rows = _run([batch])
    cols = batch.to_pydict()
    for r in rows:
        mine = [(i, c) for u, i, c in zip(cols["user_index"], cols["item_index"], cols["split_code"])
                if u == r["user_index"]]
        for code, name in enumerate(("train_items", "valid_items", "test_items")):
            assert r[name] == sorted(i for i, c in mine if c == code)
        np.testing.assert_allclose(r["train_rstar"], np.log(np.array(r["train_items"]) + 1.0), rtol=1e-6)
        assert r["user_id"] == f"u{r['user_index']}"
        if r["cold"]:
            assert r["neg_items"] == [] and r["neg_counts"] == []
        else:
            assert sum(r["neg_counts"]) == 20 and r["neg_items"] == sorted(r["neg_items"])
