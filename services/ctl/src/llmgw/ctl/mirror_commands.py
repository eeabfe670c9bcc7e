"""`llmgw ctl mirror ...`: repos fetched from Hugging Face onto the mirror (pinned to a commit,
every file verified), followed to the end with a progress bar; listed, shown, removed, updated."""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import sys
import time
from collections.abc import Awaitable, Callable, Mapping

import msgspec
from nats.aio.client import Client
from rich.filesize import decimal

from llmgw.bus import BusError, call, flushed
from llmgw.ctl.changes import BY
from llmgw.ctl.hub_commands import SEARCH
from llmgw.ctl.tables import table
from llmgw.ctl.tree import Noun, Verb, done, show
from llmgw.proto import Empty, MirroredRepo, RepoAdd, RepoList, RepoRef, mirror

__all__ = ["MIRROR", "hub_env_note", "progress_line", "repo_words", "repos_table"]

_REF = re.compile(r"^(?P<repo>[^/@\s]+/[^/@\s]+)(?:@(?P<at>[^@\s]*))?$")
_EXAMPLE = "Qwen/Qwen2.5-0.5B-Instruct-GGUF@main"
_QUIET_S = 10.0
"""With no event for this long, ask the mirror how the fetch is doing (events may be lost)."""
_LINE_EVERY_S = 5.0
"""Plain progress lines (stdout not a terminal): at most one this often, and one at each new state."""
_ENDED = ("ready", "failed")


def repo_words(text: str, at: str = "REVISION") -> tuple[str, str]:
    """OWNER/REPO[@AT] as (repo, at); a ValueError saying the form when `text` is not one."""
    found = _REF.match(text)
    if not found or (found["at"] is not None and not found["at"]):
        raise ValueError(f"'{text}' is not OWNER/REPO[@{at}]: a Hugging Face repo such as {_EXAMPLE}")
    return found["repo"], found["at"] or ""


def _checked(kind: type, text: str, form: str, **fields: object):
    """`fields` as a `kind` message, checked as the mirror will check it before it is sent."""
    try:
        return msgspec.convert(fields, kind)
    except msgspec.ValidationError as exc:
        raise ValueError(f"'{text}' is not {form} ({exc}): a Hugging Face repo such as {_EXAMPLE}") from None


def _commit_ref(text: str) -> RepoRef:
    repo, commit = repo_words(text, "COMMIT")
    return _checked(RepoRef, text, "OWNER/REPO[@COMMIT] with a 40-hex commit", repo=repo, commit=commit, by=BY)


def _key(repo: MirroredRepo, short: bool = False) -> str:
    """'owner/name@commit' (12 hex when `short`), or 'owner/name' for an import (no commit)."""
    if not repo.commit:
        return repo.repo
    return f"{repo.repo}@{repo.commit[:12] if short else repo.commit}"


def _size(n: int) -> str:
    return decimal(n).replace(" bytes", " B").replace(" byte", " B")


def _files(repo: MirroredRepo) -> str:
    return f"{len(repo.files)} file{'' if len(repo.files) == 1 else 's'}"


def _percent(repo: MirroredRepo) -> str:
    return f"{100 * repo.done // repo.size}%" if repo.size else "100%"


def _left(repo: MirroredRepo) -> str:
    if repo.eta_s is None:
        return "time left unknown"
    return f"{repo.eta_s:.0f} s left" if repo.eta_s < 120 else f"{repo.eta_s / 60:.0f} min left"


def progress_line(repo: MirroredRepo) -> str:
    """One line of a fetch's progress: state, bytes done of all, rate and time left."""
    line = f"{_key(repo, short=True)}: {repo.state} {_size(repo.done)} of {_size(repo.size)} ({_percent(repo)})"
    if repo.state == "fetching":
        line += f", {_size(int(repo.rate))}/s, {_left(repo)}" if repo.rate > 0 else ", measuring the rate"
    return line


