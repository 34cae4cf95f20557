"""benchmarks/nce_report.py: the issue-15 goal read from an experiment's table and paired CSVs."""

from __future__ import annotations

import csv

import pytest

from benchmarks.nce_report import main, summarise

TABLE = ["model", "NDCG mean", "NDCG ci95", "share_top10pct", "median_popularity", "chosen"]
PAIRED = ["reference", "label", "metric", "mean_difference", "ci95"]


def write(folder, table, paired, headers=(TABLE, PAIRED)):
    folder.mkdir()
    for name, header, rows in (("table.csv", headers[0], table),
                               ("paired.csv", headers[1], paired)):
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


LEVERS = ["model", "NDCG mean", "NDCG ci95", "share_top10pct", "median_popularity", "chosen",
          "valid_ndcg", "seeds"]
LEVERS_PAIRED = PAIRED + ["seed", "t_p_holm", "wilcoxon_p_holm"]


def levers_experiment(tmp_path, increment=(0.004, 0.003), best_minus_strongest=(0.001, 0.004)):
    """nce-autorec (first) and autorec searched over the levers, two baselines: autorec has the
    better validation NDCG (so it is the strongest) though nce-autorec's test NDCG is higher."""
    table = [["nce-autorec", 0.262, 0.01, 0.6, 80, "lam=30, pos_weight=3", 0.270, 3],
             ["autorec", 0.258, 0.01, 0.7, 90, "lam=30, width=1000", 0.275, 3],
             ["nce-plrec", 0.259, 0.01, 0.65, 85, "rank=200", 0.268, 1],
             ["ease", 0.250, 0.01, 0.66, 86, "lam=500", 0.266, 1],
             ["popularity", 0.15, 0.01, 1.0, 300, "", 0.16, 1]]
    paired = [["nce-autorec", "autorec", "NDCG", *increment, "pooled", 0.02, 0.03],
              ["nce-autorec", "autorec", "NDCG", 0.9, 0.001, "0", 0.5, 0.5],  # a seed's: unread
              ["nce-autorec", "nce-plrec", "NDCG", 0.003, 0.004, "pooled", 0.4, 0.4],
              # the best baseline is the "best after the first": its rows are it minus each
              ["nce-plrec", "autorec", "NDCG", *best_minus_strongest, "pooled", 0.6, 0.7],
              ["nce-plrec", "ease", "NDCG", 0.009, 0.004, "pooled", 0.01, 0.01]]
    return write(tmp_path / "experiment-toy-levers", table, paired, (LEVERS, LEVERS_PAIRED))


def test_the_levers_section_reads_the_strongest_by_validation_and_the_same_lever_increment(
        tmp_path):
    from benchmarks.nce_report import summarise_levers

    protocol = experiment(tmp_path)  # experiment-toy: its best baseline is ease
    r = summarise_levers(levers_experiment(tmp_path), protocol)
    assert r["dataset"] == "toy" and r["seeds"] == 3 and r["strongest_from"] == "levers"
    assert r["strongest"] == "autorec"  # by validation NDCG, not nce-autorec's higher test
    assert r["best_baseline"] == "nce-plrec" and r["best_baseline_ndcg"] == (0.259, 0.01)
    assert r["strongest_minus_best"] == (-0.001, 0.004)  # nce-plrec − autorec, turned round
    assert r["increment"] == (0.004, 0.003) and r["increment_p_holm"] == (0.02, 0.03)
    assert r["paper_nce"] == (0.25, 0.01) and r["protocol_best_baseline"] == "ease"
    assert r["protocol_best_in_levers"]
    assert r["goal"] == {"strongest_at_or_above_best_baseline": True,
                         "nce_increment_positive": True}


@pytest.mark.parametrize("change, failed", [
    ({"increment": (0.002, 0.003)}, "nce_increment_positive"),                   # CI has 0
    ({"best_minus_strongest": (0.006, 0.004)}, "strongest_at_or_above_best_baseline"),  # below
])
def test_each_part_of_the_levers_goal_fails_on_its_own(tmp_path, change, failed):
    from benchmarks.nce_report import summarise_levers

    goal = summarise_levers(levers_experiment(tmp_path, **change), None)["goal"]
    assert [k for k, ok in goal.items() if not ok] == [failed]


