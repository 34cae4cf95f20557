"""The paired tests of evaluation/significance.py against scipy.stats on the same differences, Holm
against hand-computed values, and evaluation.paired's comparisons (against the first and against the
best of the others) on a small Spark DataFrame against scipy and pandas."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from evaluation.paired import best_other, paired, paired_csv, paired_table
from evaluation.significance import holm, t_test_p, wilcoxon_p, wilcoxon_spark


def scipy_wilcoxon(d: np.ndarray) -> float:
    return stats.wilcoxon(d, method="asymptotic", correction=False).pvalue


@pytest.mark.parametrize("p, want", [
    ([0.01, 0.04, 0.03], [0.03, 0.06, 0.06]),        # sorted: 3 x .01, 2 x .03, max(.06, .04)
    ([0.04, 0.01, 0.02, 0.5], [0.08, 0.04, 0.06, 0.5]),  # 4 x .01, 3 x .02, 2 x .04, 1 x .5
    ([0.3, 0.2, 0.9], [0.6, 0.6, 0.9]),                # monotone: .3's 2 x .3 = .6 >= 3 x .2
    ([0.5, 0.6], [1.0, 1.0]),                          # capped at 1
    ([0.01, math.nan, 0.02], [0.02, math.nan, 0.02]),  # NaN stays NaN, not counted in m
    ([], []),
])
def test_holm_matches_hand_computed_values(p, want):
    np.testing.assert_allclose(holm(p), want, rtol=1e-12)


def test_the_t_test_matches_scipy_ttest_rel():
    rng = np.random.default_rng(0)
    a, b = rng.random(300), rng.random(300) * 0.9
    d = a - b
    got = t_test_p(len(d), d.mean(), d.std(ddof=1))
    assert got == pytest.approx(stats.ttest_rel(a, b).pvalue, abs=1e-12)
    assert 0 < got < 0.05  # b is a tenth lower on average: a real difference
    # undefined as in scipy: all differences 0 (NaN), one user (NaN); all equal non-zero: 0
    assert math.isnan(t_test_p(5, 0.0, 0.0)) and math.isnan(t_test_p(1, 0.3, None))
    assert t_test_p(5, 0.1, 0.0) == 0.0


def test_the_signed_rank_p_value_matches_scipy_from_its_statistics():
    d = np.array([0.5, -0.5, 1.0, 2.0, 2.0, -2.0, 3.0, 0.25, -1.0, 4.0] * 7)
    ranks = stats.rankdata(np.abs(d))
    _, counts = np.unique(np.abs(d), return_counts=True)
    p = wilcoxon_p(len(d), ranks[d > 0].sum(), float((counts ** 3 - counts).sum()))
    assert p == pytest.approx(scipy_wilcoxon(d), abs=1e-12)
    assert math.isnan(wilcoxon_p(0, 0.0, 0.0))


def test_the_signed_ranks_of_a_hand_worked_case_with_ties_and_zeros(monkeypatch):
    """``wilcoxon_spark``'s own ranking (tie groups at their average rank, zeros and nulls
    dropped: scipy's zero_method="wilcox"), run on tests/fake_spark.py's rows without a session.
    d = 0, 1, -1, 2, 2, -3, 0, null: the non-zero |d| 1, 1, 2, 2, 3 rank 1.5, 1.5, 3.5, 3.5, 5;
    W+ = 1.5 (the +1) + 3.5 + 3.5 (the two +2) = 8.5 of n = 5; ties: (2^3 - 2) twice = 12."""
    from tests import fake_spark

    fake_spark.install(monkeypatch)
    d = [0.0, 1.0, -1.0, 2.0, 2.0, -3.0, 0.0, None]
    got = wilcoxon_spark(fake_spark.DataFrame([{"g": "a", "d": x} for x in d]), ["g"], "d")
    assert got[("a",)]["n"] == 5 and got[("a",)]["w_plus"] == 8.5 and got[("a",)]["ties"] == 12
    # z = (8.5 - 5 * 6 / 4) / sqrt((5 * 6 * 11 - 12 / 2) / 24) = 1 / sqrt(13.5)
    assert got[("a",)]["p"] == pytest.approx(2 * stats.norm.sf(1 / math.sqrt(13.5)), abs=1e-12)
    assert got[("a",)]["p"] == pytest.approx(scipy_wilcoxon(np.array(d[:-1])), abs=1e-12)


def test_the_signed_ranks_with_many_ties_and_zeros_match_scipy(monkeypatch):
    """The same on groups of hundreds of differences (quarters: many zeros and ties across signs;
    two decimals: some ties), against scipy.stats.wilcoxon and scipy's ranks."""
    from tests import fake_spark

    fake_spark.install(monkeypatch)
    rng = np.random.default_rng(1)
    groups = {"coarse": rng.integers(-3, 4, 160) / 4, "fine": np.round(rng.normal(0.4, 1.0, 120), 2),
              "zeros": np.zeros(3)}
    rows = [{"g": g, "d": float(x)} for g, xs in groups.items() for x in xs]
    got = wilcoxon_spark(fake_spark.DataFrame(rows), ["g"], "d")
    assert set(got) == {("coarse",), ("fine",)}  # every difference zero: no statistic, as scipy
    assert (groups["coarse"] == 0).sum() > 10
    for g in ("coarse", "fine"):
        d = groups[g]
        nz = d[d != 0]
        _, counts = np.unique(np.abs(nz), return_counts=True)
        assert got[(g,)]["n"] == len(nz)
        assert got[(g,)]["w_plus"] == pytest.approx(stats.rankdata(np.abs(nz))[nz > 0].sum())
        assert got[(g,)]["ties"] == float((counts ** 3 - counts).sum()) > 0
        assert got[(g,)]["p"] == pytest.approx(scipy_wilcoxon(d), abs=1e-12)


