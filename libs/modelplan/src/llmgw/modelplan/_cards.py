"""Which cards a profile may run on, and which of a node's cards a replica takes: one rule for
placement (the scheduler) and for starting (the agent)."""

from __future__ import annotations

from collections.abc import Iterable

from llmgw.modelplan._speed import card_of
from llmgw.proto import GpuInfo, Profile

__all__ = ["FOREIGN_LIMIT_MB", "card_fits", "card_room", "choose_cards", "class_bandwidth", "usable_cards"]

FOREIGN_LIMIT_MB = 1024
"""A card on which processes that are not llmgw's hold more than this (MiB) is not given out."""


def _capability(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(".")) if text else ()


def card_fits(profile: Profile, card: GpuInfo) -> str | None:
    """None if `card` is one `profile` may run on (its class, memory and compute capability), else
    what it lacks."""
    if profile.gpu_class and card.cls != profile.gpu_class:
        return f"class {card.cls}, not {profile.gpu_class}"
    if card.memory_total_mb < profile.min_card_mb:
        return f"{card.memory_total_mb} MiB, under {profile.min_card_mb}"
    if profile.min_compute and _capability(card.compute_capability) < _capability(profile.min_compute):
        return f"compute capability {card.compute_capability or 'unknown'}, under {profile.min_compute}"
    return None


def card_room(card: GpuInfo) -> int | None:
    """The memory free for a replica on `card` beside what foreign processes hold (MiB); None
    where they crowd it (`FOREIGN_LIMIT_MB`): it is not given out."""
    return card.memory_total_mb - card.memory_foreign_mb if card.memory_foreign_mb < FOREIGN_LIMIT_MB else None


def usable_cards(
    profile: Profile, gpus: Iterable[GpuInfo], card_mb: int = 0, taken: Iterable[str] = ()
) -> list[GpuInfo]:
    """The cards a replica of `profile` may take: not held by another replica (`taken`), not
    crowded by foreign processes, of its class and needs, and with `card_mb` free beside what
    foreign processes hold."""
    held = set(taken)
    return [
        g
        for g in gpus
        if g.uuid not in held
        and (room := card_room(g)) is not None
        and room >= card_mb
        and card_fits(profile, g) is None
    ]


def class_bandwidth(cls: str) -> float:
    """A card class's memory bandwidth (GB/s; 0 when unknown), what its replicas' speed follows."""
    card = card_of(cls)
    return card.bandwidth_gbs if card else 0.0


def choose_cards(profile: Profile, gpus: list[GpuInfo], taken: Iterable[str] = (), card_mb: int = 0) -> list[GpuInfo]:
    """The cards a replica of `profile` runs on: `profile.gpus` usable cards all of one class (of
    the classes with that many, the fastest: the most memory bandwidth, `card_of`; the first
    listed among equals), the most NVLinked first, in index order. A ValueError says what the
    node lacks."""
    if profile.gpus == 0:
        return []
    by_class: dict[str, list[GpuInfo]] = {}
    for g in usable_cards(profile, gpus, card_mb, taken):
        by_class.setdefault(g.cls, []).append(g)
    for cards in sorted(by_class.values(), key=lambda cards: -class_bandwidth(cards[0].cls)):
        if len(cards) >= profile.gpus:
            uuids = {c.uuid for c in cards}
            linked = sorted(cards, key=lambda g: -len(set(g.nvlink_peers) & uuids))
            return sorted(linked[: profile.gpus], key=lambda g: (g.index, g.uuid))
    wanted = f"class {profile.gpu_class}" if profile.gpu_class else "one class"
    have = ", ".join(f"{len(c)} {k}" for k, c in sorted(by_class.items())) or "none"
    raise ValueError(
        f"profile '{profile.name}' needs {profile.gpus} free cards of {wanted}; this node has {have} free "
        f"of {len(gpus)} cards"
    )
