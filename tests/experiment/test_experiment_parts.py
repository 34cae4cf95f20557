"""The experiment runner's parts without a cluster: grids, the plan's checks, selection, the final
run's epochs, the table (experiment/grids.py, experiment/run.py)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from scipy import stats

from evaluation.tables import table_csv
from experiment import grids
from experiment.plan import ExperimentConfig, plan, trial_config
from experiment.report import table_md, table_rows
from experiment.search import Progress
from experiment.selection import final_config, retire_stale_final, select
from experiment.state import open_state
from prepared.errors import UsageError
from training.config import check


def prep(valid: int = 100):
    return SimpleNamespace(manifest={"counts": {"positives": {"train": 1000, "valid": valid,
                                                             "test": valid}}},
                           dataset="toy")


def exp(tmp_path: Path, **kw) -> ExperimentConfig:
    return ExperimentConfig(**{"data": str(tmp_path / "data"), "name": "e", **kw})


@pytest.mark.parametrize("name", list(grids.NAMED))
def test_every_point_of_the_named_grids_is_a_valid_training_run(name, tmp_path):
    cfg = exp(tmp_path, grid=name, models=",".join(grids.NAMED[name]))
    points = plan(cfg, prep(), str(tmp_path))
    assert set(points) == set(grids.NAMED[name])
    # the paper's grid is the product of its settings (section 4.2): 4 widths x 12 lambdas x
    # 7 betas x 4 modes for NCE-AutoRec
    if name == "paper":
        assert len(points["nce-autorec"]) == 4 * 12 * 7 * 4
        assert len(points["ns-autorec"]) == 4 * 12 * 6 * 4
    # names identify points: no two share a run directory
    for model, pts in points.items():
        names = [grids.point_name(model, p) for p in pts]
        assert len(set(names)) == len(names)


SHIPPED = sorted(str(p) for p in (Path(__file__).resolve().parents[2] / "benchmarks" / "grids")
                 .glob("*.yaml"))


def test_the_shipped_grid_files_are_found():
    assert len(SHIPPED) >= 2, SHIPPED  # an empty list would skip the test below silently


@pytest.mark.parametrize("path", SHIPPED)
def test_every_point_of_the_shipped_grid_files_is_a_valid_training_run(path, tmp_path):
    models = list(grids.read_grid_file(path))
    points = plan(exp(tmp_path, grid=path, models=",".join(models)), prep(), str(tmp_path))
    assert list(points) == models and all(points.values())


@pytest.mark.parametrize("grid, models, match", [
    ({"autorec": {"lam": []}}, "autorec", "lam has no values, so the grid has no points"),
    ({"autorec": {"num_workers": [1, 2]}}, "autorec", "'num_workers' cannot be searched"),
    ({"autorec": {"mode": ["joint"]}}, "autorec",
     "autorec .*does not take it \\(only ns-autorec, nce-autorec do\\)"),
    ({"autorec": {"lam": [-1.0]}}, "autorec", "--lam -1.0"),
    ({"gru4rec": {"width": [8]}}, "autorec", "no model gru4rec"),
    ({}, "autorec,gru4rec", "--models: no model gru4rec"),
    ({"autorec": [{"lam": [1.0]}, {"lam": []}]}, "autorec", "lam has no values"),
    ({"autorec": [{"lam": [1.0]}, 3]}, "autorec", "want a mapping of model"),
])
def test_a_bad_grid_fails_in_one_line_before_anything_runs(grid, models, match, tmp_path):
    path = tmp_path / "grid.json"
    path.write_text(json.dumps(grid))
    with pytest.raises(UsageError, match=match):
        plan(exp(tmp_path, grid=str(path), models=models), prep(), str(tmp_path))


def test_grid_files_are_yaml_or_json_and_a_broken_one_names_the_line(tmp_path):
    good = tmp_path / "g.yaml"
    good.write_text("autorec:\n  lam: [10, 30]\n  width: 32\npuresvd:\n")
    assert grids.grid(str(good), ["autorec", "puresvd"]) == {
        "autorec": [{"lam": [10, 30], "width": [32]}], "puresvd": [{}]}
    bad = tmp_path / "b.yaml"
    bad.write_text("autorec:\n  lam: [10, 30\n")
    with pytest.raises(UsageError, match=r"b.yaml: not valid YAML: .*"):
        grids.grid(str(bad), ["autorec"])
    with pytest.raises(UsageError, match="neither a named grid .* nor a file"):
        grids.grid(str(tmp_path / "missing.json"), ["autorec"])


def test_a_grid_file_entry_may_list_sub_grids_searched_as_their_union(tmp_path):
    path = tmp_path / "g.yaml"
    path.write_text("nce-autorec:\n  - {lam: [3], beta: [0.8], mode: [joint, full-finetune]}\n"
                    "  - {lam: [3.0], beta: [0.5, 0.8, 1.0], mode: [joint]}\n")
    points = plan(exp(tmp_path, grid=str(path), models="nce-autorec"), prep(), str(tmp_path))
    names = [grids.point_name("nce-autorec", p) for p in points["nce-autorec"]]
    assert names == ["nce-autorec-beta0.8-lam3-modejoint", "nce-autorec-beta0.8-lam3-modefull-finetune",
                     "nce-autorec-beta0.5-lam3-modejoint", "nce-autorec-beta1-lam3-modejoint"]


def test_a_dataset_without_a_validation_split_is_refused(tmp_path):
    with pytest.raises(UsageError, match="no validation split.*--holdout-fraction"):
        plan(exp(tmp_path), prep(valid=0), str(tmp_path))


@pytest.mark.parametrize("ensemble, why", [
    ("autorec", "name two or more of --models"), ("autorec,autorec", "each once"),
    ("autorec,wrmf", "wrmf is not among them")])
def test_an_ensemble_names_two_or_more_of_the_models(tmp_path, ensemble, why):
    with pytest.raises(UsageError, match=f"--ensemble {ensemble}: .*{why}"):
        plan(exp(tmp_path, models="autorec,puresvd", ensemble=ensemble), prep(), str(tmp_path))
    assert plan(exp(tmp_path, models="autorec,puresvd", ensemble="puresvd,autorec"), prep(),
                str(tmp_path))


@pytest.mark.parametrize("top", [0, 5])
def test_ensemble_top_keeps_the_candidates_within_the_subset_search(tmp_path, top):
    # two models x 5 > MAX_MEMBERS (8): 1023 subsets, each scored on every validation user
    with pytest.raises(UsageError, match=f"--ensemble-top {top}: .*pass K from 1 to 4"):
        plan(exp(tmp_path, models="autorec,puresvd", ensemble="autorec,puresvd",
                 ensemble_top=top), prep(), str(tmp_path))
    assert plan(exp(tmp_path, models="autorec,puresvd", ensemble="autorec,puresvd",
                    ensemble_top=4), prep(), str(tmp_path))


def test_the_ensemble_candidates_are_each_models_chosen_trial_then_its_next_best():
    from experiment.ensemble import candidates

    def model(chosen, *others):
        rows = [{"point": {"lam": lam}, "valid_ndcg": v} for lam, v in (chosen, *others)]
        return {"chosen": {"point": rows[0]["point"], "all": rows[::-1]}}

    # the seeds chose lam 3 over lam 1 (higher on the search's seed): the choice comes first
    state = {"models": {"autorec": model((3, 0.20), (1, 0.21), (10, 0.19), (30, 0.10)),
                        "puresvd": model((50, 0.15))}}
    assert candidates(state, ["autorec", "puresvd"], 1) == [
        ("autorec", "autorec", {"lam": 3}), ("puresvd", "puresvd", {"lam": 50})]
    assert candidates(state, ["autorec", "puresvd"], 3) == [
        ("autorec", "autorec", {"lam": 3}), ("autorec#2", "autorec", {"lam": 1}),
        ("autorec#3", "autorec", {"lam": 10}), ("puresvd", "puresvd", {"lam": 50})]


def test_a_chosen_candidate_beside_its_models_choice_gets_finals_of_its_own(tmp_path,
                                                                           monkeypatch):
    """--ensemble-top 2: where validation takes a model's second trial into the ensemble, that
    trial is retrained on train+valid per seed under its own name (its model's choice keeps
    its finals), and each seed's ensemble is assembled from the members' finals of that seed."""
    from experiment import ensemble as E
    from experiment import selection

    root = tmp_path / "e"
    cfg = exp(tmp_path, models="autorec,puresvd", ensemble="autorec,puresvd", ensemble_top=2,
              seeds=2)
    rows = [{"point": {"lam": 3.0}, "valid_ndcg": 0.2}, {"point": {"lam": 1.0}, "valid_ndcg": 0.1}]
    state = {"run_id": "exp", "mlflow_uri": "http://x", "models": {
        "autorec": {"run_id": "ar", "chosen": {"point": {"lam": 3.0}, "trial": "autorec-lam3",
                                               "all": rows},
                    "finals": {s: {"model_path": f"final/autorec-{s}"} for s in "01"}},
        "puresvd": {"run_id": "ps", "chosen": {"point": {}, "trial": "puresvd-defaults",
                                               "all": [{"point": {}, "valid_ndcg": 0.1}]},
                    "finals": {s: {"model_path": f"final/puresvd-{s}"} for s in "01"}}}}
    made, trained = [], []

    def assembled(ecfg, tags):
        made.append((ecfg, tags))
        members = ecfg.members if ecfg.choose == "all" else ecfg.members[1:]  # autorec#2 + ps
        return {"members": list(members), "best_valid_ndcg": 0.3,
                "best_valid_recall_at_50": 0.4, "wall_seconds": 1.0, "model_path": ecfg.run_name}

    def train_finals(cfg, root, model, chosen, state, prep, uri, ray, tags, name=None):
        trained.append((model, chosen["point"], tags, name))
        return {s: {"model_path": f"final/{name}-{s}"} for s in "01"}

    monkeypatch.setattr(E, "assembled", assembled)
    monkeypatch.setattr(selection, "train_finals", train_finals)
    monkeypatch.setattr(selection, "select", lambda root, model, points, point: {"point": point})
    e = E.experiment_stage(cfg, root, state, {"autorec": [], "puresvd": []}, None, "u", None)
    assert made[0][0].members == tuple(str(root / "trials" / t) for t in (
        "autorec-lam3", "autorec-lam1", "puresvd-defaults"))
    assert trained == [("autorec", {"lam": 1.0}, {"mlflow.parentRunId": "ar"}, "autorec-lam1")]
    assert e["members"] == ["autorec#2", "puresvd"]
    assert e["candidates"] == {"autorec": "autorec-lam3", "autorec#2": "autorec-lam1",
                               "puresvd": "puresvd-defaults"}
    assert [(c.run_name, c.members) for c, _ in made[1:]] == [
        ("ensemble-final", ("final/autorec-lam1-0", "final/puresvd-0")),
        ("ensemble-final-seed1", ("final/autorec-lam1-1", "final/puresvd-1"))]
    assert e["chosen"]["point"] == {"members": "autorec#2+puresvd"} and e["chosen"]["trials"] == 7
    # a candidate's final is the chosen-epochs retraining under the trial's name
    fc = selection.final_config(cfg, root, "autorec", {"point": {"lam": 1.0}, "best_epoch": 4,
                                                       "phase_epochs": [4]}, 1, "autorec-lam1")
    assert (fc.run_name, fc.train_splits, fc.epochs) == ("autorec-lam1-final-seed1",
                                                         "train,valid", 4)


def test_points_are_the_product_of_the_axes():
    assert grids.points({"lam": [1.0, 2.0], "mode": ["joint", "alternating"]}) == [
        {"lam": 1.0, "mode": "joint"}, {"lam": 1.0, "mode": "alternating"},
        {"lam": 2.0, "mode": "joint"}, {"lam": 2.0, "mode": "alternating"}]
    assert grids.points({}) == [{}]
    # sub-grids: the union of their points, a point two of them share once
    assert grids.points([{"beta": [0.8], "mode": ["joint", "full-finetune"]},
                         {"beta": [0.5, 0.8], "mode": ["joint"]}]) == [
        {"beta": 0.8, "mode": "joint"}, {"beta": 0.8, "mode": "full-finetune"},
        {"beta": 0.5, "mode": "joint"}]
    assert grids.point_name("nce-autorec", {"mode": "joint", "lam": 30.0}) == \
        "nce-autorec-lam30-modejoint"


def finished_trial(root: Path, model: str, point: dict, ndcg, best_epoch=5, phases=None):
    name = grids.point_name(model, point)
    d = root / "trials" / name
    d.mkdir(parents=True)
    (d / "run.json").write_text(json.dumps({"summary": {
        "best_valid_ndcg": ndcg, "best_epoch": best_epoch, "run_name": name,
        "phase_epochs": phases or [best_epoch + 3], "wall_seconds": 60.0}}))


def test_selection_takes_the_best_finished_trial_and_skips_failed_and_unfinished(tmp_path):
    pts = [{"lam": 1.0}, {"lam": 2.0}, {"lam": 3.0}, {"lam": 4.0}]
    finished_trial(tmp_path, "autorec", pts[0], 0.20)
    finished_trial(tmp_path, "autorec", pts[1], 0.25, best_epoch=7)
    finished_trial(tmp_path, "autorec", pts[2], float("nan"))  # diverged
    # pts[3] never finished (no directory)
    chosen = select(tmp_path, "autorec", pts)
    assert chosen["point"] == {"lam": 2.0} and chosen["best_epoch"] == 7
    assert chosen["trials"] == 4 and chosen["finished"] == 2
    assert chosen["search_seconds"] == pytest.approx(180.0)


def test_a_search_only_run_ranks_every_finished_trial_best_first(tmp_path):
    from experiment.report import search_md
    from experiment.run import build_parser

    pts = [{"lam": 1.0}, {"lam": 2.0}, {"lam": 3.0}]
    for p, v in zip(pts, (0.21, 0.25, 0.23)):
        finished_trial(tmp_path, "autorec", p, v, best_epoch=int(p["lam"]) + 4)
    state = {"models": {"autorec": {"chosen": select(tmp_path, "autorec", pts)}}}
    md = search_md(state, ["autorec"], "e")
    rows = [line for line in md.splitlines() if line.startswith("| ") and "rank" not in line]
    assert [r.split(" | ")[1] for r in rows] == ["lam=2", "lam=3", "lam=1"]
    assert rows[0].endswith("| 0.2500 | 6 |") and "3 of 3 trial(s)" in md
    args = build_parser().parse_args(["--data", "d", "--stop-after", "search"])
    assert args.stop_after == "search"
    assert build_parser().parse_args(["--data", "d"]).stop_after == "evaluate"


def test_the_final_run_retrains_on_train_and_valid_for_the_chosen_epochs(tmp_path):
    cfg = exp(tmp_path)
    joint = final_config(cfg, tmp_path, "nce-autorec", {
        "point": {"lam": 30.0, "mode": "joint"}, "best_epoch": 12, "phase_epochs": [15]})
    assert (joint.train_splits, joint.epochs, joint.pretrain_epochs) == ("train,valid", 12, 0)
    assert joint.lam == 30.0 and joint.run_name == "nce-autorec-final"
    # fine-tune: phase 1 as long as the selection run's; best epoch 12 counts phase 1's 8
    ft = final_config(cfg, tmp_path, "nce-autorec", {
        "point": {"mode": "limited-finetune"}, "best_epoch": 12, "phase_epochs": [8, 7]})
    assert (ft.pretrain_epochs, ft.epochs) == (8, 4)
    check(ft)


def test_a_resumed_experiment_refuses_changed_settings(tmp_path):
    cfg = exp(tmp_path)
    root = tmp_path / "e"
    root.mkdir()
    (root / "experiment.json").write_text(json.dumps({"config": {**cfg.__dict__}, "models": {}}))
    assert open_state(cfg, root)["models"] == {}
    # more models and other cluster settings resume; another seed is another experiment
    open_state(ExperimentConfig(**{**cfg.__dict__, "models": "autorec", "num_workers": 4}), root)
    with pytest.raises(UsageError, match="seed was 0, now 1.*another --name"):
        open_state(ExperimentConfig(**{**cfg.__dict__, "seed": 1}), root)


def test_valid_by_reaches_the_per_user_models_trials_only(tmp_path):
    cfg = exp(tmp_path, valid_by="trained", models="bpr,autorec", grid="small")
    assert trial_config(cfg, str(tmp_path), "bpr", {}).valid_by == "trained"
    assert trial_config(cfg, str(tmp_path), "autorec", {}).valid_by == "fold-in"
    plan(cfg, prep(), str(tmp_path))  # every point checks: autorec's never carries the flag
    # an experiment recorded validating by fold-in resumes so, not otherwise
    root = tmp_path / "e"
    root.mkdir()
    old = dict(exp(tmp_path).__dict__)
    (root / "experiment.json").write_text(json.dumps({"config": old, "models": {}}))
    open_state(exp(tmp_path), root)
    with pytest.raises(UsageError, match="valid_by was 'fold-in', now 'trained'"):
        open_state(cfg, root)


def test_a_trial_run_by_older_code_is_not_reused_silently(tmp_path):
    """A finished trial is reused by name; one whose record ran other settings than its name now
    means (here lambda in the plain units) is not, and the plan says so."""
    cfg = exp(tmp_path, grid="small", models="autorec")
    t = trial_config(cfg, str(tmp_path), "autorec", {"lam": 3.0})
    run_dir = tmp_path / "trials" / t.run_name
    run_dir.mkdir(parents=True)
    same = t.to_dict()
    (run_dir / "run.json").write_text(json.dumps({"config": same, "summary": {}}))
    plan(cfg, prep(), str(tmp_path))  # the same configuration: reused
    old = {**same, "lam_units": "plain"}
    (run_dir / "run.json").write_text(json.dumps({"config": old, "summary": {}}))
    with pytest.raises(UsageError, match="autorec-lam3 ran with settings.*lam_units was 'plain'.*"
                                         "another --name"):
        plan(cfg, prep(), str(tmp_path))


def test_trials_are_training_runs_of_the_experiment(tmp_path):
    t = trial_config(exp(tmp_path, epochs=7), str(tmp_path), "autorec", {"lam": 3.0})
    assert (t.model, t.lam, t.epochs, t.experiment, t.run_name) == (
        "autorec", 3.0, 7, "e", "autorec-lam3")
    assert t.output == f"{tmp_path}/trials"


def test_a_grid_searching_the_batch_size_overrides_the_experiments(tmp_path):
    cfg = exp(tmp_path, batch_size=512)
    assert trial_config(cfg, str(tmp_path), "autorec", {"lam": 3.0}).batch_size == 512
    t = trial_config(cfg, str(tmp_path), "autorec", {"batch_size": 2048, "lr": 0.002})
    assert (t.batch_size, t.lr, t.run_name) == (2048, 0.002, "autorec-batchsize2048-lr0.002")


def test_the_table_holds_every_model_with_cis_and_the_choice():
    state = {"models": {"autorec": {
        "evaluation_label": "autorec",
        "chosen": {"point": {"lam": 30.0}, "valid_ndcg": 0.25, "trials": 3,
                   "search_seconds": 120.0},
        "final": {"epochs_run": 9, "wall_seconds": 30.0}}}}
    rows = [{"label": "autorec", "group": "warm", "metric": "NDCG", "mean": 0.31, "ci95": 0.02,
             "users": 900},
            {"label": "autorec", "group": "cold", "metric": "NDCG", "mean": 0.11, "ci95": 0.05,
             "users": 40}]
    state["models"]["puresvd"] = {**state["models"]["autorec"], "evaluation_label": "puresvd"}
    rows += [{**rows[0], "label": "puresvd", "mean": 0.29}]
    pop = {"autorec": {"median_popularity": 212.0, "share_top10pct": 0.61}}
    pairs = [{"reference": "autorec", "label": "puresvd", "metric": "NDCG", "comparison": "first",
              "mean_difference": 0.02, "ci95": 0.005, "users": 900, "t_p_holm": 0.0031,
              "wilcoxon_p_holm": 0.00042},
             {"reference": "autorec", "label": "puresvd", "metric": "Recall@50",
              "comparison": "first", "mean_difference": 0.03, "ci95": 0.006, "users": 900,
              "t_p_holm": 0.5, "wilcoxon_p_holm": 0.6}]
    t = table_rows(state, rows, pop, pairs)
    assert t[0]["NDCG"] == (0.31, 0.02) and t[0]["users"] == 900  # warm users only
    assert t[0]["paired_ndcg"] is None and t[1]["paired_ndcg"] == (-0.02, 0.005)  # other - first
    assert t[1]["paired_p"] == (0.0031, 0.00042) and t[1]["best"] is None  # NDCG's, Holm
    md = table_md(t, "toy")
    assert "NDCG − autorec, paired | p vs autorec (t / Wilcoxon) |" in md
    assert "Holm-corrected over every NDCG comparison" in md and "NDCG − puresvd" not in md
    assert "| autorec | – | 0.3100 ± 0.0200 |" in md and "| – | – | 212 | 0.610 | lam=30 |" in md
    assert ("| 0.2900 ± 0.0200 | – | – | – | – | – | – | -0.0200 ± 0.0050 | 0.0031 / 0.00042 | "
            "below | nan |") in md
    assert "| 2.0 | 0.5 |" in md
    csv_text = table_csv(t)
    assert csv_text.splitlines()[1].startswith("autorec,,,0.310000,0.020000")
    assert "0.290000,0.020000" in csv_text.splitlines()[2]
    assert ",-0.020000,0.005000,0.0031,0.00042,,,,,," in csv_text.splitlines()[2]


def test_the_common_conventions_get_their_own_table_and_columns():
    """NDCG@20 (truncated), HR@K, MRR@K beside the paper's metrics: in a second table of
    table.md and at the end of table.csv, never in the paper's columns."""
    from prepared.protocol import STANDARD

    state = {"models": {"autorec": {
        "evaluation_label": "autorec",
        "chosen": {"point": {"lam": 30.0}, "valid_ndcg": 0.25, "trials": 3,
                   "search_seconds": 120.0},
        "final": {"epochs_run": 9, "wall_seconds": 30.0}}}}
    rows = [{"label": "autorec", "group": "warm", "metric": m, "mean": x, "ci95": 0.01,
             "users": 900} for m, x in (("NDCG", 0.31), ("NDCG@20 (truncated)", 0.27),
                                         ("HR@20", 0.81), ("MRR@50", 0.44), ("F1@5", 0.1))]
    t = table_rows(state, rows)
    assert t[0]["NDCG@20 (truncated)"] == (0.27, 0.01) and "F1@5" not in t[0]
    md = table_md(t, "toy")
    main, standard = md.split("## The common conventions")
    assert "NDCG@20" not in main and "| model | " + " | ".join(STANDARD) + " |" in standard
    assert "| autorec | 0.2700 ± 0.0100 | – | 0.8100 ± 0.0100 | – | – | – | 0.4400 ± 0.0100 |" \
        in standard
    head, row = table_csv(t).splitlines()[:2]
    assert head.endswith("NDCG@20 (truncated) mean,NDCG@20 (truncated) ci95,Recall@20 mean,"
                         "Recall@20 ci95,HR@20 mean,HR@20 ci95,MRR@20 mean,MRR@20 ci95,"
                         "NDCG@50 (truncated) mean,NDCG@50 (truncated) ci95,HR@50 mean,HR@50 ci95,"
                         "MRR@50 mean,MRR@50 ci95,paired_tost_p,best_tost_p")
    assert row.endswith(",0.270000,0.010000,,,0.810000,0.010000,,,,,,,0.440000,0.010000,,")
    # without them (an evaluation from before them): no second table
    assert "common conventions" not in table_md(table_rows(state, rows[:1]), "toy")


