"""CPU speed: what llama-bench measures here against what llmgw.modelplan predicts.

Generates models larger than the last-level cache (`llmgw plan calibrate`'s: two of each of
F16, Q8_0, Q4_0 and Q4_1), runs llama-bench at 1 and 2 threads, and prints measured against predicted with
the defaults (fitted on another fleet) and with this node's calibration. The calibrated column
is leave-one-model-out: each model is predicted by constants fitted to the others, so it shows
what calibration does for a model it has not seen. Run with `just bench`.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from llmgw.ctl.calibrate import bench_models, measure_models
from llmgw.membw import last_level_cache_bytes, measure
from llmgw.modelplan import DEFAULT_CPU, cpu_tokens_per_second, fit_cpu


def main() -> None:
    started = time.monotonic()
    bw = measure()
    if bw is None:
        print("memory bandwidth cannot be measured here: no benchmark")
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder, size_mb = Path(os.environ.get("LLMGW_BENCH_MODELS", tmp)), os.environ.get("LLMGW_BENCH_SIZE_MB")
        models = bench_models(folder, last_level_cache_bytes(), size_bytes=int(size_mb) * 2**20 if size_mb else None)
        points, _ = measure_models(models, [1, 2], bw, rounds=1)
    print(
        f"memory {bw.all_cores_gbs} GB/s all cores, {bw.one_core_gbs} one core; "
        f"last-level cache {(last_level_cache_bytes() or 0) / 2**20:.0f} MiB"
    )
    rows = [("model", "reads/token", "threads", "measured", "defaults", "err", "calibrated*", "err")]
    worst_default = worst_calibrated = 0.0
    for p in points:
        others = [q for q in points if q.name != p.name]
        k = fit_cpu(others, "others")
        d, c = (
            cpu_tokens_per_second(p.read_bytes, p.all_gbs, p.core_gbs, p.threads, x, p.type_bytes, p.layers)
            for x in (DEFAULT_CPU, k)
        )
        ed, ec = (d - p.tokens_per_second) / p.tokens_per_second, (c - p.tokens_per_second) / p.tokens_per_second
        worst_default, worst_calibrated = max(worst_default, abs(ed)), max(worst_calibrated, abs(ec))
        rows.append(
            (
                p.name,
                f"{p.read_bytes / 2**20:.0f} MiB",
                str(p.threads),
                f"{p.tokens_per_second:.1f} tok/s",
                f"{d:.1f}",
                f"{ed:+.0%}",
                f"{c:.1f}",
                f"{ec:+.0%}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print(
            "  ".join(
                cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths, strict=True))
            )
        )
    whole = fit_cpu(points, "all")
    print(
        f"worst error: defaults {worst_default:.0%}, calibrated {worst_calibrated:.0%} "
        f"(* fitted to the other models; fitted to all: core_share {whole.core_share}, thread_exp "
        f"{whole.thread_exp}, {whole.token_fixed_s * 1000:.1f} ms a token); took {time.monotonic() - started:.0f}s"
    )


if __name__ == "__main__":
    main()
