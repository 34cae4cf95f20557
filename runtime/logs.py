"""Progress lines for people, the same in every entry point."""

from __future__ import annotations

import logging
import os
import sys


def no_bars_in_logs() -> None:
    """Turn MLflow's artifact progress bars off when stderr is not a terminal (a job's log, a pipe,
    a file): they redraw with carriage returns, which a log reader shows as one line per redraw
    (35 lines per model loaded). A user's own setting wins."""
    if not sys.stderr.isatty():
        os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")


def setup_logging(quiet: bool = False, names: tuple[str, ...] = ("etl",)) -> None:
    """Progress lines on stderr (PySpark may already have put a handler on the root logger)."""
    no_bars_in_logs()
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(name)s] %(message)s", "%H:%M:%S"))
    for name in names:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.WARNING if quiet else logging.INFO)
