"""Helpers for the ETL integration tests: run the real job, load its output, and an independent
pandas reference of the protocol (written from protocol.md, sharing no code with etl/)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq

from etl.config import ETLConfig
from etl.prepare import run
from prepared import schema as S


@dataclass
class Prepared:
    path: Path
    manifest: dict
    rows: pd.DataFrame
    items: pd.DataFrame
    users: pd.DataFrame
    split: pd.DataFrame


def load(path: Path) -> Prepared:
    path = Path(path)
    read = lambda d: pq.read_table(path / d).to_pandas()
    return Prepared(path, json.loads((path / "manifest.json").read_text()),
                    read("rows").sort_values("user_index").reset_index(drop=True),
                    read("items"), read("users"), read("split"))


def prepare(spark, out: Path, **kwargs) -> Prepared:
    run(ETLConfig(output=str(out), **kwargs), spark)
    return load(out)


def reference_positives(df: pd.DataFrame, positive) -> pd.DataFrame:
    """Dedup (latest row of a pair wins; ties: later line) then binarise.

    ``df``: user, item (str), rating (float or NaN), ts (float or NaN), order (file position).
    """
    df = df.sort_values(["ts", "order"], na_position="first", kind="stable")
    df = df.drop_duplicates(["user", "item"], keep="last")
    return df[positive(df["rating"])].reset_index(drop=True)


def reference_time_split(pos: pd.DataFrame) -> pd.DataFrame:
    """Label each positive train/valid/test: oldest first, ties by item id (as integers if all are)."""
    numeric = pos["item"].str.fullmatch(r"-?\d+").all()
    pos = pos.assign(key=pos["item"].astype("int64") if numeric else pos["item"])
    out = []
    for user, g in pos.sort_values(["ts", "key"], kind="stable").groupby("user", sort=False):
        n = len(g)
        n_test, n_hold = int(0.3 * n), int(0.5 * n)
        labels = ["train"] * (n - n_hold) + ["valid"] * (n_hold - n_test) + ["test"] * n_test
        out.append(pd.DataFrame({"user": user, "item": g["item"].to_numpy(), "split": labels}))
    return pd.concat(out, ignore_index=True)


def check_prepared(p: Prepared, pos: pd.DataFrame, expected_split: pd.DataFrame | None,
                   cold_fraction: float, negatives: int, beta: float = 1.0) -> None:
    """Everything the output must satisfy given the reference positives ``pos`` (user, item)."""
    m = p.manifest
    users = sorted(pos["user"].unique())
    items = sorted(pos["item"].unique())
    assert m["counts"]["users"] == len(users) == len(p.users) == len(p.rows)
    assert m["counts"]["items"] == len(items) == len(p.items)
    assert sum(m["counts"]["positives"].values()) == len(pos) == len(p.split)

    # the split: exactly the reference positives; per-user sizes by the authors' arithmetic
    got = p.split.rename(columns={"user_id": "user", "item_id": "item"})
    assert set(zip(got.user, got.item)) == set(zip(pos.user, pos.item))
    sizes = got.groupby("user")["split"].value_counts().unstack(fill_value=0)
    n = sizes.sum(axis=1)
    for s, frac in (("test", lambda k: int(0.3 * k)),
                    ("valid", lambda k: int(0.5 * k) - int(0.3 * k))):
        col = sizes[s] if s in sizes else pd.Series(0, index=sizes.index)
        assert (col == n.map(frac)).all(), f"{s} sizes differ from the authors' arithmetic"
    if expected_split is not None:
        exp = set(zip(expected_split.user, expected_split.item, expected_split.split))
        assert set(zip(got.user, got.item, got.split)) == exp

    # indices: contiguous, in id order
    assert p.items.item_index.tolist() == list(range(len(items)))
    assert p.users.user_index.tolist() == list(range(len(users)))

    # cold users: round(fraction * m) of them, no negatives, train part kept as fold-in input
    cold = set(p.users.loc[p.users.cold, "user_id"])
    assert len(cold) == round(cold_fraction * len(users)) == m["counts"]["cold_users"]

    # popularity from warm users' training positives
    warm_train = got[(got.split == "train") & ~got.user.isin(cold)]
    pop = warm_train.item.value_counts()
    pop_tv = got[got.split.isin(["train", "valid"]) & ~got.user.isin(cold)].item.value_counts()
    items_tbl = p.items.set_index("item_id")
    assert (items_tbl.pop_train == pop.reindex(items_tbl.index, fill_value=0)).all()
    assert (items_tbl.pop_train_valid == pop_tv.reindex(items_tbl.index, fill_value=0)).all()

    # user rows: the split as index lists, R* by the formula, N negatives for warm users
    index_of = dict(zip(p.items.item_id, p.items.item_index))
    z = len(users) - len(cold)
    pop_by_index = p.items.set_index("item_index").pop_train
    by_user = {u: g for u, g in got.groupby("user")}
    for row in p.rows.itertuples():
        g = by_user[row.user_id]
        for s, col in (("train", row.train_items), ("valid", row.valid_items),
                       ("test", row.test_items)):
            assert list(col) == sorted(index_of[i] for i in g.item[g.split == s])
        assert row.cold == (row.user_id in cold)
        expected_rstar = [max(math.log(z) - beta * math.log(pop_by_index[j]), 0.0)
                          if pop_by_index[j] > 0 else 0.0 for j in row.train_items]
        np.testing.assert_allclose(row.train_rstar, expected_rstar, rtol=1e-6, atol=1e-6)
        if row.cold:
            assert len(row.neg_items) == 0
        else:
            assert sum(row.neg_counts) == negatives
            assert all(pop_by_index[j] > 0 for j in row.neg_items)


def relist_files(prepared: Path) -> None:
    """After a test edits a prepared directory by hand: its manifest lists the files as they now
    are (what the ETL's publisher writes), so that readers take the edit for a whole output."""
    manifest = json.loads((prepared / S.MANIFEST).read_text())
    manifest["files"] = {str(f.relative_to(prepared)): f.stat().st_size
                         for f in sorted(prepared.rglob("*")) if f.is_file() and f.name != S.MANIFEST}
    (prepared / S.MANIFEST).write_text(json.dumps(manifest))


def reshard_rows(prepared: Path, out: Path, shards: int) -> Path:
    """A copy of ``prepared`` whose user rows are in ``shards`` files (user i in file i mod
    ``shards``, as a hash partitioning scatters them), its manifest relisted with the new files'
    CRC-32s as the ETL writes them: a multi-shard dataset from a one-shard fixture."""
    import shutil

    import pyarrow as pa
    from pyarrow import fs

    from prepared.files import crc32_of

    shutil.copytree(prepared, out)
    rows = pq.read_table(out / S.ROWS_DIR)
    shutil.rmtree(out / S.ROWS_DIR)
    (out / S.ROWS_DIR).mkdir()
    which = np.arange(rows.num_rows) % shards
    for s in range(shards):
        pq.write_table(rows.filter(pa.array(which == s)), out / S.ROWS_DIR / f"part-{s:05d}.parquet")
    relist_files(out)
    manifest = json.loads((out / S.MANIFEST).read_text())
    local = fs.LocalFileSystem()
    manifest["crc32"] = {f: v for f, v in manifest.get("crc32", {}).items()
                         if not f.startswith(S.ROWS_DIR + "/")}
    manifest["crc32"].update({f"{S.ROWS_DIR}/part-{s:05d}.parquet":
                              crc32_of(local, str(out / S.ROWS_DIR / f"part-{s:05d}.parquet"))
                              for s in range(shards)})
    (out / S.MANIFEST).write_text(json.dumps(manifest))
    return out