def test_the_table_compares_each_model_with_the_best_after_the_first_too():
    """Three models: the pairs against the best after the first (ease, here) get their own
    columns, named after it; the first and the best have none."""
    model = {"chosen": {"point": {}, "valid_ndcg": 0.25, "trials": 1, "search_seconds": 60.0},
             "final": {"epochs_run": 1, "wall_seconds": 60.0}}
    state = {"models": {m: {**model, "evaluation_label": m} for m in ("autorec", "ease", "puresvd")}}
    rows = [{"label": m, "group": "warm", "metric": "NDCG", "mean": x, "ci95": 0.01, "users": 50}
            for m, x in (("autorec", 0.3), ("ease", 0.32), ("puresvd", 0.28))]
    pair = {"metric": "NDCG", "ci95": 0.004, "users": 50, "wilcoxon_p_holm": float("nan")}
    pairs = [{**pair, "reference": "autorec", "label": "ease", "comparison": "first",
              "mean_difference": -0.02, "t_p_holm": 0.01},
             {**pair, "reference": "autorec", "label": "puresvd", "comparison": "first",
              "mean_difference": 0.02, "t_p_holm": 0.02},
             {**pair, "reference": "ease", "label": "puresvd", "comparison": "best",
              "mean_difference": 0.04, "t_p_holm": 1e-5}]
    t = table_rows(state, rows, None, pairs)
    assert [r["best"] and r["best"]["diff"] for r in t] == [None, None, (-0.04, 0.004)]
    md = table_md(t, "toy")
    assert ("| p vs autorec (t / Wilcoxon) | vs autorec | NDCG − ease, paired | "
            "p vs ease (t / Wilcoxon) | vs ease |") in md
    assert "against autorec and against ease, the best after it by test NDCG" in md
    # ease: against the first only
    assert "| +0.0200 ± 0.0040 | 0.01 / – | above | – | – | – |" in md
    assert "| -0.0200 ± 0.0040 | 0.02 / – | below | -0.0400 ± 0.0040 | 1e-05 / – | below |" in md
    lines = table_csv(t).splitlines()
    assert ",ease,-0.040000,0.004000,1e-05,nan," in lines[3]
    assert ",ease,,,,," in lines[2] and ",,,ease,,,,," in lines[1]


