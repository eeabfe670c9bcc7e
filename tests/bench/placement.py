"""How good the scheduler's placements are, not only how fast: on small heterogeneous fleets
solved exactly, the predicted tokens a second of what llmgw places against the optimum and
against bin-packing; then how long placing and a steady pass take as the fleet grows.

Fleets: CPU-only nodes of different memory rates and core counts, and nodes with 1-4 cards of
one of four classes (one in five with two classes). Models of 1B to 70B parameters (Q4_0 or
Q8_0, a context of 8,192), most with a card profile and a CPU fallback, some CPU-only or
card-only, wanting 1-3 replicas each. A replica's predicted tokens a second on a node is the scheduler's own
figure (`llmgw.scheduler.placement.speed_of`, what its speed scorer ranks by and what the
replica's record carries); its need is the scheduler's (`need_of`), and whether a node can take
it is the scheduler's filter chain on that node empty.

- llmgw: `llmgw.scheduler.core.reconcile` from nothing, default policy (one pass).
- best-fit (the bin-packing GPUStack documents as its default placement: the candidate left
  most used): the same order of models, replicas and profiles, the same filters, each replica on
  the node left with the least room of what it takes (card memory for a card replica, host
  memory for a CPU one).
- optimum: an integer program solved by HiGHS (`highspy`): copies of each model's profiles on
  each node (and card class), at most the model's replicas, within each node's host memory,
  cores and cards of each class; first as many replicas as can be placed, then, among those
  placements, the most tokens a second.
- llmgw*, a diagnostic: the same `reconcile` with the models renamed so that it takes first
  those whose replica can run fastest anywhere (it takes them by name).

Goals: llmgw at least 95% of the optimum on every fleet drawn (placing as many replicas as
can be placed), and ahead of best-fit; 10,000
nodes and 10,000 replicas placed in under 2 s, a steady pass under 0.1 s, growing no worse than
linearly (CPU seconds, best of three runs taken in alternation). Run with `just bench`.
"""

from __future__ import annotations

import gc
import itertools
import random
import statistics
import time
from dataclasses import dataclass

import highspy
import msgspec

from llmgw.modelplan import Shape
from llmgw.proto import GpuInfo, Model, NodeInfo, Profile, ReplicaState, Scaling
from llmgw.scheduler.core import CLASS_RANK, Actual, Desired, NodeView, Policy, reconcile
from llmgw.scheduler.placement import FILTERS, Need, NodeState, claim, need_of, node_states, place, speed_of

__all__ = [
    "Fleet",
    "Row",
    "best_fit",
    "difference",
    "draw",
    "fastest_first",
    "llmgw",
    "optimum",
    "quality",
    "report",
    "scale",
]

NOW = 1_000_000.0
POLICY = Policy()
CLASSES = [("h100-80g", 81559), ("a100-40g", 40960), ("l40s-48g", 46068), ("l4-24g", 23034)]
# name: (parameters, layers, embedding, feed forward, heads, kv heads, head length)
SIZES = {
    "1b": (1.24e9, 16, 2048, 8192, 32, 8, 64),
    "3b": (3.2e9, 28, 3072, 8192, 24, 8, 128),
    "8b": (8.0e9, 32, 4096, 14336, 32, 8, 128),
    "14b": (14.8e9, 48, 5120, 13824, 40, 8, 128),
    "32b": (32.8e9, 64, 5120, 27648, 40, 8, 128),
    "70b": (70.6e9, 80, 8192, 28672, 64, 8, 128),
}
QUANTS = {"Q4_0": 0.5625, "Q8_0": 1.0625}
"""Bytes a parameter."""


@dataclass
class Fleet:
    """A drawn fleet and catalog: what `reconcile` takes."""

    nodes: dict[str, NodeView]
    models: dict[str, Model]
    weights: dict[str, int]
    shapes: dict[str, Shape]

    @property
    def replicas(self) -> int:
        """Replicas the catalog asks for."""
        return sum(m.scaling.min for m in self.models.values())


