"""`replica_totals`: the one sum of a model's replicas that `llmgw ctl models` and the console's
models page both show."""

from llmgw.proto import ReplicaState, ReplicaTotals, replica_totals


def _replica(rid, model, state, estimate=0, measured=0, tps=0.0):
    return ReplicaState(
        id=rid,
        model=model,
        profile="cpu",
        node="n",
        state=state,
        estimate_mb=estimate,
        measured_mb=measured,
        tokens_per_s=tps,
    )


def test_the_largest_memory_the_slowest_reckoned_speed_and_what_is_ready():
    replicas = [
        _replica("a", "m", "ready", estimate=900, measured=800, tps=12.0),
        _replica("b", "m", "ready", estimate=1000, measured=700, tps=9.5),
        _replica("c", "m", "starting", estimate=1100, measured=5000, tps=0.0),  # not ready: its measure not counted
        _replica("d", "other", "failed"),
    ]
    assert replica_totals(replicas) == {
        "m": ReplicaTotals(ready=2, estimate_mb=1100, measured_mb=800, tokens_per_s=9.5),
        "other": ReplicaTotals(),
    }
    assert replica_totals([]) == {}