def test_the_figures_are_drawn_for_the_settings_the_grid_varied(tmp_path):
    import torch

    from experiment.records import trial_results
    from experiment.report import best_by, figures

    pts = grids.points({"mode": ["joint", "limited-finetune"], "beta": [0.8, 1.0]})
    ndcg = {("joint", 0.8): 0.20, ("joint", 1.0): 0.22, ("limited-finetune", 0.8): 0.25,
            ("limited-finetune", 1.0): 0.21}
    for p in pts:
        name = grids.point_name("nce-autorec", p)
        d = tmp_path / "trials" / name
        d.mkdir(parents=True)
        history = [{"epoch": e, "epoch_seconds": 2.0, "valid_ndcg": ndcg[p["mode"], p["beta"]] * e / 3}
                   for e in (1, 2, 3)]
        torch.save({"history": history}, d / "model.pt")
        (d / "run.json").write_text(json.dumps({"summary": {
            "best_valid_ndcg": ndcg[p["mode"], p["beta"]], "best_epoch": 3, "run_name": name,
            "model_path": str(d / "model.pt")}}))
    results = trial_results(tmp_path, "nce-autorec", pts)
    assert best_by(results, "mode") == {"joint": 0.22, "limited-finetune": 0.25}
    assert best_by(results, "beta") == {0.8: 0.25, 1.0: 0.22}
    out = figures(tmp_path, {"nce-autorec": pts, "puresvd": [{}]})
    assert sorted(out) == ["convergence.png", "ndcg_against_beta.png", "ndcg_per_mode.png"]
    assert all(v[:4] == b"\x89PNG" for v in out.values())