def test_the_report_has_a_levers_section_beside_the_protocol_experiment(tmp_path):
    out = tmp_path / "report"
    main([str(experiment(tmp_path)), str(levers_experiment(tmp_path)), "--out", str(out)])
    text = out.with_suffix(".md").read_text()
    assert "## The AutoRec family with the levers" in text
    assert ("| toy | 3 | 0.2500 ± 0.0100 | autorec 0.2580 ± 0.0100 (levers: lam=30, width=1000; "
            "valid 0.2750) | nce-plrec 0.2590 ± 0.0100 (rank=200) | -0.0010 ± 0.0040 |") in text
    assert "| +0.0040 ± 0.0030 (p 0.02 t, 0.03 Wilcoxon, Holm) |" in text
    assert "| toy | yes | yes | ease: yes |" in text


def test_the_strongest_family_row_may_come_from_the_protocol_experiment(tmp_path):
    """A mode the protocol searched (say full fine-tune) may beat every lever on validation: the
    strongest row is then the protocol's, measured against that experiment's best baseline."""
    from benchmarks.nce_report import summarise_levers

    table = [["nce-autorec", 0.27, 0.01, 0.6, 80, "mode=full-finetune", 0.280, 3],
             ["autorec", 0.24, 0.01, 0.7, 90, "lam=3", 0.250, 3],
             ["ease", 0.26, 0.01, 0.66, 86, "lam=500", 0.266, 1]]
    paired = [["nce-autorec", "autorec", "NDCG", 0.03, 0.004, "pooled", 0.001, 0.001],
              ["nce-autorec", "ease", "NDCG", 0.01, 0.004, "pooled", 0.01, 0.01]]
    protocol = write(tmp_path / "experiment-toy", table, paired, (LEVERS, LEVERS_PAIRED))
    r = summarise_levers(levers_experiment(tmp_path), protocol)
    assert (r["strongest_from"], r["strongest"], r["best_baseline"]) == (
        "protocol", "nce-autorec", "ease")
    assert r["strongest_minus_best"] == (0.01, 0.004)
    assert r["increment"] == (0.004, 0.003)  # the levers experiment's, whatever is strongest
    assert r["goal"]["strongest_at_or_above_best_baseline"]


def test_a_protocol_row_with_fewer_final_seeds_is_not_the_strongest(tmp_path):
    """The protocol experiment's best validation row, retrained with one seed, does not stand
    against the levers experiment's rows of three: the strongest is the levers experiment's."""
    from benchmarks.nce_report import summarise_levers

    table = [["nce-autorec", 0.27, 0.01, 0.6, 80, "mode=full-finetune", 0.280, 1],
             ["autorec", 0.24, 0.01, 0.7, 90, "lam=3", 0.250, 1],
             ["ease", 0.26, 0.01, 0.66, 86, "lam=500", 0.266, 1]]
    paired = [["nce-autorec", "autorec", "NDCG", 0.03, 0.004, "pooled", 0.001, 0.001]]
    protocol = write(tmp_path / "experiment-toy", table, paired, (LEVERS, LEVERS_PAIRED))
    r = summarise_levers(levers_experiment(tmp_path), protocol)
    assert (r["strongest_from"], r["strongest"]) == ("levers", "autorec")
    assert r["paper_nce"] == (0.27, 0.01)  # still the paper's model beside them


def test_a_levers_experiment_is_read_beside_its_sets_protocol_experiment(tmp_path):
    """A set's protocol runs may be named ``experiment-SET-modes`` (citeulike-a's were, until its
    3-seed rerun): the levers section reads them where no ``experiment-SET`` is given, and the
    plain name wins where both are."""
    from pathlib import Path

    from benchmarks.nce_report import protocol_folders

    def f(name):
        return Path("results") / name

    assert protocol_folders([f("experiment-toy-modes"), f("experiment-toy-levers")]) == {
        "toy": f("experiment-toy-modes")}
    assert protocol_folders([f("experiment-toy"), f("experiment-toy-modes"),
                             f("experiment-toy-levers")]) == {"toy": f("experiment-toy")}
    assert protocol_folders([f("experiment-toy-modes"), f("experiment-toy")]) == {
        "toy": f("experiment-toy")}
    assert protocol_folders([f("experiment-toy-levers")]) == {}


