"""The rows `llmgw ctl` shows, without I/O: as a table for people, and the same fields as JSON
(`--json`).

No engine key is ever in a row: what the replicas bucket holds is copied field by field.
"""

from __future__ import annotations

import time

import msgspec

from llmgw.proto import (
    KeyList,
    Limits,
    Model,
    ModelEntry,
    ModelList,
    ModelStatusList,
    Profile,
    ReplicaList,
    ReplicaTotals,
    RequestLog,
    UsageReport,
    replica_totals,
)

__all__ = [
    "ModelRow",
    "ModelRows",
    "ReplicaRow",
    "ReplicaRows",
    "keys_table",
    "limits_text",
    "memory_cell",
    "model_rows",
    "model_yaml",
    "models_table",
    "replica_rows",
    "replicas_table",
    "requests_table",
    "speed_cell",
    "table",
    "usage_table",
]


class ModelRow(msgspec.Struct, kw_only=True):
    """One model as `llmgw ctl models` shows it."""

    name: str
    ready: int
    """Replicas ready to answer."""
    wanted: int
    """Replicas the scheduler wants running now."""
    status: str
    """The scheduler's word for it (running, parked, stopped, ...)."""
    capacity_class: str
    reserves: str
    """What one replica of its first-choice profile holds."""
    profiles: dict[str, int | None]
    """Profile -> replicas counted for it (None: the scaling decides)."""
    aliases: list[str]
    fallbacks: list[str]
    warning: str
    """Why it is parked, or the last error of a failed replica; empty when all is well."""
    estimate_mb: int = 0
    """Memory the scheduler reckoned a replica takes, MiB (the largest of its replicas'); 0: none."""
    measured_mb: int = 0
    """Memory a replica's engine uses now, MiB, as its agent measured it (the largest); 0: none."""
    tokens_per_s: float = 0.0
    """Tokens a second one reply gets on its slowest replica, as the scheduler reckoned it; 0: none."""
    declared_in: str
    """The YAML file that declares it (change it there)."""
    revision: int
    model: Model
    """The whole model, as `llmgw ctl model get` gives it."""


class ModelRows(msgspec.Struct):
    """`llmgw ctl models --json`."""

    models: list[ModelRow]


class ReplicaRow(msgspec.Struct, kw_only=True):
    """One replica as `llmgw ctl replica list` shows it (never its engine's key)."""

    id: str
    node: str
    model: str
    profile: str
    state: str
    url: str
    error: str
    estimate_mb: int = 0
    """Memory the scheduler reckoned it takes, MiB; 0: not reckoned."""
    measured_mb: int = 0
    """Memory its engine uses now, MiB, as its agent measured it; 0: not measured."""
    tokens_per_s: float = 0.0
    """Tokens a second one reply gets, as the scheduler reckoned it at placement; 0: not reckoned."""


class ReplicaRows(msgspec.Struct):
    """`llmgw ctl replica list --json`."""

    replicas: list[ReplicaRow]


def table(header: list[str], rows: list) -> str:
    """Columns padded to their widest cell, two spaces apart."""
    rows = [header, *[[str(c) for c in row] for row in rows]]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in rows)


def model_yaml(entry: ModelEntry) -> str:
    """A model as people read it: the YAML `llmgw ctl model add` takes, under a comment saying its
    revision, who changed it last and where it is declared."""
    said = [f"revision {entry.revision}", f"changed by {entry.changed_by or 'unknown'}"]
    if entry.declared_in:
        said.append(f"declared in {entry.declared_in} (change it there)")
    body = msgspec.yaml.encode(_set(entry.model)).decode().rstrip()
    return f"# {entry.model.name}: {', '.join(said)}\n{body}"


def _set(value: object) -> object:
    """`value` with every Struct field left at its default left out (what a person wrote)."""
    if isinstance(value, msgspec.Struct):
        out = {}
        for f in msgspec.structs.fields(value):
            got = getattr(value, f.name)
            default = f.default_factory() if f.default_factory is not msgspec.NODEFAULT else f.default
            if got != default or default is msgspec.NODEFAULT or f.name == "name":
                out[f.encode_name] = _set(got)
        return out
    if isinstance(value, list | tuple):
        return [_set(v) for v in value]
    if isinstance(value, dict):
        return {k: _set(v) for k, v in value.items()}
    return value


