"""What an agent answers for its machine's release: refused where nobody supervises it, where the
release is not installed, and where another upgrade is under way; else passed to its supervisor."""

import pytest

from llmgw.agent.upgrade import Upgrades
from llmgw.bus import read_release_ask, write_release
from llmgw.proto.errors import BadRequest, Conflict
from llmgw.proto.release import Release, ReleaseAsk


def _installed(home, version: str) -> None:
    python = home / "releases" / version / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\n")
    python.chmod(0o755)


async def test_an_agent_nobody_supervises_says_to_upgrade_it_another_way(tmp_path):
    upgrades = Upgrades(tmp_path, "n1")
    assert (await upgrades.show(None)).state == "unsupervised"
    with pytest.raises(BadRequest, match="node n1 is not run by `llmgw up` or `llmgw node join`"):
        await upgrades.set(ReleaseAsk(node="n1", version="0.2.0"))


async def test_a_release_not_installed_is_refused_naming_where_it_belongs(tmp_path):
    write_release(tmp_path, Release(runs={"agent": "installed"}))
    with pytest.raises(BadRequest, match="release 0.2.0 is not installed here: .*releases/0.2.0/bin/python"):
        await Upgrades(tmp_path, "n1").set(ReleaseAsk(node="n1", version="0.2.0"))
    assert read_release_ask(tmp_path) is None  # nothing was asked of the supervisor


async def test_a_second_upgrade_to_another_release_waits_and_the_same_one_follows_the_first(tmp_path):
    _installed(tmp_path, "0.2.0")
    _installed(tmp_path, "0.3.0")
    write_release(tmp_path, Release(version="0.2.0", state="running", steps=["router", "agent"]))
    upgrades = Upgrades(tmp_path, "n1")
    with pytest.raises(Conflict, match="node n1 is upgrading to 0.2.0 now; wait for it"):
        await upgrades.set(ReleaseAsk(node="n1", version="0.3.0"))
    answer = await upgrades.set(ReleaseAsk(node="n1", version="0.2.0", by="ops"))
    assert answer.version == "0.2.0" and answer.state == "running"
    assert read_release_ask(tmp_path) == ReleaseAsk(node="n1", version="0.2.0", by="ops")
