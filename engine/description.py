"""What a loaded engine runs: its target, its draft, the device and the precision (`Engine.describe()`).

Consumers (the bench, the app, a server) read these plain values instead of reaching into the
engine's compiled models, so any engine (the paged pipeline, the openvino_genai path for NPU, the
app's fake) can answer the same questions.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine.draft_policy import default_count


@dataclass(frozen=True)
class DraftDescription:
    """The loaded draft as its folder declares it (engine/models/draft.py `DraftInfo`)."""

    name: str
    variant: str  # dflash_v1 | dspark | dflash_v2
    block_size: int
    max_candidates: int  # candidates one block yields
    default_candidates: int  # candidates per step when a request does not say
    has_head: bool = False  # a Markov head / selector (markov_head_top_k applies)
    default_top_k: int = 0  # the head's scorer K when a request does not say
    has_confidence: bool = False  # drafted positions come with a confidence
    folder: Path | None = None
    cut_candidates: int | None = None  # what an `adaptive` request that does not say drafts (None: default_candidates)

    def candidates_for(self, policy: str) -> int:
        """Candidates per step a request under `policy` gets when it does not say (engine/draft_policy.default_count)."""
        return default_count(policy, self.default_candidates, self.cut_candidates or self.default_candidates)


@dataclass(frozen=True)
class EngineDescription:
    target: str  # the target folder's name
    device: str
    precision: str  # "default" | "f32" (engine/models/properties.py)
    backend: str  # "paged" (SpeculativePipeline) | "openvino_genai" (the target alone, NPU) | "fake"
    draft: DraftDescription | None = None
    target_folder: Path | None = None
    has_chat_template: bool = False
    kv_cache_tokens: int | None = None  # the KV cache's capacity in tokens, where the engine manages one

    @property
    def draft_name(self) -> str | None:
        return self.draft.name if self.draft is not None else None

    @property
    def default_num_candidates(self) -> int:
        """Candidates per step a request gets when it does not say (0: the target alone)."""
        return self.draft.default_candidates if self.draft is not None else 0
