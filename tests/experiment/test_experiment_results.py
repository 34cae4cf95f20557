"""The experiment's results (table.md, table.csv, paired.csv, figures/) are published together:
staged, moved in, and their manifest ``results.json`` written last, so a reader never takes a mix
of an earlier run's files and a later one's for a result."""

from __future__ import annotations

import json

import pytest

from experiment import results as E
from prepared.errors import UsageError


def files(tag: str, figures: tuple[str, ...], paired: bool = True) -> dict[str, bytes]:
    out = {"table.md": f"# {tag}\n".encode(), "table.csv": f"model\n{tag}\n".encode(),
           **{f"figures/{f}": f"{tag} {f}".encode() for f in figures}}
    return {**out, "paired.csv": f"label\n{tag}\n".encode()} if paired else out


def test_a_second_publication_replaces_every_file_of_the_first(tmp_path):
    E.publish_results(tmp_path, files("old", ("a.png", "b.png")))
    assert E.read_results(tmp_path)["files"]["figures/a.png"] == len(b"old a.png")
    E.publish_results(tmp_path, files("new-run", ("c.png",), paired=False))
    m = E.read_results(tmp_path)
    assert sorted(m["files"]) == ["figures/c.png", "table.csv", "table.md"]
    assert sorted(p.name for p in (tmp_path / "figures").iterdir()) == ["c.png"]  # no old figure
    assert not (tmp_path / "paired.csv").exists()  # nor an old file this run does not write
    assert (tmp_path / "table.md").read_text() == "# new-run\n"
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left


def test_results_interrupted_before_the_manifest_are_refused(tmp_path, monkeypatch):
    E.publish_results(tmp_path, files("old", ("a.png",)))
    real = E.write_json

    def killed(path, data):  # the writer dies just before the manifest
        if path.name == E.RESULTS:
            raise KeyboardInterrupt
        real(path, data)

    monkeypatch.setattr(E, "write_json", killed)
    with pytest.raises(KeyboardInterrupt):
        E.publish_results(tmp_path, files("new", ("a.png",)))
    with pytest.raises(UsageError, match=r"no results\.json, so its results are incomplete"):
        E.read_results(tmp_path)


def test_a_mix_of_files_is_refused(tmp_path):
    E.publish_results(tmp_path, files("old", ("a.png",)))
    (tmp_path / "table.csv").write_text("model\na longer row from another run\n")
    (tmp_path / "figures" / "z.png").write_bytes(b"stray")
    with pytest.raises(UsageError, match=r"incomplete: 1 file\(s\) differ in size \(e\.g\. "
                                         r"table\.csv.*1 data file\(s\) are not in its manifest"):
        E.read_results(tmp_path)
    assert json.loads((tmp_path / E.RESULTS).read_text())["files"]["table.csv"] == 10
