"""Where the commands' default outputs go (``var/runs``, ``var/experiments``, ``mlflow/state``):
beside the code in a checkout, as the README's commands expect whatever the working directory;
in the working directory for an installed package (``pip install .``), never inside
site-packages."""

from __future__ import annotations

from pathlib import Path

CODE = Path(__file__).resolve().parents[1]


def project_root() -> Path:
    """The checkout holding this code (it has a pyproject.toml), else the working directory."""
    return CODE if (CODE / "pyproject.toml").is_file() else Path.cwd()
