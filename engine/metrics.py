"""Per-request metrics: TTFT, TPOT, tokens per step, acceptance by block position, step timings.

Acceptance by position is counted in one place, `PositionCounts`: the request's figures, the app's
live plot and the draft policy's per-request history all read the same counter.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import StepEvent


@dataclass
class PositionCounts:
    """Per position of a validation window (0 = the first candidate), over closed windows: how many
    windows the target verified that far (`verified`), how many of those reached the position with
    every candidate before it accepted (`reached`), and how many accepted it (`accepted`).

    accepted / verified is the share of windows whose position i was accepted (what the app plots);
    accepted / reached is the chance of acceptance there given the prefix passed (what the draft
    policy predicts). The first rejected position is reached but not accepted; positions after it
    are verified but not reached."""

    verified: list[int] = field(default_factory=list)
    reached: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)

    def add(self, verified: int, accepted: int) -> None:
        """One closed window: `verified` candidates checked, the first `accepted` of them accepted."""
        if verified <= 0:
            return
        while len(self.verified) < verified:
            self.verified.append(0)
            self.reached.append(0)
            self.accepted.append(0)
        for i in range(verified):
            self.verified[i] += 1
            self.reached[i] += int(i <= accepted)
            self.accepted[i] += int(i < accepted)

    def __len__(self) -> int:
        return len(self.verified)

    @property
    def acceptance(self) -> list[float]:
        """Per position: the share of windows verified that far whose candidate there was accepted."""
        return [a / v if v else 0.0 for a, v in zip(self.accepted, self.verified)]

    def conditional(self, i: int, prior: float, weight: float) -> float:
        """P(position i accepted | every candidate before it was), from a prior worth `weight` windows."""
        if i >= len(self.reached):
            return prior
        return (self.accepted[i] + weight * prior) / (self.reached[i] + weight)


@dataclass
class RequestMetrics:
    """Accumulates one request's step events into the figures the CLI, app and bench report."""

    draft_name: str | None = None
    device: str = "CPU"
    prompt_tokens: int = 0
    generated_tokens: int = 0
    ttft_ms: float = 0.0
    decode_ms: float = 0.0  # from the first token to the last
    target_steps: int = 0  # verification/decode steps after the prefill
    decode_tokens: int = 0  # tokens those steps committed
    decode_produced: int = 0  # tokens those steps produced, a final EOS included (tokens per step)
    drafted_total: int = 0  # candidates the draft proposed, over all windows
    verified_total: int = 0  # of them, the ones the target checked (the draft policy may check fewer)
    accepted_total: int = 0
    positions: PositionCounts = field(default_factory=PositionCounts)
    draft_step_ms: list[float] = field(default_factory=list)
    draft_model_ms: list[float] = field(default_factory=list)
    markov_head_ms: list[float] = field(default_factory=list)
    sampling_ms: list[float] = field(default_factory=list)
    target_ms: list[float] = field(default_factory=list)
    windows: int = 0  # validation windows completed
    split_windows: int = 0  # of which validated over more than one step
    preemptions: int = 0  # times the KV cache ran out and this request was recomputed later
    cached_tokens: int = 0  # prompt tokens found in the prefix cache (not computed again)

    def record(self, event: StepEvent) -> None:
        self.generated_tokens += len(event.tokens)
        t = event.timings
        if event.step == 0 or (event.finish_reason == "cancelled" and not event.produced):
            return  # the prefill, or a cancellation that ran no target inference
        self.target_steps += 1
        self.decode_tokens += len(event.tokens)
        self.decode_produced += event.produced
        if event.window_drafted is not None:  # a window counts once, over all steps that validated it
            verified = len(event.window_drafted)
            self.windows += 1
            self.drafted_total += max(event.window_proposed, verified)
            self.verified_total += verified
            self.accepted_total += event.window_accepted
            self.positions.add(verified, event.window_accepted)
        self.draft_step_ms.append(t.draft_step_ms)
        self.draft_model_ms.append(t.draft_model_ms)
        self.markov_head_ms.append(t.markov_head_ms)
        self.sampling_ms.append(t.sampling_ms)
        self.target_ms.append(t.target_ms)

    @property
    def tpot_ms(self) -> float:
        """Mean time per output token after the first (decode only, no prefill)."""
        return self.decode_ms / self.decode_tokens if self.decode_tokens else 0.0

    @property
    def decode_tok_s(self) -> float:
        return 1e3 / self.tpot_ms if self.tpot_ms else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Tokens committed per target step (accepted drafts + the target's own token)."""
        return self.decode_produced / self.target_steps if self.target_steps else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / verified candidates (what the target checked; the policy's unchecked ones are not counted)."""
        return self.accepted_total / self.verified_total if self.verified_total else 0.0

    @property
    def mean_verified(self) -> float:
        """Candidates the target checked per window."""
        return self.verified_total / self.windows if self.windows else 0.0

    @property
    def position_verified(self) -> list[int]:
        return self.positions.verified

    @property
    def position_accepted(self) -> list[int]:
        return self.positions.accepted

    @property
    def acceptance_by_position(self) -> list[float]:
        return self.positions.acceptance

    def as_dict(self) -> dict[str, object]:
        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        return {
            "draft": self.draft_name, "device": self.device,
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "ttft_ms": round(self.ttft_ms, 3), "tpot_ms": round(self.tpot_ms, 3),
            "decode_tok_s": round(self.decode_tok_s, 2), "target_steps": self.target_steps,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "drafted": self.drafted_total, "verified": self.verified_total, "accepted": self.accepted_total,
            "mean_verified": round(self.mean_verified, 3),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_by_position": [round(x, 4) for x in self.acceptance_by_position],
            "draft_step_ms": round(mean(self.draft_step_ms), 3),
            "draft_model_ms": round(mean(self.draft_model_ms), 3),
            "markov_head_ms": round(mean(self.markov_head_ms), 3),
            "sampling_ms": round(mean(self.sampling_ms), 3),
            "target_ms": round(mean(self.target_ms), 3),
            "windows": self.windows, "split_windows": self.split_windows, "preemptions": self.preemptions,
            "cached_tokens": self.cached_tokens,
        }
