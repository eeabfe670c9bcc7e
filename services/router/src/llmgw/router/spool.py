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

__all__ = ["RESEND_S", "Spooled", "UsageSpool", "message_id"]

RESEND_S = 2.0
"""How often what is kept is sent again."""


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
    """The usage messages not yet taken by the stream, on disk and in memory."""

    def __init__(self, folder: Path, js: JetStreamContext, ack_s: float) -> None:
        self.folder, self.js, self.ack_s = folder, js, ack_s
        self.pending: dict[str, Spooled] = {}
        self.unwritten: list[bytes] = []
        """Lines the disk would not take (full): written before anything else once it does."""
        self.file = None
        self.log = get_logger("router")

    def open(self) -> None:
        """Make and lock this router's file; take over the ones no running router holds."""
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}.jsonl"
        self.file = path.open("ab")
        fcntl.flock(self.file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        for other in sorted(self.folder.glob("*.jsonl")):
            if other != path:
                self._take_over(other)

    def _take_over(self, path: Path) -> None:
        """A file whose router is gone: what it kept and never sent becomes this one's."""
        with path.open("rb") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return  # a running router's
            kept = _read(f.read())
        for message in kept.values():
            self.keep(message)
        if kept:
            self.log.info("usage left by a router that stopped is sent again", messages=len(kept), file=str(path))
        path.unlink()

    def keep(self, message: Spooled) -> None:
        """A message the stream did not take: kept until it does."""
        if message.id not in self.pending:
            self.pending[message.id] = message
            self._write(msgspec.json.encode(message))

    def _sent(self, message_id: str) -> None:
        if self.pending.pop(message_id, None) is not None:
            if self.pending:
                self._write(msgspec.json.encode(_Sent(sent=message_id)))
            else:
                self._empty()

    def _write(self, line: bytes) -> None:
        self.unwritten.append(line + b"\n")
        try:
            self.file.write(b"".join(self.unwritten))
            self.file.flush()
            os.fsync(self.file.fileno())
        except OSError as exc:
            if len(self.unwritten) == 1:
                self.log.error("usage kept in memory only: the router's disk would not take it", error=str(exc))
            with contextlib.suppress(OSError):  # a partial line is cut off by the next good write
                self.file.truncate(self.file.tell())
            return
        self.unwritten.clear()

    def _empty(self) -> None:
        """Everything was taken: the file starts over."""
        self.unwritten.clear()
        with contextlib.suppress(OSError):
            self.file.truncate(0)
            self.file.seek(0)

    async def resend(self) -> None:
        """Send what is kept every `RESEND_S` until each is taken (runs until cancelled)."""
        while True:
            await asyncio.sleep(RESEND_S)
            sent = 0
            for message in list(self.pending.values()):
                payload = msgspec.json.encode(message.records)
                try:
                    await self.js.publish(
                        message.subject, payload, timeout=self.ack_s, headers={"Nats-Msg-Id": message.id}
                    )
                except Exception:
                    break  # not yet: the rest wait for the next round
                self._sent(message.id)
                sent += 1
            if sent:
                self.log.info("kept usage taken by the stream", messages=sent, still_kept=len(self.pending))

    def close(self) -> None:
        """Stop (what is kept stays in the file for the next router)."""
        if self.file is not None:
            self.file.close()


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
