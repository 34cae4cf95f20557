"""Stop services when the process that owns them is gone.

    python -m infra.watchdog --owner PID --pgid G [--pgid G2 ...]

A test session or a demo starts an MLflow server and a Ray head in process groups of their own,
so that one signal stops each; but a group of its own also survives its owner: killed by a
timeout (SIGKILL), the owner cannot stop anything, and the servers were seen re-parented to init,
running on. This process, detached from the owner (its own session), polls the owner every
second; once the owner is gone it sends SIGTERM to every group, then SIGKILL to what is left a
few seconds later (an MLflow server and a Ray head were seen to ignore SIGTERM for 15 s). It exits
by itself when the groups are gone (stopped the ordinary way), and on SIGUSR1 without stopping
anything: the owner hands the services over to the user (the demo's stack stays up for the UI).

The user's own stack (``make stack``) has no watchdog: it runs until ``make stop``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

from infra.services import group_alive

POLL = 1.0    # seconds between looks at the owner
GRACE = 3.0   # seconds between SIGTERM and SIGKILL


def start_time(pid: int) -> str | None:
    """The process's start time (clock ticks since boot, /proc/PID/stat field 22), None if it
    is gone or a zombie: with it a pid reused by a new process does not pass for the owner."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None
    except OSError:  # no /proc (macOS): whether the pid exists is all we can tell
        try:
            os.kill(pid, 0)
            return "?"
        except ProcessLookupError:
            return None
        except PermissionError:
            return "?"
    return None if fields[0] in ("Z", "X") else fields[19]


def running(pgid: int) -> bool:
    """Whether a process of the group ``pgid`` still runs: zombies do not count (a stopped
    service's leader stays one until its parent, the owner, collects it)."""
    if not group_alive(pgid):
        return False
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:  # no /proc: the group exists, zombies or not
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] not in ("Z", "X"):
            return True
    return False


def stop_groups(pgids: list[int], grace: float = GRACE, log=print) -> None:
    """SIGTERM every group at once, SIGKILL what is left after ``grace`` seconds."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        alive = [g for g in pgids if running(g)]
        for g in alive:
            try:
                os.killpg(g, sig)
            except ProcessLookupError:
                pass
        if alive:
            log(f"watchdog: sent {signal.Signals(sig).name} to process group(s) "
                + ", ".join(map(str, alive)))
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(running(g) for g in pgids):
            time.sleep(0.1)
        if not any(running(g) for g in pgids):
            return


def watch(owner: int, pgids: list[int], poll: float = POLL, grace: float = GRACE,
          log=print) -> str:
    """Poll until the owner is gone (then stop the groups) or the groups are; returns which."""
    born = start_time(owner)
    while True:
        if not any(running(g) for g in pgids):
            return "groups gone"
        if born is None or start_time(owner) != born:
            log(f"watchdog: owner {owner} is gone; stopping process group(s) "
                + ", ".join(map(str, pgids)))
            stop_groups(pgids, grace, log)
            return "owner gone"
        time.sleep(poll)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m infra.watchdog", description=__doc__.split("\n\n")[0])
    p.add_argument("--owner", type=int, required=True, help="the pid whose end stops the groups")
    p.add_argument("--pgid", type=int, action="append", required=True,
                   help="a process group to stop (repeat for several)")
    p.add_argument("--poll", type=float, default=POLL, help="seconds between looks (default 1)")
    p.add_argument("--grace", type=float, default=GRACE,
                   help="seconds between SIGTERM and SIGKILL (default 3)")
    args = p.parse_args(argv)
    # released: the owner hands the services over; leave them running
    signal.signal(signal.SIGUSR1, lambda *_: sys.exit(0))
    log = lambda s: print(time.strftime("%H:%M:%S ") + s, file=sys.stderr, flush=True)  # noqa: E731
    watch(args.owner, args.pgid, args.poll, args.grace, log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
