"""A node's own CPU constants, fitted to what llama-bench measured on it, and kept only when they
estimate models left out of the fit better than the defaults do."""

from __future__ import annotations

import msgspec

from llmgw.modelplan._speed import DEFAULT_CPU, cpu_compute_seconds, cpu_read_gbs, cpu_tokens_per_second
from llmgw.proto import CpuCalibration

__all__ = ["Fitted", "Measured", "fit_cpu", "holdout_error", "judge_fit", "worst_error"]

_MINOR_SHARE = 0.05
"""A type holding under this share of every model's bytes (norms in F32) keeps its given cost."""


class Measured(msgspec.Struct, frozen=True, kw_only=True):
    """One llama-bench figure: a model whose tokens read `read_bytes`, on `threads` threads."""

    read_bytes: int
    threads: int
    tokens_per_second: float
    all_gbs: float
    core_gbs: float
    name: str = ""
    type_bytes: dict[str, int] = msgspec.field(default_factory=dict)
    """What a token reads, by tensor type; empty: all of an unmeasured type."""
    layers: int = 0


class Fitted(msgspec.Struct, frozen=True, kw_only=True):
    """A fit and the verdict on it."""

    fit: CpuCalibration
    """The constants fitted to every point, with their worst and held-out errors."""
    kept: bool
    """Whether they beat the defaults on models they were not fitted to."""
    defaults_error: float
    """The defaults' worst relative error over the same points."""
    worse_on: list[tuple[str, float, float]] = msgspec.field(default_factory=list)
    """Each real model the fit estimates worse than the defaults do: its name, the fit's worst
    error on it and the defaults' (any of them refuses the fit)."""


def _estimate(k: CpuCalibration, p: Measured) -> float:
    return cpu_tokens_per_second(p.read_bytes, p.all_gbs, p.core_gbs, p.threads, k, p.type_bytes or None, p.layers)


def worst_error(k: CpuCalibration, points: list[Measured]) -> float:
    """The largest relative error of `k`'s estimate over `points`."""
    return max((abs(_estimate(k, p) - p.tokens_per_second) / p.tokens_per_second for p in points), default=0.0)


def _weights(points: list[Measured], real: frozenset[str]) -> list[float]:
    """Each point's weight in a fit: the `real` models' points (files people serve, few) weigh as
    much together as the generated models' (many, of one type each), so a fit is not bought with
    an error on the files it is for."""
    n_real = sum(p.name in real for p in points)
    if n_real in (0, len(points)):
        return [1.0] * len(points)
    heavy = (len(points) - n_real) / n_real
    return [heavy if p.name in real else 1.0 for p in points]


def _rms_error(k: CpuCalibration, points: list[Measured], weights: list[float]) -> float:
    """The weighted mean of the squared relative errors."""
    squares = (((_estimate(k, p) - p.tokens_per_second) / p.tokens_per_second) ** 2 for p in points)
    return sum(w * e for w, e in zip(weights, squares, strict=True)) / sum(weights)


def _solve(a: list[list[float]], b: list[float]) -> list[float]:
    """Least squares by the normal equations (a few unknowns), a whisker of ridge for safety."""
    n = len(a[0])
    m = [[sum(r[i] * r[j] for r in a) for j in range(n)] for i in range(n)]
    v = [sum(r[i] * y for r, y in zip(a, b, strict=True)) for i in range(n)]
    for i in range(n):
        m[i][i] += 1e-9 * (m[i][i] or 1.0)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot], v[col], v[pivot] = m[pivot], m[col], v[pivot], v[col]
        for r in range(n):
            if r != col and m[col][col]:
                f = m[r][col] / m[col][col]
                m[r] = [x - f * y for x, y in zip(m[r], m[col], strict=True)]
                v[r] -= f * v[col]
    return [v[i] / m[i][i] if m[i][i] else 0.0 for i in range(n)]


def _nonnegative(a: list[list[float]], b: list[float]) -> list[float]:
    """Least squares with no negative unknown: the most negative is pinned at 0 until none is."""
    free = list(range(len(a[0])))
    x = [0.0] * len(a[0])
    while free:
        sol = _solve([[r[i] for i in free] for r in a], b)
        worst = min(range(len(free)), key=lambda i: sol[i])
        if sol[worst] >= 0:
            for i, value in zip(free, sol, strict=True):
                x[i] = value
            return x
        free.pop(worst)
    return x


