"""`llmgw ctl mirror ...` against a real mirror on a real nats-server, under ctl's own NATS role:
a repo added from a local stand-in for the Hugging Face Hub followed to the end (plain lines off a
terminal, a bar on one), updated, listed, shown, removed (never while a model uses it), and the
errors as one line with an exit code."""

import asyncio
import hashlib
import re

import msgspec
import pytest

from llmgw.bus import call
from llmgw.catalog.service import Catalog, CatalogConfig
from llmgw.ctl.cli import parser
from llmgw.ctl.tree import run_ctl
from llmgw.gguf import write_random_llama
from llmgw.mirror.imports import Import
from llmgw.mirror.service import Mirror, MirrorConfig
from llmgw.proto import Empty, MirroredRepo, Model, ModelPut, ModelRef, RepoList, RepoRef, catalog, mirror

DEMO = "demo/tiny/tiny.gguf"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return write_random_llama(tmp_path_factory.mktemp("w") / "tiny.gguf")


@pytest.fixture
async def held(serve, nc, tmp_path, tiny, hub):
    """The mirror (fetching from the stand-in, the demo file imported) and the catalog."""
    sha256 = hashlib.sha256(tiny.read_bytes()).hexdigest()
    config = MirrorConfig(
        root=str(tmp_path / "mirror"),
        hub_endpoint=hub.url,
        keep_free_bytes=0,
        imports=[Import(path=str(tiny), source=DEMO, sha256=sha256)],
    )
    await serve(Mirror(config), config)
    await serve(Catalog(CatalogConfig(file_check_s=5.0)), CatalogConfig(file_check_s=5.0))
    for _ in range(200):
        listed = await call(nc, mirror.REPO_LIST, Empty())
        if [r.state for r in listed.repos] == ["ready"]:
            return hub
        await asyncio.sleep(0.05)
    raise AssertionError(f"the import never became ready: {listed}")


_LOG = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d \[|INFO - )")
"""The services' and the Hub client's log lines (they run in this process too)."""


def said(capsys) -> tuple[str, str]:
    """What ctl printed on stdout and on stderr, without the services' log lines."""
    got = capsys.readouterr()
    return tuple(
        "".join(ln for ln in text.splitlines(keepends=True) if not _LOG.match(ln)) for text in (got.out, got.err)
    )


async def ctl(nats_server, *words: str) -> int:
    """`llmgw ctl WORDS` in this process, as the operator (ctl's own credentials)."""
    argv = ["ctl", "--nats-url", nats_server.url, "--creds", nats_server.creds("ctl"), *words]
    return await asyncio.wait_for(run_ctl(parser().parse_args(argv)), 60)


async def test_list_shows_each_repo_at_its_commit_with_state_files_size_and_how_far(held, nats_server, capsys):
    assert await ctl(nats_server, "mirror", "list") == 0
    header, row = said(capsys)[0].splitlines()
    assert header.split() == ["REPO", "COMMIT", "REVISION", "STATE", "FILES", "SIZE", "DONE"]
    assert row.split()[:5] == ["demo/tiny", "-", "-", "ready", "1"] and row.endswith("100%")
    assert await ctl(nats_server, "mirror", "list", "--json") == 0
    listed = msgspec.json.decode(said(capsys)[0], type=RepoList)
    assert [(r.repo, r.state, r.origin.startswith("file:")) for r in listed.repos] == [("demo/tiny", "ready", True)]


async def test_show_gives_each_file_its_size_hash_and_state(held, nats_server, tiny, capsys):
    assert await ctl(nats_server, "mirror", "show", "demo/tiny") == 0
    out = said(capsys)[0]
    sha = hashlib.sha256(tiny.read_bytes()).hexdigest()
    assert out.startswith("demo/tiny: ready, 436.7 kB of 436.7 kB (100%)") and "added by config" in out
    assert re.search(rf"tiny\.gguf\s+436\.7 kB\s+{sha[:12]}\s+ready", out), out


