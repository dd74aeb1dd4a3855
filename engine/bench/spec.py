"""What a bench run compares: the decodings, the configurations, the levels of concurrency, the scheduler.

A `BenchSpec` is checked (`validate`, a ValueError naming the setting) before anything loads, and
`spec_command` writes the `dflash-studio bench` command line that runs it again (the reports print it).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from engine.config import GenerationConfig
from engine.draft_policy import DEFAULT_POLICY, POLICIES
from engine.scheduler import SchedulerConfig

SCHEDULER_FIELDS = ("max_num_batched_tokens", "max_num_seqs", "num_kv_blocks", "cache_size_mb", "window_models_mb")


@dataclass(frozen=True)
class Decoding:
    """Greedy or sampled settings shared by a group of configurations (and their baseline)."""

    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    rng_seed: int | None = 0  # fixed by default so a bench run can be repeated

    @property
    def greedy(self) -> bool:
        return not self.do_sample

    @property
    def plain_greedy(self) -> bool:
        """Greedy without penalties: the target's argmax, what openvino_genai's DFlash verifies."""
        return self.greedy and self.repetition_penalty == 1.0 and not self.presence_penalty \
            and not self.frequency_penalty

    @property
    def label(self) -> str:
        parts = [f"T={self.temperature:g}"] if self.do_sample else ["greedy"]
        if self.do_sample:
            if self.top_k:
                parts.append(f"top_k={self.top_k}")
            if self.top_p < 1.0:
                parts.append(f"top_p={self.top_p:g}")
            if self.min_p:
                parts.append(f"min_p={self.min_p:g}")
        if self.repetition_penalty != 1.0:
            parts.append(f"rep={self.repetition_penalty:g}")
        if self.presence_penalty:
            parts.append(f"presence={self.presence_penalty:g}")
        if self.frequency_penalty:
            parts.append(f"frequency={self.frequency_penalty:g}")
        if self.do_sample and self.rng_seed is not None:
            parts.append(f"seed={self.rng_seed}")
        return " ".join(parts)

    def config_fields(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    def config(self, **extra: Any) -> GenerationConfig:
        """These settings as the engine's GenerationConfig (plus `extra`: n, K, max_new_tokens)."""
        return GenerationConfig(**self.config_fields(), **extra)


@dataclass
class BenchSpec:
    target: Path
    drafts: list[Path] = field(default_factory=list)
    dataset: str = "smoke"
    prompts: int | None = 4  # None: the whole set
    max_new_tokens: int = 64
    device: str = "CPU"
    precision: str = "default"
    num_assistant_tokens: list[int | None] = field(default_factory=lambda: [None])  # None: the draft's own default
    markov_head_top_k: list[int | None] = field(default_factory=lambda: [None])  # None: the draft's default K
    decodings: list[Decoding] = field(default_factory=lambda: [Decoding()])
    # The peers: at one request at a time openvino_genai.LLMPipeline (the target alone, and its DFlash with each
    # draft where it can run); with `concurrency` levels ContinuousBatchingPipeline with the target alone.
    genai_target: bool = True
    genai_dflash: bool = True
    # None: each prompt alone, prompt-major (the per-prompt table); levels: N requests in flight per level.
    concurrency: list[int] | None = None
    scheduler: dict[str, int | None] = field(default_factory=dict)  # the options given (None: default)
    draft_policies: list[str] = field(default_factory=lambda: [DEFAULT_POLICY])  # each draft configuration under each
    turns: int = 1  # user turns per conversation; rows report the last (engine/bench/turns.py)
    prefix_caching: list[bool] = field(default_factory=lambda: [True])  # this engine's rows, one per setting

    @property
    def levels(self) -> list[int] | None:
        return sorted({int(n) for n in self.concurrency}) if self.concurrency is not None else None

    def validate(self) -> "BenchSpec":
        """ValueError naming the setting, before anything is loaded."""
        if self.max_new_tokens < 2:
            raise ValueError(f"max_new_tokens={self.max_new_tokens}: TPOT needs at least 2 new tokens.")
        if self.prompts is not None and self.prompts < 1:
            raise ValueError(f"prompts={self.prompts}: run at least one prompt.")
        if not self.decodings:
            raise ValueError("decodings: choose greedy, a sampling temperature, or both.")
        if self.turns not in range(1, 9):
            raise ValueError(f"turns={self.turns}: use 1 (the first turn) to 8 (2: MT-Bench's second turn).")
        if self.turns > 1 and self.concurrency is not None:
            raise ValueError(f"turns={self.turns}: conversations run one request at a time; leave out concurrency "
                             "(--concurrency) or use --turns 1.")
        if not self.prefix_caching:
            raise ValueError("prefix_caching: choose on, off, or both.")
        if self.concurrency is not None and len(self.prefix_caching) > 1:
            raise ValueError("prefix_caching: the rows at N requests run without a prefix cache, as their "
                             "ContinuousBatchingPipeline peer; leave out --prefix-caching with --concurrency.")
        for n in self.num_assistant_tokens:
            if n is not None:
                GenerationConfig(num_assistant_tokens=n).validate()
        for k in self.markov_head_top_k:
            if k is not None:
                GenerationConfig(markov_head_top_k=k).validate()
        for d in self.decodings:
            d.config().validate()
        if self.concurrency is not None:
            if not self.concurrency:
                raise ValueError("concurrency: give at least one level (e.g. --concurrency 1 2 4 8).")
            for n in self.concurrency:
                if int(n) < 1:
                    raise ValueError(f"concurrency={n}: run at least one request at a time.")
        for k in self.scheduler:
            if k not in SCHEDULER_FIELDS:
                raise ValueError(f"{k}: not a scheduler option ({', '.join(SCHEDULER_FIELDS)}).")
        make_scheduler(self.scheduler)  # SchedulerConfig.validate names a value out of range
        for name in self.draft_policies or [DEFAULT_POLICY]:
            if name not in POLICIES:
                raise ValueError(f"draft policy {name!r}: use one of {', '.join(POLICIES)}.")
        return self


