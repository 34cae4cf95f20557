"""docs/results.md is exactly what ``benchmarks/results_page.py`` writes from the committed results
(so the page cannot drift from them), every result has its section, the docs' links into the page
name sections it has, and the docs carry no figure tags. Reads files only: no Spark, no Ray."""

import json
import re
import shutil

import pytest

from benchmarks.results_page import HEADLINES, PAGE, RESULTS, ROOT, PageError, page, pick, stamp

FIGURE_TAG = re.compile(r"<!--\s*[\w./-]+\.(?:json|csv)\s")


def test_the_page_is_what_the_script_writes_from_the_committed_results():
    assert PAGE.read_text() == page(), (
        "docs/results.md differs from what the results say; run "
        "`python benchmarks/results_page.py --write` and commit the page")


def test_every_result_has_a_section_with_its_stamp_and_its_report():
    text = page()
    for f in sorted(RESULTS.glob("*.json")):
        assert f.stem in HEADLINES, f.stem
        body = text.split(f"\n## {f.stem}\n", 1)[1].split("\n## ", 1)[0]
        assert "- Command: " in body and "- Commit: " in body and "- Machine: " in body, f.stem
        assert f"(../benchmarks/results/{f.stem}.md)" in body, f.stem
        assert "\n| " in body, f"{f.stem}: no table of headline numbers"
    # the results without a JSON are listed with a link
    for folder in (p for p in RESULTS.iterdir() if p.is_dir()):
        assert f"[{folder.name}](../benchmarks/results/{folder.name}/README.md)" in text


def test_links_into_the_page_name_its_sections():
    sections = set(re.findall(r"^## (\S+)$", PAGE.read_text(), re.M))
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    links = [(d.name, a) for d in docs for a in re.findall(r"results\.md#([\w-]+)\)", d.read_text())]
    assert len(links) >= 10, "the docs link the page's sections for their figures"
    assert [(d, a) for d, a in links if a not in sections] == []


def test_the_docs_carry_no_figure_tags():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    tagged = [f"{d.name}:{n}" for d in docs
              for n, line in enumerate(d.read_text().splitlines(), 1) if FIGURE_TAG.search(line)]
    assert tagged == [], "figures are linked to docs/results.md, not tagged: " + ", ".join(tagged)


def copy_results(tmp_path, *names):
    out = tmp_path / "results"
    out.mkdir()
    for name in names:
        for suffix in (".json", ".md"):
            shutil.copy(RESULTS / f"{name}{suffix}", out / f"{name}{suffix}")
    return out


def test_a_rerun_changes_the_page(tmp_path):
    results = copy_results(tmp_path, "fresh_clone")
    data = json.loads((results / "fresh_clone.json").read_text())
    data["steps"]["test"]["seconds"] = 1234.0
    (results / "fresh_clone.json").write_text(json.dumps(data))
    before = page(results, tmp_path / "no-cluster")
    assert "| test | `make test` | 0 | 1,234 | 20.6 |" in before
    data["steps"]["test"]["seconds"] = 1800.0
    data["commit"] = "abcdef0"
    (results / "fresh_clone.json").write_text(json.dumps(data))
    after = page(results, tmp_path / "no-cluster")
    assert "| test | `make test` | 0 | 1,800 | 30.0 |" in after and "1,234" not in after
    assert "- Commit: `abcdef0`" in after


def test_a_result_without_a_headline_function_is_named(tmp_path):
    results = copy_results(tmp_path, "fold_in")
    (results / "new_bench.json").write_text(json.dumps({"command": "python x.py", "x": 1}))
    with pytest.raises(PageError, match="new_bench.json has no entry in .*HEADLINES"):
        page(results, tmp_path)


def test_a_result_missing_what_its_function_reads_is_named(tmp_path):
    results = copy_results(tmp_path, "fold_in")
    data = json.loads((results / "fold_in.json").read_text())
    del data["results"][0]["trained"]
    (results / "fold_in.json").write_text(json.dumps(data))
    with pytest.raises(PageError, match="fold_in.json: fold_in cannot read it .*trained"):
        page(results, tmp_path)


def test_stamp_reads_the_top_level_or_run_and_says_what_is_missing():
    nested = stamp({"run": {"command": "python b.py ", "machine": "vm, 2 cores",
                            "date": "2026-11-29", "commit": "a879eb25cd26a498121b86ceffe12816c6ce9dd0"}})
    assert nested == {"command": "`python b.py`", "commit": "`a879eb2`", "date": "2026-11-29",
                      "machine": "vm, 2 cores", "cpu": ""}
    flat = stamp({"command": "make demo", "commit": "503007a+dirty", "cpu": "AMD EPYC",
                  "machine": {"cores": 2, "os": "Linux"}, "commands": ["a", "b"]})
    assert flat["machine"] == "cores 2, os Linux" and flat["commit"] == "`503007a+dirty`"
    assert flat["command"] == "`make demo` (one of 2 commands: all in the .md)"
    assert stamp({})["commit"] == "not recorded" and stamp({})["command"] == "not recorded"


def test_pick_wants_exactly_one_row():
    rows = [{"a": 1, "b": 2}, {"a": 1, "b": 3}]
    assert pick(rows, a=1, b=3) == {"a": 1, "b": 3}
    with pytest.raises(PageError, match="2 rows"):
        pick(rows, a=1)
    with pytest.raises(PageError, match="0 rows"):
        pick(rows, a=2)