def _count(n: int, thing: str) -> str:
    """`n` things, in the plural where there are not one ("1 core", "4 cores")."""
    return f"{n} {thing}" if n == 1 else f"{n} {thing}s"


def _reserves(profile: Profile) -> str:
    """What one replica of `profile` holds: cards, or cores and host memory (on each of its nodes)."""
    across = f" on each of {profile.nodes} nodes" if profile.nodes > 1 else ""
    if profile.gpus:
        return f"{profile.gpus}x{profile.gpu_class or 'gpu'}{across}"
    cores = _count(profile.cpu_cores, "core") if profile.cpu_cores else "half the cores"
    share = f"weights/{profile.nodes}" if profile.nodes > 1 else "weights"
    memory = f"{profile.host_memory_mb / 1024:.1f} GiB" if profile.host_memory_mb else f"{share}+10%"
    return f"{cores}, {memory}{across}"


def model_rows(listed: ModelList, replicas: ReplicaList, statuses: ModelStatusList | None = None) -> ModelRows:
    """Each model with its replicas ready and wanted, the scheduler's status and why it is parked or failing."""
    totals = replica_totals(replicas.replicas)
    failed: dict[str, list[str]] = {}
    for r in replicas.replicas:
        if r.state == "failed":
            failed.setdefault(r.model, []).append(r.error)
    known = {s.model: s for s in statuses.models} if statuses else {}
    rows = []
    for e in listed.models:
        m, st = e.model, known.get(e.model.name)
        errors, sums = failed.get(m.name, []), totals.get(m.name, ReplicaTotals())
        rows.append(
            ModelRow(
                name=m.name,
                ready=sums.ready,
                wanted=st.wanted if st else m.scaling.min,
                status=st.state if st else ("stopped" if m.stopped else "running"),
                capacity_class=m.capacity_class,
                reserves=_reserves(max(m.profiles, key=lambda p: p.priority)),
                profiles={p.name: p.replicas for p in m.profiles},
                aliases=m.aliases,
                fallbacks=m.fallbacks,
                warning=st.reason if st and st.reason else (f"{len(errors)} failed: {errors[-1]}" if errors else ""),
                estimate_mb=sums.estimate_mb,
                measured_mb=sums.measured_mb,
                tokens_per_s=sums.tokens_per_s,
                declared_in=e.declared_in,
                revision=e.revision,
                model=m,
            )
        )
    return ModelRows(models=rows)


def models_table(listed: ModelList, replicas: ReplicaList, statuses: ModelStatusList | None = None) -> str:
    """`llmgw ctl models`: name, ready/wanted, status, class, what a replica reserves, its memory
    (estimate/measured), profiles (with
    counts), aliases, fallbacks, and warnings (why it is parked, or replicas that failed and why)."""
    rows = []
    for r in model_rows(listed, replicas, statuses).models:
        counted = any(c is not None for c in r.profiles.values())
        rows.append(
            (
                r.name,
                f"{r.ready}/{r.wanted}",
                r.status + (" (declared)" if r.declared_in else ""),
                r.capacity_class,
                r.reserves,
                memory_cell(r.estimate_mb, r.measured_mb),
                speed_cell(r.tokens_per_s),
                ", ".join(f"{n}={c or 0}" if counted else n for n, c in r.profiles.items()),
                ", ".join(r.aliases) or "-",
                ", ".join(r.fallbacks) or "-",
                r.warning or "-",
            )
        )
    return table(
        [
            "MODEL",
            "READY",
            "STATUS",
            "CLASS",
            "RESERVES",
            "MIB PLANNED/USED",
            "~TOK/S",
            "PROFILES",
            "ALIASES",
            "FALLBACKS",
            "WARNINGS",
        ],
        rows,
    )