class _Lines:
    """Progress as plain lines (a log, a pipe): one at each new state, else one every few seconds."""

    def __init__(self, out) -> None:
        self.out, self.state, self.last, self.done = out, "", 0.0, -1

    def __enter__(self) -> _Lines:
        return self

    def __exit__(self, *_) -> None:
        return None

    def show(self, repo: MirroredRepo) -> None:
        now = time.monotonic()
        if repo.state == self.state and repo.done < self.done:
            return  # an event that came after a later one: the line said more already
        if repo.state != self.state or now - self.last >= _LINE_EVERY_S:
            print(progress_line(repo), file=self.out, flush=True)
            self.state, self.last, self.done = repo.state, now, repo.done


class _Bar:
    """Progress as a bar on a terminal: bytes done of all, rate and time left, as the mirror says."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn

        self.progress = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            DownloadColumn(),
            TextColumn("{task.fields[rate]}"),
            TextColumn("{task.fields[left]}"),
            console=console,
        )
        self.task = None

    def __enter__(self) -> _Bar:
        self.progress.start()
        return self

    def __exit__(self, *_) -> None:
        self.progress.stop()

    def show(self, repo: MirroredRepo) -> None:
        fields = {
            "description": f"{_key(repo, short=True)} {repo.state}",
            "total": repo.size,
            "completed": repo.done,
            "rate": f"{_size(int(repo.rate))}/s" if repo.state == "fetching" else "",
            "left": _left(repo) if repo.state == "fetching" else "",
        }
        if self.task is None:
            self.task = self.progress.add_task(**fields)
        else:
            self.progress.update(self.task, **fields)


def _view(args: argparse.Namespace) -> _Bar | _Lines:
    """A bar when stdout is a terminal, else plain lines (on stderr with --json: stdout is the JSON)."""
    from rich.console import Console

    if args.json:
        return _Lines(sys.stderr)
    console = Console()
    return _Bar(console) if console.is_terminal else _Lines(sys.stdout)


def _ended(args: argparse.Namespace, repo: MirroredRepo) -> int:
    """The end of a fetch: the sources to put in a model (0), or why it failed (1)."""
    if repo.state == "failed":
        print(
            f"llmgw ctl: fetching {_key(repo)} failed: {repo.error}; `llmgw ctl mirror add {_key(repo)}` tries "
            "again (files already verified are kept)",
            file=sys.stderr,
        )
        return 1
    sources = ", ".join(f"{_key(repo)}/{f.path}" for f in repo.files)
    skipped = f"; left out: {', '.join(s.path for s in repo.skipped)}" if repo.skipped else ""
    return done(
        args,
        repo,
        f"{_key(repo)} is on the mirror, verified ({_files(repo)}, {_size(repo.size)}){skipped}. "
        f"Sources for a model: {sources}",
    )


async def _now(nc: Client, repo: MirroredRepo) -> MirroredRepo:
    """The fetch as the mirror holds it now."""
    held = await call(nc, mirror.REPO_SHOW, RepoRef(repo=repo.repo, commit=repo.commit))
    return next((r for r in held.repos if r.commit == repo.commit), repo)


async def _watch(nc: Client, args: argparse.Namespace, repo: MirroredRepo, events: asyncio.Queue) -> int:
    """Show the fetch of `repo` moving on, from the mirror's events, until it is ready or failed."""
    with _view(args) as view:
        view.show(repo)
        while repo.state not in _ENDED:
            try:
                event = await asyncio.wait_for(events.get(), _QUIET_S)
            except TimeoutError:
                event = await _now(nc, repo)
            if (event.repo, event.commit) == (repo.repo, repo.commit):
                repo = event
                view.show(repo)
    return _ended(args, repo)


