"""A second machine joins the fleet a first one runs, on two machines made here (network
namespaces, `tests/machines.py`): `llmgw up --listen` on the first, `llmgw node invite` there,
`llmgw node join` on the second with the printed command; its agent signs in to the first
machine's NATS with the identity it was handed and registers. A token used twice, an expired
one, a name taken, a wrong fingerprint (nothing sent), a server that is not the first machine:
each refused, saying why."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time

import pytest

from llmgw.ctl.join import JoinError, invite, redeem
from tests.machines import Machines

LLMGW = [sys.executable, "-m", "llmgw.ctl"]


@pytest.fixture(scope="module")
def machines():
    made = Machines(3)  # the third is no machine of the fleet: the firewall keeps it out
    yield made
    made.close()


@pytest.fixture(scope="module")
def first(machines, tmp_path_factory):
    home = tmp_path_factory.mktemp("first")
    command = machines.command(0, *LLMGW, "up", "--data-dir", str(home), "--no-demo", "--listen", machines.addresses[0])
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and not any("curl " in line for line in lines):
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
    printed = "".join(lines)
    assert "machines join:" in printed, printed
    out = home / "up.out"  # what it says after (a machine joined...): read by the tests
    threading.Thread(target=lambda: out.write_text("".join(proc.stdout)), daemon=True).start()
    yield home
    proc.terminate()
    proc.wait(60)


def _ctl(machines, home, *words):
    return machines.run(0, *LLMGW, "ctl", "--data-dir", str(home), *words)


def test_a_machine_joins_with_a_one_time_token_and_its_agent_registers(machines, first, tmp_path):
    bad = machines.run(0, *LLMGW, "node", "invite", "no such name!", "--data-dir", str(first))
    assert bad.returncode == 1 and "cannot name a node" in bad.stderr
    made = machines.run(0, *LLMGW, "node", "invite", "m2", "--data-dir", str(first))
    assert made.returncode == 0 and "may join for 15 minutes, once" in made.stderr, made.stderr
    again = machines.run(0, *LLMGW, "node", "invite", "m2", "--data-dir", str(first))
    assert again.returncode == 1 and "'m2' is invited already" in again.stderr
    words = made.stdout.split()
    assert words[:3] == ["llmgw", "node", "join"] and words[3] == f"https://{machines.addresses[0]}:9470"
    url, token, fingerprint = words[3], words[4], words[6]

    wrong = machines.run(1, *LLMGW, "node", "join", url, token, "--fingerprint", "00" * 32, "--data-dir", str(tmp_path))
    assert wrong.returncode == 1 and "is not the machine that invited this one" in wrong.stderr
    assert "nothing was sent" in wrong.stderr and not (tmp_path / "creds" / "agent-m2.nk").exists()

    home = tmp_path / "second"
    joined = subprocess.Popen(
        machines.command(1, *LLMGW, "node", "join", url, token, "--fingerprint", fingerprint, "--data-dir", str(home)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        said = joined.stdout.readline()
        assert f"this machine is node m2 of the fleet at nats://{machines.addresses[0]}:4222" in said, said
        seed = home / "creds" / "agent-m2.nk"
        assert seed.stat().st_mode & 0o777 == 0o600
        for _ in range(240):  # the agent measures the machine, then registers
            listed = _ctl(machines, first, "nodes", "--json")
            nodes = {n["node"]: n for n in json.loads(listed.stdout or "{}").get("nodes", [])}
            if "m2" in nodes:
                break
            time.sleep(0.5)
        assert "m2" in nodes, (listed.stderr, (home / "logs" / "agent.log").read_text()[-2000:])
        table = _ctl(machines, first, "nodes").stdout
        assert re.search(r"^m2\s+ready", table, re.M), table

        used = machines.run(1, *LLMGW, "node", "join", url, token, "--fingerprint", fingerprint, "--data-dir", "/tmp/x")
        assert used.returncode == 1 and "not known here, or was used already" in used.stderr
        taken = machines.run(0, *LLMGW, "node", "invite", "m2", "--data-dir", str(first))
        assert taken.returncode == 1 and "there is already a node 'm2'" in taken.stderr
        _the_firewall_lets_in_the_fleet_only(machines)
    finally:
        joined.terminate()
        joined.wait(60)


def _reaches(machines, source: int, address: str, port: int) -> bool:
    probe = f"import socket; socket.create_connection(('{address}', {port}), timeout=2).close()"
    return machines.run(source, sys.executable, "-c", probe).returncode == 0


def _the_firewall_lets_in_the_fleet_only(machines) -> None:
    """m2's agent keeps its nftables table: its engines' ports and admin port take the fleet's
    machines (m1: the router, the scheduler, an agent) and nobody else (m3)."""
    first, second = machines.addresses[0], machines.addresses[1]
    for _ in range(60):
        table = machines.run(1, "nft", "list", "table", "inet", "llmgw").stdout
        if first in table:
            break
        time.sleep(0.5)
    assert first in table and second in table, table
    listener = subprocess.Popen(
        machines.command(
            1, sys.executable, "-c", f"import socket,time; s=socket.create_server(('{second}', 20999)); time.sleep(120)"
        )
    )
    try:
        time.sleep(0.5)
        assert _reaches(machines, 0, second, 20999)  # a machine of the fleet
        assert not _reaches(machines, 2, second, 20999)  # a stranger on the same network
        assert not _reaches(machines, 2, second, 9465)  # nor the agent's admin port
    finally:
        listener.kill()


def test_an_expired_token_is_refused_and_one_token_is_taken_once(tmp_path):
    token = invite(tmp_path, "late", now=1000.0, ttl_s=60)
    with pytest.raises(JoinError, match="expired"):
        redeem(tmp_path, token, now=1061.0)
    fresh = invite(tmp_path, "late", now=2000.0)
    assert redeem(tmp_path, fresh, now=2001.0) == "late"
    with pytest.raises(JoinError, match="used already"):
        redeem(tmp_path, fresh, now=2002.0)
    assert not list((tmp_path / "join" / "tokens").iterdir())  # nothing of a token is left


def test_a_client_that_connects_and_says_nothing_holds_up_no_join(tmp_path):
    import socket

    from llmgw.ctl.join import JoinServer, fetch_bundle

    server = JoinServer(tmp_path, "127.0.0.1", 0, "nats://127.0.0.1:4222", lambda node, address: None).start()
    try:
        port = int(server.url.rsplit(":", 1)[1])
        silent = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]  # no handshake, ever
        started = time.monotonic()
        with pytest.raises(JoinError, match="not known here"):  # answered beside them, at once
            fetch_bundle(server.url, "llmgw-join-nobody", server.fingerprint, timeout=5)
        assert time.monotonic() - started < 5
        for s in silent:
            s.close()
    finally:
        server.stop()


def test_the_identities_are_given_only_to_a_member_showing_a_route_certificate_of_the_fleet(tmp_path):
    from llmgw.ctl.cluster import issue_route_certificate, write_member_tls
    from llmgw.ctl.join import JoinServer, fetch_identities

    first, member, stranger = tmp_path / "first", tmp_path / "member", tmp_path / "stranger"
    route = write_member_tls(member, *issue_route_certificate(first, "m2", "127.0.0.1"))  # the fleet's CA
    forged = write_member_tls(stranger, *issue_route_certificate(stranger, "m2", "127.0.0.1"))  # a CA of its own
    server = JoinServer(first, "127.0.0.1", 0, "nats://127.0.0.1:4222", lambda node, address: None)
    server.identities = lambda: [("router", "", "UABC")]
    server.start()
    try:
        assert fetch_identities(server.url, server.fingerprint, route) == [("router", "", "UABC")]
        with pytest.raises(JoinError, match="gave no identities"):  # its certificate fails the handshake
            fetch_identities(server.url, server.fingerprint, forged)
    finally:
        server.stop()


def test_a_machine_is_taken_for_the_address_it_joins_from_never_for_the_one_it_names(tmp_path):
    from llmgw.ctl.join import JoinServer

    seen = []
    server = JoinServer(tmp_path, "127.0.0.1", 0, "nats://127.0.0.1:4222", lambda node, address: seen.append(address))
    token = invite(tmp_path, "m2", now=time.time())
    (tmp_path / "creds").mkdir()
    for name in ("agent-m2.nk", "engine-m2.secret", "scheduler.pub"):  # what `admit` would have made
        (tmp_path / "creds" / name).write_text("x")
    asked = json.dumps({"token": token, "address": "10.9.9.2"}).encode()  # claims an HA address
    status, _ = server.answer("/v1/join", asked, "10.9.9.77")
    assert status == 200 and seen == ["10.9.9.77"]
    server.httpd.server_close()
