"""Prefix caching: full KV blocks keyed by the hash of their token prefix, and what the draft needs to resume.

A block's key chains the key of the block before it with the block's own token ids, so one key names
the whole prefix up to the block's end: two sequences share a block only when everything before it
is the same too. Only full blocks are cached (a partial tail is always computed again), and a cached
block is only read: a sequence writes at its own end, past every block it shares.

The draft's KV is built from the target's tapped hidden rows, which a cache hit never computes. So each
cached block carries the draft's part too (`DraftPart`): the draft's own context keys/values of the
block's positions once the draft has taken its rows in, and until then the tapped target rows
themselves. After a hit the draft starts with the keys/values of the leading blocks and takes in the
target rows of the rest, so it drafts from the first step as if it had seen the whole prefix computed
(docs/batching.md, "Prefix caching", says why these forms and what they cost).

Blocks that no running sequence holds stay cached, least recently used first, until a new block is
needed and none is free, or until the memory they use (target KV and draft parts) exceeds the cap.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from engine.models.kv_blocks import BlockTable


def chain_hashes(tokens: Sequence[int], block_size: int, known: list[bytes]) -> list[bytes]:
    """Extend `known` (the keys of the first blocks of `tokens`) to every full block of `tokens`."""
    out = known
    for j in range(len(out), len(tokens) // block_size):
        h = hashlib.blake2b(out[-1] if out else b"prefix", digest_size=16)
        h.update(np.asarray(tokens[j * block_size:(j + 1) * block_size], np.int64).tobytes())
        out.append(h.digest())
    return out


@dataclass
class DraftPart:
    """The draft's resume state for one cached block: its context KV, or the target rows it is built from."""

    kv: list[np.ndarray] | None = None  # per cached draft tensor: [kv heads, block_size, head size]
    hidden: np.ndarray | None = None  # [block_size, taps x hidden]: until the draft has taken these rows in

    @property
    def nbytes(self) -> int:
        if self.kv is not None:
            return sum(a.nbytes for a in self.kv)
        return self.hidden.nbytes if self.hidden is not None else 0


@dataclass
class Hit:
    """What a lookup found: the cached blocks of the longest usable prefix and the draft's resume state."""

    blocks: list[int]
    hashes: list[bytes]
    draft_kv: list[np.ndarray] | None  # per draft tensor [heads, rows, head size] of the leading blocks
    draft_hidden: np.ndarray | None  # [rows, width] target rows of the blocks after those
    kv_blocks: int = 0  # leading blocks whose draft part was KV

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)


