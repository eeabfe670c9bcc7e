"""The mirror killed mid-fetch (kill -9, no chance to tidy up) takes the fetch up again where it
stopped once started again on the same root: a real `llmgw service mirror` process, its role's
NATS credentials, and the Hub stand-in (`llmgw.hubstandin`, not the Hub) sending slowly enough
to be caught halfway."""

import asyncio
import hashlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from llmgw.bus import BusError, call
from llmgw.gguf import write_random_llama
from llmgw.proto import Empty, FileRef, RepoAdd, RepoRef
from llmgw.proto import mirror as mirror_api

MIB = 1 << 20
WRITE = 10 * MIB
"""The client writes (and says how far it got) 10 MiB at a time."""


@pytest.fixture
def started(tmp_path):
    """Start `llmgw service mirror --config FILE`; every process started is killed after."""
    procs = []

    def start(config: Path) -> subprocess.Popen:
        llmgw = Path(sys.executable).parent / "llmgw"
        log = open(tmp_path / f"mirror-{len(procs)}.log", "wb")  # kept open while it runs
        procs.append(
            (subprocess.Popen([str(llmgw), "service", "mirror", "--config", str(config)], stdout=log, stderr=log), log)
        )
        return procs[-1][0]

    yield start
    for proc, log in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()


async def answering(nc, proc, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return await call(nc, mirror_api.REPO_LIST, Empty(), timeout=1)
        except BusError:
            assert proc.poll() is None, f"the mirror exited with {proc.returncode}"
            assert time.monotonic() < deadline, "the mirror never answered"
            await asyncio.sleep(0.2)


async def shown(nc, commit):
    return (await call(nc, mirror_api.REPO_SHOW, RepoRef(repo="org/big", commit=commit))).repos[0]


async def test_a_mirror_killed_mid_fetch_resumes_it_with_a_range_once_started_again(
    tmp_path, hub, nats_server, nc, started
):
    big = write_random_llama(tmp_path / "big.gguf")
    with open(big, "ab") as f:
        f.write(bytes(28 * MIB))
    size = big.stat().st_size
    commit = hub.add_repo("org/big", {"big.gguf": big})
    hub.throttle(4 * MIB)
    root = tmp_path / "mirror"
    config = tmp_path / "mirror.toml"
    config.write_text(
        f'nats_url = "{nats_server.url}"\ncreds = "{nats_server.creds("mirror")}"\nroot = "{root}"\n'
        f'hub_endpoint = "{hub.url}"\ndata_dir = "{tmp_path / "home"}"\nkeep_free_bytes = 0\nadmin_port = 0\n'
    )

    first = started(config)
    await answering(nc, first)
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/big"))
    deadline = time.monotonic() + 30
    while (now := await shown(nc, commit)).done < WRITE:
        assert now.state == "fetching" and time.monotonic() < deadline, now
        await asyncio.sleep(0.1)
    first.kill()
    first.wait()
    partial = root / ".incoming" / f"org/big@{commit}" / "big.gguf.incomplete"
    kept = partial.stat().st_size
    assert WRITE <= kept < size
    hub.clear_faults()

    second = started(config)
    await answering(nc, second)
    deadline = time.monotonic() + 30
    while (now := await shown(nc, commit)).state not in ("ready", "failed"):
        assert time.monotonic() < deadline, now
        await asyncio.sleep(0.1)
    assert now.state == "ready", now.error
    ranges = [a.range for a in hub.requests if a.method == "GET" and a.path.endswith("/big.gguf")]
    assert ranges[0] is None and ranges[-1] == f"bytes={kept}-"
    assert hub.bytes_served < size + kept  # what was kept was not sent again
    info = await call(nc, mirror_api.FILE_STAT, FileRef(source=f"org/big@{commit}/big.gguf"))
    assert info.verified and info.sha256 == hashlib.sha256(big.read_bytes()).hexdigest()