def _node(name: str, rng: random.Random, card_share: float) -> NodeView:
    gpus: list[GpuInfo] = []
    if rng.random() < card_share:
        kinds = rng.sample(CLASSES, 2 if rng.random() < 0.2 else 1)
        for cls, mem in kinds:
            gpus += [
                GpuInfo(index=len(gpus) + k, uuid=f"{name}-{len(gpus) + k}", name=cls, cls=cls, memory_total_mb=mem)
                for k in range(rng.choice([1, 2, 4]))
            ]
    total = rng.choice([32, 64, 128, 256]) * 1024
    info = NodeInfo(
        node=name,
        hostname=name,
        cpus=rng.choice([8, 16, 32, 64]),
        memory_total_mb=total,
        memory_available_mb=total,
        gpus=gpus,
        engines={"llamacpp": "1"},
        membw_all_gbs=rng.uniform(20, 300),
        membw_one_gbs=rng.uniform(6, 14),
        labels={"rack": f"r{rng.randrange(4)}"},
    )
    return NodeView(info=info, last_seen=NOW)


def _model(i: int, rng: random.Random, weights: dict[str, int], shapes: dict[str, Shape]) -> Model:
    size = rng.choice(list(SIZES))
    quant = rng.choice(list(QUANTS))
    params, layers, emb, ff, heads, kv, head = SIZES[size]
    nbytes = int(params * QUANTS[quant])
    source = f"org/{size}-{i}/model-{quant}.gguf"
    weights[source] = nbytes
    shapes[source] = Shape(
        layers=layers,
        embedding=emb,
        feed_forward=ff,
        heads=heads,
        kv_heads=kv,
        key_length=head,
        value_length=head,
        vocab=128256,
        parameters=int(params),
        weight_bytes=nbytes,
        active_bytes=nbytes,
        type_bytes={quant: nbytes},
    )
    cores = {"1b": 4, "3b": 4, "8b": 8, "14b": 8, "32b": 16, "70b": 16}[size]
    cpu = Profile(name="cpu", cpu_cores=cores)
    cards = Profile(name="gpu", gpus=2 if size == "70b" else 1, priority=10)
    profiles = rng.choice([[cards, cpu], [cards, cpu], [cards, cpu], [cpu], [cards]])
    want = rng.choice([1, 1, 2, 3])
    return Model(name=f"m{i:05d}", source=source, context=8192, profiles=profiles, scaling=Scaling(min=want, max=want))


def draw(nodes: int, replicas: int, seed: int, card_share: float = 0.5) -> Fleet:
    """A fleet of `nodes` and a catalog of models asking for `replicas` replicas in all."""
    rng = random.Random(seed)
    views = {f"node-{i:05d}": _node(f"node-{i:05d}", rng, card_share) for i in range(nodes)}
    models: dict[str, Model] = {}
    weights: dict[str, int] = {}
    shapes: dict[str, Shape] = {}
    left = replicas
    while left > 0:
        m = _model(len(models), rng, weights, shapes)
        if m.scaling.min > left:
            m.scaling = Scaling(min=left, max=left)
        models[m.name] = m
        left -= m.scaling.min
    return Fleet(nodes=views, models=models, weights=weights, shapes=shapes)


def _need(f: Fleet, model: Model, profile: Profile) -> Need:
    """A replica's need, as `reconcile` works it out."""
    return need_of(profile, f.weights[model.source], f.shapes.get(model.source), model.context)


def _empty(info: NodeInfo, cls: str = "") -> NodeState:
    """The node with nothing on it as placement sees it, its cards of class `cls` only (if given)."""
    state = node_states({info.node: (info, NOW, [])}, [], POLICY.reserve_mb)[info.node]
    if cls:
        state.free_cards = [g for g in state.free_cards if g.cls == cls]
    return state


