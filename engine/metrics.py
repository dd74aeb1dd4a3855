"""Per-request metrics: TTFT, TPOT, tokens per step, acceptance by block position, step timings."""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.events import StepEvent


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
    drafted_total: int = 0
    accepted_total: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
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
            window = event.window_drafted
            self.windows += 1
            self.drafted_total += len(window)
            self.accepted_total += event.window_accepted
            for i in range(len(window)):
                if i >= len(self.position_drafted):
                    self.position_drafted.append(0)
                    self.position_accepted.append(0)
                self.position_drafted[i] += 1
                self.position_accepted[i] += int(i < event.window_accepted)
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
        return self.accepted_total / self.drafted_total if self.drafted_total else 0.0

    @property
    def acceptance_by_position(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.position_accepted, self.position_drafted)]

    def as_dict(self) -> dict[str, object]:
        def mean(xs: list[float]) -> float:
            return sum(xs) / len(xs) if xs else 0.0

        return {
            "draft": self.draft_name, "device": self.device,
            "prompt_tokens": self.prompt_tokens, "generated_tokens": self.generated_tokens,
            "ttft_ms": round(self.ttft_ms, 3), "tpot_ms": round(self.tpot_ms, 3),
            "decode_tok_s": round(self.decode_tok_s, 2), "target_steps": self.target_steps,
            "tokens_per_step": round(self.tokens_per_step, 4),
            "drafted": self.drafted_total, "accepted": self.accepted_total,
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
