"""The real Spark ETL on the real datasets in ../shared, against an independent pandas reference."""

import pandas as pd
import pytest

from tests.conftest import ROOT, need_dataset
from tests.etl_helpers import check_prepared, prepare, reference_positives, reference_time_split

pytestmark = pytest.mark.spark


def test_ml_100k(spark, shared_datasets, tmp_path):
    raw = pd.read_csv(shared_datasets / "ml-100k" / "u.data", sep="\t", header=None,
                      names=["user", "item", "rating", "ts"], dtype={"user": str, "item": str})
    raw["order"] = range(len(raw))
    pos = reference_positives(raw, lambda r: r > 3)
    out = prepare(spark, tmp_path / "out", dataset="ml-100k",
                  input=(str(shared_datasets / "ml-100k" / "u.data"),), negatives=50)
    check_prepared(out, pos, reference_time_split(pos), cold_fraction=0.05, negatives=50)
    c = out.manifest["counts"]
    assert c["rows"] == 100_000 and c["non_positive_pairs"] == 100_000 - len(pos)
    assert c["users_raw"] == 943 and c["items_raw"] == 1682
    assert out.manifest["inputs"][0]["bytes"] == 1_979_173
    assert len(out.manifest["inputs"][0]["sha256"]) == 64
    # the split in long form keeps raw timestamps
    merged = out.split.merge(raw.rename(columns={"user": "user_id", "item": "item_id"}),
                             on=["user_id", "item_id"])
    assert (merged.timestamp == merged.ts).all()


def test_ml_latest_small_half_stars(spark, tmp_path):
    path = ROOT / "data" / "ml-latest-small" / "ratings.csv"  # shipped with the project
    raw = pd.read_csv(path, dtype={"userId": str, "movieId": str}).rename(
        columns={"userId": "user", "movieId": "item", "timestamp": "ts"})
    raw["order"] = range(len(raw))
    pos = reference_positives(raw, lambda r: r > 3)  # 3.5 counts, 3.0 does not
    out = prepare(spark, tmp_path / "out", dataset="ml-latest-small", input=(str(path),),
                  cold_users=0.1, negatives=20, seed=3)
    check_prepared(out, pos, reference_time_split(pos), cold_fraction=0.1, negatives=20)
    assert out.manifest["counts"]["lines"]["header"] == 1


def test_citeulike_random_split(spark, tmp_path):
    path = need_dataset("citeulike-a/users.dat")
    recs = []
    for k, line in enumerate(path.read_text().splitlines()):
        tokens = line.split()
        assert int(tokens[0]) == len(tokens) - 1
        recs += [(str(k), t) for t in tokens[1:]]
    raw = pd.DataFrame(recs, columns=["user", "item"]).assign(rating=float("nan"), ts=float("nan"))
    raw["order"] = range(len(raw))
    pos = reference_positives(raw, lambda r: pd.Series(True, index=r.index))
    out = prepare(spark, tmp_path / "out", dataset="citeulike", input=(str(path),), negatives=10)
    check_prepared(out, pos, None, cold_fraction=0.05, negatives=10)
    assert out.manifest["parameters"]["split"] == "random"
    # seeded: the same seed gives the same split, another seed another one
    again = prepare(spark, tmp_path / "again", dataset="citeulike", input=(str(path),),
                    negatives=10, seed=0)
    other = prepare(spark, tmp_path / "other", dataset="citeulike", input=(str(path),),
                    negatives=10, seed=1)
    key = lambda p: set(zip(p.split.user_id, p.split.item_id, p.split.split))
    assert key(again) == key(out) and key(other) != key(out)
    assert again.rows.neg_items.map(list).tolist() == out.rows.neg_items.map(list).tolist()


def test_goodbooks_sample(spark, tmp_path):
    path = need_dataset("goodbooks-sample/ratings.csv")
    raw = pd.read_csv(path, dtype={"user_id": str, "book_id": str}).rename(
        columns={"user_id": "user", "book_id": "item"})
    raw["ts"], raw["order"] = float("nan"), range(len(raw))
    pos = reference_positives(raw, lambda r: r >= 3)
    out = prepare(spark, tmp_path / "out", dataset="goodbooks",
                  input=(str(path.parent),), cold_users=0.0, negatives=5)  # a directory works
    check_prepared(out, pos, None, cold_fraction=0.0, negatives=5)
    assert out.split.timestamp.isna().all()
    # user 6 has a single rating (>= 3): train only
    assert out.split[out.split.user_id == "6"].split.tolist() == ["train"]
    assert out.manifest["counts"]["users_single_positive"] == 1
