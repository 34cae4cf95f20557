"""Faults a test injects into a running training job through ``training.hooks``
(``NCE_TEST_HOOK=training.faults:kill_a_rank:2``); nothing in a normal run calls them."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

MARKER = "fault-injected.txt"


def kill_a_rank(context: dict, epoch: str | None) -> None:
    """Rank 1 (rank 0 when alone) exits hard (SIGKILL) at the start of 0-based ``epoch``, once
    per run directory: it leaves RUN_DIR/fault-injected.txt, so the restarted worker runs on."""
    rank = context["rank"]
    if context["epoch"] != int(epoch) or rank != min(1, context["world"] - 1):
        return
    marker = Path(context["run_dir"] + "/" + MARKER)
    if not marker.exists():
        marker.write_text(f"killed rank {rank} at the start of epoch {context['epoch'] + 1}\n")
        # let Ray Train's controller collect the last epoch's reports first (it polls the
        # workers every RAY_TRAIN_HEALTH_CHECK_INTERVAL_S, 2 s by default and 0.25 s on the
        # project's stack): a worker dying mid-epoch, not mid-report, is the case to test
        interval = float(os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "2"))
        time.sleep(max(1.0, 3 * interval))
        os.kill(os.getpid(), signal.SIGKILL)


RELEASE = "release.txt"


def hold_rank0(context: dict, epoch: str | None) -> None:
    """Rank 0 stops at the start of 0-based ``epoch`` for up to 10 minutes, once per run
    directory (RUN_DIR/held.txt), or until the test writes RUN_DIR/release.txt: a test kills a
    service under a run that is surely mid-way, without training dozens of epochs to make the
    race unlikely; the rerun (or, released, the run itself) goes on."""
    if context["epoch"] != int(epoch) or context["rank"] != 0:
        return
    marker = Path(context["run_dir"] + "/held.txt")
    if not marker.exists():
        marker.write_text(f"held rank 0 at the start of epoch {context['epoch'] + 1}\n")
        release = Path(context["run_dir"] + "/" + RELEASE)
        deadline = time.monotonic() + 600
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
