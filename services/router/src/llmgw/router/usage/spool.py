"""Usage the stream has not taken yet, kept on the router's disk until it does (a full disk under
NATS, NATS away, a stream that refuses): each message is kept with the id JetStream deduplicates
by (`Nats-Msg-Id`), sent again every few seconds until acknowledged, and marked sent in the file,
so that a restart resends only what was never taken and nothing is counted twice.

The file is a list of JSON lines, one per message kept (`{"id", "subject", "records"}`) or sent
(`{"sent": id}`); it is emptied once every message in it was taken. Each router keeps its own
file under `<data>/router/usage-spool/`, locked while it runs; a router that starts takes over
the files no running router holds (one that died), so their usage is sent too. Where the disk
itself is full, what cannot be written is kept in memory (and said once) until it can.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import secrets
from pathlib import Path

import msgspec
from nats.js import JetStreamContext

from llmgw.bus import get_logger
from llmgw.proto import UsageRecord

__all__ = ["FLUSH_S", "RESEND_S", "Spooled", "UsageSpool", "message_id"]

RESEND_S = 2.0
"""How often what is kept is sent again."""
FLUSH_S = 0.2
"""How long after a message is kept (or sent) the file is written: what comes meanwhile joins it."""
COMPACT_LINES = 1000
"""The file is written anew once it holds this many lines more than twice what is pending."""


class Spooled(msgspec.Struct, kw_only=True):
    """One usage message the stream has not acknowledged."""

    id: str
    """Its `Nats-Msg-Id`: the stream takes it once, however often it is sent."""
    subject: str
    records: list[UsageRecord]


class _Sent(msgspec.Struct, kw_only=True):
    sent: str


class _Line(msgspec.Struct, kw_only=True):
    """A line of the file, either kind."""

    id: str = ""
    subject: str = ""
    records: list[UsageRecord] = msgspec.field(default_factory=list)
    sent: str = ""


def message_id(records: list[UsageRecord]) -> str:
    """The id a usage message is deduplicated by: its requests' ids, hashed."""
    return hashlib.sha256("\n".join(r.request_id for r in records).encode()).hexdigest()[:32]


