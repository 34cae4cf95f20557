"""Where a stage's files are: local paths made absolute, URIs left as given."""

import os
from pathlib import Path

from prepared.uri import absolute, join


def test_a_local_path_is_made_absolute_and_a_uri_is_kept(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert absolute("var/runs") == str(tmp_path / "var" / "runs")
    assert absolute(str(tmp_path / "x")) == str(tmp_path / "x")
    assert absolute("s3a://bucket/runs") == "s3a://bucket/runs"
    assert absolute("hdfs://nn:8020/data") == "hdfs://nn:8020/data"
    assert Path(absolute(".")).is_absolute() and absolute(".") == os.getcwd()
    assert join("s3a://bucket/runs/", "r") == "s3a://bucket/runs/r"
