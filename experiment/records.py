"""What the experiment keeps on disk and reads back: JSON records (experiment.json, each run's
run.json, the results' manifest), written whole, and the trials' summaries from their run
records (a finished trial is one whose run.json holds a summary)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from experiment import grids
from runtime.atomic import write_text
from runtime.runs import RUN_RECORD, finished_summary


def read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def write_json(path: Path, data: dict) -> None:
    """Through a temporary sibling and a rename: never half-written."""
    write_text(path, json.dumps(data, indent=2) + "\n")


def finished(run_dir: Path) -> dict | None:
    """A train.py run's summary if it finished (its run.json has one)."""
    return finished_summary(read_json(run_dir / RUN_RECORD))


def finished_trials(root: Path, model: str, pts: list[dict]) -> list[tuple[dict, dict]]:
    """(point, summary) of every finished trial of ``model``, failed ones included."""
    runs = ((p, finished(root / "trials" / grids.point_name(model, p))) for p in pts)
    return [(p, s) for p, s in runs if s]


def with_ndcg(trials: list[tuple[dict, dict]]) -> list[tuple[dict, dict]]:
    """The trials that ended with a validation NDCG (not diverged)."""
    return [(p, s) for p, s in trials if s.get("best_valid_ndcg") is not None
            and not math.isnan(s["best_valid_ndcg"])]


def trial_results(root: Path, model: str, pts: list[dict]) -> list[tuple[dict, dict]]:
    return with_ndcg(finished_trials(root, model, pts))