def test_the_paired_moments_are_the_differences_mean_variances_and_signs(monkeypatch):
    from evaluation.significance import paired_moments
    from tests import fake_spark

    fake_spark.install(monkeypatch)
    d = [0.3, -0.1, 0.0, 0.2]
    moments, ranks = paired_moments(fake_spark.DataFrame([{"k": "x", "d": v} for v in d]), ["k"])
    m = moments[("x",)]
    # mean 0.1; squared deviations 0.04, 0.04, 0.01, 0.01: var_pop 0.1 / 4, sd sqrt(0.1 / 3)
    assert (m["n"], m["mean"], m["var"]) == pytest.approx((4, 0.1, 0.025))
    assert m["sd"] == pytest.approx(math.sqrt(0.1 / 3)) and (m["wins"], m["losses"]) == (0.5, 0.25)
    assert ranks[("x",)]["w_plus"] == 5.0  # |d| 0.1, 0.2, 0.3 rank 1, 2, 3; the positives 2 + 3


@pytest.mark.spark
def test_wilcoxon_in_spark_with_ties_and_zeros_matches_scipy(spark):
    rng = np.random.default_rng(1)
    groups = {
        # quarters from -3/4 to 3/4: zeros, and ties across signs (|-0.5| = |0.5|)
        "coarse": rng.integers(-3, 4, 240) / 4,
        # two decimals, shifted: mostly distinct, some ties, a clear positive median
        "fine": np.round(rng.normal(0.4, 1.0, 300), 2),
        "one": np.array([0.0, 0.0, -0.3]),
    }
    frame = pd.DataFrame([{"g": g, "d": float(x)} for g, xs in groups.items() for x in xs]
                         + [{"g": "coarse", "d": None}])  # a null: dropped like a zero
    got = wilcoxon_spark(spark.createDataFrame(frame, "g string, d double"), ["g"], "d")
    for g, d in groups.items():
        nz = d[d != 0]
        ranks = stats.rankdata(np.abs(nz))
        assert got[(g,)]["n"] == len(nz)
        assert got[(g,)]["w_plus"] == pytest.approx(ranks[nz > 0].sum(), abs=1e-9)
        assert got[(g,)]["p"] == pytest.approx(scipy_wilcoxon(d), abs=1e-9)
    assert (groups["coarse"] == 0).sum() > 10 and got[("fine",)]["p"] < 0.05
    # every difference zero: no row, as scipy has no statistic
    zeros = spark.createDataFrame(pd.DataFrame({"g": ["z"] * 3, "d": [0.0] * 3}))
    assert wilcoxon_spark(zeros, ["g"], "d") == {}


def users_frame(rng: np.random.Generator, n: int = 120) -> pd.DataFrame:
    """Per-user NDCG and Recall@50 of three labels; C is B plus a bit, A is noisier; ties (values
    rounded to 1/20) and users where two labels agree exactly (zero differences), as real lists
    give. A few cold users and one warm user only A has must be ignored."""
    base = rng.random(n)
    values = {"A": base + rng.normal(0, 0.2, n), "B": base - 0.05, "C": base - 0.05 + rng.normal(
        0.03, 0.05, n)}
    rows = []
    for label, v in values.items():
        v = np.clip(np.round(v * 20) / 20, 0, 1)
        for u in range(n):
            rows.append({"label": label, "group": "cold" if u < 5 else "warm", "user_id": u,
                         "ndcg": float(v[u]), "recall_at_50": float(np.sqrt(v[u]))})
    rows.append({"label": "A", "group": "warm", "user_id": n, "ndcg": 0.5, "recall_at_50": 0.5})
    return pd.DataFrame(rows)