def test_points_without_a_mode_count_as_the_models_default_in_the_figures(tmp_path):
    """The protocol grid sets mode only in the sub-grid of the fine-tune modes: its other points
    are joint-mode trials, drawn as such (the run of 2026-11-27 failed here with KeyError)."""
    import torch

    from experiment.report import figures

    pts = grids.points([{"lam": [3, 10]}, {"lam": [10], "mode": ["full-finetune"]}])
    for p, ndcg in zip(pts, (0.20, 0.22, 0.25)):
        name = grids.point_name("nce-autorec", p)
        d = tmp_path / "trials" / name
        d.mkdir(parents=True)
        torch.save({"history": [{"epoch": 1, "epoch_seconds": 2.0, "valid_ndcg": ndcg}]},
                   d / "model.pt")
        (d / "run.json").write_text(json.dumps({"summary": {
            "best_valid_ndcg": ndcg, "best_epoch": 1, "run_name": name,
            "model_path": str(d / "model.pt")}}))
    out = figures(tmp_path, {"nce-autorec": pts, "ease": [{"lam": 100}]})
    assert sorted(out) == ["convergence.png", "ndcg_per_mode.png"]


def test_concurrency_leaves_a_cpu_for_the_data(tmp_path, monkeypatch):
    import ray

    from experiment.search import concurrency

    monkeypatch.setattr(ray, "cluster_resources", lambda: {"CPU": 3.0})
    assert concurrency(exp(tmp_path, num_workers=2)) == 1           # 2 x 1 CPU + 1 for data
    assert concurrency(exp(tmp_path, num_workers=1, cpus_per_worker=1)) == 1
    assert concurrency(exp(tmp_path, num_workers=1, cpus_per_worker=0.5)) == 2
    assert concurrency(exp(tmp_path, num_workers=1, cpus_per_worker=0.5, concurrency=2)) == 2
    # two trials of a 1-CPU worker each on 3 CPUs: seen to stall, every CPU idle
    with pytest.raises(UsageError, match=r"--concurrency 2 x \(--num-workers 1 x 1 CPUs \+ 1 for "
                                         r"its data\) needs 4 of the cluster's 3 CPUs.*e.g. 0.5"):
        concurrency(exp(tmp_path, num_workers=1, cpus_per_worker=1, concurrency=2))


