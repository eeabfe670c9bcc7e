"""Which client connections the router's front holds, and which to shed for a newcomer: pure
bookkeeping, no I/O (a connection is closed through its own `close`)."""

from __future__ import annotations

from typing import Protocol

__all__ = ["Seats"]


class _Seated(Protocol):
    address: str
    answered: bool

    def close(self) -> None: ...


class _Resting:
    """Connections not being answered, in the order they came to rest, those never answered apart
    (shed before any that was: a flood's fresh connections go before a client's kept one)."""

    __slots__ = ("fresh", "kept")

    def __init__(self) -> None:
        self.fresh: dict[_Seated, None] = {}
        self.kept: dict[_Seated, None] = {}

    def add(self, client: _Seated) -> None:
        (self.kept if client.answered else self.fresh)[client] = None

    def remove(self, client: _Seated) -> bool:
        """Whether it was here."""
        return self.fresh.pop(client, 0) is None or self.kept.pop(client, 0) is None

    def first(self) -> _Seated | None:
        """The one to shed first."""
        return next(iter(self.fresh or self.kept), None)

    def __bool__(self) -> bool:
        return bool(self.fresh or self.kept)


class Seats:
    """The client connections held, in all and per client address, and which of them are not
    being answered (idle, or their request still arriving): those are shed when a newcomer would
    pass a limit, the never answered first, then the longest resting. One being answered is never
    shed."""

    def __init__(self, most: int, most_per_client: int) -> None:
        self.most, self.most_per_client = most, most_per_client
        self.held: set[_Seated] = set()
        self.per_client: dict[str, int] = {}
        self.resting = _Resting()
        self.resting_of: dict[str, _Resting] = {}
        self.shed = 0
        """How many were shed to make room."""

    def admit(self, client: _Seated) -> bool:
        """Seat a newcomer, shedding a resting connection of its address, then of all, where it
        would pass a limit; False where none could be shed (every one is busy)."""
        address = client.address
        if self.per_client.get(address, 0) >= self.most_per_client and not self._shed(self.resting_of.get(address)):
            return False
        if len(self.held) >= self.most and not self._shed(self.resting):
            return False
        self.held.add(client)
        self.per_client[address] = self.per_client.get(address, 0) + 1
        self.rest(client)
        return True

    def _shed(self, resting: _Resting | None) -> bool:
        victim = resting.first() if resting else None
        if victim is None:
            return False
        victim.close()  # leaves its seat at once
        self.shed += 1
        return True

    def rest(self, client: _Seated) -> None:
        """Not being answered (again), from now: the last of its kind to be shed."""
        self.busy(client)
        self.resting.add(client)
        if (own := self.resting_of.get(client.address)) is None:
            own = self.resting_of[client.address] = _Resting()
        own.add(client)

    def busy(self, client: _Seated) -> None:
        """Being answered, or handed to the app's server: not shed."""
        if self.resting.remove(client):
            own = self.resting_of[client.address]
            own.remove(client)
            if not own:
                del self.resting_of[client.address]

    def leave(self, client: _Seated) -> None:
        """The connection closed (once, whoever closed it)."""
        if client in self.held:
            self.held.discard(client)
            self.busy(client)
            left = self.per_client[client.address] - 1
            if left:
                self.per_client[client.address] = left
            else:
                del self.per_client[client.address]
