"""benchmarks/nce_report.py: the issue-15 goal read from an experiment's table and paired CSVs."""

from __future__ import annotations

import csv

import pytest

from benchmarks.nce_report import main, summarise

TABLE = ["model", "NDCG mean", "NDCG ci95", "share_top10pct", "median_popularity", "chosen"]
PAIRED = ["reference", "label", "metric", "mean_difference", "ci95"]


def write(folder, table, paired):
    folder.mkdir()
    for name, header, rows in (("table.csv", TABLE, table), ("paired.csv", PAIRED, paired)):
        with (folder / name).open("w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
    return folder


def experiment(tmp_path, name="experiment-toy", nce_vs_autorec=(0.01, 0.004),
               nce_vs_best=(-0.002, 0.003), nce_pop=(0.60, 80)):
    table = [["nce-autorec", 0.25, 0.01, nce_pop[0], nce_pop[1], "lam=10"],
             ["autorec", 0.24, 0.01, 0.70, 90, "lam=3"],
             ["ns-autorec", 0.30, 0.01, 0.70, 90, "lam=3"],   # family: never the best baseline
             ["popularity", 0.40, 0.01, 1.0, 300, ""],         # the floor: never either
             ["puresvd", 0.23, 0.01, 0.65, 85, "rank=20"],
             ["ease", 0.252, 0.01, 0.66, 86, "lam=100"]]
    paired = [["nce-autorec", "autorec", "NDCG", *nce_vs_autorec],
              ["nce-autorec", "ease", "NDCG", *nce_vs_best],
              ["nce-autorec", "puresvd", "NDCG", 0.02, 0.004],
              ["nce-autorec", "autorec", "Recall@50", -0.5, 0.001]]  # another metric: unread
    return write(tmp_path / name, table, paired)


def test_the_best_baseline_is_the_best_model_outside_the_family_and_the_floor(tmp_path):
    r = summarise(experiment(tmp_path))
    assert r["experiment"] == "toy" and r["best_baseline"] == "ease"
    assert r["nce_minus_autorec"] == (0.01, 0.004) and r["nce_minus_best"] == (-0.002, 0.003)
    # -0.002 + 0.003 >= 0: not significantly below; 0.01 - 0.004 > 0: above AutoRec
    assert r["goal"] == {"at_or_above_best_baseline": True, "above_autorec": True,
                         "less_popular_than_autorec": True}


@pytest.mark.parametrize("change, failed", [
    ({"nce_vs_best": (-0.004, 0.003)}, "at_or_above_best_baseline"),   # CI wholly below 0
    ({"nce_vs_autorec": (0.003, 0.004)}, "above_autorec"),             # CI includes 0
    ({"nce_pop": (0.60, 95)}, "less_popular_than_autorec"),             # share lower, median not
    ({"nce_pop": (0.75, 80)}, "less_popular_than_autorec"),             # median lower, share not
])
def test_each_part_of_the_goal_fails_on_its_own(tmp_path, change, failed):
    goal = summarise(experiment(tmp_path, **change))["goal"]
    assert [k for k, ok in goal.items() if not ok] == [failed]


def test_the_report_is_written_and_a_folder_without_the_csvs_is_named(tmp_path, capsys):
    out = tmp_path / "report"
    main([str(experiment(tmp_path)), "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    assert "| toy |" in text and "ease 0.2520 ± 0.0100 (lam=100)" in text
    assert out.with_suffix(".json").is_file()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match="empty/table.csv: missing"):
        main([str(tmp_path / "empty"), "--out", str(out)])


def test_the_holm_p_values_are_quoted_where_paired_csv_has_them(tmp_path):
    """paired.csv from evaluate.py since issue 31 carries Holm-corrected p-values: the report quotes
    them beside the differences and verdicts; an older paired.csv (above) quotes none."""
    folder = experiment(tmp_path)
    rows = list(csv.reader((folder / "paired.csv").open()))
    p = {("autorec", "NDCG"): ["0.0012", "0.0034"], ("ease", "NDCG"): ["0.41", "0.5"]}
    with (folder / "paired.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(rows[0] + ["t_p_holm", "wilcoxon_p_holm"])
        w.writerows(r + p.get((r[1], r[2]), ["1", "1"]) for r in rows[1:])
    r = summarise(folder)
    assert r["p_holm"] == {"nce_minus_autorec": (0.0012, 0.0034), "nce_minus_best": (0.41, 0.5)}
    assert r["goal"]["above_autorec"]  # the verdicts stay the CIs'
    out = tmp_path / "report"
    main([str(folder), "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    assert "+0.0100 ± 0.0040 (p 0.0012 t, 0.0034 Wilcoxon, Holm)" in text
    assert "| yes (p 0.41 t, 0.5 Wilcoxon, Holm) | yes (p 0.0012 t" in text
    assert summarise(experiment(tmp_path, name="experiment-old"))["p_holm"] == {
        "nce_minus_autorec": None, "nce_minus_best": None}
