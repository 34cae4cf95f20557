"""`pip install .`: the project as a package whose stages are console scripts (nce-prepare,
nce-train, ...) running the same functions as the checkout's `spark-submit etl/prepare.py` and
`python training/train.py`, from any directory, with their default outputs beside the caller, not
inside site-packages. The installed ETL runs once, under a bare `spark-submit` as the README shows
it (no SPARK_LOCAL_IP, no options of ours): a JVM of its own serves both checks."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# its JVM is a spark-submit of its own: it runs beside the services tier (tests/tiers.py)
pytestmark = [pytest.mark.spark, pytest.mark.standalone]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The project installed by pip from a copy of the clone's files (what `git clone` has: the
    build leaves nothing in this checkout), into a target folder; its dependencies are this
    environment's."""
    src, target = tmp_path_factory.mktemp("src"), tmp_path_factory.mktemp("site")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    for f in filter(None, files):
        if (ROOT / f).is_file():
            (src / f).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / f, src / f)
    out = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--no-build-isolation", "--target", str(target), str(src)],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    return target


def env_for(target: Path) -> dict:
    # the installed copy first on the path: this environment also has the checkout (editable)
    return {**os.environ, "PYTHONPATH": str(target), "SPARK_MASTER": "local[2]",
            "SPARK_DRIVER_MEMORY": "1g"}


def test_each_stage_is_a_console_script_of_its_main(installed):
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert {"nce-prepare", "nce-train", "nce-experiment", "nce-score", "nce-evaluate"} <= set(scripts)
    for name, target in scripts.items():
        module, func = target.split(":")
        text = (installed / "bin" / name).read_text()
        assert f"from {module} import {func}" in text, (name, text)
    assert (installed / "infra" / "log4j2.properties").is_file()  # package data travels


def test_an_installed_stage_runs_end_to_end_outside_the_checkout(installed, tmp_path):
    csv = tmp_path / "shop" / "events.csv"
    csv.parent.mkdir()
    csv.write_text("customer,product,when\n" + "".join(
        f"c{u},p{(u * 7 + j) % 11},2024-01-{j + 1:02d}\n" for u in range(12) for j in range(6)))
    env = env_for(installed)
    where = subprocess.run([sys.executable, "-c", "import etl, runtime.paths as p; "
                            "print(etl.__file__); print(p.project_root())"], cwd=tmp_path, env=env,
                           capture_output=True, text=True, check=True).stdout.split("\n")
    assert where[0].startswith(str(installed))  # the installed copy, not the checkout's
    assert where[1] == str(tmp_path)  # default outputs beside the caller
    # the installed etl/prepare.py (what nce-prepare's main is) under a bare spark-submit
    env = {**env, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    env.pop("SPARK_LOCAL_IP", None)
    spark_submit = Path(sys.executable).parent / "spark-submit"
    out = subprocess.run([str(spark_submit), "--master", "local[2]", "--driver-memory", "1g",
                          str(installed / "etl" / "prepare.py"), "--dataset", "csv", "--input",
                          str(csv), "--output", "var/data/shop", "--user-col", "customer",
                          "--item-col", "product", "--rating-col", "", "--time-col", "when",
                          "--negatives", "2", "--cold-users", "0"],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    import json

    manifest = json.loads((tmp_path / "var" / "data" / "shop" / "manifest.json").read_text())
    assert manifest["dataset"] == "events" and manifest["format"] == "csv"
    assert manifest["counts"]["users"] == 12 and manifest["parameters"]["positive"] == "all"
    assert manifest["schema_version"] == 2 and manifest["counts"]["rows"] == 72
    assert manifest["spark"]["master"] == "local[2]"
    assert not any(installed.glob("**/var")) and not (installed / "mlflow").exists()
    log = out.stdout + out.stderr  # spark-submit merges the Python driver's stderr into stdout
    for step in ("read", "dedup", "users", "split", "write"):  # a progress line per step
        assert f"[etl] {step}" in log
    # its JVM started without SPARK_LOCAL_IP, so the UI would listen on every interface: off
    assert "Spark UI off" in log and "SPARK_LOCAL_IP=127.0.0.1" in log
