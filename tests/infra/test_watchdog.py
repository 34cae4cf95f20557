"""Services started for a process die with it, however it ends: an owner started here starts a
service through ``infra.services`` with itself as owner, prints the service's process group, and
is killed with SIGKILL (no cleanup of its own can run); within seconds nothing of the service may
be left. The fast case is a stand-in service that ignores SIGTERM and has a child, as an MLflow
server and a Ray head do; the real MLflow server is the slower case."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from infra import services, stack

ROOT = stack.ROOT
# real owner, watchdog and server processes, seconds each: in make test, not the edit loop
pytestmark = pytest.mark.slow

# a server that ignores SIGTERM (as MLflow's and Ray's were seen to for 15 s) with a child
# process in its group that ignores it too
STUBBORN = textwrap.dedent("""
    import http.server, signal, subprocess, sys
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.Popen([sys.executable, "-c", "import signal, time; "
                      "signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])),
                           http.server.SimpleHTTPRequestHandler).serve_forever()
""")

OWNER = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path
    from infra import services
    kind, folder, release = sys.argv[1], Path(sys.argv[2]), sys.argv[3] == "release"
    port = services.free_port()
    if kind == "mlflow":
        svc = services.start_mlflow(folder, port, owner=os.getpid())
        proc, dog = svc.proc, svc.watchdog
    else:
        proc, dog = services._start([sys.executable, "-c", sys.argv[4], str(port)],
                                    folder / "stub.log", f"http://127.0.0.1:{port}/", 60,
                                    owner=os.getpid())
    if release:
        services.release(dog)
    print(os.getpgid(proc.pid), port, dog, flush=True)
    proc.wait()  # collects the server once it is stopped, as infra.services.stop does
    time.sleep(600)
""")


def start_owner(tmp_path, kind: str, release: bool = False) -> tuple[subprocess.Popen, int, int]:
    """The owner process, once its service answers: (owner, the service's pgid, its port); its
    watchdog's pid is ``WATCHDOGS[owner.pid]``."""
    owner = subprocess.Popen([sys.executable, "-c", OWNER, kind, str(tmp_path / kind),
                              "release" if release else "keep", STUBBORN],
                             cwd=ROOT, stdout=subprocess.PIPE, text=True)
    line = owner.stdout.readline()
    assert line, f"the owner exited ({owner.wait()}) before its {kind} service answered"
    pgid, port, dog = line.split()
    WATCHDOGS[owner.pid] = int(dog)
    return owner, int(pgid), int(port)


WATCHDOGS: dict[int, int] = {}  # owner pid -> its watchdog's pid