@pytest.mark.spark
def test_paired_against_the_first_and_the_best_matches_scipy_and_holm(spark):
    frame = users_frame(np.random.default_rng(2))
    users = spark.createDataFrame(frame)
    rows = paired(users, ["A", "B", "C"], best="C")
    assert [(r["comparison"], r["reference"], r["label"], r["metric"]) for r in rows] == [
        ("first", "A", "B", "NDCG"), ("first", "A", "B", "Recall@50"),
        ("first", "A", "C", "NDCG"), ("first", "A", "C", "Recall@50"),
        ("best", "C", "B", "NDCG"), ("best", "C", "B", "Recall@50")]
    warm = frame[frame.group == "warm"]
    for metric, key in (("NDCG", "ndcg"), ("Recall@50", "recall_at_50")):
        wide = warm.pivot(index="user_id", columns="label", values=key).dropna()
        mine = [r for r in rows if r["metric"] == metric]
        for r in mine:
            a, b = wide[r["reference"]].to_numpy(), wide[r["label"]].to_numpy()
            d = a - b
            assert r["users"] == len(d) == 115 and (d == 0).sum() > 0
            assert r["mean_difference"] == pytest.approx(d.mean(), abs=1e-12)
            assert r["t_p"] == pytest.approx(stats.ttest_rel(a, b).pvalue, abs=1e-9)
            assert r["wilcoxon_p"] == pytest.approx(scipy_wilcoxon(d), abs=1e-9)
        # Holm over the metric's three comparisons, an independent step-down
        for test in ("t_p", "wilcoxon_p"):
            p = np.array([r[test] for r in mine])
            order = np.argsort(p)
            step = np.minimum(1, np.maximum.accumulate(p[order] * (len(p) - np.arange(len(p)))))
            want = np.empty_like(p)
            want[order] = step
            np.testing.assert_allclose([r[f"{test}_holm"] for r in mine], want, rtol=1e-12)
            assert all(r[f"{test}_holm"] >= r[test] for r in mine)
    c_minus_b = next(r for r in rows if r["comparison"] == "best" and r["metric"] == "NDCG")
    assert c_minus_b["t_p_holm"] < 0.01  # C is B plus 0.03 on average: found
    text = paired_table(rows)
    assert "C − B" in text and "(t), " in text and "(Wilcoxon), Holm-corrected" in text
    head, *lines = paired_csv(rows).splitlines()
    assert head.endswith("comparison,t_p,wilcoxon_p,t_p_holm,wilcoxon_p_holm")
    assert lines[-1].startswith("C,B,Recall@50,") and ",best," in lines[-1]
    # two labels: no "best" comparison
    assert {r["comparison"] for r in paired(users, ["A", "B"])} == {"first"}


def test_the_best_other_is_the_highest_warm_ndcg_after_the_first():
    rows = [{"label": label, "group": group, "metric": metric, "mean": mean}
            for label, group, metric, mean in (
                ("A", "warm", "NDCG", 0.9), ("B", "warm", "NDCG", 0.3), ("C", "warm", "NDCG", 0.2),
                ("C", "cold", "NDCG", 0.8), ("C", "warm", "Recall@50", 0.9))]
    assert best_other(rows, ["A", "B", "C"]) == "B"  # not A (the first), not by cold or Recall
    assert best_other(rows, ["A", "B"]) is None      # against the best = against the first


def test_tost_is_the_larger_of_two_one_sided_t_tests_against_scipy():
    """tost_p on a sample's mean and standard error equals scipy's two one-sided one-sample
    t-tests against -margin and +margin (the slow reference), and is below 0.05 exactly where
    the 90% interval lies inside the margin."""
    from evaluation.significance import tost_p

    rng = np.random.default_rng(1)
    for shift in (0.0, 0.004, 0.012, -0.02):
        d = rng.normal(shift, 0.05, 400)
        se, df, margin = d.std(ddof=1) / np.sqrt(len(d)), len(d) - 1, 0.01
        ref = max(stats.ttest_1samp(d, -margin, alternative="greater").pvalue,
                  stats.ttest_1samp(d, margin, alternative="less").pvalue)
        got = tost_p(float(d.mean()), float(se), df, margin)
        assert got == pytest.approx(ref, rel=1e-9)
        half = stats.t.ppf(0.95, df) * se
        assert (got < 0.05) == (-margin < d.mean() - half and d.mean() + half < margin)


def test_tost_at_the_edges():
    from evaluation.significance import tost_p

    assert tost_p(0.0, 0.0, 10, 0.01) == 0.0 and tost_p(0.02, 0.0, 10, 0.01) == 1.0
    assert math.isnan(tost_p(0.0, 0.001, 10, 0.0))
    # a difference exactly at the margin: one of the two tests has p 0.5
    assert tost_p(0.01, 0.002, math.inf, 0.01) == pytest.approx(0.5)


def test_a_difference_is_called_level_only_inside_the_equivalence_margin():
    from evaluation.tables import verdict

    assert verdict((0.01, 0.004), 0.9) == "above" and verdict((-0.01, 0.004), 0.9) == "below"
    assert verdict((-0.001, 0.004), 0.01) == "level"
    assert verdict((-0.001, 0.004), 0.2) == "not significantly below"
    assert verdict((0.001, 0.004), math.nan) == "not significantly above"
    assert verdict(None, None) == "–"