async def _follow(nc: Client, args: argparse.Namespace, ask: Callable[[], Awaitable[MirroredRepo]]) -> int:
    """Listen to the mirror's fetch events, then `ask` (an add or an update), then follow the fetch
    it answers with to its end (or, with --detach, say what was queued)."""
    events: asyncio.Queue[MirroredRepo] = asyncio.Queue()

    async def heard(msg) -> None:
        try:
            events.put_nowait(msgspec.json.decode(msg.data, type=MirroredRepo))
        except (msgspec.DecodeError, msgspec.ValidationError):
            return

    sub = await nc.subscribe(mirror.FETCH_CHANGED.all, cb=heard)
    try:
        await flushed(nc)  # the subscription is the server's before the fetch can start
        repo = await ask()
        if args.detach and repo.state not in _ENDED:
            return done(
                args,
                repo,
                f"Queued {_key(repo)} ({repo.revision or 'imported'}): {repo.state}, {_files(repo)}, "
                f"{_size(repo.size)}; `llmgw ctl mirror show {_key(repo)}` shows how far it is.",
            )
        return await _watch(nc, args, repo, events)
    finally:
        await sub.unsubscribe()


def hub_env_note(env: Mapping[str, str], origin: str | None) -> str:
    """What to tell an operator who set HF_ENDPOINT or HF_TOKEN for `ctl` (`env`): the mirror
    service reads its own. `origin`: where the mirror said it fetches from (None: the add failed,
    and either may be why); '' where there is nothing to say."""
    endpoint, token = env.get("HF_ENDPOINT", "").rstrip("/"), env.get("HF_TOKEN", "")
    if origin is not None:
        token = ""  # it worked: the mirror's own token (or none) was enough
        if not endpoint or origin.rstrip("/") == endpoint or origin.startswith("file:"):
            return ""
    names = [n for n, v in (("HF_ENDPOINT", endpoint), ("HF_TOKEN", token)) if v]
    if not names:
        return ""
    where = f" (it fetches from {origin})" if origin else ""
    return (
        f"{' and '.join(names)} set here {'do' if len(names) > 1 else 'does'} not reach the mirror: "
        f"the mirror service reads its own environment{where}; set "
        "them where it runs (or before `llmgw up`), or hub_endpoint and token_file in its config"
    )


async def _add(nc: Client, args: argparse.Namespace) -> int:
    repo, revision = repo_words(args.repo)
    req = _checked(
        RepoAdd, args.repo, "OWNER/REPO[@REVISION]", repo=repo, revision=revision or "main", include=args.include, by=BY
    )

    async def ask() -> MirroredRepo:
        try:
            added = await call(nc, mirror.REPO_ADD, req)
        except BusError as exc:
            note = hub_env_note(os.environ, None)
            raise type(exc)(f"{exc.message}; {note}" if note else exc.message) from None
        if note := hub_env_note(os.environ, added.origin):
            print(f"note: {note}", file=sys.stderr, flush=True)
        return added

    return await _follow(nc, args, ask)


async def _update(nc: Client, args: argparse.Namespace) -> int:
    repo, at = repo_words(args.repo, "COMMIT")
    if at:
        raise ValueError(f"update follows the branch {repo} was added at: name the repo alone, not '{args.repo}'")
    ref = _checked(RepoRef, args.repo, "OWNER/REPO", repo=repo, by=BY)
    return await _follow(nc, args, lambda: call(nc, mirror.REPO_UPDATE, ref))


def repos_table(listed: RepoList) -> str:
    """`llmgw ctl mirror list`: one row per repo at a commit."""
    rows = [
        (r.repo, r.commit[:12] or "-", r.revision or "-", r.state, len(r.files), _size(r.size), _percent(r))
        for r in listed.repos
    ]
    return table(["REPO", "COMMIT", "REVISION", "STATE", "FILES", "SIZE", "DONE"], rows)


