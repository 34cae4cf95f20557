"""Which Ray cluster a driver (training/train.py, training/experiment.py) joins."""

from __future__ import annotations

import os

from prepared.errors import UsageError


def join_address(explicit: str | None) -> str | None:
    """``--ray-address``, else ``$RAY_ADDRESS``; None: start a local Ray.

    An ``http(s)://`` address is a job server's (the dashboard's): what ``ray job submit`` wants,
    and what the local stack's printed exports set, so a shell that submits jobs has it. ``ray.init``
    needs the head's GCS address (HOST:6379) instead, and would refuse in a traceback; inside a
    submitted job Ray sets RAY_ADDRESS to the GCS address itself."""
    address = explicit or os.environ.get("RAY_ADDRESS") or None
    if address and address.startswith(("http://", "https://")):
        where = "--ray-address" if explicit else "RAY_ADDRESS"
        raise UsageError(
            f"{where}={address} is a Ray job server's address (what `ray job submit` takes); a "
            "driver run directly joins the head by its GCS address: pass --ray-address HOST:6379 "
            "(the local stack's: 127.0.0.1:6379, `python -m infra.stack status` prints it), submit "
            "this command with `ray job submit -- python ...`, or unset RAY_ADDRESS to start a "
            "local Ray")
    return address