def _passes(need: Need, state: NodeState) -> bool:
    return all(f(need, state, NOW, POLICY.stale_s) is None for _, f in FILTERS)


def _total(f: Fleet, placed: list[ReplicaState]) -> float:
    """The scheduler's predicted tokens a second of the replicas placed, summed."""
    return sum(_way_tps(f, f.models[r.model], *_where(f, r)[1:]) for r in placed)


def llmgw(f: Fleet, policy: Policy = POLICY) -> list[ReplicaState]:
    """What one `reconcile` pass from nothing starts."""
    ids = (f"r{i}" for i in itertools.count())
    plan = reconcile(
        Desired(models=f.models), Actual(nodes=f.nodes, weights=f.weights, shapes=f.shapes), NOW, policy, ids=ids
    )
    return [s.replica for s in plan.starts]


def _room_left(need: Need, state: NodeState, cards: list[str]) -> tuple[int, int]:
    """What the node has left of what the replica takes once it is placed, then the rest."""
    cards_left = sum(g.memory_total_mb for g in state.free_cards if g.uuid not in cards)
    host_left = state.free_mb - need.memory_mb
    return (cards_left, host_left) if need.cards else (host_left, cards_left)


def best_fit(f: Fleet) -> list[ReplicaState]:
    """Bin-packing: in `reconcile`'s order, each replica on the first of its profiles that fits
    anywhere, on the node that passes the scheduler's filters and is left with the least room."""
    states = node_states({n: (v.info, v.last_seen, v.weights) for n, v in f.nodes.items()}, [], POLICY.reserve_mb)
    placed = []
    order = sorted(f.models.values(), key=lambda m: (-CLASS_RANK[m.capacity_class], m.name))
    for model in order:
        for k in range(model.scaling.min):
            for profile in sorted(model.profiles, key=lambda p: -p.priority):
                need = _need(f, model, profile)
                best = None
                for name, state in states.items():
                    if _passes(need, state):
                        where, _ = place(need, model, {name: state}, NOW)
                        room = _room_left(need, state, where.cards)
                        if best is None or room < best[0]:
                            best = (room, where)
                if best:
                    where = best[1]
                    r = ReplicaState(
                        id=f"{model.name}-{k}",
                        model=model.name,
                        profile=profile.name,
                        node=where.node,
                        memory_mb=need.memory_mb,
                        cores=profile.cpu_cores or 0,
                        gpus=where.cards,
                        updated=NOW,
                    )
                    claim(states, r)
                    placed.append(r)
                    break
    return placed


@dataclass
class _Way:
    model: str
    profile: str
    node: str
    cls: str
    tps: float
    need: Need


def _ways(f: Fleet) -> list[_Way]:
    """Every (model, profile, node, card class) whose replica the node, empty, would take."""
    out = []
    for model in f.models.values():
        for profile in model.profiles:
            need = _need(f, model, profile)
            for name, view in f.nodes.items():
                classes = sorted({g.cls for g in view.info.gpus}) if need.cards else [""]
                for cls in classes:
                    state = _empty(view.info, cls)
                    if _passes(need, state):
                        out.append(_Way(model.name, profile.name, name, cls, speed_of(need, state), need))
    return out


