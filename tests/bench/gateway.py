"""What a gateway adds, measured with wrk against peers in the same run (issue 18).

Every row posts the same streaming chat completion (16 chunks, the usage chunk, [DONE]) to the
same stub backend: nginx answering every request with that stream, on core 0 beside the load
generator (wrk, one thread). Each gateway runs alone on core 1 (`taskset`): nginx as a plain
reverse proxy (the floor), vllm-router (Rust, round-robin), the Python floor (`python_floor.py`:
the least a gateway on the router's own stack does, to tell the language's share of a gap from
the router's own), Portkey's gateway (Node, an
OpenAI-compatible custom host, its HTTP stack at the versions its lockfile pins; as shipped, and
without the 25 ms it waits before a stream's first event), LiteLLM's proxy as its production page
says and its image installs it, and llmgw's router with a plain key, with a key carrying every
limit, with that key on NATS as a cluster runs it (nkeys and TLS), with keys near their limits
(7 in flight allowed; a tokens-a-minute limit 90% used before each run); last, vllm-router and
two llmgw routers (two processes, each on its own SO_REUSEPORT socket of the one port) given
both cores, which they share with wrk and the backend then; and the plain key's router
exporting its spans over OTLP/HTTP (to a receiver of ours in this process, on core 0) with 1% of
traces sampled and with every one. The rows take turns, `ROUNDS`
times; each keeps its best, and a limit's cost over the plain key is the median of their rounds
side by side. Figures: added latency p50/p99 at one connection (against the backend
alone), the most requests a second with p99 under 20 ms over 1, 4, 16 and 64 connections, and the
gateway's resident memory. A peer that cannot be installed or does not start is a row saying why.
Run with `just bench` (wrk and nginx are installed from Debian when root);
`python tests/bench/gateway.py llmgw` measures only the rows whose name holds "llmgw" (and the
backend alone, which every row is measured against): for working on one row, not for the record.
"""

from __future__ import annotations

import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from gateway_peers import (
    BODY,
    LOAD_CORE,
    Peer,
    Unavailable,
    ensure_debian,
    rss,
    settle,
    start_backend,
    start_litellm,
    start_nginx,
    start_portkey,
    start_python_floor,
    start_vllm_router,
)
from gateway_peers import start_router as router_peer

sys.path.insert(0, str(Path(__file__).parent.parent.parent))
from llmgw.proto import Limits
from llmgw.proto.guard import Check, Policy
from tests.otlp import OtlpReceiver

__all__ = ["load_script", "main"]

ROUNDS = 5
CONNECTIONS = (1, 4, 16, 64)
SECONDS = {1: 4, 4: 2, 16: 2, 64: 2}
"""How long wrk runs at each step: longer at one connection, where p99 is the figure."""
P99_CEILING_MS = 20.0
PATH = "/v1/chat/completions"
SCRIPT = f"""wrk.method = "POST"
wrk.body = '{BODY}'
wrk.headers["Content-Type"] = "application/json"
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format('{{"p50":%d,"p99":%d,"requests":%d,"us":%d,"errors":%d}}\\n',
    latency:percentile(50), latency:percentile(99), summary.requests, summary.duration,
    e.connect + e.read + e.write + e.status + e.timeout))
end
"""
EVERY_LIMIT = Limits(
    requests_per_minute=10**9,
    tokens_per_minute=10**12,
    concurrent=10**6,
    tokens_per_day=10**15,
    tokens_per_month=10**15,
)
BOTH = "0,1"
"""The cores of the last two rows' gateways: the load generator's and the backend's too (this
machine has two), so those rows compare with each other only."""
SEVEN = Limits(concurrent=7)
"""A key near its limit at every request: 7 in flight allowed (what a KV slot each would be)."""
TPM = Limits(tokens_per_minute=10**7)
"""A key whose minute is 90% used before each run (`used=0.9`): its last 10% hold a whole run
(and far more than a lease asks for: it leases as a key far from its limits does)."""
LIMITED = ("llmgw every limit", "  + nkeys and TLS", "llmgw 7 in flight", "llmgw tokens/min 90%")
"""The rows whose cost over the plain key is a limit's."""
GUARDED = Policy(
    name="bench",
    input=[Check(kind="pii"), Check(kind="pattern", action="block", pattern=r"(?i)project\s+falcon", label="CODENAME")],
)
"""A guardrail policy the guarded row's requests meet: every pii kind and a tenant pattern."""


