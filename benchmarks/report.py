"""What every benchmark's results carry, and how they are written: the command, machine and date
that produced them, and a JSON + Markdown pair replaced atomically (a run that fails midway
leaves the committed results as they were)."""

from __future__ import annotations

import json
import platform
import sys
import time
from pathlib import Path

import torch

from runtime.atomic import write_text


def stamp(script: str, argv: list[str] | None = None) -> dict:
    """The command (as typed), machine (CPU model and vector flags, cores, torch threads, the BLAS
    kernels numpy's library picked and what pinned them), date and commit of this run (the
    commit lets `benchmarks/staleness.py` tell when the code it measured changed since)."""
    import numpy  # noqa: F401  (its BLAS loaded, so that ``blas`` can name it)

    from runtime.machine import blas, cpu, describe_cpu

    args = sys.argv[1:] if argv is None else argv
    info, kernels = cpu(), blas()
    return {"command": f"python benchmarks/{script} " + " ".join(args),
            "machine": f"{platform.node()}, {describe_cpu(info)}, "
                       f"{torch.get_num_threads()} torch threads, {kernels}",
            "cpu": info, "blas": kernels, "date": time.strftime("%Y-%m-%d"), "commit": commit()}


def commit() -> str:
    """The code's commit, ``+dirty`` when tracked code outside the results differs from it (a
    rewritten result file is not a change to the code that produced it)."""
    from infra.demo import commit as code_commit

    return code_commit(exclude=("benchmarks/results", "*.md"))


def publish(out: Path, payload: dict, lines: list[str]) -> None:
    """``out``.json (``payload``) and ``out``.md (``lines``), each written whole, then renamed.
    The Markdown names the payload's commit (``with_commit``) where its lines do not already:
    ``commit``, or ``run.commit`` where the stamp is kept under ``run``."""
    run = payload.get("run")
    commit = payload.get("commit") or (run.get("commit") if isinstance(run, dict) else None)
    for suffix, text in ((".json", json.dumps(payload, indent=2) + "\n"),
                         (".md", "\n".join(with_commit(lines, commit)) + "\n")):
        write_text(out.with_suffix(suffix), text)


def with_commit(lines: list[str], commit: str | None) -> list[str]:
    """``lines`` with a ``Commit:`` line after the ``Machine:`` line (else the ``Command:`` line,
    else the title), so a reader of the .md sees what code produced it, as the .json records;
    unchanged when there is no commit, a line starts with "Commit" or the ``Machine:`` line names
    this commit. (Only that line: another may name the same commit for what it cites, as
    yahoo_scale's note on the floors' commit did, and then the report went without its own.)"""
    if not commit or any(line.lower().startswith("commit")
                         or (line.startswith("Machine:") and commit[:7] in line) for line in lines):
        return lines
    at = next((i for i, line in enumerate(lines) if line.startswith("Machine:")),
              next((i for i, line in enumerate(lines) if line.startswith("Command:")), 0))
    return [*lines[:at + 1], f"Commit: {commit}  ", *lines[at + 1:]]