async def test_add_follows_the_fetch_to_the_end_in_plain_lines_and_names_the_sources(held, nats_server, tiny, capsys):
    commit = held.add_repo("org/tiny", {"m.gguf": tiny, "README.md": b"hello\n", "pytorch_model.bin": b"x" * 64})
    held.throttle(150_000)  # about three seconds: progress to see
    assert await ctl(nats_server, "mirror", "add", "org/tiny") == 0
    out, err = said(capsys)
    lines = out.splitlines()
    assert lines[0].startswith(f"org/tiny@{commit[:12]}: queued") and lines[-1].startswith(
        f"org/tiny@{commit[:12]}: ready"
    )
    fetching = [line for line in lines if ": fetching " in line]
    rate = r"of 436\.7 kB \(\d+%\), ([\d.]+ k?B/s, |measuring the rate$)"  # no '0 B/s' before a rate is known
    assert fetching and all(re.search(rate, line) for line in fetching), lines
    assert f"Sources for a model: org/tiny@{commit}/m.gguf" in err, err
    assert "left out: pytorch_model.bin" in err
    assert await ctl(nats_server, "mirror", "show", f"org/tiny@{commit}") == 0
    assert "left out pytorch_model.bin:" in said(capsys)[0]


async def test_on_a_terminal_update_draws_a_bar_to_the_new_commit(held, nats_server, nc, tiny, capsys, monkeypatch):
    first = held.add_repo("org/tiny", {"m.gguf": tiny})
    assert await ctl(nats_server, "mirror", "add", "org/tiny@main") == 0
    second = held.add_repo("org/tiny", {"m.gguf": tiny.read_bytes()[:-1] + b"\1"})
    held.throttle(150_000)
    capsys.readouterr()
    monkeypatch.setenv("FORCE_COLOR", "1")  # rich takes stdout for a terminal
    assert await ctl(nats_server, "mirror", "update", "org/tiny") == 0
    out, err = said(capsys)
    assert "\x1b[" in out and "━" in out and f"org/tiny@{second[:12]} ready" in out, out
    assert f"org/tiny@{second}/m.gguf" in err
    listed = await call(nc, mirror.REPO_SHOW, RepoRef(repo="org/tiny"))
    assert {r.commit for r in listed.repos} == {first, second}, "the old commit stays beside the new"


async def test_detach_says_what_was_queued_and_returns(held, nats_server, tiny, capsys):
    commit = held.add_repo("org/tiny", {"m.gguf": tiny})
    held.throttle(50_000)
    assert await ctl(nats_server, "mirror", "add", "org/tiny", "--detach") == 0
    out, err = said(capsys)
    assert out == "" and err.startswith(f"Queued org/tiny@{commit} (main): queued, 1 file, 436.7 kB;"), err
    assert await ctl(nats_server, "mirror", "add", "org/tiny", "--detach", "--json") == 0
    queued = msgspec.json.decode(said(capsys)[0], type=MirroredRepo)
    assert (queued.repo, queued.commit, queued.added_by) == ("org/tiny", commit, "ctl")
    held.throttle(None)  # the fetch under way ends at once: the teardown waits for it


async def test_a_failed_fetch_exits_1_with_its_error(held, nats_server, tiny, capsys):
    held.add_repo("org/tiny", {"m.gguf": tiny})
    held.corrupt("org/tiny", "m.gguf")
    assert await ctl(nats_server, "mirror", "add", "org/tiny") == 1
    err = said(capsys)[1]
    assert err.startswith("llmgw ctl: fetching org/tiny@") and "failed: " in err and "m.gguf" in err, err


async def test_a_repo_the_hub_does_not_have_is_one_line_and_exit_1(held, nats_server, capsys):
    assert await ctl(nats_server, "mirror", "add", "org/nothing") == 1
    err = said(capsys)[1]
    assert err.count("\n") == 1 and "org/nothing" in err, err
    assert await ctl(nats_server, "mirror", "show", "org/nothing") == 1
    assert "the mirror holds no org/nothing" in said(capsys)[1]


