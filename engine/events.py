"""The contract between the engine and its consumers (CLI, app, bench): one event per target step,
one result per finished request."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.metrics import RequestMetrics


@dataclass
class StepTimings:
    """Wall-clock parts of one step, in milliseconds (the seed's draft_step / draft_model metrics)."""

    draft_step_ms: float = 0.0  # the whole drafting stage (inputs, backbone, selection)
    draft_model_ms: float = 0.0  # the draft backbone inference alone
    markov_head_ms: float = 0.0  # Markov head / selector inference (0 without a head)
    sampling_ms: float = 0.0  # candidate selection on the host
    target_ms: float = 0.0  # target inference (prefill or verification)
    total_ms: float = 0.0  # the whole step


@dataclass
class TextPiece:
    """A run of decoded text and whether its tokens were drafted and accepted (for colouring)."""

    text: str
    from_draft: bool


@dataclass
class StepEvent:
    """What one target step did for one request.

    `tokens` are the tokens committed this step: the first `accepted` of them are draft tokens the
    target accepted, the last one (if any) is the target's own token (correction or bonus) unless
    the step validated only the first part of a split window (then all of them are drafts).
    `drafted` are the candidates this step validated.
    """

    request_id: int
    step: int  # 0 = prefill (emits the first token), then one per verification
    drafted: list[int] = field(default_factory=list)
    accepted: int = 0
    tokens: list[int] = field(default_factory=list)
    pieces: list[TextPiece] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None  # "eos" | "length" | "stop" | "cancelled"
    timings: StepTimings = field(default_factory=StepTimings)
    confidence: list[float] | None = None  # per drafted position, drafts with a confidence head
    peak: list[float] | None = None  # per drafted position, the draft distribution's largest probability there
    logprobs: list[float] | None = None  # target log-probability of each committed token (logits requests)
    produced: int = 0  # tokens the step produced before stop rules cut them (an EOS counts)
    # Set only on the step that completes a validation window (a split window spans several steps):
    # the window's candidates that were validated, and how many of them the target accepted.
    window_drafted: list[int] | None = None
    window_accepted: int = 0
    # Candidates the draft proposed for the window this step validates (the draft policy may verify fewer:
    # docs/batching.md); 0 on steps that validate no window.
    window_proposed: int = 0

    @property
    def text(self) -> str:
        return "".join(p.text for p in self.pieces)


@dataclass
class GenerationResult:
    """One finished request: its text, tokens, why it ended and its metrics (what generate() returns)."""

    text: str
    token_ids: list[int]
    finish_reason: str
    metrics: RequestMetrics
    cumulative_logprob: float | None = None  # under the processed target distribution (logits requests)
