"""Choosing a replica, pure: pools by priority, within a pool the replica that would start
reading the prompt soonest and read least of it (its queued work plus what of this prompt it
does not hold, from an index of hashed prompt blocks), and ejection of replicas whose engine's
health probe failed.

No I/O and no clock: the shell passes `now` and tells the balancer when a request starts,
ends, what the engine said it had cached, and how long it said reading the prompt took.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence

import msgspec

from llmgw.router.routing.pace import Pace

__all__ = [
    "REQUEST_BOUNDS",
    "REQUEST_CHARS",
    "Balancer",
    "Candidate",
    "Sent",
    "leading",
    "prompt_blocks",
    "read_chars",
    "text_blocks",
]

BLOCK_CHARS = 256
"""Characters of prompt per hashed block (about 64 tokens of English)."""
REQUEST_CHARS = 256
"""What a request in flight weighs besides the prompt it has to read, in prompt characters (its
answer, its turn on the engine), until its replica's engine has said what its work takes."""
REQUEST_BOUNDS = (16, 4096)
"""What a request is learned to weigh is kept within these (prompt characters): a timing from a
near-idle or a stalled engine moves it, but never to nothing or to everything."""


class Candidate(msgspec.Struct, frozen=True, kw_only=True):
    """A ready replica as the balancer sees it."""

    id: str
    priority: int = 0
    """Its profile's priority: the highest pool is tried first."""
    weight: int = 1
    """Its profile's router weight: twice the weight takes twice the requests."""
    slots: int = 1
    """Requests it serves at once; beyond, it queues (saturated)."""


def prompt_blocks(text: str, block_chars: int = BLOCK_CHARS) -> list[bytes]:
    """Chained hashes of the prompt's whole blocks: block i's hash covers blocks 0..i, so two
    prompts share block i's hash exactly when they share everything up to its end."""
    out, h = [], b""
    data = text.encode()
    for i in range(0, len(data) - block_chars + 1, block_chars):
        h = hashlib.blake2b(h + data[i : i + block_chars], digest_size=12).digest()
        out.append(h)
    return out


def leading(blocks: list[bytes], held) -> int:
    """How many of these leading blocks are in `held` (a set or a mapping)."""
    n = 0
    for b in blocks:
        if b not in held:
            break
        n += 1
    return n


def text_blocks(held_tokens: int, tokens: int, size: int) -> int:
    """An engine's word that it holds a prompt's first `held_tokens` (of its `tokens`), as whole
    blocks of the prompt's text (`size` bytes): what `Balancer.pick`'s `held` says."""
    return int(held_tokens * size / max(tokens, 1)) // BLOCK_CHARS


def _size(blocks: list[bytes], size: int | None) -> int:
    """A prompt's length in bytes: as given, else its whole blocks and half a block's tail."""
    return size if size is not None else len(blocks) * BLOCK_CHARS + BLOCK_CHARS // 2


def read_chars(blocks: list[bytes], size: int | None, prompt_tokens: int, cached_tokens: int | None) -> int:
    """What of a prompt (these blocks, `size` bytes where known) its engine read, in its bytes:
    the share of its tokens it did not hold (for `Balancer.measured`)."""
    unread = prompt_tokens - (cached_tokens or 0)
    return _size(blocks, size) * unread // prompt_tokens if prompt_tokens > 0 else 0


def _cached_blocks(blocks: int, size: int | None, cached_share: float) -> int:
    """How many of a prompt's `blocks` whole blocks its engine's cache covered, from the share of
    its tokens it said were cached: reckoned on the whole text where its size is known (its
    tail past the last whole block is in the share too), else on the blocks alone."""
    if not size:
        return int(blocks * cached_share)
    return min(blocks, int(size * cached_share / BLOCK_CHARS))


class Sent(msgspec.Struct, frozen=True):
    """A request sent to a replica, as `started` counted it."""

    believed: int
    """Leading blocks of its prompt the index believed the replica held (for `served`)."""
    work: float
    """What it added to the replica's queued work (for `finished`)."""