def watching(pgid: int) -> list[int]:
    """The pids of live watchdogs of process group ``pgid`` (``infra.watchdog --pgid PGID``)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"infra.watchdog" in args and str(pgid).encode() in args:
            found.append(int(pid))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet collected, does not)."""
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_until(condition, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def wait_gone(pgid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not services.group_alive(pgid):
            return True
        time.sleep(0.2)
    return False


def test_an_owner_killed_with_sigkill_takes_its_service_along(tmp_path):
    owner, pgid, port = start_owner(tmp_path, "stub")
    try:
        assert services.group_alive(pgid)
        members = [p for p in os.listdir("/proc") if p.isdigit() and _pgid(int(p)) == pgid]
        assert len(members) >= 2  # the server and its child
        owner.kill()
        owner.wait()
        # polled every second, SIGTERM ignored, SIGKILL 3 s later
        assert wait_gone(pgid, 10), "the owner's service outlived it"
        assert services.port_is_free(port)
        log = (tmp_path / "stub" / "stub.log").read_text()
        assert f"owner {owner.pid} is gone" in log and "sent SIGKILL" in log, log
    finally:
        owner.kill()
        services.stop_group(pgid, 1)


def test_a_released_service_outlives_its_owner(tmp_path):
    """What the demo does when it finishes: its stack stays up for the MLflow UI."""
    owner, pgid, _ = start_owner(tmp_path, "stub", release=True)
    try:
        # released: its watchdog has exited (reaped by the owner), and no other watches the
        # group, so nothing is left that could stop it when the owner ends
        assert wait_until(lambda: not running(WATCHDOGS[owner.pid]) and watching(pgid) == [], 30)
        owner.kill()
        owner.wait()
        assert services.group_alive(pgid)
    finally:
        services.stop_group(pgid, 1)
    assert not services.group_alive(pgid)


def test_an_owners_mlflow_server_goes_with_it(tmp_path):
    """The real server (about 20 s to start here), whose workers are in its process group."""
    owner, pgid, port = start_owner(tmp_path, "mlflow")
    try:
        owner.kill()
        owner.wait()
        assert wait_gone(pgid, 15), "the MLflow server outlived its owner"
        assert services.port_is_free(port)
    finally:
        owner.kill()
        services.stop_group(pgid, 1)


def test_the_watchdog_leaves_when_the_services_are_stopped_the_ordinary_way(tmp_path):
    owner, pgid, _ = start_owner(tmp_path, "stub")
    try:
        dog = next(int(p) for p in os.listdir("/proc") if p.isdigit()
                   and f"--pgid\0{pgid}" in _cmdline(int(p)))
        services.stop_group(pgid, 1)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _cmdline(dog):
            time.sleep(0.2)
        assert not _cmdline(dog), "the watchdog stayed after its services were stopped"
    finally:
        owner.kill()
        owner.wait()
        services.stop_group(pgid, 1)


def _pgid(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except ProcessLookupError:
        return None


def _cmdline(pid: int) -> str:
    """The process's command line, '' once it is gone or a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                return ""
        with open(f"/proc/{pid}/cmdline") as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError):
        return ""


@pytest.mark.ray
def test_the_session_stack_is_watched_and_a_users_is_not(local_stack):
    for svc in local_stack.services.values():
        assert svc.owner == os.getpid() and _cmdline(svc.watchdog)
    assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL  # SIGTERM stops the stack


def test_free_ports_come_from_below_the_kernels_ephemeral_range():
    """The ports handed to servers are ones the kernel never assigns by itself (a Ray head's
    processes binding port 0 cannot take them before the server binds), each bindable."""
    import socket

    span = services.chosen_range()
    lo = int(services.EPHEMERAL_RANGE.read_text().split()[0])
    assert span is not None and span.stop == lo and len(span) >= 1000
    ports = services.free_ports(6)
    assert len(set(ports)) == 6 and all(p in span for p in ports)
    for p in ports:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_free_ports_skip_a_taken_candidate_and_fall_back_to_the_kernel(monkeypatch, tmp_path):
    """A candidate in use is skipped, and once the candidates run out the kernel chooses; where
    the range cannot be read there are no candidates."""
    import socket

    with socket.socket() as taken, socket.socket() as spare:
        taken.bind(("127.0.0.1", 0))
        spare.bind(("127.0.0.1", 0))
        p, q = taken.getsockname()[1], spare.getsockname()[1]
        spare.close()
        monkeypatch.setattr(services, "chosen_range", lambda: [p, q])
        ports = services.free_ports(3)
    assert p not in ports and q in ports and len(set(ports)) == 3
    monkeypatch.undo()
    monkeypatch.setattr(services, "EPHEMERAL_RANGE", tmp_path / "absent")
    assert services.chosen_range() is None
    assert len(set(services.free_ports(3))) == 3


def test_free_ports_are_distinct_and_avoid_the_given_ones(monkeypatch):
    """Ports probed one at a time can come back twice (a Ray head once got the same port for its
    GCS and its metrics exporter, and refused to start): the probe sockets stay bound until all are
    chosen, and a port the kernel repeats or the caller already uses is skipped."""
    import socket

    handed = iter([5001, 5001, 5002, 6379, 5003, 5004, 5005, 5005, 5006, 5007, 5008])

    class FakeSocket:
        def bind(self, address):
            self.port = next(handed)

        def getsockname(self):
            return ("127.0.0.1", self.port)

        def close(self):
            pass

    monkeypatch.setattr(socket, "socket", FakeSocket)
    assert services.free_ports(3, avoid=(6379,)) == [5001, 5002, 5003]
    assert services.ray_side_ports(head=False, avoid=(5004,)) == [
        "--dashboard-agent-listen-port", "5005", "--dashboard-agent-grpc-port", "5006",
        "--metrics-export-port", "5007", "--runtime-env-agent-port", "5008"]