@dataclass
class Step:
    """One wrk run: latency percentiles in ms, requests a second, failed requests."""

    p50: float
    p99: float
    rps: float
    errors: int


@dataclass
class Row:
    """A peer's runs, per round and connection count; or why it has none."""

    name: str
    start: object
    peer: Peer | None = None
    why: str = ""
    runs: list[dict[int, Step]] = field(default_factory=list)
    memory: int = 0

    def best(self, figure: str, connections: int = 1) -> float:
        return min(getattr(r[connections], figure) for r in self.runs)

    def sustained(self) -> list[float]:
        """Each round's most requests a second at a step whose p99 stayed under the ceiling."""
        return [
            max((s.rps for s in r.values() if s.p99 < P99_CEILING_MS and not s.errors), default=0.0) for r in self.runs
        ]


def wrk(script: Path, peer: Peer, connections: int, seconds: int) -> Step:
    """One wrk run pinned to the load core (the peer put back where it is measured first)."""
    if peer.prepare is not None:
        peer.prepare()
    argv = ["taskset", "-c", str(LOAD_CORE), "wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "--latency"]
    argv += ["-s", str(script), "-H", f"Authorization: Bearer {peer.key}"]
    argv += [a for name, value in peer.headers.items() for a in ("-H", f"{name}: {value}")] + [peer.url + PATH]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 30).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return Step(got["p50"] / 1000, got["p99"] / 1000, got["requests"] / (got["us"] / 1e6), got["errors"])


def load_script(tmp: Path, max_tokens: int = 16) -> Path:
    """wrk's script posting the chat body (asking `max_tokens`) written in `tmp`; Unavailable
    where wrk cannot be had."""
    ensure_debian("wrk", "wrk")
    script = tmp / "chat.lua"
    script.write_text(SCRIPT.replace('"max_tokens":16', f'"max_tokens":{max_tokens}'))
    return script