SET = ["model", "NDCG mean", "NDCG ci95", "chosen", "valid_ndcg", "seeds",
       "paired_ndcg_minus_first", "paired_ci95", "paired_tost_p", "best_after_first",
       "paired_ndcg_minus_best", "best_ci95", "best_tost_p"]


def set_experiment(tmp_path, name="experiment-toy-start", ensemble_valid=0.280,
                   ease_minus_ensemble=("0.001", "0.004", "0.03"),
                   members="nce-autorec+autorec"):
    """A set's final experiment as experiment/run.py writes table.csv: nce-autorec first, the
    ensemble the best after it by test NDCG; every row's difference from both."""
    table = [["nce-autorec", 0.262, 0.01, "lam=30", 0.270, 3, "", "", "", "ensemble", "0.004",
              "0.003", "0.2"],
             ["autorec", 0.258, 0.01, "lam=30, width=1000", 0.275, 3, "-0.004", "0.003", "0.01",
              "ensemble", "-0.008", "0.004", "0.9"],
             ["ensemble", 0.266, 0.01, f"members={members}", ensemble_valid, 3, "0.004",
              "0.003", "0.2", "ensemble", "", "", ""],
             ["ease", 0.265, 0.01, "lam=500", 0.266, 3, "0.003", "0.004", "0.3", "ensemble",
              *ease_minus_ensemble],
             ["popularity", 0.15, 0.01, "", 0.16, 3, "-0.1", "0.01", "1", "ensemble", "-0.11",
              "0.01", "1"]]
    return write(tmp_path / name, table, [], (SET, PAIRED))


def test_a_pair_is_read_from_either_row_of_the_table_and_turned_round(tmp_path):
    from benchmarks.nce_report import table_pair

    table = {r["model"]: r for r in csv.DictReader((set_experiment(tmp_path) / "table.csv").open())}
    assert table_pair(table, "autorec", "nce-autorec") == (-0.004, 0.003, 0.01)
    assert table_pair(table, "nce-autorec", "autorec") == (0.004, 0.003, 0.01)
    assert table_pair(table, "ensemble", "ease") == (-0.001, 0.004, 0.03)  # ease's row, turned
    assert table_pair(table, "autorec", "ease") is None  # never paired in this experiment