class _Index:
    """The prompt blocks one replica is believed to hold in its cache, least recently used first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.blocks: OrderedDict[bytes, None] = OrderedDict()

    def match(self, blocks: list[bytes]) -> int:
        """How many leading blocks it holds."""
        return leading(blocks, self.blocks)

    def add(self, blocks: list[bytes]) -> None:
        for b in blocks:
            self.blocks[b] = None
            self.blocks.move_to_end(b)
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


class Balancer:
    """Keeps what each replica is doing and picks the one for the next request.

    - Pools by priority: the highest pool takes requests while any replica in it has a free
      slot; only when all are saturated does the next pool get one (a CPU replica never takes
      a request a free card could). When every pool is saturated, the highest queues it.
    - Within a pool: the replica of least cost, by weight. Its cost is the work queued on it
      (each request in flight: what of its prompt it had to read, plus what a request weighs
      there: `request_cost`, learned from its engine's timings) and
      what of this prompt it does not hold. That miss is weighed twice on a replica whose
      cache is as full as the pool's mean (read now, and again later by what its room there
      pushes out), more on a fuller one, less on an emptier one: new prefixes go where there
      is room. A replica holding a conversation's history keeps it until the work queued there
      outweighs reading the history afresh elsewhere; a popular prefix spills over only when
      waiting for it would take longer. Ties go to the replica given the fewest recent
      requests (decayed, by weight), then by lot: new prefixes on idle replicas spread evenly.
    - Only a replica's own health takes it out: a request that failed on it (refused, a 5xx,
      no answer in time) is a suspicion (`failures`), which the shell confirms by probing its
      engine's /health; a failed probe `eject`s it: it gets nothing for `eject_s`, doubling
      while its probes keep failing (up to ten times that), until a probe answers (`healthy`).
      A client leaving or a request the engine refuses for its content is no word on it.
    """

    def __init__(
        self,
        *,
        index_blocks: int = 65536,
        min_blocks: int = 1,
        request_chars: int = REQUEST_CHARS,
        eject_s: float = 10.0,
        decay: float = 0.98,
        seed: int | None = None,
    ) -> None:
        self.index_blocks, self.min_blocks, self.request_chars = index_blocks, min_blocks, request_chars
        self.eject_s = eject_s
        self.outstanding: dict[str, int] = {}
        self.work: dict[str, float] = {}
        """Replica -> its queued work: prompt characters its requests in flight had to read,
        plus what a request weighs there (`request_cost`) each."""
        self.recent: dict[str, float] = {}
        """Requests started per replica, each older one counting `decay` times less."""
        self.decay = decay
        self.failures: dict[str, int] = {}
        """Replica -> requests that failed on it since it last answered (suspicions, not verdicts)."""
        self.ejected: dict[str, float] = {}
        """Replica -> until when it gets nothing."""
        self.strikes: dict[str, int] = {}
        """Replica -> probes failed in a row (its ejection doubles with each)."""
        self.indexes: dict[str, _Index] = {}
        self.paces: dict[str, Pace] = {}
        """Replica -> what its engine says its work takes (`measured`)."""
        self.claims: dict[str, dict[bytes, int]] = {}
        """Replica -> the prompt blocks of its requests in flight (how many claim each): it takes
        them in first, so the next prompt sharing them goes there before the first is answered."""
        self.rng = random.Random(seed)

    # -- choosing ---------------------------------------------------------------------------
    def pick(
        self,
        replicas: list[Candidate],
        blocks: list[bytes],
        now: float,
        exclude: frozenset[str] | set[str] = frozenset(),
        held: Callable[[str], int] | None = None,
        size: int | None = None,
    ) -> tuple[Candidate | None, str]:
        """The replica for a request with these prompt blocks, and why it (for logs and metrics:
        "affinity", "least-loaded", "only", "saturated"); None when none may take it.

        `held`, where given, says how many of the prompt's leading blocks a replica holds (its
        engine's own word, from KV events) in place of the index's belief. `size`: the prompt's
        length (bytes, as the blocks are cut), where known."""
        usable = [r for r in replicas if r.id not in exclude and self.ejected.get(r.id, 0.0) <= now]
        if not usable:
            return None, "none"
        pools: dict[int, list[Candidate]] = {}
        for r in usable:
            pools.setdefault(r.priority, []).append(r)
        ordered = [pools[p] for p in sorted(pools, reverse=True)]
        for pool in ordered:
            if any(self.outstanding.get(r.id, 0) < r.slots for r in pool):
                return self._within(pool, blocks, held, _size(blocks, size), "")
        return self._within(ordered[0], blocks, held, _size(blocks, size), "saturated")

    def _within(
        self, pool: list[Candidate], blocks: list[bytes], held: Callable[[str], int] | None, size: int, saturated: str
    ) -> tuple[Candidate, str]:
        """The pool's replica of least cost (see the class), a full one too: a request queued
        behind short ones where its prefix is beats reading it afresh; why, as `pick` says it."""
        if len(pool) == 1:
            return pool[0], saturated or "only"
        full = [self._fullness(r) for r in pool]
        mean = sum(full) / len(pool)
        costs: list[tuple[float, Candidate, int]] = []
        for r, f in zip(pool, full, strict=True):
            n = (held(r.id) if held else self.held(r.id, blocks)) if blocks or held else 0
            miss = (1 + (f / mean if mean else 1)) * max(0, size - n * BLOCK_CHARS)
            costs.append(((self.work.get(r.id, 0.0) + miss) / r.weight, r, n))
        least = min(c[0] for c in costs)
        tied = [c for c in costs if c[0] <= least + 1]
        if len(tied) > 1:  # the fewest recent requests, then by lot
            fewest = min(self.recent.get(c[1].id, 0.0) / c[1].weight for c in tied)
            tied = [c for c in tied if self.recent.get(c[1].id, 0.0) / c[1].weight <= fewest]
        _, chosen, n = tied[0] if len(tied) == 1 else self.rng.choice(tied)
        return chosen, saturated or ("affinity" if n >= self.min_blocks else "least-loaded")

    def _fullness(self, r: Candidate) -> float:
        """Blocks its index holds, by weight: how full its cache is believed to be."""
        index = self.indexes.get(r.id)
        return len(index.blocks) / r.weight if index else 0.0

    # -- what happened ------------------------------------------------------------------------
    def started(self, replica_id: str, blocks: list[bytes] | None = None, size: int | None = None) -> Sent:
        """A request with these prompt blocks (a prompt of `size` bytes, where known) went to
        this replica: they are claimed there until it ends, and it adds to the replica's queued
        work what of it the replica does not hold plus `request_cost`. What the index believed
        it held before and that work, returned (for `served` and `finished`)."""
        blocks = blocks or []
        self.outstanding[replica_id] = self.outstanding.get(replica_id, 0) + 1
        for rid in self.recent:
            self.recent[rid] *= self.decay
        self.recent[replica_id] = self.recent.get(replica_id, 0.0) + 1.0
        index, claims = self.indexes.get(replica_id), self.claims.setdefault(replica_id, {})
        believed = index.match(blocks) if index and blocks else 0
        held = max(believed, leading(blocks, claims))
        work = max(0, _size(blocks, size) - held * BLOCK_CHARS) + self.request_cost(replica_id)
        self.work[replica_id] = self.work.get(replica_id, 0.0) + work
        for b in blocks:
            claims[b] = claims.get(b, 0) + 1
        return Sent(believed, work)

    def finished(self, replica_id: str, ok: bool | None, blocks: Sequence[bytes] = (), work: float = 0.0) -> None:
        """A request to this replica ended (ok: it answered; False: it refused or failed, a
        suspicion its probe decides; None: no word on the replica, as when the client went away);
        its claim on its prompt `blocks` and its `work` (`Sent.work`) end (where it answered,
        `served` says what it holds)."""
        self.outstanding[replica_id] = max(0, self.outstanding.get(replica_id, 0) - 1)
        self.work[replica_id] = max(0.0, self.work.get(replica_id, 0.0) - work)
        claims = self.claims.get(replica_id, {})
        for b in blocks:
            if claims.get(b, 0) > 1:
                claims[b] -= 1
            else:
                claims.pop(b, None)
        if ok:
            self.failures.pop(replica_id, None)
        elif ok is False:
            self.failures[replica_id] = self.failures.get(replica_id, 0) + 1

    def eject(self, replica_id: str, now: float) -> float:
        """Its engine's health probe failed: it gets nothing for `eject_s`, doubled for each
        probe failed in a row before (at most ten times). Until when, returned."""
        n = self.strikes[replica_id] = self.strikes.get(replica_id, 0) + 1
        until = self.ejected[replica_id] = now + min(self.eject_s * 2 ** (n - 1), self.eject_s * 10)
        return until

    def healthy(self, replica_id: str) -> None:
        """Its engine's health probe answered: back in rotation, its suspicions dropped."""
        for table in (self.failures, self.strikes, self.ejected):
            table.pop(replica_id, None)

    def out(self, replica_id: str, now: float) -> bool:
        """Whether it is ejected now."""
        return self.ejected.get(replica_id, 0.0) > now

    def served(
        self,
        replica_id: str,
        blocks: list[bytes],
        prompt_tokens: int,
        cached_tokens: int | None,
        believed: int | None = None,
        size: int | None = None,
    ) -> None:
        """The replica answered a prompt of these blocks: it now holds them.

        Where the engine said how many prompt tokens came from its cache, the index is
        calibrated by it: fewer than the index believed (when the request was sent: `believed`,
        from `started`; else now) means the engine holds less than the index does, so the index
        shrinks by the blocks it got wrong (least recently used go); a full hit on a full index
        lets it grow back (up to `index_blocks`). A block only claimed by a request in flight is
        no belief: the engine may still be reading it. How many blocks the engine's cached
        tokens cover is reckoned on the whole prompt (`size`, the bytes its blocks were cut from,
        as `pick` takes it: the blocks cover only its whole ones), a partial hit given a block's
        slack."""
        index = self.indexes.setdefault(replica_id, _Index(self.index_blocks))
        if cached_tokens is not None and prompt_tokens > 0 and blocks:
            really = _cached_blocks(len(blocks), size, min(cached_tokens, prompt_tokens) / prompt_tokens)
            believed = index.match(blocks) if believed is None else believed
            wrong = believed - really - (1 if cached_tokens else 0)  # a partial hit's estimate is a block fuzzy
            if wrong > 0:
                index.capacity = max(len(blocks), len(index.blocks) - wrong)
            elif believed and len(index.blocks) >= index.capacity:
                index.capacity = min(self.index_blocks, int(index.capacity * 1.1) + 1)
        index.add(blocks)

    def measured(self, replica_id: str, read_chars: int, prompt_ms: float) -> None:
        """Its engine said reading `read_chars` of a prompt (what it did not hold) took
        `prompt_ms`: the replica's pace is fitted again, and with it what a request weighs there
        (`request_cost`)."""
        if read_chars > 0 and 0 < prompt_ms < math.inf:
            self.paces.setdefault(replica_id, Pace()).add(read_chars, prompt_ms)

    def request_cost(self, replica_id: str) -> float:
        """What a request weighs on this replica besides the prompt it reads, in prompt
        characters: the fixed part of its engine's time reading a prompt over its time a
        character (within `REQUEST_BOUNDS`); `request_chars` where its engine has not said. The
        answer's time is not counted: an engine with several slots reads a new prompt beside the
        others' answers, not after them."""
        pace = self.paces.get(replica_id)
        chars = pace.chars if pace is not None else None
        if chars is None:
            return self.request_chars
        low, high = REQUEST_BOUNDS
        return min(max(chars, low), high)

    def held(self, replica_id: str, blocks: list[bytes]) -> int:
        """Leading blocks of this prompt the replica is believed to hold, or is taking in for a
        request in flight."""
        index = self.indexes.get(replica_id)
        return max(index.match(blocks) if index else 0, leading(blocks, self.claims.get(replica_id, {})))

    def keep_only(self, replica_ids: Collection[str]) -> None:
        """Forget every replica not among these (the ones still in the replicas bucket)."""
        for gone in (set(self.indexes) | set(self.recent) | set(self.paces)) - set(replica_ids):
            self.forget_replica(gone)

    def forget_replica(self, replica_id: str) -> None:
        """A replica gone: drop what was kept of it."""
        tables = (
            self.outstanding,
            self.work,
            self.recent,
            self.failures,
            self.strikes,
            self.ejected,
            self.indexes,
            self.claims,
            self.paces,
        )
        for table in tables:
            table.pop(replica_id, None)