def main() -> int:
    with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory(prefix="llmgw-gateway-") as d:
        tmp = Path(d)
        try:
            script = load_script(tmp)
        except Unavailable as e:
            print(f"no load generator, nothing measured: {e}")
            return 1
        try:
            backend = start_backend(stack, tmp)
        except Unavailable as e:
            print(f"no stub backend, nothing measured: {e}")
            return 1
        rows = [
            Row("backend alone", lambda: backend),
            Row("nginx (C)", lambda: start_nginx(stack, tmp, backend.url)),
            Row("vllm-router (Rust)", lambda: start_vllm_router(stack, tmp, backend.url)),
            Row("LiteLLM (Python)", lambda: start_litellm(stack, tmp, backend.url)),
            Row("Portkey (Node)", lambda: start_portkey(stack, tmp / "portkey", backend.url)),
            Row("  no 25 ms wait", lambda: start_portkey(stack, tmp / "portkey0", backend.url, wait=False)),
            Row("Python floor", lambda: start_python_floor(stack, tmp / "floor", backend.url)),
            Row("llmgw plain key", lambda: router_peer(stack, tmp / "plain", backend.url)),
            Row("llmgw every limit", lambda: router_peer(stack, tmp / "limited", backend.url, EVERY_LIMIT)),
            Row("  + nkeys and TLS", lambda: router_peer(stack, tmp / "tls", backend.url, EVERY_LIMIT, secure=True)),
            Row("llmgw 7 in flight", lambda: router_peer(stack, tmp / "seven", backend.url, SEVEN)),
            Row("llmgw tokens/min 90%", lambda: router_peer(stack, tmp / "tpm", backend.url, TPM, used=0.9)),
            Row("llmgw + pii and a pattern", lambda: router_peer(stack, tmp / "guard", backend.url, policy=GUARDED)),
            Row("llmgw traced 1%", lambda: router_peer(stack, tmp / "t1", backend.url, env=traced(stack, "0.01"))),
            Row("llmgw traced 100%", lambda: router_peer(stack, tmp / "t100", backend.url, env=traced(stack, "1"))),
            Row("vllm-router 2 cores", lambda: start_vllm_router(stack, tmp / "vr2", backend.url, core=BOTH)),
            Row("llmgw 2 processes", lambda: router_peer(stack, tmp / "two", backend.url, processes=2, core=BOTH)),
        ]
        wanted = sys.argv[1:]
        rows = [rows[0], *(r for r in rows[1:] if not wanted or any(w in r.name for w in wanted))]
        for row in rows:
            try:
                row.peer = row.start()
                probe = wrk(script, row.peer, 4, 1)  # warm up, and a peer that answers errors is a row saying so
                if probe.errors:
                    row.why, row.peer = f"{probe.errors} failed requests of {probe.rps:.0f}/s", None
            except (Unavailable, subprocess.SubprocessError, ValueError, IndexError) as e:
                row.why = str(e).replace("\n", " ")[:160] or type(e).__name__
        for i in range(ROUNDS):
            print(f"round {i + 1} of {ROUNDS}", file=sys.stderr)
            for row in rows:
                if row.peer:
                    row.runs.append({c: wrk(script, row.peer, c, SECONDS[c]) for c in CONNECTIONS})
                    row.memory = max(row.memory, rss(row.peer))
                    settle(row.peer)  # its backlog worked off before the next row is measured
        report(rows)
    return 0


def traced(stack: contextlib.ExitStack, ratio: str) -> dict[str, str]:
    """The environment that has the router export its spans, `ratio` of the traces sampled, to an
    OTLP receiver started here (its spans counted, then dropped)."""
    receiver = OtlpReceiver(keep=False)
    stack.callback(receiver.stop)
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.http_url,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": ratio,
    }


def peak(row: Row) -> float:
    """The most requests a second a row served at any step, whatever its p99."""
    return max(s.rps for r in row.runs for s in r.values())


def paired_p99(row: Row, against: Row) -> float:
    """The median over rounds of `row`'s p99 at one connection less `against`'s in the same round:
    rows measured in turn share each round's phase of the machine, which a best against a best
    (each from whichever round was quietest for it) does not."""
    return statistics.median(r[1].p99 - a[1].p99 for r, a in zip(row.runs, against.runs, strict=True))


def report(rows: list[Row]) -> None:
    """The table, the ratios, how far rounds varied, and which goals are met."""
    base = rows[0]
    print(
        f"streaming chat completions; wrk -t1, {SECONDS[1]} s at 1 connection, {SECONDS[4]} s at each of "
        f"{', '.join(map(str, CONNECTIONS[1:]))}; best of {ROUNDS} rounds taken in turn; gateway alone on one core"
    )
    head = f"{'':20}{'p50 ms':>8}{'p99 ms':>8}{'+p50':>7}{'+p99':>7}{'req/s p99<20':>13}{'peak':>7}{'RSS MiB':>8}"
    print(head + "  rounds varied (p99 at 1; req/s)")
    for row in rows:
        if not row.runs:
            print(f"{row.name:20}not measured: {row.why}")
            continue
        p50, p99 = row.best("p50"), row.best("p99")
        add50, add99 = p50 - base.best("p50"), p99 - base.best("p99")
        sus = row.sustained()
        p99s = [r[1].p99 for r in row.runs]
        mem = "" if row is base else f"{row.memory / 2**20:8.0f}"
        print(
            f"{row.name:20}{p50:8.2f}{p99:8.2f}{add50:7.2f}{add99:7.2f}{max(sus):13.0f}{peak(row):7.0f}{mem:>8}"
            f"  {min(p99s):.2f}-{max(p99s):.2f}; {min(sus):.0f}-{max(sus):.0f}"
        )
    goals(rows)


