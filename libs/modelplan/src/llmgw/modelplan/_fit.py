"""A node's own CPU constants, fitted to what llama-bench measured on it."""

from __future__ import annotations

import msgspec

from llmgw.modelplan._speed import DEFAULT_CPU, cpu_tokens_per_second
from llmgw.proto import CpuCalibration

__all__ = ["Measured", "fit_cpu", "worst_error"]


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """One llama-bench figure: a model whose tokens read `read_bytes`, on `threads` threads."""

    read_bytes: int
    threads: int
    tokens_per_second: float
    all_gbs: float
    core_gbs: float
    name: str = ""


def worst_error(k: CpuCalibration, points: list[Measured]) -> float:
    """The largest relative error of `k`'s estimate over `points`."""
    return max(
        (
            abs(cpu_tokens_per_second(p.read_bytes, p.all_gbs, p.core_gbs, p.threads, k) - p.tokens_per_second)
            / p.tokens_per_second
            for p in points
        ),
        default=0.0,
    )


def _rms_error(k: CpuCalibration, points: list[Measured]) -> float:
    return sum(
        (
            (cpu_tokens_per_second(p.read_bytes, p.all_gbs, p.core_gbs, p.threads, k) - p.tokens_per_second)
            / p.tokens_per_second
        )
        ** 2
        for p in points
    ) / len(points)


def fit_cpu(points: list[Measured], source: str) -> CpuCalibration:
    """The constants that make the estimate closest to `points` (least mean squared relative error;
    one noisy figure moves it less than fitting the worst would).

    A search over the thread exponent and the fixed cost per token, with the core share solved
    in between: few parameters, few points, no solver needed. The machine's cap stays.
    """
    if not points:
        raise ValueError("nothing measured to fit")
    best, best_err = DEFAULT_CPU, _rms_error(DEFAULT_CPU, points)
    for exp_i in range(30, 101, 2):
        thread_exp = exp_i / 100
        for fixed_i in range(0, 31):
            fixed = fixed_i / 2000  # 0 to 15 ms
            for share_i in range(30, 151, 2):
                k = msgspec.structs.replace(
                    DEFAULT_CPU, core_share=share_i / 100, thread_exp=thread_exp, token_fixed_s=fixed
                )
                err = _rms_error(k, points)
                if err < best_err:
                    best, best_err = k, err
    return msgspec.structs.replace(best, source=source, worst_error=round(worst_error(best, points), 4))
