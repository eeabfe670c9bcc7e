"""`llmgw service NAME` at start: fixed admin ports, and a start that cannot go on says why in one
line and starts nothing."""

import socket
import subprocess
import sys

from llmgw.agent.config import AgentConfig
from llmgw.bus import ADMIN_PORTS
from llmgw.catalog.service import CatalogConfig
from llmgw.mirror.service import MirrorConfig
from llmgw.router.config import RouterConfig
from llmgw.scheduler.service import SchedulerConfig


def test_each_service_has_a_fixed_admin_port_of_its_own_on_the_loopback():
    configs = {
        "catalog": CatalogConfig(),
        "scheduler": SchedulerConfig(),
        "mirror": MirrorConfig(),
        "router": RouterConfig(),
        "agent": AgentConfig(),
    }
    assert {name: c.admin_port for name, c in configs.items()} == ADMIN_PORTS
    assert len(set(ADMIN_PORTS.values())) == len(ADMIN_PORTS)
    assert {c.admin_host for c in configs.values()} == {"127.0.0.1"}


def _service(*args):
    cmd = [sys.executable, "-m", "llmgw.ctl", "service", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_a_taken_admin_port_is_one_line_at_start_before_nats_is_tried():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # No NATS listens on port 1: a service that tried it would wait there, not exit at once.
        done = _service("catalog", "--admin-port", str(port), "--nats-url", "nats://127.0.0.1:1")
    assert done.returncode == 1
    assert (
        f"admin HTTP on 127.0.0.1:{port}" in done.stdout + done.stderr and "set admin_port" in done.stdout + done.stderr
    )
    assert "Traceback" not in done.stdout + done.stderr


def test_a_wrong_engine_secret_is_one_line_and_exit_2_before_nats_is_tried(tmp_path):
    (tmp_path / "engine.secret").write_text("not a secret\n")
    done = _service("router", "--engine-secret", str(tmp_path / "engine.secret"), "--nats-url", "nats://127.0.0.1:1")
    assert done.returncode == 2
    out = done.stdout + done.stderr
    assert "not an engine secret" in out and "Traceback" not in out


def test_an_agent_whose_engines_listen_off_the_loopback_needs_its_engine_secret(tmp_path):
    done = _service("agent", "--address", "10.0.3.12", "--data-dir", str(tmp_path), "--nats-url", "nats://127.0.0.1:1")
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "keys anyone can work out" in out and "engine-<node>.secret" in out, out
    assert "Traceback" not in out


def test_an_agent_with_credentials_but_no_scheduler_key_is_one_line_and_exit_2(tmp_path):
    from llmgw.bus import new_identity, write_identity

    write_identity(tmp_path / "agent.nk", new_identity("agent", "n"))
    common = ("--data-dir", str(tmp_path), "--nats-url", "nats://127.0.0.1:1", "--creds", str(tmp_path / "agent.nk"))
    done = _service("agent", *common)
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "scheduler_key is not set" in out and "scheduler.pub" in out, out
    assert "Traceback" not in out
    done = _service("agent", *common, "--scheduler-key", str(tmp_path / "none.pub"))
    out = done.stdout + done.stderr
    assert done.returncode == 2 and "none.pub" in out and "No such file" in out, out