def test_trials_with_a_large_fit_run_no_more_at_once_than_memory_holds(monkeypatch, capsys):
    from experiment.search import memory_bound
    from models import closed_form
    from models.ease import fit_bytes

    need = fit_bytes(16_980)                                  # citeulike-a: 5.4 GiB a fit
    assert need == 16_980 ** 2 * 20             # float64, LAPACK's copy of it, B's float32
    monkeypatch.setattr(closed_form, "available_memory", lambda: int(2.6 * need))
    assert memory_bound("ease", 16_980, 4) == 2               # 0.8 x 2.6 = 2.08 fits
    monkeypatch.setattr(closed_form, "available_memory", lambda: int(1.1 * need))
    assert memory_bound("ease", 16_980, 4) == 2               # too little for float64: float32's
    assert "2 trial(s) at a time, not 4: a fit on 16,980 items holds 2.1 GiB" in capsys.readouterr().out
    monkeypatch.setattr(closed_form, "available_memory", lambda: int(0.5 * need))
    assert memory_bound("ease", 16_980, 2) == 1               # seen: both refused, the run stopped
    # never 0: the one trial's own check refuses a fit that cannot fit, with the size it needs
    monkeypatch.setattr(closed_form, "available_memory", lambda: need // 2)
    assert memory_bound("ease", 16_980, 2) == 1
    # models without a large dense state keep the CPU-bound concurrency
    assert memory_bound("puresvd", 16_980, 2) == 2
    assert memory_bound("nce-autorec", 16_980, 2) == 2


def test_a_final_run_of_an_earlier_choice_is_moved_aside_not_reused_or_fatal(tmp_path):
    """Resumed with a grown grid, validation may choose another point: its retraining must not
    reuse (or fail on) the final run recorded for the old choice."""
    cfg = exp(tmp_path)

    def final(lam: float):
        chosen = {"point": {"lam": lam}, "best_epoch": 7, "phase_epochs": []}
        return final_config(cfg, tmp_path, "autorec", chosen)

    old = final(1.0)
    run_dir = Path(old.output) / old.run_name
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"config": old.to_dict(),
                                                  "summary": {"best_epoch": 7}}))
    assert retire_stale_final(old) is None and run_dir.is_dir()  # the same choice: resumed as is
    moved = retire_stale_final(final(3.0))
    assert not run_dir.exists() and moved.parent == run_dir.parent
    assert moved.name.startswith("autorec-final.superseded-")
    assert json.loads((moved / "run.json").read_text())["config"]["lam"] == 1.0
    assert retire_stale_final(final(3.0)) is None  # nothing on record any more


