"""benchmarks/staleness.py: every committed result says what code it measures, and a result is
stale exactly when a later commit changed that code (not its comments, not other code), read from
git alone (no list of reviewed commits)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import staleness  # noqa: E402


def test_every_committed_result_is_listed_with_paths_that_exist():
    found = staleness.result_files(ROOT)
    assert "loss_speed" in found and "local_cluster" in found  # both places are read
    assert sorted(set(found) - set(staleness.MEASURES)) == []
    for name, paths in staleness.MEASURES.items():
        assert paths, name
        missing = [p for p in paths if not (ROOT / p).exists()]
        assert missing == [], (name, missing)
    for name, sources in staleness.DERIVED_FROM.items():
        assert set(sources) <= set(staleness.MEASURES), name


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=repo,
                          check=True, capture_output=True, text=True).stdout.strip()


def commit_all(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


def test_a_result_goes_stale_only_when_the_code_it_measures_changes(tmp_path):
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    git(repo, "init", "-q")
    code = repo / "speed.py"
    code.write_text('"""Old docstring."""\n\ndef f(x):\n    return x + 1  # fast\n')
    (repo / "other.py").write_text("y = 1\n")
    ran_on = commit_all(repo, "code")
    result = repo / "benchmarks" / "results" / "speed.json"
    result.write_text(json.dumps({"commit": ran_on[:7] + "+dirty", "users_per_s": 10}))
    commit_all(repo, "result")

    def check():
        return staleness.verdict(repo, "speed", [result], ("speed.py",))

    v = check()
    assert (v.produced, v.how, v.since) == (ran_on, "recorded", [])
    # a docstring, a comment and another file's code: the numbers cannot have moved
    code.write_text('"""New docstring."""\n\ndef f(x):\n    return x + 1  # faster\n')
    (repo / "other.py").write_text("y = 2\n")
    commit_all(repo, "words")
    assert check().since == []
    # a file added beside what it measures, in a path it watches: nothing that ran used it
    (repo / "grids").mkdir()
    (repo / "grids" / "new.yaml").write_text("model: {lam: [1]}\n")
    commit_all(repo, "a new grid")
    assert staleness.verdict(repo, "speed", [result], ("speed.py", "grids")).since == []
    # a grid's comments: the values searched are the same
    (repo / "grids" / "new.yaml").write_text("# chosen before: see the old run\nmodel:\n"
                                             "  lam: [1]  # the edge\n")
    commit_all(repo, "the grid's comments")
    assert staleness.verdict(repo, "speed", [result], ("speed.py", "grids")).since == []
    (repo / "grids" / "new.yaml").write_text("model: {lam: [3]}\n")
    edited = commit_all(repo, "the grid edited")
    assert staleness.verdict(repo, "speed", [result], ("speed.py", "grids")).since == \
        [f"{edited[:7]} the grid edited"]
    # a change to what the code does
    code.write_text('"""New docstring."""\n\ndef f(x):\n    return x + 2\n')
    changed = commit_all(repo, "behaviour")
    assert check().since == [f"{changed[:7]} behaviour"]
    # a result recording no commit is dated by its file's last commit
    result.write_text(json.dumps({"users_per_s": 11}))
    rerun = commit_all(repo, "rerun")
    v = check()
    assert (v.produced, v.how, v.since) == (rerun, "file's commit", [])


def two_results(tmp_path, code_name: str, code_text: str, names: tuple[str, str]):
    """A repository with one code file and two results that ran on its first commit."""
    repo = tmp_path / "repo"
    (repo / "benchmarks" / "results").mkdir(parents=True)
    git(repo, "init", "-q")
    code = repo / code_name
    code.write_text(code_text)
    ran_on = commit_all(repo, "code")
    results = {}
    for name in names:
        results[name] = repo / "benchmarks" / "results" / f"{name}.json"
        results[name].write_text(json.dumps({"commit": ran_on[:7]}))
    commit_all(repo, "results")
    return repo, code, results


def test_a_refactor_that_keeps_the_numbers_still_counts_git_is_all_that_is_read(tmp_path):
    # no list of commits judged harmless: a change to the syntax tree is a change
    repo, code, results = two_results(tmp_path, "model.py", "def f(x):\n    return x + 1\n",
                                      ("quality_result", "speed_result"))
    code.write_text("def f(x):\n    y = x + 1\n    return y\n")  # the same values
    refactor = commit_all(repo, "refactor: behaviour unchanged")
    for name in results:
        v = staleness.verdict(repo, name, [results[name]], ("model.py",))
        assert v.since == [f"{refactor[:7]} refactor: behaviour unchanged"], name
    assert not [n for n in vars(staleness) if "REVIEW" in n.upper()]


def test_a_report_is_stale_when_a_result_it_summarises_was_rewritten_after_it(tmp_path):
    repo, code, results = two_results(tmp_path, "report.py", "X = 1\n", ("source", "report"))
    measures = {"source": ("report.py",), "report": ("report.py",)}
    derived = {"report": ("source",)}

    def by_name():
        return {v.name: v for v in staleness.verdicts(repo, measures, derived)}

    assert [v.since for v in by_name().values()] == [[], []]
    # the source reran (its new commit recorded) on unchanged code: the report predates it
    (repo / "notes.txt").write_text("a later commit\n")
    later = commit_all(repo, "unrelated")
    results["source"].write_text(json.dumps({"commit": later[:7]}))
    commit_all(repo, "source rerun")
    v = by_name()
    assert v["source"].since == [] and v["report"].since == [f"{later[:7]} rewrote source"]
    rows = staleness.table(list(v.values()))
    assert [r.split(" | ")[-1] for r in rows[2:]] == ["**stale** |", "current |"]


def test_verdicts_refuse_a_result_missing_from_measures(tmp_path):
    repo, code, results = two_results(tmp_path, "a.py", "A = 1\n", ("listed", "unlisted"))
    with pytest.raises(SystemExit, match="unlisted"):
        staleness.verdicts(repo, {"listed": ("a.py",)}, {})
