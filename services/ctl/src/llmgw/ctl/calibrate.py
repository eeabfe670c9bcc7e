"""`llmgw plan calibrate`: this node's own CPU speed constants, from llama-bench on generated models.

The models are random-weight GGUF files (dense and experts) larger than the last-level cache,
so every token reads memory, not cache. llama-bench runs each at 1, 2, ... threads; the
constants are fitted to the figures and kept in `<data_dir>/calibration.json`, which the
agent reports and the estimates use.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import subprocess
from pathlib import Path

from llmgw.bus import find_llamacpp
from llmgw.gguf import Header, TinyLlama, read_model, write_random_llama
from llmgw.membw import Bandwidth, last_level_cache_bytes, measure, save_calibration
from llmgw.modelplan import Measured, fit_cpu, worst_error
from llmgw.proto import CpuCalibration

__all__ = ["bench_models", "calibrate", "llama_bench", "measure_models", "report"]


def bench_models(folder: Path, llc_bytes: int | None) -> list[tuple[Path, Header]]:
    """Dense models of about 4, 6 and 8 times the last-level cache, and one of experts whose tokens
    read 4 times it, all Q8_0."""
    llc = max(llc_bytes or 0, 32 * 2**20)
    out = []
    layer = 1024 * 1024 * 4 + 3 * 1024 * 2816  # Q8_0 parameters of one dense layer below, ~1.06 bytes each
    for times in (4, 6, 8):
        layers = max(1, round(times * llc / (layer * 34 / 32)))
        shape = TinyLlama(
            embedding=1024, heads=8, kv_heads=8, feed_forward=2816, layers=layers, tensor_type="Q8_0", context=2048
        )
        out.append(write_random_llama(folder / f"dense-{times}x-llc.gguf", shape))
    active = (1024 * 1024 * 4 + 2 * 3 * 1024 * 1024) * 34 / 32  # what a token reads of one layer: 2 experts of 8
    experts = TinyLlama(
        embedding=1024,
        heads=8,
        kv_heads=8,
        feed_forward=1024,
        experts=8,
        experts_used=2,
        layers=max(1, round(4 * llc / active)),
        tensor_type="Q8_0",
        context=2048,
    )
    out.append(write_random_llama(folder / "experts-8x-llc.gguf", experts))
    return [(p, read_model(p)) for p in out]


def llama_bench(model: Path, threads: list[int], tokens: int = 64, repetitions: int = 3) -> dict[int, float]:
    """llama-bench's tokens a second generating `tokens` tokens, by thread count."""
    cmd = [
        find_llamacpp().bench,
        "-m",
        str(model),
        "-p",
        "0",
        "-n",
        str(tokens),
        "-r",
        str(repetitions),
        "-t",
        ",".join(map(str, threads)),
        "-ngl",
        "0",
        "-o",
        "json",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return {int(r["n_threads"]): float(r["avg_ts"]) for r in json.loads(done.stdout)}


def measure_models(models: list[tuple[Path, Header]], threads: list[int], bw: Bandwidth) -> list[Measured]:
    """Every model at every thread count, as points to fit."""
    points = []
    for path, header in models:
        for t, tps in sorted(llama_bench(path, threads).items()):
            points.append(
                Measured(
                    read_bytes=header.active_bytes,
                    threads=t,
                    tokens_per_second=tps,
                    all_gbs=bw.all_cores_gbs,
                    core_gbs=bw.one_core_gbs,
                    name=path.stem,
                )
            )
    return points


def calibrate(
    home: Path, threads: list[int] | None = None, folder: Path | None = None
) -> tuple[CpuCalibration, list[Measured]]:
    """Measure this node, fit its constants, and keep them in `home/calibration.json`."""
    bw = measure()
    if bw is None:
        raise RuntimeError(
            "this machine's memory bandwidth cannot be measured honestly (too little free memory "
            "for a buffer four times the last-level cache); nothing calibrated"
        )
    threads = threads or sorted({1, 2, *([os.cpu_count() or 1])})
    folder = folder or home / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    points = measure_models(bench_models(folder, last_level_cache_bytes()), threads, bw)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    fitted = fit_cpu(
        points, f"llama-bench on {socket.gethostname()} {stamp}, {bw.all_cores_gbs}/{bw.one_core_gbs} GB/s"
    )
    save_calibration(home, fitted)
    return fitted, points


def report(points: list[Measured], before: CpuCalibration, after: CpuCalibration) -> str:
    """What was measured beside what each set of constants predicts."""
    from llmgw.modelplan import cpu_tokens_per_second

    rows = [("MODEL", "THREADS", "MEASURED", "DEFAULTS", "ERR", "CALIBRATED", "ERR")]
    for p in points:
        a = cpu_tokens_per_second(p.read_bytes, p.all_gbs, p.core_gbs, p.threads, before)
        b = cpu_tokens_per_second(p.read_bytes, p.all_gbs, p.core_gbs, p.threads, after)
        rows.append(
            (
                p.name,
                str(p.threads),
                f"{p.tokens_per_second:.1f}",
                f"{a:.1f}",
                f"{(a - p.tokens_per_second) / p.tokens_per_second:+.0%}",
                f"{b:.1f}",
                f"{(b - p.tokens_per_second) / p.tokens_per_second:+.0%}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    )
    return (
        f"{table}\nworst error: defaults {worst_error(before, points):.0%}, calibrated {worst_error(after, points):.0%}"
        f" (core_share {after.core_share}, thread_exp {after.thread_exp}, {after.token_fixed_s * 1000:.1f} ms a token)"
    )
