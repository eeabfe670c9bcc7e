"""The catalog's rules, without I/O: what makes a model acceptable (the changes to one: edits.py).

Replicas per profile: when any profile of a model has a count, each profile runs exactly
its count and the scaling is their sum (min and max alike).
"""

from __future__ import annotations

from collections.abc import Collection

from llmgw.modelplan import check_engine_args
from llmgw.proto import (
    FileInfo,
    FilePlace,
    Model,
    ModelEntry,
    Profile,
    PurgeReport,
    WeightsDeleted,
)
from llmgw.proto.errors import BadRequest, BusError, Conflict

__all__ = [
    "check_catalog",
    "check_editable",
    "check_file",
    "check_model",
    "check_removable",
    "counts_of",
    "files_to_purge",
    "is_pinned",
    "tally_purge",
]


def counts_of(model: Model) -> dict[str, int] | None:
    """Replicas per profile, or None when the model is not counted per profile."""
    if all(p.replicas is None for p in model.profiles):
        return None
    return {p.name: p.replicas or 0 for p in model.profiles}


def _describe(counts: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in counts.items())


def check_model(model: Model, allowed: Collection[str] = ()) -> None:
    """Raise BadRequest saying what is wrong with `model` beyond its schema; its engines' args and
    env keep to `llmgw.modelplan.check_engine_args`, with the flags and variables `allowed` besides
    (the catalog's `engine_args_allowed`: what chosen nodes opted into)."""
    names = [p.name for p in model.profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise BadRequest(f"model '{model.name}': profile names must be unique; repeated: {', '.join(dupes)}")
    for scaling, what in ((model.scaling, "scaling"), (model.stopped, "stopped scaling")):
        if scaling is not None and scaling.min > scaling.max:
            raise BadRequest(
                f"model '{model.name}': {what} min {scaling.min} is above max {scaling.max}; raise max or lower min"
            )
    for p in model.profiles:
        _check_profile(model, p, allowed)
    if model.name in model.aliases:
        raise BadRequest(f"model '{model.name}': an alias cannot be the model's own name")
    if model.name in model.fallbacks:
        raise BadRequest(f"model '{model.name}': a model cannot fall back to itself; name another model")
    _check_counts(model)
    if model.adapters:
        _check_adapters(model)


def _check_adapters(model: Model) -> None:
    """Raise BadRequest where `model`'s adapters cannot be loaded as they are said: names twice,
    an embedding model, or a vLLM profile (llama.cpp's GGUF LoRA files only, for now)."""
    names = [a.name for a in model.adapters]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise BadRequest(f"model '{model.name}': adapter names must be unique; repeated: {', '.join(dupes)}")
    if model.kind == "embedding":
        raise BadRequest(f"model '{model.name}' is an embedding model: it takes no adapters")
    if any(p.engine == "vllm" for p in model.profiles):
        raise BadRequest(
            f"model '{model.name}' runs on vLLM, whose adapters llmgw does not serve yet (vLLM loads a PEFT "
            "adapter's whole folder; nodes cache files one by one): attach GGUF LoRA adapters to a llama.cpp model"
        )


def _check_profile(model: Model, p: Profile, allowed: Collection[str]) -> None:
    """Raise BadRequest where profile `p` cannot serve `model` as it says, or gives its engine
    what it may not (`allowed` besides the allow-list)."""
    where = f"model '{model.name}' profile '{p.name}'"
    refused = check_engine_args(p.engine, p.args, p.env, allowed)
    if refused:
        raise BadRequest(f"{where}: {'; '.join(refused)}")
    if p.engine == "llamacpp" and not model.source.endswith(".gguf"):
        raise BadRequest(f"{where}: llama.cpp serves GGUF files; source '{model.source}' is not a .gguf")
    if p.gpus and p.gpus % p.tensor_parallel:
        raise BadRequest(
            f"{where}: tensor_parallel {p.tensor_parallel} does not divide its {p.gpus} GPUs; use a divisor of {p.gpus}"
        )
    if p.kv_events and p.engine != "vllm":
        raise BadRequest(
            f"{where}: kv_events is vLLM's (llama.cpp publishes none; the router learns its "
            "cache from the cached tokens it reports); drop kv_events or use engine vllm"
        )
    if p.nodes > 1 and p.engine != "llamacpp":
        raise BadRequest(f"{where}: only llama.cpp spans nodes here (RPC workers); use engine llamacpp or nodes 1")
    if (p.min_card_mb or p.min_compute or p.gpu_class) and not p.gpus:
        raise BadRequest(
            f"{where}: gpu_class, min_card_mb and min_compute say which cards it needs, and it "
            "takes none; set gpus or drop them"
        )
    if p.keep_within and p.nodes == 1:
        raise BadRequest(
            f"{where}: keep_within '{p.keep_within}' only applies to a replica across nodes; "
            "set nodes above 1 or drop keep_within"
        )
    _check_experts(where, p)


def _check_experts(where: str, p: Profile) -> None:
    """cpu_moe_layers is llama.cpp's, beside cards, on one node."""
    if not p.cpu_moe_layers:
        return
    if p.engine != "llamacpp":
        raise BadRequest(f"{where}: cpu_moe_layers is llama.cpp's (--n-cpu-moe); drop it or use engine llamacpp")
    if not p.gpus:
        raise BadRequest(
            f"{where}: cpu_moe_layers {p.cpu_moe_layers} keeps experts in host memory beside cards, and a CPU "
            "profile holds every weight there already; set gpus or drop cpu_moe_layers"
        )
    if p.nodes > 1:
        raise BadRequest(
            f"{where}: cpu_moe_layers and nodes {p.nodes} are one or the other (the RPC workers get whole "
            "layers); use nodes 1 or drop cpu_moe_layers"
        )
    if p.gpus > 1:
        raise BadRequest(
            f"{where}: cpu_moe_layers keeps the first layers' experts in host memory, and over {p.gpus} cards "
            "those layers are the first card's (the others keep theirs whole); use gpus 1 or drop cpu_moe_layers"
        )


def _check_counts(model: Model) -> None:
    """Raise BadRequest where counts per profile disagree with the scaling, or meet a schedule."""
    counts = counts_of(model)
    if counts is None:
        return
    scaling = model.stopped or model.scaling
    if scaling.schedule:
        raise BadRequest(
            f"model '{model.name}': replicas per profile and a schedule are one or the other; "
            "drop the schedule or the counts"
        )
    total = sum(counts.values())
    if (scaling.min, scaling.max) != (total, total):
        raise BadRequest(
            f"model '{model.name}': replicas per profile add up to {total} ({_describe(counts)}) "
            f"but its scaling is min {scaling.min}, max {scaling.max}; set both to {total} or change the counts"
        )


def check_catalog(model: Model, others: dict[str, Model]) -> None:
    """Raise BadRequest where `model` clashes with the rest of the catalog (`others`, without it)."""
    taken = {alias: o.name for o in others.values() for alias in o.aliases}
    if model.name in taken:
        raise BadRequest(f"model '{model.name}': that name is an alias of model '{taken[model.name]}'")
    for alias in model.aliases:
        if alias in others:
            raise BadRequest(f"model '{model.name}': alias '{alias}' is another model's name; pick another alias")
        if alias in taken:
            raise BadRequest(f"model '{model.name}': alias '{alias}' is already an alias of model '{taken[alias]}'")
    for fallback in model.fallbacks:
        if fallback not in others:
            raise BadRequest(f"model '{model.name}': fallback '{fallback}' is not in the catalog; add it first")


def is_pinned(source: str) -> bool:
    """Whether `source` names a file fetched at a commit ('OWNER/REPO@COMMIT/FILE')."""
    return "@" in source.split("/")[1]


def check_file(model: Model, info: FileInfo) -> None:
    """400 for a model whose file (as the mirror holds it) has a GGUF header that does not read:
    no engine could load it; and for a pinned source the mirror holds but has not verified."""
    if is_pinned(model.source) and not info.verified:
        raise BadRequest(
            f"model '{model.name}': the mirror has not verified {model.source}; "
            "`llmgw ctl mirror show` says how its fetch is doing"
        )
    if info.header_error:
        raise BadRequest(
            f"model '{model.name}': its file {info.header_error}; put a GGUF model there, or name another source"
        )


def check_editable(entry: ModelEntry, revision: int | None = None) -> None:
    """Raise where `entry` may not be changed through the API: it is declared in a file, or it is
    not at the `revision` the change expects (None: any)."""
    name = entry.model.name
    if entry.declared_in:
        raise BadRequest(f"model '{name}' is declared in {entry.declared_in}; change it there and restart the catalog")
    if revision is not None and revision != entry.revision:
        raise Conflict(
            f"model '{name}' is at revision {entry.revision}, not {revision}: someone changed it since; see how "
            f"(`llmgw ctl model get {name}`) and reapply your change at revision {entry.revision}"
        )


def check_removable(name: str, others: dict[str, Model]) -> None:
    """Raise BadRequest where another model falls back to `name`."""
    leaning = sorted(n for n, m in others.items() if name in m.fallbacks)
    if leaning:
        raise BadRequest(f"model '{name}' is a fallback of {', '.join(leaning)}; remove it from their fallbacks first")


def files_to_purge(model: Model, others: dict[str, Model]) -> tuple[list[str], list[FilePlace]]:
    """The files a purge of `model` deletes (its weights, its adapters), and those it keeps
    because another model uses them."""
    deleted, kept = [], []
    for source in model.files():
        users = sorted(o.name for o in others.values() if o.name != model.name and source in o.files())
        if users:
            kept.append(FilePlace(source=source, where="everywhere", why=f"model {', '.join(users)} uses it"))
        elif source not in deleted:
            deleted.append(source)
    return deleted, kept


def tally_purge(
    entry: ModelEntry, sources: list[str], kept: list[FilePlace], answers: list[WeightsDeleted | BusError]
) -> PurgeReport:
    """What a purge of `entry` deleted and kept, from every answer to its delete of `sources` (an
    error keeps each source in an unknown place, saying why)."""
    report = PurgeReport(entry=entry, kept=list(kept))
    for answer in answers:
        if isinstance(answer, BusError):
            report.kept.extend(FilePlace(source=s, where="unknown", why=answer.message) for s in sources)
            continue
        report.deleted.extend(FilePlace(source=s, where=answer.where) for s in answer.deleted)
        report.kept.extend(answer.kept)
    return report