def _fit_costs(points: list[Measured], k: CpuCalibration, types: list[str], weights: list[float]) -> CpuCalibration:
    """The costs of `types` and the fixed cost that fit `points` best with `k`'s memory constants,
    in relative terms (each token's time divided by its measured time), each point `weights` heavy."""
    rows, ys = [], []
    for p, w in zip(points, weights, strict=True):
        scale = w**0.5
        measured_s = 1 / p.tokens_per_second
        read_s = p.read_bytes / (cpu_read_gbs(p.all_gbs, p.core_gbs, p.threads, k) * 1e9)
        rest = {t: n for t, n in (p.type_bytes or {"": p.read_bytes}).items() if t not in types}
        known_s = read_s + cpu_compute_seconds(rest, p.threads, k)
        per = 1e-9 / max(p.threads, 1)
        by_type = p.type_bytes or {"": p.read_bytes}
        sync = p.layers if p.threads > 1 else 0
        row = [*(by_type.get(t, 0) * per / measured_s for t in types), sync / measured_s, 1 / measured_s]
        rows.append([scale * x for x in row])
        ys.append(scale * (1 - known_s / measured_s))
    *costs, layer_sync, fixed = _nonnegative(rows, ys)
    return msgspec.structs.replace(
        k,
        compute_ns_per_byte={**k.compute_ns_per_byte, **{t: round(c, 5) for t, c in zip(types, costs, strict=True)}},
        layer_sync_s=round(layer_sync, 7),
        token_fixed_s=round(min(fixed, 0.05), 6),
    )


def _fitted_types(points: list[Measured]) -> list[str]:
    types: set[str] = set()
    for p in points:
        for t, n in (p.type_bytes or {"": p.read_bytes}).items():
            if n >= _MINOR_SHARE * p.read_bytes:
                types.add(t)
    return sorted(types)


def fit_cpu(
    points: list[Measured],
    source: str,
    base: CpuCalibration = DEFAULT_CPU,
    memory: bool = True,
    real: frozenset[str] = frozenset(),
) -> CpuCalibration:
    """The constants that make the estimate closest to `points` (least mean squared relative error;
    one noisy figure moves it less than fitting the worst would; the `real` models' points weigh as
    much together as the others').

    The arithmetic per byte of each type the points hold, the threads' wait a layer and the fixed
    cost a token are solved for (never negative); with `memory`, over a search of the threads' share of one core's rate
    and their exponent too. Types the points do not hold keep `base`'s costs; the machine's cap
    stays.
    """
    if not points:
        raise ValueError("nothing measured to fit")
    types, weights = _fitted_types(points), _weights(points, real)
    base = msgspec.structs.replace(base, all_gbs=0.0, core_gbs=0.0)  # each point at the rates measured with it
    grid = (
        [(s / 100, e / 100) for s in range(50, 151, 5) for e in range(50, 101, 5)]
        if memory
        else [(base.core_share, base.thread_exp)]
    )
    best, best_err = base, _rms_error(base, points, weights)
    for share, exp in grid:
        k = _fit_costs(points, msgspec.structs.replace(base, core_share=share, thread_exp=exp), types, weights)
        err = _rms_error(k, points, weights)
        if err < best_err:
            best, best_err = k, err
    fitted = msgspec.structs.replace(best, source=source, worst_error=round(worst_error(best, points), 4))
    rates = {(p.all_gbs, p.core_gbs) for p in points}
    if len(rates) == 1:  # measured at one moment (a calibration): estimates read at those rates
        fitted = msgspec.structs.replace(fitted, all_gbs=points[0].all_gbs, core_gbs=points[0].core_gbs)
    return fitted


def holdout_error(
    points: list[Measured], base: CpuCalibration = DEFAULT_CPU, memory: bool = True, real: frozenset[str] = frozenset()
) -> float:
    """The largest relative error on a model left out of the fit: each model (by name) is estimated
    by the constants fitted to the others (`real` as `fit_cpu` weighs them); 0 with fewer than two
    models."""
    names = sorted({p.name for p in points})
    if len(names) < 2:
        return 0.0
    worst = 0.0
    for name in names:
        fitted = fit_cpu([p for p in points if p.name != name], "", base, memory, real)
        worst = max(worst, worst_error(fitted, [p for p in points if p.name == name]))
    return worst


def judge_fit(
    points: list[Measured],
    source: str,
    base: CpuCalibration = DEFAULT_CPU,
    memory: bool = True,
    real: frozenset[str] = frozenset(),
) -> Fitted:
    """Fit `points` and say whether to keep the fit: only when its error on models it was not
    fitted to is below the defaults' error on the same models, and it estimates none of the
    `real` models (points by name: files people serve) worse than the defaults do."""
    base = msgspec.structs.replace(base, all_gbs=0.0, core_gbs=0.0)  # each point at the rates measured with it
    fit = fit_cpu(points, source, base, memory, real)
    held_out = holdout_error(points, base, memory, real)
    fit = msgspec.structs.replace(fit, holdout_error=round(held_out, 4))
    defaults = worst_error(base, points)
    worse_on = []
    for name in sorted(real):
        mine = [p for p in points if p.name == name]
        fitted, given = worst_error(fit, mine), worst_error(base, mine)
        if mine and fitted > given:
            worse_on.append((name, round(fitted, 4), round(given, 4)))
    kept = len({p.name for p in points}) >= 2 and held_out < defaults and not worse_on
    return Fitted(fit=fit, kept=kept, defaults_error=defaults, worse_on=worse_on)