def test_the_per_set_section_chooses_by_validation_and_says_level_only_by_the_tost(tmp_path):
    from benchmarks.nce_report import summarise_set

    protocol = experiment(tmp_path)  # its nce-autorec is the paper's model
    r = summarise_set(set_experiment(tmp_path), protocol)
    assert r["dataset"] == "toy" and r["seeds"] == 3 and r["paper_nce"] == (0.25, 0.01)
    assert (r["strongest"], r["strongest_single"], r["best_baseline"]) == (
        "ensemble", "autorec", "ease")  # by validation: the ensemble, then autorec
    assert next(x["chosen"] for x in r["rows"] if x["model"] == "ensemble") == (
        "nce-autorec (lam=30) + autorec (lam=30, width=1000)")  # its members by their settings
    s = r["strongest_minus_best"]
    assert s["diff"] == (-0.001, 0.004) and s["verdict"] == "level"  # TOST p 0.03 < 0.05
    assert r["single_minus_best"] is None  # autorec was not paired with ease
    assert r["increment"]["diff"] == (0.004, 0.003) and r["increment"]["verdict"] == "above"
    # the protocol's baselines the final experiment did not rerun come along, marked as its
    assert {x["model"]: x["from"] for x in r["rows"] if x["kind"] == "baseline"} == {
        "ease": None, "puresvd": "experiment-toy"}
    # the same difference without the equivalence test's support is not "level"
    r = summarise_set(set_experiment(tmp_path, name="experiment-toy-wide",
                                     ease_minus_ensemble=("0.001", "0.004", "0.2")), None)
    assert r["strongest_minus_best"]["verdict"] == "not significantly below"
    assert r["paper_nce"] is None
    # validation choosing one member alone: the ensemble is that model, not a stronger one
    r = summarise_set(set_experiment(tmp_path, name="experiment-toy-ensemble",
                                     members="autorec", ensemble_valid=0.275), None)
    assert r["strongest"] == "autorec"
    # several members, the best single model among them: the ensemble was chosen over it on
    # the same users, whatever the trials' (perhaps sampled) validation NDCG says
    r = summarise_set(set_experiment(tmp_path, name="experiment-toy-width",
                                     ensemble_valid=0.27), None)
    assert r["strongest"] == "ensemble"
    # the best single model outside the ensemble: the two are compared by validation NDCG
    r = summarise_set(set_experiment(tmp_path, name="experiment-toy-levers",
                                     members="nce-autorec+ns-autorec", ensemble_valid=0.28), None)
    assert r["strongest"] == "ensemble"
    r = summarise_set(set_experiment(tmp_path, name="experiment-toy-probe",
                                     members="nce-autorec+ns-autorec", ensemble_valid=0.27), None)
    assert r["strongest"] == "autorec"
    # an ensemble with a baseline among its members is not the family's, whatever it scores
    r = summarise_set(set_experiment(tmp_path, name="experiment-toy-modes",
                                     members="autorec+ease", ensemble_valid=0.29), None)
    assert r["strongest"] == "autorec"
    assert next(x["kind"] for x in r["rows"] if x["model"] == "ensemble") == "mixed ensemble"
    # --ensemble-top's candidates: MODEL#2 is that model's second trial, still the family's
    (tmp_path / "top").mkdir()
    folder = set_experiment(tmp_path / "top", name="experiment-toy-start",
                            members="nce-autorec+nce-autorec#2+autorec", ensemble_valid=0.27)
    # its settings are the model's best trial but its choice (the seeds may have chosen the
    # second), from the experiment's search.md
    (folder / "search.md").write_text(
        "# toy\n\n## nce-autorec: 3 of 3 trial(s) finished\n\n| rank | point | valid NDCG | best "
        "epoch |\n|---|---|---|---|\n| 1 | lam=10 | 0.28 | 3 |\n| 2 | lam=30 | 0.27 | 4 |\n"
        "| 3 | lam=100 | 0.26 | 5 |\n\n## autorec: 1 of 1 trial(s) finished\n")
    r = summarise_set(folder, None)
    assert r["strongest"] == "ensemble"
    assert next(x["chosen"] for x in r["rows"] if x["model"] == "ensemble") == (
        "nce-autorec (lam=30) + nce-autorec#2 (lam=10) + autorec (lam=30, width=1000)")


def test_a_baseline_fitted_beside_the_experiment_is_paired_with_nce_autorec(tmp_path):
    """benchmarks/final_in_process.py's *-final.json (EASE on Gowalla): a baseline of the set,
    its difference from NCE-AutoRec's seeds read as the strongest's where NCE-AutoRec is it."""
    import json

    from benchmarks.nce_report import summarise_set

    folder = set_experiment(tmp_path)
    table = [r for r in csv.reader((folder / "table.csv").open())
             if r[0] not in ("ensemble", "ease")]  # no ensemble, ease fitted apart
    table[2][4] = "0.26"  # autorec's validation NDCG below nce-autorec's 0.270
    with (folder / "table.csv").open("w", newline="") as f:
        csv.writer(f).writerows(table)
    (folder / "ease-final.json").write_text(json.dumps({
        "model": "ease", "settings": {"lam": 50},
        "test": {"ndcg": {"mean": 0.27, "ci95": 0.01}},
        "paired": {"label": "nce-autorec seed 0 + nce-autorec seed 1", "ndcg": {
            "mean": 0.005, "ci95": 0.002}}}))
    r = summarise_set(folder, None)
    assert (r["strongest"], r["best_baseline"]) == ("nce-autorec", "ease")
    assert r["strongest_minus_best"]["diff"] == (-0.005, 0.002)
    assert r["strongest_minus_best"]["verdict"] == "below"
    assert r["strongest_minus_best"]["tost_p"] is None  # not computed there: None, never NaN
    assert [x["model"] for x in r["rows"] if x["kind"] == "baseline"] == ["ease"]