def _repo_text(r: MirroredRepo) -> str:
    """One commit of a repo: where it came from, its files, what was left out and why it failed."""
    when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(r.added_at)) if r.added_at else "-"
    head = (
        f"{_key(r)}: {r.state}, {_size(r.done)} of {_size(r.size)} ({_percent(r)}); revision {r.revision or '-'}, "
        f"from {r.origin}, added by {r.added_by or '-'} at {when} UTC"
    )
    files = table(
        ["  FILE", "SIZE", "SHA256", "STATE", "ERROR"],
        [(f"  {f.path}", _size(f.size), f.sha256[:12] or f.blob_id[:12] or "-", f.state, f.error) for f in r.files],
    )
    said = [head, files]
    said += [f"  left out {s.path}: {s.why}" for s in r.skipped]
    if r.error:
        said.append(f"  failed: {r.error}")
    return "\n".join(said)


async def _list(nc: Client, args: argparse.Namespace) -> int:
    listed = await call(nc, mirror.REPO_LIST, Empty())
    return show(args, listed, repos_table(listed))


async def _show(nc: Client, args: argparse.Namespace) -> int:
    held = await call(nc, mirror.REPO_SHOW, _commit_ref(args.repo))
    return show(args, held, "\n\n".join(_repo_text(r) for r in held.repos))


async def _remove(nc: Client, args: argparse.Namespace) -> int:
    removed = await call(nc, mirror.REPO_REMOVE, _commit_ref(args.repo))
    said = "; ".join(f"{_key(r)} ({_files(r)}, {_size(r.size)})" for r in removed.repos)
    return done(args, removed, f"Removed from the mirror: {said}. Agents' cached copies stay until collected.")


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "repo", metavar="OWNER/REPO[@REVISION]", help="a Hugging Face repo, at a branch, tag or commit (default main)"
    )
    parser.add_argument(
        "--include",
        action="append",
        default=[],
        metavar="GLOB",
        help="only files matching it (again for more); default: every GGUF and safetensors file, configs, tokenizer",
    )
    _detach(parser)


def _detach(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--detach", action="store_true", help="say what was queued and return; the fetch goes on")


def _commit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", metavar="OWNER/REPO[@COMMIT]", help="a mirrored repo (every commit held, or one)")


def _update_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("repo", metavar="OWNER/REPO", help="a mirrored repo added at a branch")
    _detach(parser)


_LIST = Verb(
    "list",
    "every repo on the mirror at each commit: revision, state, files, size, how far its fetch is",
    "llmgw ctl mirror list",
    "`llmgw ctl mirror show OWNER/REPO` shows its files",
    _list,
)

MIRROR = Noun(
    "mirror",
    "repos fetched from Hugging Face onto the mirror, pinned to a commit, every file verified",
    (
        Verb(
            "add",
            "fetch a repo at the commit its revision names now, showing the progress to the end",
            f"llmgw ctl mirror add {_EXAMPLE} --include '*Q4_K_M.gguf'",
            "put a source it prints (OWNER/REPO@COMMIT/FILE) in a model file and `llmgw ctl model add` it",
            _add,
            _add_arguments,
        ),
        _LIST,
        SEARCH,
        Verb(
            "show",
            "a repo's commits: each file's size, sha256 and state, the files left out and why, errors",
            "llmgw ctl mirror show Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            "`llmgw ctl mirror add` again retries a failed fetch",
            _show,
            _commit_arguments,
        ),
        Verb(
            "remove",
            "delete a repo's files from the mirror (one commit, or every one); refused while a model uses them",
            "llmgw ctl mirror remove Qwen/Qwen2.5-0.5B-Instruct-GGUF@" + "0" * 40,
            "nodes keep their cached copies until `llmgw ctl weights collect`",
            _remove,
            _commit_arguments,
        ),
        Verb(
            "update",
            "fetch the commit the repo's branch names now, beside the one held",
            "llmgw ctl mirror update Qwen/Qwen2.5-0.5B-Instruct-GGUF",
            "models keep the old commit until you point them at the new sources it prints",
            _update,
            _update_arguments,
        ),
    ),
    default=_LIST,
)
"""`llmgw ctl mirror VERB ...`."""