def make_scheduler(options: dict[str, int | None]) -> SchedulerConfig | None:
    """A validated engine SchedulerConfig from the options that were given (None: none given)."""
    given = {k: v for k, v in options.items() if v is not None}
    return SchedulerConfig(**given).validate() if given else None


def effective_scheduler(options: dict[str, int | None]) -> dict[str, int | None]:
    """The engine's scheduler settings in force: the options given over the SchedulerConfig defaults."""
    eff = {k: getattr(SchedulerConfig(), k) for k in SCHEDULER_FIELDS}
    eff.update({k: v for k, v in options.items() if v is not None})
    return eff


def spec_command(spec: BenchSpec) -> str:
    """The `dflash-studio bench` command line that runs `spec` again."""
    parts = ["dflash-studio", "bench", "--target", str(spec.target)]
    parts += ["--draft", *map(str, spec.drafts)] if spec.drafts else ["--draft", "none"]
    parts += ["--device", spec.device, "--precision", spec.precision, "--dataset", spec.dataset,
              "--prompts", str(spec.prompts or 0), "--max-new-tokens", str(spec.max_new_tokens)]
    if any(n is not None for n in spec.num_assistant_tokens):
        parts += ["--num-assistant-tokens", *(str(n) for n in spec.num_assistant_tokens if n is not None)]
    if any(k is not None for k in spec.markov_head_top_k):
        parts += ["--markov-head-top-k", *(str(k) for k in spec.markov_head_top_k if k is not None)]
    sampled = [d for d in spec.decodings if d.do_sample]
    if sampled:
        d = sampled[0]
        parts += ["--temperature", *(f"{x.temperature:g}" for x in sampled)]
        if d.top_k:
            parts += ["--top-k", str(d.top_k)]
        if d.top_p < 1.0:
            parts += ["--top-p", f"{d.top_p:g}"]
        if d.min_p:
            parts += ["--min-p", f"{d.min_p:g}"]
        if d.rng_seed:
            parts += ["--seed", str(d.rng_seed)]
    if not any(d.greedy for d in spec.decodings):
        parts.append("--no-greedy")
    if spec.decodings and spec.decodings[0].repetition_penalty != 1.0:
        parts += ["--repetition-penalty", f"{spec.decodings[0].repetition_penalty:g}"]
    if spec.turns != 1:
        parts += ["--turns", str(spec.turns)]
    if spec.prefix_caching != [True]:
        parts += ["--prefix-caching", *("on" if x else "off" for x in spec.prefix_caching)]
    if not spec.genai_target and not spec.genai_dflash:
        parts.append("--no-genai")
    elif not spec.genai_dflash:
        parts.append("--no-genai-dflash")
    elif not spec.genai_target:
        parts.append("--no-genai-target")
    if spec.concurrency is not None:
        parts += ["--concurrency", *(str(n) for n in spec.concurrency)]
    for k in SCHEDULER_FIELDS:
        v = spec.scheduler.get(k)
        if v is not None:
            parts += ["--" + k.replace("_", "-"), str(v)]
    if spec.draft_policies and spec.draft_policies != [DEFAULT_POLICY]:
        parts += ["--draft-policy", *spec.draft_policies]
    return " ".join(shlex.quote(x) for x in parts)
