"""Which requests run in the next step, and how many target rows each gets.

Every step is one target inference under a token budget (`max_num_batched_tokens` rows).
Requests that are decoding come first, each with as much of its validation window as fits
(dynamic split fuse: a window that does not fit is split, and its rest waits for a later step);
prompts are prefilled in chunks with what is left. The decoding order rotates every step, so a
budget smaller than the number of requests still serves them all in turn. KV blocks are
reserved for every scheduled row; when the cache runs out, the newest running request is
preempted (its blocks freed, recomputed later from its tokens) — see docs/batching.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from engine.draft_policy import DEFAULT_POLICY, check_policy


WINDOW_MODELS_MB = 512  # SmolLM2-135M gets both copies, Qwen2.5-Coder-0.5B none (docs/batching.md)


@dataclass
class SchedulerConfig:
    """Batching limits (the names follow openvino_genai.SchedulerConfig)."""

    max_num_batched_tokens: int = 256  # target rows per step: prompt chunks + validation rows
    max_num_seqs: int = 16  # requests running at once; the rest wait in the queue
    num_kv_blocks: int | None = None  # KV cache size in blocks; None: from cache_size_mb
    cache_size_mb: int = 512  # KV cache size when num_kv_blocks is None
    draft_policy: str = DEFAULT_POLICY  # how much of a drafted window is verified: "adaptive" what pays (the default), "always" all
    prefix_caching: bool = False  # reuse the KV blocks of cached token prefixes (engine/prefix_cache.py)
    prefix_cache_mb: int = 256  # memory of cached blocks no running request holds (target KV + draft parts)
    # memory the target's extra compiled copies for the adaptive cut's window sizes may take (CPU; each copy costs
    # about the target's weights file; 0: none): two for a small target, one, or none (engine/pipeline.py)
    window_models_mb: int = WINDOW_MODELS_MB

    def validate(self) -> "SchedulerConfig":
        """Raise ValueError naming the field and its allowed range."""
        if not isinstance(self.max_num_batched_tokens, int) or self.max_num_batched_tokens < 1:
            raise ValueError(f"max_num_batched_tokens={self.max_num_batched_tokens!r}: use an integer >= 1 "
                             "(target rows per step; 256 is a good default).")
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs={self.max_num_seqs!r}: use an integer >= 1 (requests running at once).")
        if self.num_kv_blocks is not None and (not isinstance(self.num_kv_blocks, int) or self.num_kv_blocks < 1):
            raise ValueError(f"num_kv_blocks={self.num_kv_blocks!r}: use an integer >= 1, or leave it unset to "
                             "size the cache by cache_size_mb.")
        if not isinstance(self.cache_size_mb, int) or self.cache_size_mb < 1:
            raise ValueError(f"cache_size_mb={self.cache_size_mb!r}: use an integer >= 1 (megabytes of KV cache).")
        check_policy(self.draft_policy)
        if not isinstance(self.prefix_caching, bool):
            raise ValueError(f"prefix_caching={self.prefix_caching!r}: use True or False.")
        if not isinstance(self.prefix_cache_mb, int) or self.prefix_cache_mb < 0:
            raise ValueError(f"prefix_cache_mb={self.prefix_cache_mb!r}: use an integer >= 0 (megabytes of cached "
                             "prefixes kept for later requests; 0 keeps none once their requests end).")
        if not isinstance(self.window_models_mb, int) or self.window_models_mb < 0:
            raise ValueError(f"window_models_mb={self.window_models_mb!r}: use an integer >= 0 (megabytes the target's "
                             "extra compiled copies for the adaptive cut may take; 0: none).")
        return self


@dataclass
class StepStats:
    """What the last step did (for tests, the bench and the app's status line)."""

    requests: list[int] = field(default_factory=list)  # scheduled request ids
    tokens: int = 0  # target rows in the inference
    prefill_tokens: int = 0  # of which prompt (or recompute) rows
    split: list[int] = field(default_factory=list)  # requests whose window did not fit whole
    preempted: list[int] = field(default_factory=list)  # requests preempted in this step
    cached_tokens: int = 0  # prompt tokens that requests admitted in this step found in the prefix cache
    draft_batch: int = 0  # requests drafted in this step's draft inference


class Schedulable(Protocol):
    id: int

    def rows_wanted(self) -> int: ...  # target rows the request would like this step

    @property
    def decoding(self) -> bool: ...


def plan_rows(running: list[Schedulable], budget: int, max_seqs: int, rotate: int) -> list[tuple[Schedulable, int]]:
    """(request, rows) for this step: decoding requests first (rotated), then prefill chunks.

    Each decoding request gets as many rows of its window as the budget still holds (at least one
    while any is left); prefill takes the rest, oldest first."""
    decoding = [r for r in running if r.decoding]
    if decoding:
        k = rotate % len(decoding)
        decoding = decoding[k:] + decoding[:k]
    prefilling = [r for r in running if not r.decoding]
    plan: list[tuple[Schedulable, int]] = []
    for req in decoding + prefilling:
        if budget <= 0 or len(plan) >= max_seqs:
            break
        rows = min(req.rows_wanted(), budget)
        if rows > 0:
            plan.append((req, rows))
            budget -= rows
    return plan
