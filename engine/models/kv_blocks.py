"""The KV block table: which physical cache blocks hold each sequence's tokens.

The PagedAttention target (engine/models/paged_target.py) stores keys and values in fixed-size
blocks shared by all sequences; a sequence owns a list of block ids covering its committed tokens.
Rolling back after a rejection is only a shorter length (and freeing blocks that no longer hold
any token); nothing in the cache is copied. docs/batching.md explains the choice.

With prefix caching (engine/prefix_cache.py) a full block can be held by several sequences at once
(reference counts): it is only ever read, since a sequence writes at its own end, past every block
it shares. A cached block no sequence holds stays in the prefix cache (idle, least recently used
first) and is reused from there for a new block only when no block is free.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.prefix_cache import PrefixCache


class OutOfBlocks(RuntimeError):
    """The cache has fewer free blocks than a sequence needs (the scheduler preempts then)."""


class BlockTable:
    """A free list of `num_blocks` blocks of `block_size` tokens, each sequence's blocks, and reference
    counts for blocks that several sequences share through the prefix cache."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("A KV cache needs at least one block of at least one token.")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._owned: dict[int, list[int]] = {}
        self._refs = [0] * num_blocks
        self.cache: PrefixCache | None = None  # set by the pipeline when prefix caching is on

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    @property
    def free_blocks(self) -> int:
        """Blocks a sequence can take: free ones and cached ones that no sequence holds."""
        return len(self._free) + (self.cache.idle_blocks if self.cache is not None else 0)

    def refs(self, block: int) -> int:
        return self._refs[block]

    def blocks(self, seq: int) -> list[int]:
        return self._owned.get(seq, [])

    def can_grow(self, seq: int, tokens: int) -> bool:
        """Whether `seq` can hold `tokens` tokens in all (its own blocks plus free ones)."""
        return self.blocks_for(tokens) - len(self.blocks(seq)) <= self.free_blocks

    def grow(self, seq: int, tokens: int) -> list[int]:
        """Make `seq` own enough blocks for `tokens` tokens; OutOfBlocks (nothing taken) if it can't."""
        owned = self._owned.setdefault(seq, [])
        need = self.blocks_for(tokens) - len(owned)
        if need > self.free_blocks:
            raise OutOfBlocks(f"sequence {seq} needs {need} more KV blocks, {self.free_blocks} are free")
        for _ in range(max(0, need)):
            block = self._free.pop() if self._free else self.cache.evict()
            self._refs[block] = 1
            owned.append(block)
        return owned

    def adopt(self, seq: int, blocks: list[int]) -> None:
        """Make `seq` (holding nothing yet) start with cached `blocks`, which it shares and never writes."""
        if self._owned.get(seq):
            raise ValueError(f"sequence {seq} already holds blocks; a prefix is adopted before anything else")
        for block in blocks:
            if self._refs[block] == 0:
                self.cache.hold(block)  # leaves the idle list: not evictable while held
            self._refs[block] += 1
        self._owned[seq] = list(blocks)

    def _unref(self, block: int) -> None:
        self._refs[block] -= 1
        if self._refs[block] == 0:
            if self.cache is not None and self.cache.holds(block):
                self.cache.park(block)
            else:
                self._free.append(block)

    def shrink(self, seq: int, tokens: int) -> None:
        """Free the blocks of `seq` past the first `tokens` tokens (a rollback)."""
        owned = self._owned.get(seq)
        if not owned:
            return
        keep = self.blocks_for(tokens)
        while len(owned) > keep:
            self._unref(owned.pop())

    def release(self, seq: int) -> None:
        """Let go of every block of `seq` (finished, cancelled or preempted). Its last block goes first,
        so a cached prefix is evicted from its end and its start stays reusable longest."""
        for block in reversed(self._owned.pop(seq, [])):
            self._unref(block)
        if self.cache is not None:
            self.cache.trim()

    def give_back(self, block: int) -> None:
        """A cached block that no sequence holds left the cache (evicted or cleared): free again."""
        assert self._refs[block] == 0, f"block {block} is held by a sequence"
        self._free.append(block)
