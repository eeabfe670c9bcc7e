"""Fetching from Hugging Face: the real huggingface_hub client against llmgw.hubstandin (a local
stand-in for the Hub, not the Hub). Pinned commits, every file verified, pickles refused, cut
connections and stopped mirrors resumed, and each bad input a clear error."""

import asyncio
import hashlib
import http.server
import json
import pickle
import threading

import httpx
import pytest

from llmgw.bus import BadRequest, Internal, NotFound, call
from llmgw.gguf import write_random_llama
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Empty, FileRef, RepoAdd, RepoRef, WeightsDelete
from llmgw.proto import mirror as mirror_api


@pytest.fixture
def gguf(tmp_path):
    path = tmp_path / "m.gguf"
    write_random_llama(path)
    return path


@pytest.fixture
def start_mirror(serve, tmp_path, hub):
    async def start(**settings):
        config = MirrorConfig(root=str(tmp_path / "mirror"), hub_endpoint=hub.url, keep_free_bytes=0, **settings)
        return await serve(Mirror(config), config)

    return start


async def settled(nc, repo, commit, timeout=30.0):
    """The repo at `commit` once its fetch is ready or failed."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        found = (await call(nc, mirror_api.REPO_SHOW, RepoRef(repo=repo, commit=commit))).repos[0]
        if found.state in ("ready", "failed") or asyncio.get_running_loop().time() > deadline:
            return found
        await asyncio.sleep(0.1)


async def test_a_repo_is_fetched_at_the_commit_its_branch_names_verified_and_served(start_mirror, hub, gguf, nc):
    config = json.dumps({"architectures": ["LlamaForCausalLM"]}).encode()
    commit = hub.add_repo("org/m", {"m.gguf": gguf, "config.json": config, "notes/other.txt": b"x"})
    await start_mirror()
    events = []

    async def note(msg):
        events.append(json.loads(msg.data))

    sub = await nc.subscribe(mirror_api.FETCH_CHANGED.subject(commit), cb=note)
    added = await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/m", revision="main"))
    assert (added.commit, added.state, [f.path for f in added.files]) == (commit, "queued", ["m.gguf"])
    done = await settled(nc, "org/m", commit)
    await sub.unsubscribe()
    assert done.state == "ready", done.error
    assert done.done == done.size == gguf.stat().st_size
    assert {"queued", "fetching", "verifying", "ready"} <= {e["state"] for e in events}
    info = await call(nc, mirror_api.FILE_STAT, FileRef(source=f"org/m@{commit}/m.gguf"))
    assert info.verified and info.sha256 == hashlib.sha256(gguf.read_bytes()).hexdigest()
    async with httpx.AsyncClient() as client:
        assert (await client.get(info.url)).content == gguf.read_bytes()
    listed = await call(nc, mirror_api.FILE_LIST, Empty())
    assert [f.source for f in listed.files] == [f"org/m@{commit}/m.gguf"]


async def test_safetensors_come_with_their_configs_and_pickled_weights_beside_them_are_skipped(start_mirror, hub, nc):
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    tensors = len(header).to_bytes(8, "little") + header + bytes(8)
    commit = hub.add_repo(
        "org/st",
        {
            "model.safetensors": tensors,
            "pytorch_model.bin": pickle.dumps({"w": [0.0, 0.0]}),
            "config.json": b"{}",
            "tokenizer.json": b"{}",
        },
    )
    await start_mirror()
    added = await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/st"))
    assert [f.path for f in added.files] == ["config.json", "model.safetensors", "tokenizer.json"]
    assert [s.path for s in added.skipped] == ["pytorch_model.bin"] and "runs code" in added.skipped[0].why
    assert (await settled(nc, "org/st", commit)).state == "ready"


async def test_a_repo_with_only_pickled_weights_is_refused_saying_why_and_what_to_fetch(start_mirror, hub, nc):
    hub.add_repo("org/pk", {"pytorch_model.bin": pickle.dumps([1, 2]), "config.json": b"{}"})
    await start_mirror()
    with pytest.raises(BadRequest, match=r"pytorch_model\.bin is pickled weights.*runs whatever code.*GGUF"):
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/pk"))
    with pytest.raises(BadRequest, match="pickled"):
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/pk", include=["*.bin"]))


async def test_a_corrupt_file_of_the_right_size_is_refused_removed_and_never_served(start_mirror, hub, gguf, nc):
    commit = hub.add_repo("org/bad", {"m.gguf": gguf})
    hub.corrupt("org/bad", "m.gguf")
    mirror = await start_mirror()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/bad"))
    failed = await settled(nc, "org/bad", commit)
    published = hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert failed.state == "failed" and published in failed.error and "the file was removed" in failed.error
    assert not [p for p in mirror.root.rglob("m.gguf*")]
    with pytest.raises(NotFound):
        await call(nc, mirror_api.FILE_STAT, FileRef(source=f"org/bad@{commit}/m.gguf"))
    hub.clear_faults()  # asked again, it is fetched whole and verifies
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/bad"))
    assert (await settled(nc, "org/bad", commit)).state == "ready"


async def test_a_connection_cut_mid_file_is_resumed_with_a_range_not_started_again(start_mirror, hub, tmp_path, nc):
    big = tmp_path / "big.gguf"
    write_random_llama(big)
    with open(big, "ab") as f:  # past the client's 10 MiB write chunk, so the cut lands after a write
        f.write(bytes(12 << 20))
    commit = hub.add_repo("org/big", {"big.gguf": big}, lfs={"big.gguf"})
    hub.cut_once("org/big", "big.gguf", after_bytes=11 << 20)
    await start_mirror()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/big", include=["big.gguf"]))
    assert (await settled(nc, "org/big", commit, timeout=60)).state == "ready"
    ranges = [a.range for a in hub.requests if a.method == "GET" and "big.gguf" in a.path]
    assert ranges[0] is None and ranges[1] and int(ranges[1].split("=")[1].split("-")[0]) > 0
    assert hub.bytes_served < 2 * big.stat().st_size


async def test_a_mirror_stopped_mid_fetch_takes_it_up_again_where_it_stopped(
    start_mirror, hub, tmp_path, nc, nats_server
):
    big = tmp_path / "big.gguf"
    write_random_llama(big)
    with open(big, "ab") as f:  # the client writes (and says how far it got) 10 MiB at a time
        f.write(bytes(24 << 20))
    commit = hub.add_repo("org/slow", {"big.gguf": big})
    hub.throttle(6 << 20)
    config = MirrorConfig(root=str(tmp_path / "mirror"), hub_endpoint=hub.url, keep_free_bytes=0)
    first = Mirror(config)
    service, conn = await nats_server.start(first, config)
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/slow"))
    while (await call(nc, mirror_api.REPO_SHOW, RepoRef(repo="org/slow"))).repos[0].done < (10 << 20):
        await asyncio.sleep(0.1)
    await first.stop()  # as a stop would: the download ends where it is, its partial file kept
    await service.stop()
    await conn.close()
    hub.throttle(None)
    await start_mirror()
    assert (await settled(nc, "org/slow", commit)).state == "ready"
    ranges = [a.range for a in hub.requests if a.method == "GET" and "big.gguf" in a.path]
    assert ranges[-1] and int(ranges[-1].split("=")[1].split("-")[0]) >= (10 << 20)


async def test_a_disk_that_cannot_hold_the_files_is_refused_before_any_byte_is_fetched(serve, hub, gguf, tmp_path, nc):
    hub.add_repo("org/m", {"m.gguf": gguf})
    config = MirrorConfig(root=str(tmp_path / "mirror"), hub_endpoint=hub.url, keep_free_bytes=1 << 60)
    await serve(Mirror(config), config)
    with pytest.raises(BadRequest, match=r"free some space or fetch fewer files"):
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/m"))
    assert not [a for a in hub.requests if "resolve" in a.path or a.origin == "cdn"]


async def test_a_moved_branch_leaves_the_pinned_commit_served_and_update_fetches_the_new_one_beside(
    start_mirror, hub, gguf, tmp_path, nc
):
    old = hub.add_repo("org/m", {"m.gguf": gguf})
    await start_mirror()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/m"))
    assert (await settled(nc, "org/m", old)).state == "ready"
    other = tmp_path / "other.gguf"
    other.write_bytes(gguf.read_bytes() + bytes(32))
    new = hub.add_repo("org/m", {"m.gguf": other})
    assert new != old
    updated = await call(nc, mirror_api.REPO_UPDATE, RepoRef(repo="org/m"))
    assert updated.commit == new and (await settled(nc, "org/m", new)).state == "ready"
    held = await call(nc, mirror_api.REPO_SHOW, RepoRef(repo="org/m"))
    assert {r.commit for r in held.repos} == {old, new}
    assert (await call(nc, mirror_api.FILE_STAT, FileRef(source=f"org/m@{old}/m.gguf"))).verified


@pytest.mark.parametrize(
    ("repo", "revision", "error", "match"),
    [
        ("org/nope", "main", NotFound, "has no repo org/nope"),
        ("org/m", "no-such-branch", NotFound, "has no revision 'no-such-branch'"),
    ],
)
async def test_an_unknown_repo_or_revision_says_which(start_mirror, hub, gguf, nc, repo, revision, error, match):
    hub.add_repo("org/m", {"m.gguf": gguf})
    await start_mirror()
    with pytest.raises(error, match=match):
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo=repo, revision=revision))


async def test_a_gated_repo_without_a_token_says_to_accept_the_licence_and_with_one_is_fetched(
    start_mirror, hub, gguf, tmp_path, nc, monkeypatch
):
    commit = hub.add_repo("org/gated", {"m.gguf": gguf}, gated=True, token="hf_secret_token")
    await start_mirror()
    with pytest.raises(BadRequest, match=r"gated: accept its licence.*HF_TOKEN"):
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/gated"))
    token_file = tmp_path / "hf.token"
    token_file.write_text("hf_secret_token\n")
    config = MirrorConfig(
        root=str(tmp_path / "mirror2"), hub_endpoint=hub.url, keep_free_bytes=0, token_file=str(token_file)
    )
    with_token = Mirror(config)
    await asyncio.to_thread(with_token.hub.check_access, "org/gated", commit, "m.gguf")
    assert "hf_secret_token" not in repr(vars(with_token.hub)).replace("_token': 'hf_secret_token", "")


async def test_bad_file_names_and_a_gguf_that_is_not_one_are_refused(start_mirror, hub, nc):
    commit = hub.add_repo("org/odd", {"fake.gguf": b"<html>not found</html>" * 50, "ok.txt": b"x"})
    await start_mirror()
    with pytest.raises(BadRequest, match="no file matches"):
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/odd", include=["*.safetensors"]))
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/odd"))
    failed = await settled(nc, "org/odd", commit)
    assert failed.state == "failed" and "fake.gguf is not a GGUF file" in failed.error


class _WebPage(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"<html>a web page, not a Hub</html>"
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_):
        pass


async def test_an_endpoint_that_is_not_a_hub_is_named_as_such_and_one_not_there_too(serve, tmp_path, nc):
    page = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _WebPage)
    threading.Thread(target=page.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{page.server_address[1]}"
        config = MirrorConfig(root=str(tmp_path / "m"), hub_endpoint=url, keep_free_bytes=0)
        await serve(Mirror(config), config)
        with pytest.raises(BadRequest, match=r"did not answer as a Hugging Face Hub does.*HF_ENDPOINT"):
            await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/m"))
    finally:
        page.shutdown()
    gone = MirrorConfig(root=str(tmp_path / "n"), hub_endpoint="http://127.0.0.1:9", keep_free_bytes=0)
    with pytest.raises(Internal, match=r"cannot reach http://127.0.0.1:9"):
        await asyncio.to_thread(Mirror(gone).hub.resolve, "org/m", "main")


async def test_the_token_fetches_a_gated_repo_and_is_never_logged_published_or_kept(
    serve, hub, gguf, tmp_path, nc, capfd
):
    token = "hf_do_not_leak_0123456789"
    commit = hub.add_repo("org/gated", {"m.gguf": gguf}, gated=True, token=token)
    (tmp_path / "hf.token").write_text(token + "\n")
    root = tmp_path / "mirror"
    config = MirrorConfig(
        root=str(root), hub_endpoint=hub.url, keep_free_bytes=0, token_file=str(tmp_path / "hf.token")
    )
    await serve(Mirror(config), config)
    seen = []

    async def note(msg):
        seen.append(msg.data)

    sub = await nc.subscribe("llmgw.v1.evt.>", cb=note)
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/gated"))
    assert (await settled(nc, "org/gated", commit)).state == "ready"
    await sub.unsubscribe()
    out, err = capfd.readouterr()
    kept = b"".join(p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix in (".json", ".sha256", ""))
    assert seen and not any(token.encode() in d for d in seen)
    assert token not in out + err and token.encode() not in kept


async def test_a_deleted_fetched_file_leaves_its_repos_listing_and_an_emptied_repo_goes(start_mirror, hub, gguf, nc):
    commit = hub.add_repo("org/two", {"a.gguf": gguf, "b.gguf": gguf})
    mirror = await start_mirror()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/two"))
    assert (await settled(nc, "org/two", commit)).state == "ready"
    ask = WeightsDelete(sources=[f"org/two@{commit}/a.gguf"])
    assert (await call(nc, mirror_api.FILE_DELETE, ask)).deleted == ask.sources
    left = (await call(nc, mirror_api.REPO_SHOW, RepoRef(repo="org/two"))).repos[0]
    assert [f.path for f in left.files] == ["b.gguf"] and left.size == gguf.stat().st_size
    await call(nc, mirror_api.FILE_DELETE, WeightsDelete(sources=[f"org/two@{commit}/b.gguf"]))
    assert (await call(nc, mirror_api.REPO_LIST, Empty())).repos == []
    assert not (mirror.root / ".repos" / "org" / f"two@{commit}.json").exists()


async def test_a_verified_file_changed_on_disk_afterwards_is_no_longer_offered(start_mirror, hub, gguf, nc):
    commit = hub.add_repo("org/m", {"m.gguf": gguf})
    mirror = await start_mirror()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/m"))
    assert (await settled(nc, "org/m", commit)).state == "ready"
    served = mirror.root / f"org/m@{commit}/m.gguf"
    served.write_bytes(served.read_bytes()[:-4] + b"evil")
    with pytest.raises(NotFound, match="changed on the mirror's disk since it was verified"):
        await call(nc, mirror_api.FILE_STAT, FileRef(source=f"org/m@{commit}/m.gguf"))


async def test_a_removed_repo_can_be_added_again_and_another_include_adds_its_files(start_mirror, hub, gguf, nc):
    commit = hub.add_repo("org/q", {"a-Q4.gguf": gguf, "a-Q8.gguf": gguf})
    mirror = await start_mirror()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/q", include=["*Q4*"]))
    assert [f.path for f in (await settled(nc, "org/q", commit)).files] == ["a-Q4.gguf"]
    more = await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/q", include=["*Q8*"]))
    assert [f.path for f in more.files] == ["a-Q4.gguf", "a-Q8.gguf"]
    done = await settled(nc, "org/q", commit)
    assert done.state == "ready" and all(f.state == "ready" for f in done.files)
    await mirror.fetches.remove(f"org/q@{commit}")  # as REPO_REMOVE does once the catalog says none uses it
    assert not (mirror.root / f"org/q@{commit}").exists()
    await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/q", include=["*Q4*"]))
    assert (await settled(nc, "org/q", commit)).state == "ready"


async def test_a_repo_publishing_a_name_that_climbs_out_never_gets_it_fetched(start_mirror, hub, gguf, nc):
    commit = hub.add_repo("org/evil", {"../../evil.gguf": gguf, "ok.gguf": gguf})
    mirror = await start_mirror()
    with pytest.raises(BadRequest, match=r"\.\./\.\./evil\.gguf cannot be fetched: it climbs out of the repo"):
        await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/evil", include=["*evil*"]))
    added = await call(nc, mirror_api.REPO_ADD, RepoAdd(repo="org/evil"))
    assert [f.path for f in added.files] == ["ok.gguf"] and "climbs out" in added.skipped[0].why
    assert (await settled(nc, "org/evil", commit)).state == "ready"
    assert not list(mirror.root.parent.glob("**/evil.gguf"))
