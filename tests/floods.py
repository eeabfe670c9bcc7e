"""Floods a hostile client sends a gateway's port (issue 31), shared by the chaos tests and
tests/bench/floods.py, and a steady client beside them whose answers say whether the gateway
kept serving.

The kinds, each from its own process (`python tests/floods.py KIND ...`, JSON tally on stdout),
from source addresses 127.0.0.<first>... in turn so that a per-address limit is met as a flood
from many machines would meet it:
- `heads`: a request line, then a header line every `every_s`, never the blank line;
- `bodies`: a whole head with `content-length: 100000`, then one byte of body every `every_s`;
- `idle`: connections that send nothing;
- `pipeline`: one connection, `n` requests for /v1/models written at once and no answer read.
Each connection holds on for `hold_s` from its opening, then lets go; the tally counts the connections made, those the
gateway ended before then, and the statuses it answered.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

__all__ = ["Steady", "Tally", "flood"]


@dataclass
class Tally:
    """What one flood saw."""

    made: int = 0
    """Connections the gateway accepted."""
    refused: int = 0
    """Connections it would not take."""
    ended: int = 0
    """Connections it ended before the flood let go."""
    statuses: dict[str, int] = field(default_factory=dict)
    """Status lines it answered with, counted."""

    def add(self, other: Tally) -> None:
        self.made, self.refused, self.ended = (
            self.made + other.made,
            self.refused + other.refused,
            self.ended + other.ended,
        )
        for status, n in other.statuses.items():
            self.statuses[status] = self.statuses.get(status, 0) + n


def flood(
    kind: str, port: int, n: int, hold_s: float, *, key: str = "", every_s: float = 2.0, sources: int = 1
) -> Tally:
    """Run a flood from processes of its own (at most 9,000 connections each, the descriptors one
    may hold here; a pipeline from one) and add up their tallies."""
    procs, first, left = [], 2, n
    while left > 0:
        share = left if kind == "pipeline" else min(left, 9000)
        span = max(1, round(sources * share / n))
        argv = [sys.executable, __file__, kind, str(port), str(share), str(hold_s)]
        argv += ["--key", key, "--every-s", str(every_s), "--first", str(first), "--sources", str(span)]
        procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE))
        first, left = first + span, left - share
    total = Tally()
    for proc in procs:
        out, _ = proc.communicate(timeout=hold_s + 300)
        total.add(Tally(**json.loads(out)))
    return total


class Steady:
    """A client asking `path` one request after another (a new connection where one is closed),
    each answer's time and status kept: the client the floods must not starve."""

    def __init__(self, url: str, key: str, body: dict | None = None) -> None:
        self.url, self.key = url, key
        self.body = body or {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
        self.answers: list[tuple[float, float, str]] = []
        """(when, seconds, status or error) of each request."""
        self.stopping = asyncio.Event()

    async def run(self, every_s: float = 0.05) -> None:
        """Until `stop()`."""
        async with httpx.AsyncClient(timeout=30) as http:
            while not self.stopping.is_set():
                started = time.monotonic()
                try:
                    answer = await http.post(
                        f"{self.url}/v1/chat/completions",
                        json=self.body,
                        headers={"authorization": f"Bearer {self.key}"},
                    )
                    status = str(answer.status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                self.answers.append((started, time.monotonic() - started, status))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), every_s)

    def stop(self) -> None:
        self.stopping.set()

    def failed(self) -> list[tuple[float, float, str]]:
        """The answers that were not 200."""
        return [a for a in self.answers if a[2] != "200"]

    def p99_ms(self) -> float:
        """The 99th percentile of its answers' times."""
        times = sorted(a[1] for a in self.answers) or [0.0]
        return 1000 * times[min(len(times) - 1, int(len(times) * 0.99))]


# -- one flood process ------------------------------------------------------------------------------
async def _connection(args, source: str, piece: bytes, first: bytes, tally: Tally) -> None:
    """One connection, held `hold_s` from its opening unless the gateway ends it first."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", args.port, local_addr=(source, 0))
    except OSError:
        tally.refused += 1
        return
    tally.made += 1
    stop = time.monotonic() + args.hold_s
    try:
        writer.write(first)
        while (left := stop - time.monotonic()) > 0:
            try:
                data = await asyncio.wait_for(reader.read(65536), min(args.every_s, left))
            except TimeoutError:
                if piece:
                    writer.write(piece)
                continue
            if data.startswith(b"HTTP/"):
                status = data.split(b"\r\n", 1)[0].decode(errors="replace")
                tally.statuses[status] = tally.statuses.get(status, 0) + 1
            if not data:
                tally.ended += 1
                return
    except OSError:
        tally.ended += 1
    finally:
        writer.close()


async def _pipeline(args, tally: Tally) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", args.port)
    tally.made += 1
    request = f"GET /v1/models HTTP/1.1\r\nhost: x\r\nauthorization: Bearer {args.key}\r\n\r\n".encode()
    writer.transport.set_write_buffer_limits(high=1 << 30)
    writer.write(request * args.n)  # never read: the gateway must stop reading, not pile answers up
    await asyncio.sleep(args.hold_s)
    writer.transport.abort()


async def _main(args) -> Tally:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    tally = Tally()
    if args.kind == "pipeline":
        await _pipeline(args, tally)
        return tally
    first, piece = {
        "heads": (b"GET /v1/models HTTP/1.1\r\nhost: x\r\n", b"x-slow: 1\r\n"),
        "bodies": (
            b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"content-length: 100000\r\n\r\n{",
            b" ",
        ),
        "idle": (b"", b""),
    }[args.kind]
    sources = [f"127.0.0.{args.first + i}" for i in range(args.sources)]
    tasks = []
    for i in range(args.n):  # opened a few at a time, as a client would, not all in one burst
        tasks.append(asyncio.create_task(_connection(args, sources[i % len(sources)], piece, first, tally)))
        if i % 200 == 199:
            await asyncio.sleep(0.01)
    await asyncio.gather(*tasks)
    return tally


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("kind", choices=["heads", "bodies", "idle", "pipeline"])
    parser.add_argument("port", type=int)
    parser.add_argument("n", type=int)
    parser.add_argument("hold_s", type=float)
    parser.add_argument("--key", default="")
    parser.add_argument("--every-s", type=float, default=2.0)
    parser.add_argument("--first", type=int, default=2)
    parser.add_argument("--sources", type=int, default=1)
    result = asyncio.run(_main(parser.parse_args()))
    print(json.dumps(collections.OrderedDict(vars(result))))