def optimum(f: Fleet) -> tuple[float, int, dict[tuple[str, str, str, str], int]]:
    """The most tokens a second among the placements of as many replicas as can be placed: the
    total, the replicas placed, and how many copies go each way (model, profile, node, class)."""
    ways = _ways(f)
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("mip_rel_gap", 1e-7)
    h.setOptionValue("time_limit", 60.0)
    y = [h.addIntegral(lb=0, ub=f.models[w.model].scaling.min) for w in ways]
    by_model, by_node, by_cards = {}, {}, {}
    for v, w in zip(y, ways, strict=True):
        by_model.setdefault(w.model, []).append(v)
        by_node.setdefault(w.node, []).append((v, w))
        if w.cls:
            by_cards.setdefault((w.node, w.cls), []).append((v, w))
    for name, vs in by_model.items():
        h.addConstr(h.qsum(vs) <= f.models[name].scaling.min)
    for name, vws in by_node.items():
        info = f.nodes[name].info
        h.addConstr(h.qsum(w.need.memory_mb * v for v, w in vws) <= info.memory_available_mb - POLICY.reserve_mb)
        h.addConstr(h.qsum((w.need.profile.cpu_cores or 0) * v for v, w in vws) <= info.cpus)
    for (name, cls), vws in by_cards.items():
        count = sum(g.cls == cls for g in f.nodes[name].info.gpus)
        h.addConstr(h.qsum(w.need.cards * v for v, w in vws) <= count)
    count = h.qsum(y)
    h.maximize(count)
    placed = round(h.getInfo().objective_function_value)
    h.addConstr(count >= placed)
    h.maximize(h.qsum(w.tps * v for v, w in zip(y, ways, strict=True)))
    if h.getModelStatus() != highspy.HighsModelStatus.kOptimal:
        raise RuntimeError(f"HiGHS did not prove the optimum: {h.modelStatusToString(h.getModelStatus())}")
    values = h.vals(y)
    chosen = {(w.model, w.profile, w.node, w.cls): round(x) for w, x in zip(ways, values, strict=True) if round(x)}
    return h.getInfo().objective_function_value, placed, chosen


def _where(f: Fleet, r: ReplicaState) -> tuple[str, str, str, str]:
    cls = next((g.cls for g in f.nodes[r.node].info.gpus if r.gpus and g.uuid == r.gpus[0]), "")
    return (r.model, r.profile, r.node, cls)


def _way_tps(f: Fleet, model: Model, profile: str, node: str, cls: str) -> float:
    need = _need(f, model, next(p for p in model.profiles if p.name == profile))
    return speed_of(need, _empty(f.nodes[node].info, cls))


def difference(f: Fleet, placed: list[ReplicaState], best: dict[tuple[str, str, str, str], int]) -> list[str]:
    """Where llmgw's placement and the optimum's differ, model by model, with each way's tokens a second."""
    ours: dict[tuple[str, str, str, str], int] = {}
    for r in placed:
        ours[_where(f, r)] = ours.get(_where(f, r), 0) + 1

    def say(model: Model, ways: dict[tuple[str, str, str, str], int]) -> str:
        return ", ".join(
            f"{n}x {p}@{node}{'/' + cls if cls else ''} {_way_tps(f, model, p, node, cls):.0f}"
            for (_, p, node, cls), n in sorted(ways.items())
        )

    lines = []
    for name in sorted(f.models):
        a = {k: n for k, n in ours.items() if k[0] == name}
        b = {k: n for k, n in best.items() if k[0] == name}
        if a != b:
            m = f.models[name]
            lines.append(f"  {name} ({m.source.split('/')[1]}): llmgw {say(m, a) or '-'} | optimum {say(m, b) or '-'}")
    return lines


def fastest_first(f: Fleet) -> Fleet:
    """The same fleet and catalog with the models renamed so that `reconcile`, which takes them
    by name, places first those whose replica can run fastest anywhere (a diagnostic of its order)."""
    top: dict[str, float] = {}
    for w in _ways(f):
        top[w.model] = max(top.get(w.model, 0.0), w.tps)
    names = sorted(f.models, key=lambda m: (-top.get(m, 0.0), m))
    renamed = {old: f"x{i:05d}" for i, old in enumerate(names)}
    models = {renamed[k]: msgspec.structs.replace(m, name=renamed[k]) for k, m in f.models.items()}
    return Fleet(nodes=f.nodes, models=models, weights=f.weights, shapes=f.shapes)


