"""benchmarks/alternatives.py's pieces that are not timing: implicit's input is the users' rows as
a CSR of ones, and the report's ratio is the alternative's seconds over ours."""

import json
from types import SimpleNamespace

from benchmarks import alternatives as A


def test_csr_holds_each_users_items_as_ones():
    m = A.csr([[0, 3], [], [2]], 5)
    assert m.shape == (3, 5) and m.dtype.name == "float32"
    assert m.toarray().tolist() == [[1, 0, 0, 1, 0], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]]


def test_the_report_shows_every_row_with_its_ratio(tmp_path):
    rows = [{"part": "train", "shape": "gowalla", "width": 200, "ours": "epoch", "ours_seconds": 2.0,
             "theirs": "sweep", "theirs_seconds": 5.0, "ratio": 2.5}]
    st = {"command": "python benchmarks/alternatives.py", "machine": "m", "date": "d",
          "commit": "abc1234", "cpu": {}}
    A.write(rows, st, SimpleNamespace(users=10, out=str(tmp_path / "alt")))
    md = (tmp_path / "alt.md").read_text()
    assert "| train | gowalla | 200 | epoch | 2.0 | sweep | 5.0 | 2.50 |" in md
    assert "Commit: abc1234" in md
    assert json.loads((tmp_path / "alt.json").read_text())["results"] == rows
