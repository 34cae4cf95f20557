"""The ETL's command line, as users run it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable


def test_help_lists_flags_and_dataset_defaults():
    out = subprocess.run([PY, "etl/prepare.py", "--help"], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0
    for flag in ("--dataset", "--input", "--output", "--seed", "--overwrite", "--cold-users",
                 "--beta", "--negatives", "--max-bad-rows", "--positive", "--split"):
        assert flag in out.stdout
    assert "yahoo-r1" in out.stdout and "80..100" in out.stdout


def test_usage_error_is_one_line_without_traceback(tmp_path):
    out = subprocess.run([PY, "etl/prepare.py", "--dataset", "ml-100k", "--input",
                          str(tmp_path / "missing.data"), "--output", str(tmp_path / "o")],
                         cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 2
    assert "missing.data: no such file; check --input" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.spark
def test_spark_submit_ml_100k(shared_datasets, tmp_path):
    """The issue's acceptance command, through spark-submit itself."""
    spark_submit = Path(PY).parent / "spark-submit"
    env = {**os.environ, "PYSPARK_PYTHON": PY, "PYSPARK_DRIVER_PYTHON": PY}
    out = subprocess.run([str(spark_submit), "--master", "local[2]", "--driver-memory", "1g",
                          "etl/prepare.py", "--dataset", "ml-100k", "--input",
                          str(shared_datasets / "ml-100k" / "u.data"), "--output", str(tmp_path / "p")],
                         cwd=ROOT, capture_output=True, text=True, env=env, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    manifest = json.loads((tmp_path / "p" / "manifest.json").read_text())
    assert manifest["schema_version"] == 1 and manifest["counts"]["users"] == 942
    assert manifest["spark"]["master"] == "local[2]"
    log = out.stdout + out.stderr  # spark-submit merges the Python driver's stderr into stdout
    for step in ("read", "dedup", "split", "write-rows"):  # a progress line per step
        assert f"[etl] {step}" in log