@dataclass
class Row:
    """One fleet's placements: each one's tokens a second and replicas placed."""

    seed: int
    fleet: Fleet
    best: float
    best_n: int
    chosen: dict[tuple[str, str, str, str], int]
    ours: list[ReplicaState]
    ours_tps: float
    packed_tps: float
    packed_n: int
    ordered_tps: float
    ordered_n: int

    @property
    def ratio(self) -> float:
        """llmgw's share of the optimum."""
        return self.ours_tps / self.best

    @property
    def met(self) -> bool:
        """llmgw placed as many replicas as can be, at 95% of the optimum's tokens a second."""
        return len(self.ours) >= self.best_n and self.ratio >= 0.95


def quality(seeds: range) -> list[Row]:
    """For each seed, a fleet of 8-20 nodes and 10-40 replicas: the placements' totals."""
    rows = []
    for seed in seeds:
        rng = random.Random(seed)
        f = draw(rng.randint(8, 20), rng.randint(10, 40), seed)
        ours, packed = llmgw(f), best_fit(f)
        ordered = fastest_first(f)
        ordered_placed = llmgw(ordered)
        best, best_n, chosen = optimum(f)
        rows.append(
            Row(
                seed=seed,
                fleet=f,
                best=best,
                best_n=best_n,
                chosen=chosen,
                ours=ours,
                ours_tps=_total(f, ours),
                packed_tps=_total(f, packed),
                packed_n=len(packed),
                ordered_tps=_total(ordered, ordered_placed),
                ordered_n=len(ordered_placed),
            )
        )
    return rows


def _cpu(fn, *args):
    """CPU seconds of `fn(*args)` (the machine is shared: wall time is noisy), and what it gave;
    the garbage of the run before is collected first, not counted against this one."""
    gc.collect()
    t = time.process_time()
    out = fn(*args)
    return time.process_time() - t, out


def _steady(f: Fleet, running: list[ReplicaState]):
    ids = (f"s{i}" for i in itertools.count())
    actual = Actual(nodes=f.nodes, replicas=running, weights=f.weights, shapes=f.shapes)
    return reconcile(Desired(models=f.models), actual, NOW, POLICY, ids=ids)


def scale(sizes: tuple[int, ...], rounds: int = 3) -> dict[int, tuple[list[float], list[float], int]]:
    """For each size, N nodes and N replicas: the CPU seconds of each run placing all from nothing
    and of the steady pass after (`rounds` runs, the sizes taken in alternation), and how many
    were placed."""
    fleets = {n: draw(n, n, seed=n, card_share=0.6) for n in sizes}
    runs: dict[int, tuple[list[float], list[float], int]] = {n: ([], [], 0) for n in sizes}
    for _ in range(rounds):
        for n, f in fleets.items():
            place_s, placed = _cpu(llmgw, f)
            running = [msgspec.structs.replace(r, state="ready") for r in placed]
            steady_s, steady = _cpu(_steady, f, running)
            assert not steady.starts and not steady.stops, "the steady pass should have nothing to do"
            runs[n][0].append(place_s)
            runs[n][1].append(steady_s)
            runs[n] = (runs[n][0], runs[n][1], len(placed))
    return runs