def goals(rows: list[Row]) -> None:
    """The issue's goals for llmgw against the peers measured in this run, each said unjudged
    where the difference is within the floor's own spread between rounds (the machine's noise)."""
    by = {r.name.split(" (")[0]: r for r in rows if r.runs}
    if "  no 25 ms wait" in by and ("Portkey" not in by or peak(by["  no 25 ms wait"]) > peak(by["Portkey"])):
        by["Portkey"] = by["  no 25 ms wait"]  # a peer compared at its best
    ours = by.get("llmgw plain key")
    if not ours:
        print("llmgw's router was not measured: no goal can be judged")
        return
    base = rows[0]
    floor = [r[1].p99 for r in base.runs]
    noise = max(floor) - min(floor)
    print(f"noise: the backend alone's p99 at one connection varied {noise:.2f} ms between rounds")
    add99 = ours.best("p99") - base.best("p99")
    rps = max(ours.sustained())
    peers = ", ".join(f"{n} {by[n].best('p99') - base.best('p99'):+.2f}" for n in ("nginx", "vllm-router") if n in by)
    said = f"llmgw adds {add99:.2f} ms at p99 at one connection (goal < 0.5 ms{'; ' + peers if peers else ''})"
    lines = [(said, add99 < 0.5, add99 - 0.5)]
    compared = (("LiteLLM", 10, ">= 10x"), ("Portkey", 1.0, ">= 1x"), ("vllm-router", 1.0, ">= 1x"))
    for name, factor, goal in compared:
        if name not in by:
            lines.append((f"{name} not measured: no comparison this run", False, None))
        elif theirs := max(by[name].sustained()):
            text = f"llmgw / {name} requests a second (p99 < 20 ms): {rps / theirs:.2f}x (goal {goal})"
            lines.append((text, rps / theirs >= factor, None))
        else:  # it never kept p99 under the ceiling: compare the most each served
            ratio = peak(ours) / peak(by[name])
            text = f"llmgw / {name} peak requests a second ({name} never kept p99 < 20 ms): {ratio:.2f}x (goal {goal})"
            lines.append((text, ratio >= factor, None))
    if "Python floor" in by and "vllm-router" in by:  # where the gap is: the language's, or the router's own
        floor = max(by["Python floor"].sustained())
        print(
            f"where the gap is: the Python floor serves {floor / max(max(by['vllm-router'].sustained()), 1):.2f}x "
            f"vllm-router's requests a second; llmgw serves {rps / max(floor, 1):.2f}x the floor's"
        )
    if "llmgw 2 processes" in by and "vllm-router 2 cores" in by:
        two, theirs = max(by["llmgw 2 processes"].sustained()), max(by["vllm-router 2 cores"].sustained())
        text = f"two cores: two llmgw routers / vllm-router, requests a second {two / max(theirs, 1):.2f}x (goal >= 1x)"
        lines.append((text, two >= theirs, None))
    for name in LIMITED:
        if name in by:
            best, paired = by[name].best("p99") - ours.best("p99"), paired_p99(by[name], ours)
            text = (
                f"{name.strip()} costs {paired:+.2f} ms at p99 over the plain key, the median of rounds "
                f"side by side ({best:+.2f} best against best; goal < 0.3)"
            )
            lines.append((text, paired < 0.3, paired - 0.3))
    for text, met, by_ms in lines:  # by_ms: how far a latency goal was missed, within the noise or not
        judged = "met    " if met else ("noise  " if by_ms is not None and by_ms < noise else "NOT met")
        print(f"{judged}  {text}")


if __name__ == "__main__":
    sys.exit(main())
