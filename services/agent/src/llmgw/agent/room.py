"""The cards and ports this node's engines and workers hold, by holder: handed out free, never twice."""

from __future__ import annotations

import socket
from collections.abc import Callable

from llmgw.agent.core import cards_for, pick_port
from llmgw.proto import GpuInfo, Profile

__all__ = ["Room"]


def _bindable(host: str, port: int) -> bool:
    """Whether nothing listens on `port` of `host` now."""
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


class Room:
    """What each holder (a replica's engine, or a worker) holds of the node's cards and ports."""

    def __init__(self, ports: range, address: str, cards: Callable[[], list[GpuInfo]]) -> None:
        self.ports, self.address, self._here = ports, address, cards
        self.cards: dict[str, list[str]] = {}
        """UUIDs of the cards each holder holds."""
        self.port: dict[str, int] = {}
        """Each holder's own port (the one after it is kept free for it as well)."""

    def take_cards(self, holder: str, chosen: list[str], profile: Profile) -> list[GpuInfo]:
        """The cards `chosen` by the scheduler if all are here and free, else free ones for
        `profile`; held by `holder` from now. A ValueError says what is missing."""
        taken = {u for h, uuids in self.cards.items() if h != holder for u in uuids}
        cards = cards_for(profile, chosen, self._here(), taken)
        self.cards[holder] = [g.uuid for g in cards]
        return cards

    def take_port(self, holder: str, besides: int = 0) -> int:
        """A free port: none another holder holds (nor the one after it), nor `besides`. The first
        one `holder` takes is its own until released."""
        held = {p for h, port in self.port.items() if h != holder for p in (port, port + 1)} | {besides}
        port = pick_port(self.ports, held, lambda p: _bindable(self.address, p))
        self.port.setdefault(holder, port)
        return port

    def keep(self, holder: str, port: int, cards: list[str]) -> None:
        """`holder` holds this port and these cards (an engine adopted as it runs)."""
        self.port[holder], self.cards[holder] = port, list(cards)

    def release(self, holder: str) -> None:
        """`holder` holds nothing any more."""
        self.cards.pop(holder, None)
        self.port.pop(holder, None)
