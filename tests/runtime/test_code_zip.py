"""runtime.spark's code zip for the executors: named by its process, swept once that process is
gone (a SIGKILL skips the exit handler that removes it)."""

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from runtime.spark import CODE_PREFIX, _code_zip, sweep_code_folders


def test_the_zip_holds_the_packages_in_a_folder_named_by_this_process(monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = Path(_code_zip())
    assert path.parent.parent == tmp_path
    assert path.parent.name.startswith(f"{CODE_PREFIX}{os.getpid()}-")
    names = zipfile.ZipFile(path).namelist()
    assert "runtime/spark.py" in names and "models/registry.py" in names
    assert not any(n.startswith(("tests/", "benchmarks/")) for n in names)


def test_a_dead_processs_folder_is_swept_and_the_others_are_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    gone = tmp_path / f"{CODE_PREFIX}{dead.pid}-abc"
    gone.mkdir()
    (gone / "project.zip").write_bytes(b"zip")
    alive = tmp_path / f"{CODE_PREFIX}{os.getpid()}-def"    # this process: running
    alive.mkdir()
    older = tmp_path / f"{CODE_PREFIX}0r4ygixa"             # no pid in its name: not judged
    older.mkdir()
    other = tmp_path / "nce-autorec-native-0"               # not a code folder
    other.mkdir()
    assert sweep_code_folders(str(tmp_path)) == [str(gone)]
    assert not gone.exists() and alive.is_dir() and older.is_dir() and other.is_dir()
    assert sweep_code_folders(str(tmp_path)) == []
