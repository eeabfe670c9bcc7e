"""The fleet's first three machines as its HA machines, on three machines made here (network
namespaces, `tests/machines.py`): `llmgw up --listen A1 --ha A2,A3` on the first waits for the
other two; `llmgw node join` at A2 and A3 each starts a NATS cluster member (routes over mutual
TLS), a router and an agent. A key made through one machine's router works on another's; with the
first machine's cable pulled, the other two still answer and still take changes (everything is
kept in three copies; two carry on)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest

from llmgw.ctl.cluster import HaError, check_ha
from tests.machines import Machines
from tests.releases import install

LLMGW = [sys.executable, "-m", "llmgw.ctl"]

_HTTP = """
import json, sys, urllib.request, urllib.error
url, key, body = sys.argv[1], sys.argv[2], sys.argv[3]
ask = urllib.request.Request(url, data=body.encode() or None, headers={"authorization": "Bearer " + key,
    "content-type": "application/json"})
try:
    with urllib.request.urlopen(ask, timeout=5) as answer:
        print(answer.status, answer.read().decode())
except urllib.error.HTTPError as exc:
    print(exc.code, exc.read().decode())
except OSError as exc:
    print(0, exc)
"""


def _http(machines, source: int, url: str, key: str, body: str = "") -> tuple[int, str]:
    """Ask `url` from machine `source`: the status (0: no answer) and the body."""
    said = machines.run(source, sys.executable, "-c", _HTTP, url, key, body, timeout=30).stdout
    status, _, text = said.partition(" ")
    return int(status or 0), text


def _until_line(proc: subprocess.Popen, lines: list[str], words: str, timeout: float) -> str:
    """Read `proc`'s output until a line holds `words` (everything read kept in `lines`)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if words in line:
            return line
    raise AssertionError(f"no line with {words!r}: {''.join(lines)[-3000:]}")


