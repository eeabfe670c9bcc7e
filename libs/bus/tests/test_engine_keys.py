"""Engine keys: worked out by the router from the fleet secret and by an agent from its node's,
the same key both ways, and no node able to work out another's."""

import stat

import pytest

from llmgw.bus import EngineKeys, EngineSecretError, new_fleet_secret, node_secret, write_secret


def test_the_router_and_the_agent_work_out_the_same_key_for_a_replica():
    fleet = new_fleet_secret()
    router = EngineKeys.parse(fleet, "fleet")
    agent_a = EngineKeys.parse(node_secret(fleet, "a"), "a")
    assert router.key("a", "r1") == agent_a.key("a", "r1")
    assert router.key("a", "r1") != router.key("a", "r2") != router.key("b", "r2")
    assert len(router.key("a", "r1")) == 32 and not router.insecure


def test_a_nodes_secret_cannot_work_out_another_nodes_keys():
    agent_a = EngineKeys.parse(node_secret(new_fleet_secret(), "a"), "a")
    with pytest.raises(EngineSecretError, match="node a's keys, not node b's"):
        agent_a.key("b", "r1")


def test_two_fleets_give_different_keys():
    assert EngineKeys.parse(new_fleet_secret(), "x").key("a", "r") != EngineKeys.parse(new_fleet_secret(), "y").key(
        "a", "r"
    )


def test_secret_files_are_private_and_read_back_for_their_node(tmp_path):
    fleet = new_fleet_secret()
    write_secret(tmp_path / "fleet.secret", fleet)
    write_secret(tmp_path / "a.secret", node_secret(fleet, "a"))
    assert stat.S_IMODE((tmp_path / "a.secret").stat().st_mode) == 0o600
    router = EngineKeys.read(str(tmp_path / "fleet.secret"))
    agent_a = EngineKeys.read(str(tmp_path / "a.secret"), node="a")
    assert router.key("a", "r1") == agent_a.key("a", "r1")
    assert EngineKeys.read(str(tmp_path / "fleet.secret"), node="a").key("a", "r1") == agent_a.key("a", "r1")


def test_a_wrong_secret_file_says_which_and_what_to_do(tmp_path):
    fleet = new_fleet_secret()
    write_secret(tmp_path / "a.secret", node_secret(fleet, "a"))
    (tmp_path / "junk").write_text("hello\n")
    with pytest.raises(EngineSecretError, match="is node a's, and this is node b: give each agent its own"):
        EngineKeys.read(str(tmp_path / "a.secret"), node="b")
    with pytest.raises(EngineSecretError, match="the router needs the fleet's"):
        EngineKeys.read(str(tmp_path / "a.secret"))
    with pytest.raises(EngineSecretError, match=r"junk: not an engine secret .*`llmgw up`"):
        EngineKeys.read(str(tmp_path / "junk"))
    with pytest.raises(EngineSecretError, match="none: No such file"):
        EngineKeys.read(str(tmp_path / "none"))
    with pytest.raises(EngineSecretError, match="not from another node's"):
        node_secret(node_secret(fleet, "a"), "b")


def test_no_secret_gives_keys_anyone_can_work_out():
    assert EngineKeys.read("").insecure and EngineKeys.read("").key("a", "r") == EngineKeys(b"").key("a", "r")