def test_one_fit_beside_the_experiment_may_be_paired_with_several_of_its_models(tmp_path):
    """The same EASE fit paired with NCE-AutoRec's seeds in one file and with the ensemble's in
    another (final_in_process.py --reuse): one baseline row, each difference where it belongs;
    two files that disagree on the fit's own score are refused."""
    import json

    from benchmarks.nce_report import summarise_set

    folder = set_experiment(tmp_path)
    table = [r for r in csv.reader((folder / "table.csv").open()) if r[0] != "ease"]
    with (folder / "table.csv").open("w", newline="") as f:
        csv.writer(f).writerows(table)

    def fit(name, label, mean, score=0.27):
        (folder / name).write_text(json.dumps({
            "model": "ease", "settings": {"lam": 50},
            "test": {"ndcg": {"mean": score, "ci95": 0.01}},
            "paired": {"label": label, "ndcg": {"mean": mean, "ci95": 0.002}}}))

    fit("ease-final.json", "nce-autorec seed 0 + nce-autorec seed 1", 0.008)
    fit("ease-final-ensemble.json", "ensemble seed 0 + ensemble seed 1", 0.004)
    r = summarise_set(folder, None)
    assert (r["strongest"], r["strongest_single"], r["best_baseline"]) == (
        "ensemble", "autorec", "ease")
    assert r["strongest_minus_best"]["diff"] == (-0.004, 0.002)  # the ensemble's pairing
    assert r["single_minus_best"] is None  # autorec was paired with neither
    assert [x["model"] for x in r["rows"] if x["kind"] == "baseline"] == ["ease"]
    fit("ease-final-ensemble.json", "ensemble seed 0", 0.004, score=0.28)
    with pytest.raises(SystemExit, match="test NDCG differs"):
        summarise_set(folder, None)


def test_the_increment_comes_from_the_run_an_ensemble_resumed_when_it_holds_the_same_finals(
        tmp_path):
    """Resumed with --ensemble, an experiment whose first model is a baseline pairs every model
    with the baseline and with the ensemble, no longer NCE-AutoRec with AutoRec; the run before
    the resume did, and its two rows are the same finals: the increment is read there, and only
    there."""
    from benchmarks.nce_report import summarise_set

    def folder(name, best, autorec_minus_best, autorec_ndcg=0.258):
        table = [["nce-plrec", 0.25, 0.01, "rank=1000", 0.26, 3, "", "", "", best, "", "", ""],
                 ["nce-autorec", 0.262, 0.01, "lam=30", 0.270, 3, "0.012", "0.003", "1", best,
                  *(("", "", "") if best == "nce-autorec" else ("-0.004", "0.003", "0.2"))],
                 ["autorec", autorec_ndcg, 0.01, "lam=3", 0.265, 3, "0.008", "0.003", "1", best,
                  *autorec_minus_best]]
        if best == "ensemble":
            table.append(["ensemble", 0.266, 0.01, "members=nce-autorec+autorec", 0.28, 3, "0.016",
                          "0.003", "1", best, "", "", ""])
        return write(tmp_path / name, table, [], (SET, PAIRED))

    resumed = folder("experiment-toy-ensemble", "ensemble", ("-0.008", "0.003", "0.9"))
    before = folder("experiment-toy-wide", "nce-autorec", ("-0.004", "0.002", "0.3"))
    other = folder("experiment-toy-width", "nce-autorec", ("-0.009", "0.002", "0.3"), 0.2581)
    assert summarise_set(resumed, None)["increment"] is None
    r = summarise_set(resumed, None, [other, before])  # other's autorec is another final
    assert r["strongest"] == "ensemble"
    assert r["increment"]["diff"] == (0.004, 0.002) and r["increment"]["verdict"] == "above"


def test_the_readme_table_is_the_per_set_reading_where_the_report_has_one(tmp_path):
    import json

    from benchmarks.readme_table import table

    out = tmp_path / "report"
    main([str(experiment(tmp_path)), "--sets", str(set_experiment(tmp_path)), "--out", str(out)])
    report = json.loads(out.with_suffix(".json").read_text())
    assert "## Per set: the family at its strongest" in out.with_suffix(".md").read_text()
    lines = table(report)
    assert lines[0].startswith("| set | the paper's NCE-AutoRec | strongest family configuration")
    assert lines[2] == ("| toy | 0.250 ± 0.010 | ensemble 0.266 ± 0.010 (nce-autorec (lam=30) + "
                        "autorec (lam=30, width=1000)) | ease 0.265 ± 0.010 | -0.0010 ± 0.0040 "
                        "level | +0.0040 ± 0.0030 above |")
    # a report without the per-set section keeps the per-experiment table
    assert table({**report, "sets": []})[0].startswith("| experiment | NCE-AutoRec | AutoRec")