def test_progress_after_a_resume_counts_the_best_trial_that_finished_before_it(capsys):
    progress = Progress("nce-autorec", 4, 2, 1, best_before=(0.1285, "before"))
    progress.trial_done("third", {"valid_ndcg": 0.1280})
    assert "trial 3/4 third: validation NDCG 0.1280; best 0.1285 (before); 1 left" in \
        capsys.readouterr().out
    progress.trial_done("fourth", {"valid_ndcg": 0.1300})
    assert "trial 4/4 fourth: validation NDCG 0.1300; best 0.1300 (fourth); 0 left" in \
        capsys.readouterr().out


def test_the_final_runs_seeds_and_which_of_them_a_resume_runs(tmp_path):
    """--seeds N: seeds --seed .. --seed + N - 1, the first under the name a final run had
    before --seeds (an old experiment's final run is its first seed); a resume with more seeds
    runs only the new ones, with fewer the first N, and a run of another choice runs again."""
    from experiment.selection import final_seeds, seeds_to_run

    root = tmp_path / "e"
    chosen = {"point": {"lam": 30.0}, "best_epoch": 4, "phase_epochs": [6]}
    cfg = exp(tmp_path, seed=5, seeds=2)
    assert final_seeds(cfg) == [5, 6]
    first, second = (final_config(cfg, root, "autorec", chosen, s) for s in (5, 6))
    assert (first.seed, first.run_name) == (5, "autorec-final")
    assert (second.seed, second.run_name) == (6, "autorec-final-seed6")
    assert final_config(cfg, root, "autorec", chosen) == first  # default: --seed
    assert first.output == second.output == str(root / "final")
    assert seeds_to_run(cfg, root, "autorec", chosen) == [5, 6]

    def finish(fc, summary=True):
        d = Path(fc.output) / fc.run_name
        d.mkdir(parents=True, exist_ok=True)
        (d / "run.json").write_text(json.dumps({"config": fc.to_dict(), **(
            {"summary": {"best_epoch": 4, "run_name": fc.run_name}} if summary else {})}))

    finish(first)  # an experiment run with one seed (or from before --seeds)
    finish(second, summary=False)  # interrupted
    assert seeds_to_run(cfg, root, "autorec", chosen) == [6]
    assert seeds_to_run(exp(tmp_path, seed=5, seeds=4), root, "autorec", chosen) == [6, 7, 8]
    assert seeds_to_run(exp(tmp_path, seed=5, seeds=1), root, "autorec", chosen) == []
    # validation chose anew (a grown grid): every seed's final run is of the old choice
    other = {**chosen, "point": {"lam": 10.0}}
    assert seeds_to_run(cfg, root, "autorec", other) == [5, 6]
    with pytest.raises(UsageError, match="--seeds 0"):
        plan(exp(tmp_path, seeds=0, grid="small", models="autorec"), prep(), str(tmp_path))


