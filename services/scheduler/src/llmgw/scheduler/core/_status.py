"""How many replicas a model wants now, how long a failing one waits, and what its status says."""

from __future__ import annotations

from llmgw.proto import Model, ModelStatus, ReplicaState, Scaling
from llmgw.scheduler.core._plan import Desired, Plan

__all__ = ["CLASS_RANK", "backoff_s", "model_statuses", "status", "wanted"]

CLASS_RANK = {"batch": 0, "standard": 1, "critical": 2}
"""Capacity classes: a replica of a higher class may take the room of a lower one's."""


def wanted(scaling: Scaling, now: float, last_asked: float | None = None) -> int:
    """Replicas kept running now: the window of the schedule that holds at this UTC time of day
    (a window may run past midnight), else the scaling's min; with an idle timeout, at least
    one while the model was asked for within it (scaled to zero after, woken by a request)."""
    base = scaling.min
    minute = int(now // 60) % (24 * 60)
    for w in scaling.schedule:
        start, end = (int(t[:2]) * 60 + int(t[3:]) for t in (w.start, w.end))
        inside = start <= minute < end if start <= end else (minute >= start or minute < end)
        if inside:
            base = w.min
            break
    if scaling.idle_timeout_s is not None and last_asked is not None and now - last_asked < scaling.idle_timeout_s:
        return max(base, 1)
    return base


def backoff_s(failures: int, base: float = 5.0, cap: float = 300.0) -> float:
    """Seconds to wait before replacing a model's replica after `failures` failures in a row."""
    return min(cap, base * 2 ** max(0, failures - 1))


def _idle_reason(model: Model, last_asked: float | None) -> str:
    if last_asked:
        return f"scaled to zero: not asked for in {model.scaling.idle_timeout_s:g}s; the first request wakes it"
    return "on demand: the first request starts it"


def status(
    model: Model, replicas: list[ReplicaState], plan: Plan, now: float, held: str = "", last_asked: float | None = None
) -> ModelStatus:
    """A model's status from what runs and what this pass could not do; `held` is why it gave
    room to a higher class (kept by the shell until the model runs whole again)."""
    ready = sum(1 for r in replicas if r.model == model.name and r.state == "ready")
    want = wanted(model.scaling, now, last_asked)
    reason = plan.unplaced.get(model.name, "")
    if model.stopped is not None:
        state = "stopped"
    elif held and ready < want:
        state, reason = "held", held + (f"; {reason}" if reason else "")
    elif model.name in plan.backoff_until:
        state = "backing-off"
    elif reason:
        state = "parked"
    elif ready < want:
        state = "starting"
    elif want == 0 and model.scaling.idle_timeout_s is not None:
        state, reason = "idle", _idle_reason(model, last_asked)
    else:
        state = "running"
    return ModelStatus(
        model=model.name,
        state=state,
        ready=ready,
        wanted=want,
        reason=reason,
        until=plan.backoff_until.get(model.name, 0.0),
    )


def model_statuses(
    desired: Desired, replicas: list[ReplicaState], plan: Plan, now: float, held: dict[str, str]
) -> tuple[dict[str, ModelStatus], dict[str, str]]:
    """Every model's status after a pass, and the models still held: one that gave room to a
    higher class stays held until it runs whole again (or is stopped)."""
    held = {**held, **plan.held}
    out = {
        name: status(model, replicas, plan, now, held.get(name, ""), desired.demand.get(name))
        for name, model in desired.models.items()
    }
    still = {
        name: why for name, why in held.items() if name not in out or out[name].state not in ("running", "stopped")
    }
    return out, still
