"""One request run to its end on any engine (engine/api.py): what each engine's `generate()` is.

A convenience over the loop every consumer could write: add the request, step until its finishing
event, hand each of its events to `on_event` (a truthy answer cancels it), return its result.
The engines share this one loop instead of each keeping a copy.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from engine.config import GenerationConfig
from engine.events import GenerationResult, StepEvent
from engine.models.tokenizer import Prompt

if TYPE_CHECKING:
    from engine.api import Engine


def generate(engine: Engine, prompt: Prompt, config: GenerationConfig | None = None, chat: bool | None = None,
             on_event: Callable[[StepEvent], object] | None = None) -> GenerationResult:
    """Run one request to the end beside whatever else the engine serves; its GenerationResult."""
    rid = engine.add_request(prompt, config, chat)
    done = False
    while not done and engine.has_unfinished():
        for event in engine.step():
            if event.request_id != rid:
                continue
            if on_event is not None and on_event(event):
                engine.cancel(rid)
            done = done or event.finished
    return engine.result(rid)