def test_the_final_runs_of_several_seeds_run_side_by_side(tmp_path, monkeypatch):
    """Where the cluster takes two trials at once, the seeds' final runs go to Tune together (as
    the search's trials do), each the final configuration of its seed and tagged as a final run
    of that seed in MLflow; one seed, or one trial at a time, leaves them to the loop."""
    from experiment import search as S
    from experiment import selection as R

    ran = []
    monkeypatch.setattr(R, "tune_trials", lambda model, root, configs, state, at_once, progress,
                        kind="trial": ran.append((model, configs, at_once, kind)))
    monkeypatch.setattr(R, "concurrency", lambda cfg: cfg.concurrency)
    root = tmp_path / "e"
    chosen = {"point": {"lam": 30.0}, "best_epoch": 4, "phase_epochs": [6]}
    cfg = exp(tmp_path, seed=5, seeds=3, concurrency=2)
    R.run_finals(cfg, root, "autorec", chosen, [5, 6, 7], {}, 100)
    (model, configs, at_once, kind), = ran
    assert (model, at_once, kind) == ("autorec", 2, "final")
    assert configs == [final_config(cfg, root, "autorec", chosen, s) for s in (5, 6, 7)]
    assert [c.train_splits for c in configs] == ["train,valid"] * 3
    ran.clear()
    R.run_finals(cfg, root, "autorec", chosen, [6], {}, 100)  # one left: the loop runs it
    R.run_finals(exp(tmp_path, seed=5, seeds=3, concurrency=1), root, "autorec", chosen,
                 [5, 6, 7], {}, 100)
    assert ran == []
    # the Tune trial tags a final run with its seed, as the loop's call to train.py does
    import training.train
    seen = {}

    def fake_run(c, uri, tags):
        seen.clear()
        seen.update(tags)
        return {"best_valid_ndcg": None, "best_epoch": 4}

    monkeypatch.setattr(training.train, "run", fake_run)
    out = S.trial({"train": configs[1].to_dict(), "mlflow_uri": "u", "parent": "p",
                   "kind": "final"})
    assert seen == {S.PARENT: "p", "kind": "final", "seed": "6"}
    assert out["valid_ndcg"] is None
    S.trial({"train": trial_config(cfg, str(root), "autorec", {"lam": 30.0}).to_dict(),
             "mlflow_uri": "u", "parent": "p"})
    assert seen == {S.PARENT: "p", "kind": "trial"}  # a search trial: no seed tag, as before


def test_the_table_pools_seeds_with_their_spread():
    """Pooled rows (evaluation/seeds.py's) give the table its means, CIs, the seed spread and
    the pooled paired difference; the per-seed pairs stay out of it (paired.csv has them)."""
    model = {"chosen": {"point": {}, "valid_ndcg": 0.25, "trials": 1, "search_seconds": 60.0},
             "final": {"epochs_run": 3, "wall_seconds": 60.0},
             "finals": {"0": {"epochs_run": 3, "wall_seconds": 60.0},
                        "1": {"epochs_run": 3, "wall_seconds": 90.0}}}
    state = {"models": {m: {**model, "evaluation_label": m} for m in ("nce-autorec", "autorec")}}
    rows = [{"label": m, "group": "warm", "metric": "NDCG", "mean": x, "ci95": 0.02, "users": 50,
             "seeds": 2, "seed_sd": 0.003, "seed_min": x - 0.002, "seed_max": x + 0.002}
            for m, x in (("nce-autorec", 0.25), ("autorec", 0.24))]
    pair = {"reference": "nce-autorec", "label": "autorec", "metric": "NDCG", "users": 50,
            "comparison": "first", "t_p_holm": 0.2, "wilcoxon_p_holm": 0.3}
    pairs = [{**pair, "seed": "0", "mean_difference": 0.02, "ci95": 0.005},
             {**pair, "seed": "pooled", "mean_difference": 0.01, "ci95": 0.012, "seed_sd": 0.01,
              "se": 0.006, "df": 2.5},
             {**pair, "seed": "1", "mean_difference": 0.0, "ci95": 0.005}]
    t = table_rows(state, rows, None, pairs)
    assert t[1]["paired_ndcg"] == (-0.01, 0.012) and t[1]["seeds"] == 2
    # the equivalence test within 1% of the reference's 0.25 (the pooled row's se and df)
    margin = 0.0025
    assert t[1]["paired_tost_p"] == pytest.approx(max(
        stats.t.sf((-0.01 + margin) / 0.006, 2.5), stats.t.cdf((-0.01 - margin) / 0.006, 2.5)))
    assert t[0]["final_minutes"] == pytest.approx(2.5)  # both seeds' retrainings
    md = table_md(t, "toy")
    assert "each with 2 seeds" in md and "| seeds | NDCG seed sd (min–max) |" in md
    assert "| -0.0100 ± 0.0120 | 0.2 / 0.3 | not significantly below |" in md
    assert "| 2 | 0.0030 (0.2380–0.2420) |" in md
    assert "within ±1% of the reference's NDCG" in md and "Satterthwaite" in md
    head, _, second = table_csv(t).splitlines()
    blank = "," * 14  # the common conventions' columns (none in these rows)
    assert ",seeds,ndcg_seed_sd,ndcg_seed_min,ndcg_seed_max,paired_seed_sd,NDCG@20" in head
    assert head.endswith(",paired_tost_p,best_tost_p")
    assert second.endswith(",2,0.003000,0.238000,0.242000,0.010000" + blank
                           + f",{t[1]['paired_tost_p']:.6f},")
    # one seed: the table as before --seeds (no seed columns), the csv's seed columns empty
    one = table_rows(state, [{k: v for k, v in r.items() if not k.startswith("seed")}
                             for r in rows], None, pairs[1:2])
    assert "seeds" not in table_md(one, "toy")
    assert table_csv(one).splitlines()[1].endswith(",1,,,," + blank + ",,")  # no pair
    assert table_csv(one).splitlines()[2].endswith(
        ",1,,,,0.010000" + blank + f",{one[1]['paired_tost_p']:.6f},")


