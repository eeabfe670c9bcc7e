"""A provider's keys as one pool, without I/O (time is passed in): a request takes the key least
used this minute that is not cooling down and has room for it within its own limits (requests and
tokens a minute); a 429 cools a key for as long as the provider says (`retry-after`), else
longer each time (1, 2, 4 ... 60 s); a 401 or 403 (a key revoked) for ten minutes."""

from __future__ import annotations

from dataclasses import dataclass

from llmgw.proto.providers import KeyState, ProviderKey

__all__ = ["REFUSED_S", "Pool", "Slot"]

REFUSED_S = 600.0
"""How long a key the provider refused (401, 403) is left alone before it is tried again."""
_MOST_BACKOFF_S = 60.0


@dataclass
class Slot:
    """One key's minute: what it spent, and whether it is cooling down."""

    limits: ProviderKey
    minute: int = 0
    requests: int = 0
    tokens: int = 0
    cooling_until: float = 0.0
    why: str = ""
    backoff_s: float = 0.5

    def roll(self, now: float) -> None:
        """A new minute starts empty."""
        if int(now // 60) != self.minute:
            self.minute, self.requests, self.tokens = int(now // 60), 0, 0

    def room(self, tokens: int, now: float) -> bool:
        """Whether a request of about `tokens` fits this key now."""
        self.roll(now)
        rpm, tpm = self.limits.requests_per_minute, self.limits.tokens_per_minute
        if self.cooling_until > now:
            return False
        # a request larger than a key's minute still goes where the key has spent nothing yet
        return (not rpm or self.requests < rpm) and (not tpm or self.tokens + tokens <= tpm or not self.tokens)


class Pool:
    """A provider's keys, by their names."""

    def __init__(self, keys: list[ProviderKey]) -> None:
        self.slots = {k.name: Slot(k) for k in keys}

    def take(self, tokens: int, now: float) -> str | None:
        """The key a request of about `tokens` goes with (its request counted), least used this
        minute first; None: none has room now."""
        open_ = [(s.requests, s.tokens, name) for name, s in self.slots.items() if s.room(tokens, now)]
        if not open_:
            return None
        name = min(open_)[2]
        slot = self.slots[name]
        slot.requests += 1
        slot.tokens += tokens
        return name

    def spent(self, name: str, estimated: int, actual: int, now: float) -> None:
        """A request's answer came: its tokens as counted, in place of the estimate taken."""
        slot = self.slots.get(name)
        if slot is not None:
            slot.roll(now)
            slot.tokens = max(0, slot.tokens - estimated + actual)
            slot.backoff_s = 0.5

    def cool(self, name: str, status: int, retry_after_s: float | None, now: float) -> None:
        """The provider refused a request with this key (429, 401, 403): left alone a while."""
        slot = self.slots.get(name)
        if slot is None:
            return
        if status == 429:
            slot.backoff_s = min(slot.backoff_s * 2, _MOST_BACKOFF_S)
            wait = retry_after_s if retry_after_s is not None else slot.backoff_s
            slot.why = "429: too many requests"
        else:
            wait, slot.why = REFUSED_S, f"{status}: the provider refused the key"
        slot.cooling_until = max(slot.cooling_until, now + wait)

    def soonest(self, now: float) -> float:
        """Seconds until a key may have room again: the first cooling key's end where every key is
        cooling, else the next minute (where one is at its limit)."""
        cooling = [s.cooling_until - now for s in self.slots.values() if s.cooling_until > now]
        return min(cooling) if len(cooling) == len(self.slots) else 60 - now % 60

    def states(self, now: float) -> dict[str, KeyState]:
        """Each key's state now."""
        out = {}
        for name, s in self.slots.items():
            s.roll(now)
            cooling = s.cooling_until if s.cooling_until > now else 0.0
            out[name] = KeyState(
                cooling_until=cooling, why=s.why if cooling else "", requests=s.requests, tokens=s.tokens
            )
        return out