def _met(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(rows: list[Row]) -> list[str]:
    """The quality table, its summary and the worst fleet's difference; the goal lines."""
    print("Placement quality: predicted tokens a second of one reply (the scheduler's speed_of), summed over")
    print("the replicas placed. optimum: HiGHS, as many replicas as can be placed, then the most tokens a second.")
    print("best-fit: bin-packing (GPUStack's default), each replica on the node left with the least room.")
    print("llmgw*: the same reconcile with the models renamed so the fastest-running come first (a diagnostic).")
    head = f"{'seed':>4}{'nodes':>6}{'asked':>6}{'optimum':>9}{'n':>4}"
    head += "".join(f"{name:>9}{'n':>4}{'/opt':>7}" for name in ("llmgw", "best-fit", "llmgw*"))
    print(head)
    for r in rows:
        line = f"{r.seed:4d}{len(r.fleet.nodes):6d}{r.fleet.replicas:6d}{r.best:9.0f}{r.best_n:4d}"
        for tps, n in ((r.ours_tps, len(r.ours)), (r.packed_tps, r.packed_n), (r.ordered_tps, r.ordered_n)):
            line += f"{tps:9.0f}{n:4d}{tps / r.best:7.1%}"
        print(line + ("" if r.met else "  <"))
    ratios = [r.ratio for r in rows]
    packs = [r.packed_tps / r.best for r in rows]
    ordered = [r.ordered_tps / r.best for r in rows]
    ahead = sum(r.ours_tps > r.packed_tps + 1e-6 for r in rows)
    behind = sum(r.ours_tps < r.packed_tps - 1e-6 for r in rows)
    short = sum(len(r.ours) < r.best_n for r in rows)
    print(
        f"of the optimum, min / median: llmgw {min(ratios):.1%} / {statistics.median(ratios):.1%}, "
        f"best-fit {min(packs):.1%} / {statistics.median(packs):.1%}, llmgw* {min(ordered):.1%} / "
        f"{statistics.median(ordered):.1%}; llmgw placed fewer than could be on {short} fleets; "
        f"< marks a fleet short of the goal"
    )
    print(f"llmgw against best-fit: ahead on {ahead} fleets, behind on {behind}, tied on {len(rows) - ahead - behind}")
    worst = min(rows, key=lambda r: (r.met, r.ratio))
    print(f"worst fleet (seed {worst.seed}), where llmgw and the optimum differ (tokens a second of each way):")
    for name, v in worst.fleet.nodes.items():
        i = v.info
        cards = ", ".join(f"{sum(g.cls == c for g in i.gpus)}x {c}" for c in dict.fromkeys(g.cls for g in i.gpus))
        memory = f"{i.memory_total_mb // 1024} GiB at {i.membw_all_gbs:.0f} GB/s"
        print(f"  {name}: {i.cpus} cores, {memory}; {cards or 'no cards'}")
    print("\n".join(difference(worst.fleet, worst.ours, worst.chosen)))
    met_all = sum(r.met for r in rows)
    return [
        f"llmgw at least 95% of the optimum (placing as many) on every fleet: {_met(met_all == len(rows))} "
        f"({met_all} of {len(rows)}; min {min(ratios):.1%})",
        f"llmgw ahead of best-fit: {_met(behind == 0 and ahead > 0)} (ahead on {ahead}, behind on {behind})",
    ]


def main() -> None:
    goals = report(quality(range(20)))
    sizes = (1000, 5000, 10000)
    runs = scale(sizes)
    print()
    print("Scale: N nodes (60% with cards) and N replicas; CPU seconds of one process, best of 3 in alternation")
    print(f"{'N':>6}{'place all s':>13}{'placed':>8}{'steady pass s':>15}{'runs varied':>13}")
    best = {}
    for n in sizes:
        places, steadies, placed = runs[n]
        best[n] = (min(places), min(steadies))
        varied = max(max(places) / min(places), max(steadies) / min(steadies)) - 1
        print(f"{n:6d}{min(places):13.3f}{placed:8d}{min(steadies):15.3f}{varied:12.0%}")
    (p1, s1), (p10, s10) = best[sizes[0]], best[sizes[-1]]
    print(f"growth 1,000 -> 10,000: placing {p10 / p1:.1f}x, steady {s10 / s1:.1f}x (linear would be 10.0x)")
    goals += [
        f"10,000 nodes and 10,000 replicas placed in under 2 s: {_met(p10 < 2)} ({p10:.3f} s)",
        f"a steady pass over them under 0.1 s: {_met(s10 < 0.1)} ({s10:.3f} s)",
        f"growth no worse than linear: {_met(p10 / p1 <= 10 and s10 / s1 <= 10)}",
    ]
    print("goals:")
    print("\n".join(f"  {g}" for g in goals))


if __name__ == "__main__":
    main()
