"""benchmarks/staleness.py: every committed result says what code it measures, and a result is
stale exactly when a later commit changed that code (not its comments, not other code)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
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


def test_every_reviewed_commit_is_in_the_history_with_a_reason():
    for sha, (kinds, why) in staleness.REVIEWED.items():
        assert kinds and kinds <= {staleness.QUALITY, staleness.TIMING} and len(why) > 20, sha
        assert len(sha) == 7 and int(sha, 16) >= 0, sha
        shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=ROOT,
                                 capture_output=True, text=True).stdout.strip() == "true"
        if not shallow:  # a shallow clone holds no history to look in; the format is checked
            full = subprocess.run(["git", "rev-parse", "--verify", "--quiet",
                                   f"{sha}^{{commit}}"], cwd=ROOT, capture_output=True,
                                  text=True).stdout.strip()
            assert full.startswith(sha), sha
    assert set(staleness.SPEED) <= set(staleness.MEASURES)


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


def test_a_reviewed_commit_leaves_only_its_kind_of_result_current(tmp_path, monkeypatch):
    repo, code, results = two_results(tmp_path, "model.py", "def f(x):\n    return x + 1\n",
                                      ("quality_result", "speed_result"))
    code.write_text("def f(x):\n    y = x + 1\n    return y\n")  # the same numbers, faster
    refactor = commit_all(repo, "refactor")
    monkeypatch.setattr(staleness, "SPEED", {"speed_result"})
    monkeypatch.setattr(staleness, "REVIEWED", {refactor[:7]: (
        frozenset({staleness.QUALITY}), "a refactor: the same values, another speed")})

    def check(name):
        return staleness.verdict(repo, name, [results[name]], ("model.py",))

    q, t = check("quality_result"), check("speed_result")
    assert (q.since, q.reviewed) == ([], [f"{refactor[:7]} a refactor: the same values, "
                                          "another speed"])
    assert (t.since, t.reviewed) == ([f"{refactor[:7]} refactor"], [])


def test_a_commit_reviewed_for_one_result_leaves_the_others_stale(tmp_path, monkeypatch):
    repo, code, results = two_results(tmp_path, "config.py", "BATCH = 128\n",
                                      ("overrides_it", "uses_it"))
    code.write_text("BATCH = 512\n")
    default = commit_all(repo, "a new default")
    monkeypatch.setattr(staleness, "REVIEWED_FOR", {"overrides_it": {
        default[:7]: "every run of it gives its batch size"}})

    def check(name):
        return staleness.verdict(repo, name, [results[name]], ("config.py",))

    mine, other = check("overrides_it"), check("uses_it")
    assert (mine.since, mine.reviewed) == ([], [f"{default[:7]} every run of it gives its "
                                                "batch size"])
    assert (other.since, other.reviewed) == ([f"{default[:7]} a new default"], [])


def test_every_commit_reviewed_for_a_result_names_a_listed_result_with_a_reason():
    for name, reviews in staleness.REVIEWED_FOR.items():
        assert name in staleness.MEASURES, name
        for sha, why in reviews.items():
            assert len(sha) == 7 and int(sha, 16) >= 0 and len(why) > 20, (name, sha)
