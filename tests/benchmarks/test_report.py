"""benchmarks.report.publish: every result's Markdown names the commit its JSON records."""

import json

from benchmarks.report import publish, with_commit


def test_the_commit_line_follows_the_machine_line(tmp_path):
    lines = ["# T", "", "Command: `python x.py`  ", "Machine: vm, 2 cores", "", "| a |"]
    publish(tmp_path / "r", {"commit": "abc1234", "x": 1}, lines)
    md = (tmp_path / "r.md").read_text().splitlines()
    assert md[:5] == ["# T", "", "Command: `python x.py`  ", "Machine: vm, 2 cores",
                      "Commit: abc1234  "]
    assert md[5:] == ["", "| a |"]
    assert json.loads((tmp_path / "r.json").read_text()) == {"commit": "abc1234", "x": 1}


def test_without_a_machine_line_it_follows_the_command_then_the_title():
    assert with_commit(["# T", "Command: c", "x"], "c0ffee") == ["# T", "Command: c",
                                                                 "Commit: c0ffee  ", "x"]
    assert with_commit(["# T", "x"], "c0ffee") == ["# T", "Commit: c0ffee  ", "x"]


def test_lines_that_name_a_commit_or_no_commit_are_left_as_they_are():
    named = ["# T", "Machine: m", "Commit: 1234567; date: today"]
    assert with_commit(named, "abcdef0") == named
    inline = ["# T", "Machine: m; 2026-11-29; commit abcdef0."]
    assert with_commit(inline, "abcdef0123") == inline
    assert with_commit(["# T", "Machine: m"], None) == ["# T", "Machine: m"]
    assert with_commit(["# T", "Machine: m"], "") == ["# T", "Machine: m"]


def test_a_line_citing_the_same_commit_for_something_else_does_not_stand_for_the_reports():
    cites = ["# T", "Machine: m", "Floors from floors.md, commit abcdef0."]
    assert with_commit(cites, "abcdef0123") == [*cites[:2], "Commit: abcdef0123  ", cites[2]]


def test_a_stamp_kept_under_run_names_its_commit_too(tmp_path):
    publish(tmp_path / "r", {"run": {"commit": "abc1234"}, "rows": []}, ["# T", "Machine: m"])
    assert (tmp_path / "r.md").read_text() == "# T\nMachine: m\nCommit: abc1234  \n"
