"""The experiment's pooling over seeds (experiment/report.py ``pool_over_seeds``,
``pool_popularity``) on a hand-computed case of three users and two seeds, its Spark aggregations
run on tests/fake_spark.py's rows: the pooled mean divides by the seed count and the pooled CI
takes the variance of the users' seed means, not one seed's."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

from experiment.report import pool_over_seeds, pool_popularity

# per user (rows) and seed (columns): NDCG of models a, b, c (c is b plus 0.1 for every user)
VALUES = {"a": [[0.2, 0.4], [0.4, 0.2], [0.6, 0.3]],
          "b": [[0.1, 0.2], [0.4, 0.3], [0.3, 0.3]],
          "c": [[0.2, 0.3], [0.5, 0.4], [0.4, 0.4]]}
LABELS = {m: [f"{m} seed 0", f"{m} seed 1"] for m in VALUES}


def test_pool_over_seeds_by_hand(monkeypatch, tmp_path):
    from tests import fake_spark

    fake_spark.install(monkeypatch)
    rows = [{"label": f"{m} seed {s}", "group": "warm", "user_id": f"u{u}", "ndcg": x[u][s],
             "recall_at_50": x[u][s] / 2}
            for m, x in VALUES.items() for u in range(3) for s in (0, 1)]
    read = []
    spark = SimpleNamespace(read=SimpleNamespace(
        parquet=lambda path: read.append(path) or fake_spark.DataFrame(rows)))
    metrics, pairs = pool_over_seeds(spark, tmp_path, LABELS, [0, 1])
    assert read == [str(Path(tmp_path) / "per_user")]
    ndcg = {r["label"]: r for r in metrics if r["metric"] == "NDCG"}
    # a: seed means 0.4, 0.3 (mean 0.35, sample variance 0.005); y_u = 0.3, 0.3, 0.45 (variance
    # 0.005): se^2 = 0.005 / 3 + 0.005 / 2 = 0.0041667 on Satterthwaite df
    # se^4 / ((0.005/3)^2 / 2 + (0.005/2)^2 / 1) = 2.2727, t quantile 3.84385: CI 0.248119
    # (1.96 would give 0.126517)
    assert ndcg["a"]["mean"] == pytest.approx(0.35) and ndcg["a"]["seeds"] == 2
    assert ndcg["a"]["df"] == pytest.approx(2.272727, abs=1e-6)
    assert ndcg["a"]["ci95"] == pytest.approx(0.248119, abs=1e-6)
    assert ndcg["b"]["mean"] == pytest.approx(0.8 / 3) and ndcg["c"]["mean"] == pytest.approx(1.1 / 3)
    # c has the best pooled NDCG after a: the comparisons are a - b, a - c, c - b
    got = {(p["comparison"], p["reference"], p["label"]): p for p in pairs
           if p["metric"] == "NDCG" and p["seed"] == "pooled"}
    assert sorted(got) == [("best", "c", "b"), ("first", "a", "b"), ("first", "a", "c")]
    ab = got["first", "a", "b"]
    # d seed 0 (0.1, 0, 0.3), seed 1 (0.2, -0.1, 0): seed means 0.1333, 0.0333 (sample variance
    # 0.005); per-user seed means (0.15, -0.05, 0.15): variance 0.0088889;
    # se = sqrt(0.0088889 / 3 + 0.005 / 2) = 0.073912 on df 2.8050 (t 3.31134): CI 0.244748
    # (1.96 would give 0.144867; seed 0's variance 0.0155556 instead, 0.171824 at 1.96)
    assert ab["mean_difference"] == pytest.approx(0.25 / 3)
    assert ab["ci95"] == pytest.approx(0.244748, abs=1e-6)
    cb = got["best", "c", "b"]  # 0.1 for every user and seed: no spread at all
    assert cb["mean_difference"] == pytest.approx(0.1) and cb["ci95"] == pytest.approx(0, abs=1e-7)
    recall = next(p for p in pairs if p["metric"] == "Recall@50" and p["seed"] == "pooled"
                  and p["label"] == "b" and p["comparison"] == "first")
    assert recall["mean_difference"] == pytest.approx(0.125 / 3)
    assert recall["ci95"] == pytest.approx(0.244748 / 2, abs=1e-6)  # half the values: half the CI


def test_pool_popularity_is_the_mean_over_the_seeds_that_have_it():
    pop = {"a seed 0": {"median_popularity": 10.0, "share_top10pct": 0.5},
           "a seed 1": {"median_popularity": 20.0, "share_top10pct": 0.3},
           "b seed 0": {"median_popularity": 7.0, "share_top10pct": 0.9}}
    got = pool_popularity(pop, {"a": ["a seed 0", "a seed 1"], "b": ["b seed 0", "b seed 1"],
                                "c": ["c seed 0"]})
    assert got["a"] == pytest.approx({"median_popularity": 15.0, "share_top10pct": 0.4})
    # b's seed 1 has no figures: the mean of the one seed that has them, not half of it
    assert got["b"] == pytest.approx({"median_popularity": 7.0, "share_top10pct": 0.9})
    assert "c" not in got and pool_popularity(None, {"a": ["a"]}) == {}
    assert not math.isnan(got["a"]["median_popularity"])
