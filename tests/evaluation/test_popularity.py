"""The popularity analysis against hand-computed values, edge cases and a slow reference."""

import re

import numpy as np
import pytest

from evaluation.popularity import gini, head_items, popularity_summary, summary_from_counts, weighted_median


def gini_reference(x):
    """Mean absolute difference over all ordered pairs / (2 * mean): the textbook definition."""
    x = np.asarray(x, dtype=float)
    if x.sum() == 0:
        return 0.0
    return sum(abs(a - b) for a in x for b in x) / (2 * len(x) ** 2 * x.mean())


def test_gini_hand_computed_and_bounds():
    assert gini([5, 5, 5, 5]) == 0.0                     # all equal
    assert gini([0, 0, 0, 8]) == pytest.approx(3 / 4)    # all on one of 4: (n - 1) / n
    # [1, 2, 3]: sum |xi - xj| over ordered pairs = 8; 8 / (2 * 9 * 2) = 2/9
    assert gini([3, 1, 2]) == pytest.approx(2 / 9)
    assert gini([]) == 0.0 and gini([0, 0]) == 0.0


def test_gini_matches_the_pairwise_definition():
    rng = np.random.default_rng(3)
    for _ in range(20):
        x = rng.integers(0, 50, size=rng.integers(1, 40))
        assert gini(x) == pytest.approx(gini_reference(x), abs=1e-12)


def test_head_items_is_the_top_tenth_with_stable_ties():
    pop = np.array([5, 9, 9, 1, 0, 3, 7, 2, 8, 4, 6, 10, 9, 0, 1, 2, 3, 4, 5, 6])
    assert head_items(pop).tolist() == [11, 1]       # 10% of 20 = 2: pop 10, then the first 9
    assert head_items(np.array([1, 2, 3])).tolist() == [2]  # at least one item


def test_summary_by_hand():
    pop = np.array([100, 50, 10, 5, 1, 1, 1, 1, 1, 1])  # head (10% of 10) = item 0
    recs = np.array([[0, 2, 4], [0, 1, -1]])             # -1 pads a short list
    s = popularity_summary(recs, pop)
    # recommended popularities: 100, 10, 1, 100, 50 -> median 50, mean 52.2
    assert s["median_popularity"] == 50 and s["mean_popularity"] == pytest.approx(52.2)
    assert s["share_top10pct"] == pytest.approx(2 / 5)
    assert s["coverage"] == pytest.approx(4 / 10) and s["recommendations"] == 5
    assert s["gini"] == pytest.approx(gini_reference([2, 1, 1, 0, 1, 0, 0, 0, 0, 0]))


def test_summary_of_nothing_says_so():
    with pytest.raises(ValueError, match="no recommendations"):
        popularity_summary(np.full((3, 2), -1), np.ones(5))


def test_weighted_median_equals_the_median_of_the_pooled_list():
    rng = np.random.default_rng(3)
    for _ in range(50):
        values = rng.integers(0, 30, rng.integers(1, 12))
        weights = rng.integers(0, 5, len(values))
        if weights.sum() == 0:
            weights[0] = 1
        assert weighted_median(values, weights) == np.median(np.repeat(values, weights))


def test_summary_from_counts_equals_the_summary_of_the_lists():
    rng = np.random.default_rng(4)
    popularity = rng.integers(0, 100, 40)
    recs = rng.integers(0, 40, (25, 7))
    recs[3, 5:] = -1  # short lists
    counts = np.bincount(recs[recs >= 0], minlength=40)
    pooled = popularity[recs[recs >= 0]]
    s = summary_from_counts(counts, popularity)
    assert s == popularity_summary(recs, popularity)
    assert s["median_popularity"] == np.median(pooled)
    assert s["mean_popularity"] == pytest.approx(pooled.mean())
    assert s["recommendations"] == (recs >= 0).sum()


def test_log_density_integrates_to_one_and_peaks_at_the_heavy_item():
    from evaluation.plots import log_density

    grid = np.linspace(-3, 7, 5001)
    d = log_density(np.array([10, 1000]), np.array([1, 9]), grid)
    assert (d * (grid[1] - grid[0])).sum() == pytest.approx(1.0, abs=1e-6)
    assert grid[np.argmax(d)] == pytest.approx(3.0, abs=0.05)


def test_metric_keys_are_mlflow_safe_and_round_trip_names():
    from evaluation.spark_metrics import METRICS, metric_key, split_name

    keys = [metric_key(m) for m in METRICS]
    assert len(set(keys)) == len(METRICS)
    assert all(re.fullmatch(r"[a-z0-9_]+", k) for k in keys)
    assert metric_key("Recall@50") == "recall_at_50"
    assert metric_key("NDCG@5 (truncated)") == "ndcg_at_5_truncated"
    assert split_name("R-Precision") == ("R-Precision", None)
    assert split_name("F1@15") == ("F1", 15)
    assert split_name("NDCG@10 (truncated)") == ("NDCG (truncated)", 10)


def test_the_cold_start_plot_wraps_many_models_into_rows_and_counts_each_panel():
    from evaluation.plots import cold_start_scatter
    from runtime.tracking import pyplot as _plt

    ref = np.array([0.0, 0.5, 1.0])
    others = {f"m{i}": ref + (0.1 if i % 2 else -0.1) for i in range(6)}
    fig = cold_start_scatter("ref", {"ref": ref, **others}, "t")
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert len(fig.axes) == 8 and len(shown) == 6  # 2 rows of 4, two spare panels hidden
    assert shown[0].get_title().startswith("m0 better for 0 users, worse for 3")
    assert shown[1].get_title().startswith("m1 better for 3 users, worse for 0")
    _plt().close(fig)


def test_the_popularity_plot_draws_every_model_past_the_colour_cycle():
    from evaluation.plots import popularity_density
    from runtime.tracking import pyplot as _plt

    pop = np.array([1.0, 10.0, 100.0])
    models = {f"m{i}": (pop, np.array([i + 1.0, 1.0, 1.0])) for i in range(13)}
    summaries = {k: {"median_popularity": 10.0, "share_top10pct": 0.5, "coverage": 1.0}
                 for k in models}
    fig = popularity_density(models, summaries, "t")
    lines = [ln for ln in fig.axes[0].get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label().split(":")[0] for ln in lines] == list(models)
    # no two models share both colour and line style
    assert len({(ln.get_color(), ln.get_linestyle()) for ln in lines}) == 13
    _plt().close(fig)