class PrefixCache:
    """Which KV blocks hold which token prefixes, which of them no sequence holds (LRU), and their draft parts."""

    def __init__(self, table: BlockTable, block_bytes: int, cap_bytes: int, with_draft: bool) -> None:
        self.table = table
        self.block_bytes = block_bytes  # target KV bytes per block
        self.cap_bytes = cap_bytes
        self.with_draft = with_draft  # a block is only cached with its draft part
        self._block: dict[bytes, int] = {}
        self._key: dict[int, bytes] = {}
        self._draft: dict[int, DraftPart] = {}
        self._idle: OrderedDict[int, None] = OrderedDict()  # oldest first
        self._idle_bytes = 0
        self.draft_bytes = 0
        self.hit_tokens = 0  # prompt tokens served from the cache (all lookups)
        self.looked_up_tokens = 0  # prompt tokens that lookups could have served
        self.evictions = 0
        table.cache = self

    # ---- what the block table asks ----------------------------------------------------------------
    @property
    def idle_blocks(self) -> int:
        return len(self._idle)

    def holds(self, block: int) -> bool:
        return block in self._key

    def hold(self, block: int) -> None:
        """A sequence takes an idle cached block: it is no longer evictable."""
        self._idle.pop(block)
        self._idle_bytes -= self._bytes(block)

    def park(self, block: int) -> None:
        """No sequence holds the cached block any more: it becomes the most recently used idle one."""
        self._idle[block] = None
        self._idle_bytes += self._bytes(block)

    def evict(self) -> int:
        """Forget the least recently used idle block and hand it out (the block table reuses it)."""
        block, _ = self._idle.popitem(last=False)
        self._idle_bytes -= self._bytes(block)
        self._forget(block)
        self.evictions += 1
        return block

    def trim(self) -> None:
        """Evict idle blocks, oldest first, while the idle ones use more memory than the cap."""
        while self._idle and self._idle_bytes > self.cap_bytes:
            self.table.give_back(self.evict())

    # ---- lookups and inserts ------------------------------------------------------------------------
    def lookup(self, hashes: list[bytes]) -> Hit:
        """The cached blocks of the longest prefix of `hashes` whose draft parts let the draft resume:
        KV blocks first, then blocks with target rows (a KV block after a rows block would leave the
        draft without the rows of its positions, so the prefix stops there)."""
        blocks, kv, hidden = [], [], []
        for h in hashes:
            block = self._block.get(h)
            if block is None:
                break
            part = self._draft.get(block)
            if self.with_draft:
                if part is None or (part.kv is not None and hidden):
                    break
                (kv if part.kv is not None else hidden).append(part)
            blocks.append(block)
        self.looked_up_tokens += len(hashes) * self.table.block_size
        self.hit_tokens += len(blocks) * self.table.block_size
        draft_kv = ([np.concatenate(t, axis=1) for t in zip(*(p.kv for p in kv))] if kv else None)
        draft_hidden = np.concatenate([p.hidden for p in hidden]) if hidden else None
        return Hit(blocks, list(hashes[: len(blocks)]), draft_kv, draft_hidden, len(kv))

    def insert(self, key: bytes, block: int, part: DraftPart | None) -> bool:
        """Cache a full block a sequence holds under its prefix key; False when the key is cached already
        (the sequence computed the same prefix in a block of its own, which stays its own)."""
        if key in self._block or block in self._key:
            return False
        if self.with_draft and part is None:
            raise ValueError("a block is cached with the draft's part when a draft is on")
        self._block[key] = block
        self._key[block] = key
        if part is not None:
            self._draft[block] = part
            self.draft_bytes += part.nbytes
        return True

    def draft_part(self, key: bytes) -> DraftPart | None:
        block = self._block.get(key)
        return self._draft.get(block) if block is not None else None

    def set_draft_kv(self, key: bytes, kv: list[np.ndarray]) -> None:
        """The draft has taken in the block's rows: keep its keys/values instead of the target rows."""
        block = self._block.get(key)
        part = self._draft.get(block) if block is not None else None
        if part is None or part.kv is not None:
            return
        before = part.nbytes
        part.kv, part.hidden = kv, None
        self.draft_bytes += part.nbytes - before
        if block in self._idle:
            self._idle_bytes += part.nbytes - before

    def clear(self) -> int:
        """Forget every cached prefix; blocks no sequence holds are free again, held ones stay their
        sequences' own. Returns the bytes that were cached."""
        freed = self.memory_bytes
        while self._idle:
            self.table.give_back(self.evict())
        for block in list(self._key):
            self._forget(block)
        return freed

    # ---- figures ------------------------------------------------------------------------------------
    @property
    def cached_blocks(self) -> int:
        return len(self._key)

    @property
    def memory_bytes(self) -> int:
        """Target KV of every cached block plus the draft parts kept beside them."""
        return self.cached_blocks * self.block_bytes + self.draft_bytes

    def stats(self) -> dict[str, int]:
        return {"cached_blocks": self.cached_blocks, "idle_blocks": self.idle_blocks,
                "cached_tokens": self.cached_blocks * self.table.block_size, "memory_bytes": self.memory_bytes,
                "draft_bytes": self.draft_bytes, "cap_bytes": self.cap_bytes, "hit_tokens": self.hit_tokens,
                "looked_up_tokens": self.looked_up_tokens, "evictions": self.evictions}

    def _bytes(self, block: int) -> int:
        part = self._draft.get(block)
        return self.block_bytes + (part.nbytes if part is not None else 0)

    def _forget(self, block: int) -> None:
        key = self._key.pop(block)
        del self._block[key]
        part = self._draft.pop(block, None)
        if part is not None:
            self.draft_bytes -= part.nbytes
