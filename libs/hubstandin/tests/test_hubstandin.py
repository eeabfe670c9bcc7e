"""The real huggingface_hub client against the Hub stand-in: what it reads, what it downloads, how it fails."""

import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import httpx
import pytest
from huggingface_hub import HfApi, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    GatedRepoError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from llmgw.hubstandin import HubStandIn

CONFIG = b'{"architectures": ["LlamaForCausalLM"]}\n'
BIG = 12 * 1024 * 1024 + 7  # over the client's 10 MiB write chunk, so a cut after 11 MiB is resumed
SUBPROCESS_TIMEOUT = 60


def _pattern(size: int, seed: int = 0) -> bytes:
    block = hashlib.sha256(b"%d" % seed).digest() * 2048
    return (block * (size // len(block) + 1))[:size]


def _git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    path = tmp_path / "published" / "model-Q4.gguf"
    path.parent.mkdir()
    path.write_bytes(_pattern(3 * 1024 * 1024 + 11, seed=1))
    return path


def _download(hub: HubStandIn, repo: str, name: str, dest: Path, **kw) -> bytes:
    kw.setdefault("token", False)
    return Path(hf_hub_download(repo, name, endpoint=hub.url, local_dir=dest, **kw)).read_bytes()


def test_model_info_with_files_metadata_gives_sizes_blob_ids_and_sha256(hub, weights):
    commit = hub.add_repo("org/model", {"config.json": CONFIG, "model-Q4.gguf": weights})
    info = HfApi(endpoint=hub.url, token=False).model_info("org/model", files_metadata=True)
    assert (info.id, info.sha, info.private, info.gated) == ("org/model", commit, False, False)
    files = {s.rfilename: s for s in info.siblings}
    assert files["config.json"].size == len(CONFIG)
    assert files["config.json"].blob_id == _git_blob_sha1(CONFIG)
    assert files["config.json"].lfs is None
    gguf = files["model-Q4.gguf"]
    assert gguf.size == gguf.lfs.size == weights.stat().st_size
    assert gguf.lfs.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{gguf.lfs.sha256}\nsize {gguf.size}\n"
    assert (gguf.blob_id, gguf.lfs.pointer_size) == (_git_blob_sha1(pointer.encode()), len(pointer))
    assert hub.requests[-1].path == "/api/models/org/model?blobs=true"


def test_list_repo_tree_lists_files_and_folders_with_their_oids(hub, weights):
    commit = hub.add_repo("org/model", {"config.json": CONFIG, "q/model-Q4.gguf": weights})
    api = HfApi(endpoint=hub.url, token=False)
    tree = {e.path: e for e in api.list_repo_tree("org/model", recursive=True, revision=commit)}
    assert sorted(tree) == ["config.json", "q", "q/model-Q4.gguf"]
    assert tree["config.json"].blob_id == _git_blob_sha1(CONFIG)
    assert tree["q/model-Q4.gguf"].lfs.sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert len(tree["q"].tree_id) == 40
    assert [e.path for e in api.list_repo_tree("org/model")] == ["q", "config.json"]
    assert [e.path for e in api.list_repo_tree("org/model", path_in_repo="q")] == ["q/model-Q4.gguf"]


def test_hf_hub_download_into_a_local_dir_gets_the_exact_bytes_small_ones_from_the_hub_lfs_ones_from_the_cdn(
    hub, weights, tmp_path
):
    commit = hub.add_repo("org/model", {"config.json": CONFIG, "model-Q4.gguf": weights})
    assert _download(hub, "org/model", "model-Q4.gguf", tmp_path / "out") == weights.read_bytes()
    assert _download(hub, "org/model", "config.json", tmp_path / "out") == CONFIG
    asked = [(r.method, r.path, r.origin) for r in hub.requests]
    assert asked == [
        ("HEAD", "/org/model/resolve/main/model-Q4.gguf", "hub"),
        ("GET", f"/org/model/{commit}/model-Q4.gguf", "cdn"),
        ("HEAD", "/org/model/resolve/main/config.json", "hub"),
        ("GET", "/org/model/resolve/main/config.json", "hub"),
    ]
    assert hub.bytes_served == weights.stat().st_size + len(CONFIG)


def test_the_resolve_url_answers_as_the_hub_does_with_a_redirect_and_linked_headers_for_lfs_files(hub, weights):
    commit = hub.add_repo("org/model", {"config.json": CONFIG, "model-Q4.gguf": weights})
    small = httpx.head(f"{hub.url}/org/model/resolve/main/config.json")
    assert (small.status_code, small.headers["etag"], small.headers["x-repo-commit"]) == (
        200,
        f'"{_git_blob_sha1(CONFIG)}"',
        commit,
    )
    lfs = httpx.head(f"{hub.url}/org/model/resolve/main/model-Q4.gguf")
    assert lfs.status_code == 302
    assert lfs.headers["location"].startswith(hub.cdn_url)
    assert lfs.headers["x-linked-etag"] == f'"{hashlib.sha256(weights.read_bytes()).hexdigest()}"'
    assert lfs.headers["x-linked-size"] == str(weights.stat().st_size)
    assert not [h for h in [*small.headers, *lfs.headers] if h.lower().startswith("x-xet")]
    part = httpx.get(lfs.headers["location"], headers={"Range": "bytes=10-19"})
    assert (part.status_code, part.content) == (206, weights.read_bytes()[10:20])
    assert part.headers["content-range"] == f"bytes 10-19/{weights.stat().st_size}"
    beyond = httpx.get(lfs.headers["location"], headers={"Range": f"bytes={weights.stat().st_size}-"})
    assert beyond.status_code == 416


def test_hf_hub_download_into_a_cache_dir_and_snapshot_download_get_every_file(hub, weights, tmp_path):
    commit = hub.add_repo("org/model", {"config.json": CONFIG, "sub/model-Q4.gguf": weights})
    cached = hf_hub_download("org/model", "config.json", endpoint=hub.url, cache_dir=tmp_path / "c", token=False)
    assert Path(cached).read_bytes() == CONFIG
    assert commit in cached
    snap = Path(snapshot_download("org/model", endpoint=hub.url, cache_dir=tmp_path / "s", token=False))
    assert snap.name == commit
    assert (snap / "sub/model-Q4.gguf").read_bytes() == weights.read_bytes()
    assert (snap / "config.json").read_bytes() == CONFIG


def test_a_moved_branch_still_serves_the_old_commit_by_its_sha(hub, tmp_path):
    old = hub.add_repo("org/model", {"config.json": CONFIG, "notes.txt": b"v1"})
    new = hub.add_repo("org/model", {"config.json": b"{}"}, remove=["notes.txt"])
    hub.tag("org/model", "v1.0", old)
    api = HfApi(endpoint=hub.url, token=False)
    assert api.model_info("org/model").sha == new
    assert [s.rfilename for s in api.model_info("org/model", revision=old).siblings] == ["config.json", "notes.txt"]
    assert _download(hub, "org/model", "config.json", tmp_path / "new") == b"{}"
    assert _download(hub, "org/model", "config.json", tmp_path / "old", revision=old) == CONFIG
    assert _download(hub, "org/model", "notes.txt", tmp_path / "tag", revision="v1.0") == b"v1"


def test_a_cut_connection_is_resumed_with_a_range_request_not_fetched_again(hub, tmp_path):
    content = _pattern(BIG, seed=2)
    commit = hub.add_repo("org/model", {"model.gguf": content})
    hub.cut_once("org/model", "model.gguf", 11 * 1024 * 1024)
    assert _download(hub, "org/model", "model.gguf", tmp_path / "out") == content
    gets = [r for r in hub.requests if r.method == "GET"]
    # The client resumes from the last whole 10 MiB chunk it wrote: a cut before 10 MiB starts again at 0.
    assert [(r.path, r.range) for r in gets] == [
        (f"/org/model/{commit}/model.gguf", None),
        (f"/org/model/{commit}/model.gguf", f"bytes={10 * 1024 * 1024}-"),
    ]
    assert hub.bytes_served == 11 * 1024 * 1024 + BIG - 10 * 1024 * 1024


def test_a_killed_download_leaves_a_uniquely_named_partial_file_that_the_next_call_does_not_resume(hub, tmp_path):
    content = _pattern(4 * 1024 * 1024, seed=3)
    hub.add_repo("org/model", {"model.gguf": content})
    hub.throttle(256 * 1024)
    code = (
        "import sys; from huggingface_hub import hf_hub_download; "
        "hf_hub_download('org/model', 'model.gguf', endpoint=sys.argv[1], local_dir=sys.argv[2], token=False)"
    )
    env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    proc = subprocess.Popen([sys.executable, "-c", code, hub.url, str(tmp_path / "out")], env=env)
    try:
        deadline = time.monotonic() + SUBPROCESS_TIMEOUT
        while hub.bytes_served < 256 * 1024 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert hub.bytes_served >= 256 * 1024
    finally:
        proc.kill()
        proc.wait(SUBPROCESS_TIMEOUT)
    partial = list((tmp_path / "out/.cache/huggingface/download").glob("*.incomplete"))
    sha256 = hashlib.sha256(content).hexdigest()
    assert len(partial) == 1
    _, etag, unique, suffix = partial[0].name.split(".")
    assert (etag, len(unique), suffix) == (sha256, 8, "incomplete")
    # The client writes whole 10 MiB chunks: what it held in memory when killed is lost.
    assert partial[0].stat().st_size % (10 * 1024 * 1024) == 0
    hub.throttle(None)
    assert _download(hub, "org/model", "model.gguf", tmp_path / "out") == content
    assert [r.range for r in hub.requests if r.method == "GET"] == [None, None]


def test_an_unknown_repo_revision_or_file_raises_the_clients_typed_errors(hub, tmp_path):
    commit = hub.add_repo("org/model", {"config.json": CONFIG})
    api = HfApi(endpoint=hub.url, token=False)
    with pytest.raises(RepositoryNotFoundError):
        api.model_info("org/nothing")
    with pytest.raises(RepositoryNotFoundError):
        _download(hub, "org/nothing", "config.json", tmp_path)
    with pytest.raises(RevisionNotFoundError):
        api.model_info("org/model", revision="no-such-branch")
    with pytest.raises(RevisionNotFoundError):
        _download(hub, "org/model", "config.json", tmp_path, revision="0" * 40)
    with pytest.raises(EntryNotFoundError) as missing:
        _download(hub, "org/model", "model.gguf", tmp_path)
    assert missing.value.response.headers["x-repo-commit"] == commit


def test_a_private_repo_without_its_token_looks_like_no_repo_and_with_it_downloads(hub, tmp_path):
    hub.add_repo("org/secret", {"config.json": CONFIG}, private=True, token="hf_right")
    for token in (False, "hf_wrong"):
        with pytest.raises(RepositoryNotFoundError):
            HfApi(endpoint=hub.url, token=token).model_info("org/secret")
        with pytest.raises(RepositoryNotFoundError):
            _download(hub, "org/secret", "config.json", tmp_path, token=token)
    assert HfApi(endpoint=hub.url, token="hf_right").model_info("org/secret").private is True
    assert _download(hub, "org/secret", "config.json", tmp_path, token="hf_right") == CONFIG


def test_a_gated_repo_lists_its_files_but_refuses_them_without_the_right_token(hub, weights, tmp_path):
    hub.add_repo("org/gated", {"model-Q4.gguf": weights}, gated="manual", token="hf_right")
    assert HfApi(endpoint=hub.url, token=False).model_info("org/gated").gated == "manual"
    for token in (False, "hf_wrong"):
        with pytest.raises(GatedRepoError):
            _download(hub, "org/gated", "model-Q4.gguf", tmp_path, token=token)
    assert _download(hub, "org/gated", "model-Q4.gguf", tmp_path, token="hf_right") == weights.read_bytes()
    cdn_get = [r for r in hub.requests if r.origin == "cdn"]
    assert len(cdn_get) == 1


def test_a_corrupt_file_of_the_right_size_is_accepted_by_the_client_which_checks_only_the_size(hub, weights, tmp_path):
    hub.add_repo("org/model", {"model-Q4.gguf": weights})
    hub.corrupt("org/model", "model-Q4.gguf")
    got = _download(hub, "org/model", "model-Q4.gguf", tmp_path)
    assert len(got) == weights.stat().st_size
    assert got != weights.read_bytes()
    hub.clear_faults()
    assert httpx.get(f"{hub.url}/org/model/resolve/main/model-Q4.gguf", follow_redirects=True).content == (
        weights.read_bytes()
    )


def test_the_command_line_serves_every_owner_name_folder_as_a_repo(tmp_path):
    (tmp_path / "org/model/q").mkdir(parents=True)
    (tmp_path / "org/model/config.json").write_bytes(CONFIG)
    (tmp_path / "org/model/q/model.gguf").write_bytes(b"GGUF" + bytes(100))
    (tmp_path / "org/model/.cache").mkdir()
    (tmp_path / "org/model/.cache/junk").write_bytes(b"x")
    proc = subprocess.Popen(
        [sys.executable, "-m", "llmgw.hubstandin", str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        url = lines[-1].rsplit("HF_ENDPOINT=", 1)[-1].strip()
        info = HfApi(endpoint=url, token=False).model_info("org/model")
        assert [s.rfilename for s in info.siblings] == ["config.json", "q/model.gguf"]
    finally:
        proc.terminate()
        proc.wait(SUBPROCESS_TIMEOUT)


def test_list_models_searches_by_words_and_filter_most_downloaded_first_as_the_client_asks():
    with HubStandIn() as hub:
        hub.add_repo("acme/Tiny-Chat-GGUF", {"tiny.Q4_K_M.gguf": b"GGUF....", "README.md": b"x"})
        hub.add_repo("bob/tiny-chat-gguf", {"chat.gguf": b"GGUF...."})
        hub.add_repo("acme/tiny-chat", {"model.safetensors": b"\0" * 8})
        hub.add_repo("eve/tiny-chat-private-GGUF", {"m.gguf": b"GGUF"}, private=True, token="hf_eve")
        hub.popularity("bob/tiny-chat-gguf", downloads=50, likes=3)
        hub.popularity("acme/Tiny-Chat-GGUF", downloads=10)
        api = HfApi(endpoint=hub.url, token=False)
        found = list(api.list_models(search="tiny chat", filter="gguf", sort="downloads", expand=["siblings"]))
        assert [m.id for m in found] == ["bob/tiny-chat-gguf", "acme/Tiny-Chat-GGUF"]
        assert [s.rfilename for s in found[1].siblings] == ["README.md", "tiny.Q4_K_M.gguf"]
        assert found[0].downloads == 50 and found[0].likes == 3
        assert [m.id for m in api.list_models(search="tiny", limit=1)] == ["bob/tiny-chat-gguf"]
        mine = HfApi(endpoint=hub.url, token="hf_eve").list_models(search="private", filter="gguf")
        assert [m.id for m in mine] == ["eve/tiny-chat-private-GGUF"]
        hub.rate_limit(1, retry_after_s=7)
        limited = httpx.get(f"{hub.url}/api/models", params={"search": "tiny"})
        assert limited.status_code == 429 and limited.headers["retry-after"] == "7"
        assert httpx.get(f"{hub.url}/api/models", params={"search": "tiny"}).status_code == 200