class UsageSpool:
    """The usage messages not yet taken by the stream, in memory and, a `FLUSH_S` later, on disk
    (written, synced and compacted off the event loop)."""

    def __init__(self, folder: Path, js: JetStreamContext, ack_s: float) -> None:
        self.folder, self.js, self.ack_s = folder, js, ack_s
        self.pending: dict[str, Spooled] = {}
        self.unwritten: list[bytes] = []
        """Lines not in the file yet: the next flush writes them (a full disk: a later one)."""
        self.lines = 0
        """Lines in the file: once far more than what is pending, it is written anew."""
        self.path: Path | None = None
        self.file = None
        self.failing = False
        self.news = asyncio.Event()
        """Set when a line is added to `unwritten`: `run` sleeps while there is none."""
        self.log = get_logger("router")

    def open(self) -> None:
        """Make and lock this router's file (locked before it has its name, so no other router
        takes it over); take over the ones no running router holds."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.path = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        self.file = _locked(self.path)
        for other in sorted(self.folder.glob("*.jsonl")):
            if other != self.path:
                self._take_over(other)

    def _take_over(self, path: Path) -> None:
        """A file whose router is gone: what it kept and never sent becomes this one's."""
        try:
            f = path.open("rb")
        except FileNotFoundError:
            return  # taken over by another router meanwhile
        with f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a running router's
            if os.fstat(f.fileno()).st_nlink == 0:
                return  # taken over and removed by another between our open and lock
            kept = _read(f.read())
            for message in kept.values():
                self.keep(message)
            path.unlink()  # while locked: no other router reads it after
        if kept:
            self.log.info("usage left by a router that stopped is sent again", messages=len(kept), file=str(path))

    def keep(self, message: Spooled) -> None:
        """A message the stream did not take: kept until it does."""
        if message.id not in self.pending:
            self.pending[message.id] = message
            self.unwritten.append(msgspec.json.encode(message) + b"\n")
            self.news.set()

    def _sent(self, message_id: str) -> None:
        if self.pending.pop(message_id, None) is not None:
            self.unwritten.append(msgspec.json.encode(_Sent(sent=message_id)) + b"\n")
            self.news.set()

    async def flush(self) -> None:
        """Write what is new, synced, off the loop; start the file over where it holds far more
        than what is pending (emptied where nothing is)."""
        lines, self.unwritten = self.unwritten, []
        anew = self.lines + len(lines) > 2 * len(self.pending) + COMPACT_LINES or not self.pending
        if anew and self.lines:
            lines = [msgspec.json.encode(m) + b"\n" for m in self.pending.values()]
        elif not lines:
            return
        try:
            await asyncio.to_thread(self._write_out, lines, anew and self.lines > 0)
        except OSError as exc:
            self.unwritten = lines + self.unwritten if not anew else self.unwritten
            self.news.set()  # tried again in `FLUSH_S`, whatever comes meanwhile
            if not self.failing:
                self.log.error("usage kept in memory only: the router's disk would not take it", error=str(exc))
            self.failing = True
            return
        if self.failing:
            self.log.info("usage kept on disk again")
        self.failing = False

    def _write_out(self, lines: list[bytes], anew: bool) -> None:
        """(In a thread.) Append `lines`, or put a file of them alone in the file's place."""
        if anew:
            temporary = self.path.with_name(f".{self.path.name}.new")
            fresh = temporary.open("wb", buffering=0)
            fcntl.flock(fresh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            _write_all(fresh.fileno(), b"".join(lines))
            os.replace(temporary, self.path)
            self.file.close()
            self.file, self.lines = fresh, len(lines)
            return
        fd = self.file.fileno()
        end = os.lseek(fd, 0, os.SEEK_END)
        try:
            _write_all(fd, b"".join(lines))
        except OSError:
            with contextlib.suppress(OSError):  # no partial line left for a reader to stumble on
                os.ftruncate(fd, end)
            raise
        self.lines += len(lines)

    async def run(self) -> None:
        """Write what is new `FLUSH_S` after it came (with what comes meanwhile); send what is
        kept again every `RESEND_S` (until cancelled). Where nothing is kept, it sleeps."""
        loop = asyncio.get_running_loop()
        resend_at = loop.time() + RESEND_S
        while True:
            if not self.unwritten:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.news.wait(), resend_at - loop.time() if self.pending else None)
            self.news.clear()
            await asyncio.sleep(FLUSH_S)
            await self.flush()
            if loop.time() >= resend_at and self.pending:
                await self.resend()
                resend_at = loop.time() + RESEND_S

    async def resend(self) -> None:
        """Send each kept message once more, until one is not taken (the rest wait)."""
        sent = 0
        for message in list(self.pending.values()):
            payload = msgspec.json.encode(message.records)
            try:
                await self.js.publish(message.subject, payload, timeout=self.ack_s, headers={"Nats-Msg-Id": message.id})
            except Exception:
                break  # the stream is not taking: the rest wait for the next round
            self._sent(message.id)
            sent += 1
        if sent:
            self.log.info("kept usage taken by the stream", messages=sent, still_kept=len(self.pending))

    def close(self) -> None:
        """Stop (what is kept stays in the file for the next router)."""
        if self.file is not None:
            with contextlib.suppress(OSError):
                _write_all(self.file.fileno(), b"".join(self.unwritten))
            self.file.close()
            self.file, self.unwritten = None, []


def _locked(path: Path):
    """A new file at `path`, locked by this process: made under a name of its own first, so that
    no other router can see it unlocked."""
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    f = temporary.open("ab", buffering=0)
    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.replace(temporary, path)
    return f


def _write_all(fd: int, data: bytes) -> None:
    """Every byte of `data` to `fd`, then synced (OSError where the disk will not take them)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.fsync(fd)


def _read(data: bytes) -> dict[str, Spooled]:
    """The messages a file keeps and never marked sent (a line cut short by a full disk is skipped)."""
    kept: dict[str, Spooled] = {}
    for line in data.splitlines():
        try:
            entry = msgspec.json.decode(line, type=_Line)
        except msgspec.DecodeError:
            continue
        if entry.sent:
            kept.pop(entry.sent, None)
        elif entry.id:
            kept[entry.id] = Spooled(id=entry.id, subject=entry.subject, records=entry.records)
    return kept