async def test_hf_endpoint_and_token_set_for_ctl_are_said_not_to_reach_the_mirror(
    held, nats_server, tiny, capsys, monkeypatch
):
    """HF_ENDPOINT and HF_TOKEN set on `ctl mirror add` had no effect, and the error said "check
    hub_endpoint or HF_ENDPOINT" to a user who had."""
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.example.invalid")
    monkeypatch.setenv("HF_TOKEN", "hf_not_sent")
    assert await ctl(nats_server, "mirror", "add", "org/nothing") == 1
    err = said(capsys)[1]
    assert err.count("\n") == 1 and "HF_ENDPOINT and HF_TOKEN set here do not reach the mirror" in err, err
    assert "hf_not_sent" not in err
    held.add_repo("org/tiny", {"m.gguf": tiny})
    assert await ctl(nats_server, "mirror", "add", "org/tiny", "--detach") == 0
    err = said(capsys)[1]
    note = "note: HF_ENDPOINT set here does not reach the mirror: the mirror service reads its own environment"
    assert f"{note} (it fetches from {held.url})" in err, err


@pytest.mark.parametrize(
    ("words", "message"),
    [
        (["add", "tiny"], "'tiny' is not OWNER/REPO[@REVISION]"),
        (["add", "org/tiny@"], "'org/tiny@' is not OWNER/REPO[@REVISION]"),
        (["add", "org/tiny@a b"], "is not OWNER/REPO[@REVISION]"),
        (["show", "org/tiny@main"], "'org/tiny@main' is not OWNER/REPO[@COMMIT] with a 40-hex commit"),
        (["remove", "org/a/b"], "'org/a/b' is not OWNER/REPO[@COMMIT]"),
        (["update", "org/tiny@" + "0" * 40], "name the repo alone"),
    ],
)
async def test_a_repo_not_written_owner_slash_repo_is_refused_with_the_form_before_anything_is_sent(
    nats_server, capsys, words, message
):
    assert await ctl(nats_server, "mirror", *words) == 1
    err = said(capsys)[1]
    assert err.startswith("llmgw ctl: ") and message in err and err.count("\n") == 1, err


async def test_remove_is_refused_while_a_model_uses_the_repo_and_names_that_model(held, nats_server, nc, capsys):
    await call(nc, catalog.MODEL_PUT, ModelPut(model=Model(name="tiny", source=DEMO)))
    assert await ctl(nats_server, "mirror", "remove", "demo/tiny") == 1
    assert "demo/tiny is used by tiny (demo/tiny/tiny.gguf)" in said(capsys)[1]
    await call(nc, catalog.MODEL_REMOVE, ModelRef(name="tiny"))
    assert await ctl(nats_server, "mirror", "remove", "demo/tiny") == 0
    assert said(capsys)[1].startswith("Removed from the mirror: demo/tiny (1 file, 436.7 kB)")
    assert (await call(nc, mirror.REPO_LIST, Empty())).repos == []


async def test_adding_and_removing_a_repo_is_put_on_the_audit_trail_with_who(held, nats_server, nc, tiny):
    from llmgw.proto.people import AUDIT, AuditEntry

    heard = await nc.subscribe(AUDIT.subject("mirror"))
    commit = held.add_repo("org/tiny", {"m.gguf": tiny})
    assert await ctl(nats_server, "mirror", "add", "org/tiny", "--detach") == 0
    assert await ctl(nats_server, "mirror", "remove", f"org/tiny@{commit}") == 0
    added, removed = [msgspec.json.decode((await heard.next_msg(10)).data, type=AuditEntry) for _ in range(2)]
    assert (added.action, added.who, added.subject, added.before) == ("add", "ctl", f"org/tiny@{commit}", "")
    assert '"files":["m.gguf"]' in added.after
    assert (removed.action, removed.who, removed.after) == ("remove", "ctl", "") and "m.gguf" in removed.before
