"""What every benchmark's results carry, and how they are written: the command, machine and date
that produced them, and a JSON + Markdown pair replaced atomically (a run that fails midway
leaves the committed results as they were)."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import torch

from runtime.atomic import write_text


def stamp(script: str, argv: list[str] | None = None) -> dict:
    """The command (as typed), machine (cores, torch threads), date and commit of this run (the
    commit lets `benchmarks/staleness.py` tell when the code it measured changed since)."""
    args = sys.argv[1:] if argv is None else argv
    return {"command": f"python benchmarks/{script} " + " ".join(args),
            "machine": f"{platform.node()}, {os.cpu_count()} cores, "
                       f"{torch.get_num_threads()} torch threads",
            "date": time.strftime("%Y-%m-%d"), "commit": commit()}


def commit() -> str:
    """The code's commit, ``+dirty`` when tracked code outside the results differs from it (a
    rewritten result file is not a change to the code that produced it)."""
    from infra.demo import commit as code_commit

    return code_commit(exclude=("benchmarks/results", "*.md"))


def publish(out: Path, payload: dict, lines: list[str]) -> None:
    """``out``.json (``payload``) and ``out``.md (``lines``), each written whole, then renamed."""
    for suffix, text in ((".json", json.dumps(payload, indent=2) + "\n"),
                         (".md", "\n".join(lines) + "\n")):
        write_text(out.with_suffix(suffix), text)
