"""The KV block table: which physical cache blocks hold each sequence's tokens.

The PagedAttention target (engine/models/paged_target.py) stores keys and values in fixed-size
blocks shared by all sequences; a sequence owns a list of block ids covering its committed tokens.
Rolling back after a rejection is only a shorter length (and freeing blocks that no longer hold
any token); nothing in the cache is copied. docs/batching.md explains the choice.
"""
from __future__ import annotations


class OutOfBlocks(RuntimeError):
    """The cache has fewer free blocks than a sequence needs (the scheduler preempts then)."""


class BlockTable:
    """A free list of `num_blocks` blocks of `block_size` tokens and each sequence's blocks."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("A KV cache needs at least one block of at least one token.")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # pop() hands out low ids first
        self._owned: dict[int, list[int]] = {}

    def blocks_for(self, tokens: int) -> int:
        """Blocks needed to hold `tokens` tokens."""
        return -(-tokens // self.block_size)

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    def blocks(self, seq: int) -> list[int]:
        return self._owned.get(seq, [])

    def can_grow(self, seq: int, tokens: int) -> bool:
        """Whether `seq` can hold `tokens` tokens in all (its own blocks plus free ones)."""
        return self.blocks_for(tokens) - len(self.blocks(seq)) <= len(self._free)

    def grow(self, seq: int, tokens: int) -> list[int]:
        """Make `seq` own enough blocks for `tokens` tokens; OutOfBlocks (nothing taken) if it can't."""
        owned = self._owned.setdefault(seq, [])
        need = self.blocks_for(tokens) - len(owned)
        if need > len(self._free):
            raise OutOfBlocks(f"sequence {seq} needs {need} more KV blocks, {len(self._free)} are free")
        for _ in range(max(0, need)):
            owned.append(self._free.pop())
        return owned

    def shrink(self, seq: int, tokens: int) -> None:
        """Free the blocks of `seq` past the first `tokens` tokens (a rollback)."""
        owned = self._owned.get(seq)
        if not owned:
            return
        keep = self.blocks_for(tokens)
        while len(owned) > keep:
            self._free.append(owned.pop())

    def release(self, seq: int) -> None:
        """Free every block of `seq` (finished, cancelled or preempted)."""
        for block in reversed(self._owned.pop(seq, [])):
            self._free.append(block)