def _join(machines, first_home, machine: int, name: str, home, *flags: str) -> subprocess.Popen:
    made = machines.run(0, *LLMGW, "node", "invite", name, "--data-dir", str(first_home))
    assert made.returncode == 0, made.stderr
    words = made.stdout.split()
    command = [*LLMGW, *words[1:], "--data-dir", str(home), *flags]
    return subprocess.Popen(
        machines.command(machine, *command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def test_the_ha_addresses_are_this_machine_and_two_more_each_an_address():
    assert check_ha("10.0.0.1", []) == []
    assert check_ha("10.0.0.1", ["10.0.0.2", "10.0.0.3"]) == ["10.0.0.1", "10.0.0.2", "10.0.0.3"]
    for listen, others, says in (
        ("127.0.0.1", ["10.0.0.2", "10.0.0.3"], "needs --listen ADDR"),
        ("10.0.0.1", ["10.0.0.2"], "the members are three"),
        ("10.0.0.1", ["10.0.0.2", "node3"], "'node3' is not an IPv4 address"),
        ("10.0.0.1", ["10.0.0.2", "fd00::3"], "'fd00::3' is not an IPv4 address"),
        ("10.0.0.1", ["10.0.0.2", "10.0.0.1"], "repeat"),
    ):
        with pytest.raises(HaError, match=says):
            check_ha(listen, others)


def test_up_with_one_ha_address_is_refused_saying_the_members_are_three(tmp_path):
    done = subprocess.run(
        [*LLMGW, "up", "--data-dir", str(tmp_path), "--no-demo", "--listen", "10.9.9.1", "--ha", "10.9.9.2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "the members are three" in done.stderr, done.stderr


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    """Three HA machines up: (machines, the admin API key, what each machine's process said, and
    each one's data directory)."""
    machines = Machines(4)  # the fourth joins later, with its agent alone
    first = tmp_path_factory.mktemp("m1")
    a1, a2, a3, _ = machines.addresses
    up = [*LLMGW, "up", "--data-dir", str(first), "--no-demo", "--listen", a1, "--ha", f"{a2},{a3}"]
    procs = [subprocess.Popen(machines.command(0, *up), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)]
    said: list[list[str]] = [[], [], []]
    homes = [first]
    try:
        _until_line(procs[0], said[0], "waiting for the other HA machines", 60)
        for machine in (1, 2):
            homes.append(tmp_path_factory.mktemp(f"m{machine + 1}"))
            flags = ("--no-firewall",) if machine == 2 else ()  # m3 leaves its firewall to its operator
            procs.append(_join(machines, first, machine, f"m{machine + 1}", homes[machine], *flags))
            _until_line(procs[machine], said[machine], "  firewall: ", 60)  # printed after "agent: started"
        _until_line(procs[0], said[0], "curl ", 180)
        for i, proc in enumerate(procs):  # keep reading, so no pipe fills
            threading.Thread(target=lambda p=proc, s=said[i]: s.extend(p.stdout), daemon=True).start()
        yield machines, (first / "up" / "api-key").read_text().strip(), said, homes
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        machines.close()


_LOAD = """
import os, sys, time, urllib.request
url, key, until = sys.argv[1], sys.argv[2], sys.argv[3]  # until: seconds, or a file whose making ends it
ok = failed = 0
ask = urllib.request.Request(url, headers={"authorization": "Bearer " + key})
end = time.monotonic() + float(until) if until.replace(".", "").isdigit() else None
while (time.monotonic() < end) if end is not None else not os.path.exists(until):
    try:
        with urllib.request.urlopen(ask, timeout=15) as answer:
            ok += answer.status == 200
            failed += answer.status != 200
    except OSError:
        failed += 1
    time.sleep(0.02)
print(ok, failed)
"""


def _made_key(machines, source: int, router: str, admin: str, name: str) -> str:
    status, body = _http(machines, source, f"http://{router}:8080/api/v1/keys", admin, json.dumps({"name": name}))
    assert status == 201, (status, body)
    return json.loads(body)["key"]


def test_each_ha_machine_runs_a_router_and_a_change_made_through_one_is_seen_by_the_others(fleet):
    machines, admin, said, homes = fleet
    a1, a2, a3, _ = machines.addresses
    joined = "".join(said[1])
    assert f"NATS: a cluster member at {a2}:4222, its routes to {a1}, {a3} over TLS" in joined, joined
    assert f"router: the OpenAI endpoint on http://{a2}:8080/v1" in joined
    assert "firewall: the agent keeps nftables table inet llmgw" in joined
    assert "firewall: left out (--no-firewall)" in "".join(said[2])
    for _ in range(120):  # m2's agent keeps its firewall; m3's was told to leave it alone
        if "inet llmgw" in machines.run(1, "nft", "list", "tables").stdout:
            break
        time.sleep(0.25)
    assert "inet llmgw" in machines.run(1, "nft", "list", "tables").stdout
    assert "inet llmgw" not in machines.run(2, "nft", "list", "tables").stdout
    for router in (a1, a2, a3):
        for _ in range(120):  # each router listens once its services have started
            status, body = _http(machines, 2, f"http://{router}:8080/v1/models", admin)
            if status == 200:
                break
            time.sleep(0.5)
        assert status == 200, (router, status, body)
    for home in homes:  # the keys' bucket is kept on every member (three copies)
        assert (home / "nats" / "jetstream" / "$G" / "streams" / "KV_llmgw_keys").is_dir(), home
    key = _made_key(machines, 0, a2, admin, "made-on-m2")
    for router in (a1, a3):
        for _ in range(40):
            status, body = _http(machines, 1, f"http://{router}:8080/v1/models", key)
            if status == 200:
                break
            time.sleep(0.25)
        assert status == 200, (router, status, body)


def test_a_machine_that_joins_later_runs_its_agent_and_every_member_lets_it_in(fleet, tmp_path):
    machines, _, _, homes = fleet
    proc = _join(machines, homes[0], 3, "m4", tmp_path)
    try:
        said: list[str] = []
        _until_line(proc, said, "agent: started", 60)
        assert "left to the HA machines" in "".join(said) and ",nats://" in said[0], said
        for home in homes[1:]:  # each member asks the first machine for the identities again
            conf = home / "nats" / "server.conf"
            for _ in range(120):
                if "# agent-m4" in conf.read_text():
                    break
                time.sleep(0.25)
            assert "# agent-m4" in conf.read_text(), home
        for _ in range(240):
            listed = machines.run(0, *LLMGW, "ctl", "--data-dir", str(homes[0]), "nodes", "--json")
            if "m4" in {n["node"] for n in json.loads(listed.stdout or "{}").get("nodes", [])}:
                break
            time.sleep(0.5)
        else:
            raise AssertionError((tmp_path / "logs" / "agent.log").read_text()[-2000:])
    finally:
        proc.terminate()
        proc.wait(60)


@pytest.mark.long  # `just long`: the HA fleet's other cases and one machine's upgrade run in ./dev test
def test_an_upgrade_goes_machine_by_machine_and_the_gateway_never_fails_a_request(fleet, tmp_path):
    machines, admin, _, homes = fleet
    _, a2, _, _ = machines.addresses
    for home in homes:
        install(home, "next")
    stop = tmp_path / "stop"
    steady = subprocess.Popen(  # a client of m2's router, asking all along: m2 is upgraded too
        machines.command(1, sys.executable, "-c", _LOAD, f"http://{a2}:8080/v1/models", admin, str(stop)),
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        began = time.monotonic()
        moved = machines.run(0, *LLMGW, "ctl", "--data-dir", str(homes[0]), "upgrade", "next", timeout=600)
        took = time.monotonic() - began
        assert moved.returncode == 0, moved.stdout + moved.stderr
        lines = moved.stdout.splitlines()
        order = [line.split("(")[1].split(")")[0] for line in lines if line.endswith(": runs next")]
        assert len(order) == 3 and order[1:] == ["m2", "m3"], moved.stdout  # the first machine (its services) first
    finally:
        stop.touch()
    ok, failed = map(int, steady.communicate(timeout=60)[0].split())
    assert ok > 100 and failed == 0, (ok, failed)
    print(f"HA, upgrade of three machines: {took:.1f} s; m2's router answered {ok} requests, {failed} failed")
    back = machines.run(0, *LLMGW, "ctl", "--data-dir", str(homes[0]), "upgrade", "--rollback", timeout=600)
    assert back.returncode == 0 and "every machine runs installed" in back.stdout, back.stdout + back.stderr


def test_with_the_first_machines_cable_pulled_the_other_two_answer_and_take_changes(fleet):
    machines, admin, _, _ = fleet
    _, a2, a3, _ = machines.addresses
    steady = subprocess.Popen(  # a client of m2's router, asking all along
        machines.command(2, sys.executable, "-c", _LOAD, f"http://{a2}:8080/v1/models", admin, "20"),
        stdout=subprocess.PIPE,
        text=True,
    )
    time.sleep(2)
    machines.cut(0)
    try:
        cut_at = time.monotonic()
        for _ in range(240):  # the cluster elects new leaders for what the first machine led
            status, body = _http(machines, 2, f"http://{a2}:8080/api/v1/keys", admin, json.dumps({"name": "after-cut"}))
            if status == 201:
                break
            time.sleep(0.25)
        assert status == 201, (status, body)
        recovered_s = time.monotonic() - cut_at
        key = json.loads(body)["key"]
        # A router's watch whose consumer was on the lost machine starts again after two missed
        # heartbeats (nats-py's ordered consumer: 10 to 15 s).
        for _ in range(160):
            status, body = _http(machines, 1, f"http://{a3}:8080/v1/models", key)
            if status == 200:
                break
            time.sleep(0.25)
        assert status == 200, (status, body)
        seen_s = time.monotonic() - cut_at
        ok, failed = map(int, steady.communicate(timeout=60)[0].split())
        assert ok > 100 and failed == 0, (ok, failed)  # m2's clients never noticed
        said = f"a change taken after {recovered_s:.1f} s, seen by another router after {seen_s:.1f} s"
        print(f"HA, cable pulled: {said}; m2's router answered {ok} requests in 20 s around it, {failed} failed")
    finally:
        machines.mend(0)
