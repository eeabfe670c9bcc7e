"""A second mirror kept in step with a primary: every verified repo copied over HTTP and verified
again, a copy that does not verify never served, a repo gone from the primary gone from it, and
repos changed on the primary only."""

import asyncio
import hashlib
import threading

import httpx
import msgspec
import pytest

from llmgw.bus import BusError, NotFound, call, call_all, load_config
from llmgw.gguf import write_random_llama
from llmgw.mirror.imports import Import
from llmgw.mirror.peer import PeerOrigin
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import FileRef, RepoAdd, RepoList
from llmgw.proto import mirror as mirror_api

SOURCE = "test/tiny/m.gguf"
KEY = "test/tiny"


async def _until(check, what, timeout_s=20.0):
    """Wait (bounded) until `check()` is true."""
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {timeout_s}s: {what}")


def _ready(mirror) -> bool:
    """The test repo is ready on `mirror` (its file verifies a moment before the repo is marked)."""
    repo = mirror.fetches.repos.get(KEY)
    return repo is not None and repo.state == "ready"


@pytest.fixture
async def primary(serve, tmp_path):
    """A primary mirror that took in one file (checked against its sha256)."""
    weights = write_random_llama(tmp_path / "given" / "m.gguf")
    sha256 = hashlib.sha256(weights.read_bytes()).hexdigest()
    config = MirrorConfig(
        node="m1",
        site="north",
        root=str(tmp_path / "primary"),
        hub_endpoint="http://127.0.0.1:9",
        imports=[Import(path=str(weights), source=SOURCE, sha256=sha256)],
    )
    mirror = await serve(Mirror(config), config)
    await _until(lambda: _ready(mirror), "the primary verified its import")
    return mirror


def _secondary_config(primary, tmp_path):
    return MirrorConfig(node="m2", site="south", root=str(tmp_path / "secondary"), primary=primary.http.url, sync_s=0.1)


async def test_a_secondary_copies_every_verified_file_of_its_primary_and_serves_it_verified(
    primary, serve, tmp_path, nc
):
    secondary = await serve(Mirror(_secondary_config(primary, tmp_path)), _secondary_config(primary, tmp_path))
    await _until(lambda: _ready(secondary), "the secondary verified its copy")
    copy = secondary.fetches.repos[KEY]
    assert secondary.fetches.file(SOURCE) is not None
    assert copy.origin == primary.http.url and copy.added_by == "primary"
    answers = await call_all(nc, mirror_api.FILE_WHERE, FileRef(source=SOURCE), window_s=1.0)
    assert sorted((a.mirror, a.site, a.verified) for a in answers) == [("m1", "north", True), ("m2", "south", True)]
    theirs = next(a for a in answers if a.mirror == "m2")
    async with httpx.AsyncClient() as http:
        served = (await http.get(theirs.url)).content
    assert theirs.url.startswith(secondary.http.url) and hashlib.sha256(served).hexdigest() == theirs.sha256
    assert served == (primary.root / SOURCE).read_bytes()


