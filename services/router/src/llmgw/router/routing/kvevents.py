"""What a vLLM replica's prefix cache holds, from the KV events it publishes. Pure: no I/O.

vLLM (with `--kv-events-config`) publishes over ZMQ every batch of blocks it stored in or
evicted from its prefix cache: three frames (topic, an 8-byte big-endian sequence number, a
msgpack `KVEventBatch`). A stored block comes with its token ids and its parent's hash, so the
router keys each block by its own chained hash of token ids (`token_blocks`) and never needs to
reproduce vLLM's hash function or seed: a prompt's tokens, hashed the same way, say how many of
its leading blocks each replica holds.
"""

from __future__ import annotations

import hashlib
from array import array

import msgspec

from llmgw.router.routing.balance import leading

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "CacheView",
    "KVEventBatch",
    "decode_batch",
    "token_blocks",
]

EngineHash = int | bytes
"""How vLLM names a block in its events (an int, or the hash's bytes)."""


class BlockStored(msgspec.Struct, array_like=True, tag=True):
    """Blocks the engine stored, in order: each one's parent is the one before it."""

    block_hashes: list[EngineHash]
    parent_block_hash: EngineHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None


class BlockRemoved(msgspec.Struct, array_like=True, tag=True):
    """Blocks the engine evicted."""

    block_hashes: list[EngineHash]


class AllBlocksCleared(msgspec.Struct, array_like=True, tag=True):
    """The engine's prefix cache was emptied."""


Event = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True):
    """One published batch; events of kinds this router does not know are kept raw and skipped."""

    ts: float
    events: list[msgspec.Raw]


_batch = msgspec.msgpack.Decoder(KVEventBatch)
_event = msgspec.msgpack.Decoder(Event)


def decode_batch(payload: bytes) -> tuple[float, list[Event]]:
    """A batch's time and the events it holds that this router knows; a msgspec.DecodeError
    when the payload is not a batch at all."""
    batch = _batch.decode(payload)
    events = []
    for raw in batch.events:
        try:
            events.append(_event.decode(raw))
        except msgspec.ValidationError:
            continue  # a kind of event added after this router was written
    return batch.ts, events


def _chain(parent: bytes, tokens: list[int]) -> bytes:
    return hashlib.blake2b(parent + array("I", tokens).tobytes(), digest_size=16).digest()


def token_blocks(tokens: list[int], block_size: int) -> list[bytes]:
    """Chained hashes of the whole blocks of `tokens`: block i's covers blocks 0..i, as vLLM's do."""
    out, h = [], b""
    for i in range(0, len(tokens) - block_size + 1, block_size):
        h = _chain(h, tokens[i : i + block_size])
        out.append(h)
    return out


class CacheView:
    """One replica's prefix cache as its events tell it: its blocks under the router's keys."""

    def __init__(self) -> None:
        self.keys: dict[EngineHash, bytes] = {}
        """The engine's name of a block -> the router's key of it."""
        self.held: set[bytes] = set()
        self.block_size = 0
        """Tokens a block holds (from the events; 0 until the first one)."""
        self.seq = -1
        self.gaps = 0
        """Batches missed (sequence numbers skipped): blocks stored then are not known, and
        blocks evicted then are still believed held."""
        self.unchained = 0
        """Stored blocks whose parent was never seen (stored before the router listened)."""

    def apply(self, seq: int, events: list[Event]) -> None:
        """Take in the batch numbered `seq`."""
        if self.seq >= 0 and seq > self.seq + 1:
            self.gaps += seq - self.seq - 1
        self.seq = seq
        for event in events:
            if isinstance(event, BlockStored):
                self._stored(event)
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    key = self.keys.pop(h, None)
                    if key is not None:
                        self.held.discard(key)
            else:
                self.keys.clear()
                self.held.clear()

    def _stored(self, event: BlockStored) -> None:
        if event.lora_id is not None:
            return  # an adapter's blocks: no request through this router asks for them
        if event.parent_block_hash is None:
            parent = b""
        elif event.parent_block_hash in self.keys:
            parent = self.keys[event.parent_block_hash]
        else:
            self.unchained += len(event.block_hashes)
            return
        self.block_size = size = event.block_size
        for i, h in enumerate(event.block_hashes):
            tokens = event.token_ids[i * size : (i + 1) * size]
            if len(tokens) < size:
                break
            parent = _chain(parent, tokens)
            self.keys[h] = parent
            self.held.add(parent)

    def match(self, blocks: list[bytes]) -> int:
        """How many of these leading blocks the replica holds."""
        return leading(blocks, self.held)
