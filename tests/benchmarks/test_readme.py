"""The README stays what a newcomer reads in five minutes: at most 250 lines, its results table
exactly what ``benchmarks/readme_table.py`` prints from the committed report, and every relative
link in it and in docs/ pointing at a file that exists. Reads files only: no Spark, no Ray."""

import json
import re
from pathlib import Path

from benchmarks.readme_table import REPORT, table

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")  # [text](target#anchor): the target


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(path.read_text()) if not re.match(r"[a-z]+:", t)]


def test_readme_is_short():
    n = len(README.read_text().splitlines())
    assert n <= 250, f"README.md has {n} lines; move detail into docs/ to keep it at most 250"


def test_readme_table_is_the_generators_output():
    block = "\n".join(table(json.loads(REPORT.read_text())))
    assert block in README.read_text(), (
        "README.md's results table differs from `python benchmarks/readme_table.py`; paste its output")


def test_readme_links_docs_and_they_exist():
    links = relative_links(README)
    assert any(t.startswith("docs/") for t in links), "README.md links no docs/ file"
    missing = [t for t in links if not (ROOT / t).exists()]
    assert not missing, f"README.md links missing files: {missing}"


def test_docs_links_exist():
    docs = sorted((ROOT / "docs").glob("*.md"))
    assert docs, "docs/ holds no pages"
    missing = [f"{d.name}: {t}" for d in docs for t in relative_links(d)
               if not (d.parent / t).resolve().exists()]
    assert not missing, f"docs/ links missing files: {missing}"


def test_every_docs_page_is_listed_in_the_readme():
    listed = {t for t in relative_links(README) if t.startswith("docs/")}
    unlisted = [f"docs/{d.name}" for d in (ROOT / "docs").glob("*.md") if f"docs/{d.name}" not in listed]
    assert not unlisted, f"README.md's Documentation list lacks {unlisted}"