async def test_a_file_that_changed_on_the_primary_after_it_verified_is_refused_by_the_secondary(
    primary, serve, tmp_path
):
    on_disk = primary.root / SOURCE
    good = on_disk.read_bytes()
    with open(on_disk, "r+b") as f:  # the same size, other bytes: a disk that rotted
        f.seek(len(good) // 2)
        f.write(b"\x55" * 64)
    secondary = await serve(Mirror(_secondary_config(primary, tmp_path)), _secondary_config(primary, tmp_path))
    await _until(lambda: KEY in secondary.fetches.repos and secondary.fetches.repos[KEY].state == "failed", "refused")
    failed = secondary.fetches.repos[KEY]
    assert "sha256" in failed.error and primary.fetches.repos[KEY].files[0].sha256 in failed.error
    assert not (secondary.root / SOURCE).exists() and secondary.fetches.file(SOURCE) is None
    with pytest.raises(NotFound):
        await secondary.where(FileRef(source=SOURCE))
    async with httpx.AsyncClient() as http:
        assert (await http.get(f"{secondary.http.url}/files/{SOURCE}")).status_code == 404
    on_disk.write_bytes(good)  # the primary's file mended: the copy is tried again, and verifies
    await _until(lambda: secondary.fetches.file(SOURCE) is not None, "the secondary copied the mended file")
    assert (secondary.root / SOURCE).read_bytes() == good


async def test_a_repo_removed_on_the_primary_goes_from_the_secondary(primary, serve, tmp_path):
    secondary = await serve(Mirror(_secondary_config(primary, tmp_path)), _secondary_config(primary, tmp_path))
    await _until(lambda: _ready(secondary), "the secondary verified its copy")
    await primary.fetches.remove(KEY)
    # the repo leaves the list first (nothing serves it from then on), then its files are deleted
    await _until(lambda: KEY not in secondary.fetches.repos, "the secondary forgot the repo")
    await _until(lambda: not (secondary.root / SOURCE).exists(), "the secondary deleted its copy")


async def test_a_secondary_leaves_adding_repos_to_its_primary(primary, serve, tmp_path, nc):
    await serve(Mirror(_secondary_config(primary, tmp_path)), _secondary_config(primary, tmp_path))
    for _ in range(6):  # over the bus every request reaches the primary (its Hub is away here), never the secondary
        with pytest.raises(BusError) as refused:
            await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/other"), timeout=30)
        assert "copies the primary" not in refused.value.message


async def test_the_primary_lists_its_ready_repos_over_http_for_secondaries(primary):
    async with httpx.AsyncClient() as http:
        r = await http.get(f"{primary.http.url}/repos")
    [repo] = msgspec.json.decode(r.content, type=RepoList).repos
    assert (repo.repo, repo.state, repo.files[0].sha256) == (KEY, "ready", primary.fetches.repos[KEY].files[0].sha256)


async def test_a_partial_copy_is_resumed_with_a_range_request_not_started_again(primary, tmp_path):
    repo = primary.fetches.repos[KEY]
    staging = tmp_path / "staging"
    staging.mkdir()
    (staging / "m.gguf.incomplete").write_bytes(b"\xaa" * 1000)  # what a break left (marked, to be seen)
    got = await asyncio.to_thread(
        PeerOrigin(primary.http.url).download, repo, repo.files[0], staging, lambda n: None, threading.Event()
    )
    whole = (primary.root / SOURCE).read_bytes()
    assert got == staging / "m.gguf" and got.read_bytes() == b"\xaa" * 1000 + whole[1000:]


def test_primary_and_sync_s_are_flags():
    config = load_config(MirrorConfig, ["--primary", "http://10.0.0.1:8090", "--sync-s", "5"], env={})
    assert (config.primary, config.sync_s) == ("http://10.0.0.1:8090", 5.0)


async def test_a_file_purged_on_the_primary_goes_from_the_secondarys_copy(serve, tmp_path, nc):
    from llmgw.hubstandin import HubStandIn
    from llmgw.proto import WeightsDelete

    gguf = write_random_llama(tmp_path / "m.gguf")
    with HubStandIn() as hub:
        commit = hub.add_repo("org/two", {"a.gguf": gguf, "b.gguf": gguf})
        config = MirrorConfig(node="m1", root=str(tmp_path / "primary"), hub_endpoint=hub.url, keep_free_bytes=0)
        primary = await serve(Mirror(config), config)
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/two"))
        key = f"org/two@{commit}"
        await _until(lambda: primary.fetches.repos[key].state == "ready", "the primary fetched the repo")
    secondary = await serve(Mirror(_secondary_config(primary, tmp_path)), _secondary_config(primary, tmp_path))
    await _until(lambda: secondary.fetches.file(f"{key}/a.gguf") is not None, "the secondary copied it")
    await call(nc, mirror_api.FILE_DELETE, WeightsDelete(sources=[f"{key}/a.gguf"]))
    await _until(lambda: secondary.fetches.file(f"{key}/a.gguf") is None, "the secondary dropped the purged file")
    assert not (secondary.root / key / "a.gguf").exists() and secondary.fetches.file(f"{key}/b.gguf")
