"""The engine's API: what every consumer (CLI, bench, app worker, server) may call, and the one loader.

An `Engine` serves many requests through one loop: `add_request` queues a prompt, each `step()`
runs one target inference for the scheduled requests and returns one `StepEvent` per request that
emitted or ended, `cancel` ends a request at the next step, `metrics` / `result` read a request's
figures and output, and `describe()` says what is loaded. `fit_chat` applies the engine's context
rule to a chat (the oldest turns left out), `check_fits` refuses a request too large before it runs,
and the prefix cache is read, cleared and switched through it. `SpeculativePipeline` (the paged engine,
engine/pipeline.py), `GenAITargetPipeline` (the target alone through openvino_genai, the NPU path,
engine/genai_target.py) and the app's fake engine all have this shape; `load_engine` picks the first
two by device, so no consumer needs to know which one it got.
"""
from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, Sequence, runtime_checkable

from engine.config import GenerationConfig
from engine.description import EngineDescription
from engine.errors import DeviceError
from engine.events import GenerationResult, StepEvent
from engine.metrics import RequestMetrics
from engine.models.tokenizer import Prompt
from engine.scheduler import SchedulerConfig, StepStats

if TYPE_CHECKING:
    import openvino as ov


@runtime_checkable
class Engine(Protocol):
    """The surface the bench, the app and a server drive (one thread at a time)."""

    last_step: StepStats  # what the latest step() scheduled (requests, rows)

    def describe(self) -> EngineDescription: ...

    def encode_prompt(self, prompt: Prompt, chat: bool | None = None) -> list[int]: ...

    def chat_prompt(self, messages: Sequence[dict[str, str]]) -> str:
        """The chat template's text for the messages, the assistant's turn begun (ValueError without a template)."""

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a text as it stands, no special tokens added (a continuation of a rendered prompt)."""

    def fit_chat(self, messages: Sequence[dict[str, str]], max_new_tokens: int) -> tuple[list[dict[str, str]], int]:
        """The messages that fit the context with max_new_tokens to spare, and how many oldest turns went."""

    def check_fits(self, prompt_tokens: int, max_new_tokens: int) -> None:
        """ContextLengthError when a request of this size cannot run (context, KV cache): a bench or a batch
        checks every prompt before it starts, so none fails midway."""

    def add_request(self, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None) -> int: ...

    def step(self) -> list[StepEvent]: ...

    def cancel(self, request_id: int) -> None: ...

    def has_unfinished(self) -> bool: ...

    def metrics(self, request_id: int) -> RequestMetrics: ...

    def result(self, request_id: int) -> GenerationResult: ...

    def prefix_cache_stats(self) -> dict[str, int] | None:
        """The prefix cache's blocks, memory_bytes and hits; None when the engine keeps none."""

    def clear_prefix_cache(self) -> int:
        """Forget every cached prefix; the bytes it held (0 without a cache)."""

    def set_prefix_caching(self, on: bool) -> None:
        """Turn the prefix cache on or off for the requests added next (a no-op for an engine without one)."""


def is_npu(device: str) -> bool:
    return device.upper().startswith("NPU")


def load_engine(target: Path | str, draft: Path | str | None = None, device: str = "CPU",
                precision: str = "default", scheduler: SchedulerConfig | None = None,
                core: ov.Core | None = None) -> Engine:
    """The engine for a target (and draft) on a device: the paged speculative pipeline, or on NPU the
    target alone through openvino_genai (NPU cannot run the speculative loop; a draft is refused there).

    Raises ModelFolderError / DraftMismatchError / DeviceError saying what to change."""
    if is_npu(device):
        from engine.devices import NPU_NOTICE
        from engine.genai_target import GenAITargetPipeline

        if draft is not None:
            raise DeviceError(f"{device}: {NPU_NOTICE}")
        return GenAITargetPipeline(Path(target), device, precision)
    from engine.pipeline import SpeculativePipeline

    return SpeculativePipeline.load(target, draft, device=device, precision=precision, core=core, scheduler=scheduler)
