"""The local stack script (``infra.stack``) on the session's real stack: a second start reuses it,
status sees it, a taken port is refused with a clear message. (Stopping it leaving nothing behind
is asserted when the session's ``local_stack`` fixture ends.)"""

from __future__ import annotations

import json
import socket

import pytest

from infra import services, stack

pytestmark = pytest.mark.ray


def test_second_start_reuses_the_running_stack(local_stack):
    said = []
    again = stack.start(state=local_stack.state, mlflow_config=local_stack.mlflow_config,
                        log=said.append)
    assert {k: v.pgid for k, v in again.items()} == \
        {k: v.pgid for k, v in local_stack.services.items()}
    assert len(said) == 2 and all("already running" in s and "reusing" in s for s in said)
    lines = []
    assert stack.status(local_stack.state, log=lines.append)
    assert sorted(lines) == sorted(f"{k}: up at {v.url}" for k, v in local_stack.services.items())


def test_a_taken_port_is_refused_with_the_port_and_the_fix(local_stack, tmp_path):
    port = int(local_stack.services["mlflow"].url.rsplit(":", 1)[1])
    config = tmp_path / "server.json"
    config.write_text(json.dumps({"port": port, "state_dir": str(tmp_path / "m")}))
    with pytest.raises(services.ServiceError,
                       match=rf"port {port} on 127.0.0.1 is taken \(wanted for the MLflow server\); "
                             "stop what uses it or pick another port"):
        stack.start(state=tmp_path / "state", mlflow_config=config, log=lambda s: None)
    assert not stack.read_record(tmp_path / "state")  # nothing recorded, nothing started


def test_status_of_a_dead_stack_says_down(tmp_path):
    with socket.socket() as s:  # a recorded service whose process group is gone
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    stack.write_record({"mlflow": stack.Running("mlflow", 2**22 + 12345, f"http://127.0.0.1:{port}",
                                                "", "")}, tmp_path)
    lines = []
    assert not stack.status(tmp_path, log=lines.append)
    assert lines == [f"mlflow: DOWN (recorded at http://127.0.0.1:{port})", "ray: not started"]


def test_bad_mlflow_settings_name_the_file(tmp_path):
    bad = tmp_path / "server.json"
    bad.write_text("{port: 5000")
    with pytest.raises(services.ServiceError, match=rf"{bad}: cannot read the MLflow server settings"):
        stack.mlflow_settings(bad)
