"""Progress lines for people, the same in every entry point."""

from __future__ import annotations

import logging
import sys


def setup_logging(quiet: bool = False, names: tuple[str, ...] = ("etl",)) -> None:
    """Progress lines on stderr (PySpark may already have put a handler on the root logger)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s [%(name)s] %(message)s", "%H:%M:%S"))
    for name in names:
        logger = logging.getLogger(name)
        logger.handlers[:] = [handler]
        logger.propagate = False
        logger.setLevel(logging.WARNING if quiet else logging.INFO)