def replica_rows(replicas: ReplicaList) -> ReplicaRows:
    """Each replica: where it runs, what it serves, its state and URL, and why it failed."""
    return ReplicaRows(
        replicas=[
            ReplicaRow(
                id=r.id,
                node=r.node,
                model=r.model,
                profile=r.profile,
                state=r.state,
                url=r.url,
                error=r.error,
                estimate_mb=r.estimate_mb,
                measured_mb=r.measured_mb,
                tokens_per_s=r.tokens_per_s,
            )
            for r in replicas.replicas
        ]
    )


def replicas_table(replicas: ReplicaList) -> str:
    """`llmgw ctl replica list`: one line each, its memory as estimate/measured (an error's first line)."""
    rows = [
        (
            r.id,
            r.node,
            r.model,
            r.profile,
            r.state,
            memory_cell(r.estimate_mb, r.measured_mb),
            speed_cell(r.tokens_per_s),
            r.url or "-",
            r.error.splitlines()[0] if r.error else "",
        )
        for r in replica_rows(replicas).replicas
    ]
    return table(["ID", "NODE", "MODEL", "PROFILE", "STATE", "MIB PLANNED/USED", "~TOK/S", "URL", "ERROR"], rows)


def memory_cell(estimate_mb: int, measured_mb: int) -> str:
    """A replica's memory as the scheduler reckoned it and as its agent measured it:
    "estimate/measured" in MiB, under the column "MIB PLANNED/USED" ("?" where not reckoned,
    "-" where not measured), "-" for neither."""
    if not estimate_mb and not measured_mb:
        return "-"
    return f"{estimate_mb or '?'}/{measured_mb or '-'}"


def speed_cell(tokens_per_s: float) -> str:
    """The speed one reply gets, as reckoned at placement, marked slow under 15 and very slow under 5."""
    if not tokens_per_s:
        return "-"
    mark = " (very slow)" if tokens_per_s < 5 else " (slow)" if tokens_per_s < 15 else ""
    return f"{tokens_per_s:.0f}{mark}" if tokens_per_s >= 10 else f"{tokens_per_s:.1f}{mark}"


def limits_text(limits: Limits) -> str:
    """The limits set, as `name=value` words; 'none' when none is."""
    said = [f"{k}={v}" for k, v in msgspec.structs.asdict(limits).items() if v is not None]
    return " ".join(said) or "none"


def keys_table(keys: KeyList) -> str:
    """`llmgw ctl key list`: ids, names, projects, models, limits and expiry (never a key)."""
    rows = [
        (
            kid,
            k.name,
            k.project,
            "yes" if k.admin else "",
            ",".join(k.models) or "all",
            limits_text(k.limits),
            time.strftime("%Y-%m-%d", time.gmtime(k.expires)) if k.expires else "never",
        )
        for kid, k in keys.keys.items()
    ]
    return table(["ID", "NAME", "PROJECT", "ADMIN", "MODELS", "LIMITS", "EXPIRES"], rows)


def usage_table(report: UsageReport, by: str) -> str:
    """`llmgw ctl usage`: requests, errors and tokens, one row per `by`."""
    rows = [(r.group, r.requests, r.errors, r.prompt_tokens, r.cached_tokens, r.completion_tokens) for r in report.rows]
    return table([by.upper(), "REQUESTS", "ERRORS", "PROMPT", "CACHED", "COMPLETION"], rows)


def requests_table(log: RequestLog) -> str:
    """`llmgw ctl requests`: the latest requests, newest first, and how to see older ones."""
    rows = [
        (
            time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(r.time)),
            r.key,
            r.model,
            r.replica or "-",
            r.status,
            r.prompt_tokens,
            r.completion_tokens,
            r.saved_tokens or "-",
            f"{r.ttft_s * 1000:.0f}" if r.ttft_s is not None else "-",
            f"{r.latency_s * 1000:.0f}",
        )
        for r in log.requests
    ]
    head = ["TIME (UTC)", "KEY", "MODEL", "REPLICA", "STATUS", "PROMPT", "COMPLETION", "SAVED", "TTFT MS", "MS"]
    older = f"\nolder: --before {log.next}" if log.next else ""
    return table(head, rows) + older