def test_the_seed_spread_decides_whether_the_two_best_are_rerun():
    from experiment.selection import seed_mean, within_spread

    # best 0.30, 0.28, 0.26 over three seeds: sd 0.02, a single-seed difference's sd 0.0283
    assert within_spread([0.30, 0.28, 0.26], 0.28)        # gap 0.02 <= 0.0283
    assert not within_spread([0.30, 0.28, 0.26], 0.27)    # gap 0.03 > 0.0283
    assert not within_spread([0.30, 0.30], 0.2999)        # no spread: any gap decides
    assert seed_mean([0.2, float("nan"), 0.3]) == pytest.approx(0.25)  # a diverged seed left out


def test_the_two_best_points_within_the_seed_spread_are_chosen_by_their_mean_over_seeds(
        tmp_path, monkeypatch):
    import experiment.selection as E

    ran = []
    monkeypatch.setattr(E, "run_trials", lambda cfg, root, model, configs, *a: ran.append(
        [(c.run_name, c.seed) for c in configs]))
    pts = [{"lam": 1.0}, {"lam": 2.0}, {"lam": 3.0}]
    for p, v in zip(pts, (0.300, 0.295, 0.20)):
        finished_trial(tmp_path, "autorec", p, v, best_epoch=int(p["lam"]) + 4)
    # the seed trials' results: lam 1 drops with the other seeds, lam 2 holds
    for p, vals in ((pts[0], (0.27, 0.28)), (pts[1], (0.296, 0.294))):
        for seed, v in zip((1, 2), vals):
            d = tmp_path / "trials" / f"{grids.point_name('autorec', p)}-seed{seed}"
            d.mkdir()
            (d / "run.json").write_text(json.dumps({"summary": {"best_valid_ndcg": v}}))
    cfg = exp(tmp_path, seeds=3)
    chosen = select(tmp_path, "autorec", pts)
    assert chosen["point"] == pts[0]
    got = E.reseed_choice(cfg, tmp_path, "autorec", pts, chosen, {}, 100)
    # lam 1 over seeds 0.300, 0.27, 0.28: sd 0.0153, x sqrt 2 = 0.0216 > the gap 0.005
    assert ran == [[("autorec-lam1-seed1", 1), ("autorec-lam1-seed2", 2)],
                   [("autorec-lam2-seed1", 1), ("autorec-lam2-seed2", 2)]]
    assert got["point"] == pts[1] and got["best_epoch"] == 6  # lam 2's own trial's epochs
    assert got["seed_check"]["rerun"] and got["seed_check"]["second_seeds"] == [0.295, 0.296, 0.294]
    # one seed, or a gap beyond the spread: the search's choice stands, nothing more runs
    ran.clear()
    assert E.reseed_choice(exp(tmp_path, seeds=1), tmp_path, "autorec", pts, chosen, {}, 100) \
        is chosen and ran == []
    far = select(tmp_path, "autorec", pts[::2])  # lam 1 (0.300) against lam 3 (0.20)
    got = E.reseed_choice(cfg, tmp_path, "autorec", pts[::2], far, {}, 100)
    assert got["point"] == pts[0] and not got["seed_check"]["rerun"] and len(ran) == 1


def test_a_second_run_of_one_experiment_is_refused_with_the_holders_pid(tmp_path, monkeypatch):
    """Two processes of one experiment would rerun each other's trials and overwrite its state:
    the second is refused (before any trial) while the first holds the directory's lock, and a
    killed one's lock is taken over."""
    import socket
    import subprocess
    import sys

    from experiment import run as E

    cfg = exp(tmp_path, output=str(tmp_path / "experiments"))
    monkeypatch.setattr(E, "open_prepared", lambda data: SimpleNamespace(dataset="d"))
    root = tmp_path / "experiments" / "e"
    hold = ("import sys; from runtime.publish import WriterLock; "
            "WriterLock.local(sys.argv[1], 'x').acquire(); print('held', flush=True); "
            "sys.stdin.read()")
    root.mkdir(parents=True)
    first = subprocess.Popen([sys.executable, "-c", hold, str(root / E.WRITER_LOCK)],
                             cwd=Path(__file__).resolve().parents[2], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    assert first.stdout.readline().strip() == "held"
    ran = []
    monkeypatch.setattr(E, "_run_experiment", lambda *a: ran.append(a) or {"done": True})
    with pytest.raises(UsageError, match=rf"is being written by another job: pid {first.pid} on "
                                         rf"host {socket.gethostname()}"):
        E.run_experiment(cfg)
    assert ran == []
    first.kill()  # as a killed run: its lock stays behind, stale
    first.wait(30)
    assert E.run_experiment(cfg) == {"done": True} and len(ran) == 1
    assert not (root / E.WRITER_LOCK).exists()  # let go when the run ended
