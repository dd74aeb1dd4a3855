"""Multi-turn bench conversations: MT-Bench's second turn with the first turn's own answer as history.

MT-Bench is meant to be run so: the model answers turn 1, and turn 2 is asked with that answer in the
conversation. Every configuration answers the earlier turns itself and its row reports the last turn;
each later prompt is the previous prompt's ids, the answer's ids as generated and the tokens of the
rest of the rendered conversation (engine/conversation.py): where the prefix cache can serve the
history, it does. The TTFT of every turn goes into a note (median over the prompts).

Prefix caching is a setting per engine configuration (`--prefix-caching on off`: one row per setting,
side by side in one run). This engine's cache is cleared before every conversation, so a turn reuses
only its own conversation's history, never another prompt's (nor an earlier configuration's).
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import replace
from typing import Any, Callable

from engine.bench.datasets import Prompt
from engine.bench.report import ENGINE, BatchRun
from engine.conversation import extend_ids
from engine.errors import DFlashError


def caching_label(on: bool) -> str:
    return f"prefix cache {'on' if on else 'off'}"


def fresh_cache(runner: Any) -> None:
    """Put an engine runner's engine in its configuration's prefix-caching setting, with nothing cached
    (a peer's runner, openvino_genai's, has no engine of ours: it is left as it is)."""
    if runner.engine != ENGINE:
        return
    if runner.prefix_caching is not None:
        runner.pipe.set_prefix_caching(runner.prefix_caching)
    runner.pipe.clear_prefix_cache()


def check_turns(prompts: list[Prompt], turns: int) -> None:
    """DFlashError when a prompt has fewer user turns than asked for."""
    short = [p.id for p in prompts if 1 + len(p.followups) < turns or (turns > 1 and not p.chat)]
    if short:
        raise DFlashError(f"--turns {turns} needs chat prompts with {turns} user turns; {len(short)} prompts "
                          f"(first: {short[0]}) have fewer: use --dataset mt-bench (two turns each), or --turns 1.")


def run_turns(runner: Any, encoder: Any, prompt: Prompt, ids: list[int], turns: int, max_new_tokens: int,
              cancel: Callable[[], bool] | None = None) -> tuple[BatchRun, list[float]]:
    """Run `prompt`'s conversation (its first turn encoded as `ids`) for `turns` user turns on `runner`,
    one request at a time: the last turn's run and the TTFT of every turn.

    `encoder` is this engine's runner whose tokenizer renders the chat for every configuration (the
    same prompt ids for all); each later turn's history is the configuration's own answer."""
    fresh_cache(runner)
    run = runner.run([(prompt.id, ids)], 1, max_new_tokens, cancel)
    ttft = [r.ttft_ms for r in run.requests[:1]]
    if turns < 2 or run.cancelled:
        return run, ttft
    renderer = encoder.pipe
    messages = [{"role": "user", "content": prompt.text}]
    text = renderer.chat_prompt(messages)
    for follow in prompt.followups[: turns - 1]:
        out = run.requests[0]
        seen, seen_ids = text + out.text, ids + list(out.token_ids)
        messages += [{"role": "assistant", "content": out.text}, {"role": "user", "content": follow}]
        text = renderer.chat_prompt(messages)
        ids = extend_ids(text, [(seen, seen_ids)], renderer.encode_text) or renderer.encode_text(text)
        run = runner.run([(prompt.id, ids)], 1, max_new_tokens, cancel)
        if run.cancelled:
            break
        ttft.append(run.requests[0].ttft_ms)
    return run, ttft


def turn_notes(configs: list[Any], turns: int, prompts: int) -> list[str]:
    """One note per configuration: the median TTFT of each turn over the prompts every configuration
    finished (each configuration's `turn_ttft_ms`, one list per prompt)."""
    if turns < 2:
        return []
    notes = []
    for c in configs:
        per_turn = list(zip(*c.turn_ttft_ms[:prompts]))
        if len(per_turn) == turns:
            ms = " / ".join(f"{statistics.median(t):.0f}" for t in per_turn)
            notes.append(f"{c.row.config}: TTFT by turn (median ms over {prompts} prompts): {ms}")
    return notes


def per_setting(configs: list[Any], settings: list[bool], turns: int,
                genai_cached: Callable[[Any], Any] | None) -> list[Any]:
    """Every engine configuration once per prefix-caching setting (labelled when there are several; the
    runners are copies sharing the loaded engine, each with its `prefix_caching`);
    with `turns` > 1, the openvino_genai target alone also with its prefix caching on (`genai_cached()`
    gives that peer's runner for a configuration's decoding, or None when it cannot load)."""
    out = []
    several = len(settings) > 1
    for c in configs:
        if c.row.engine != ENGINE:
            if several:  # openvino_genai without its cache: compared with this engine without
                off = f" [{caching_label(False)}]"
                c = replace(c, row=replace(c.row, config=c.row.config + off, baseline=c.row.baseline + off))
            out.append(c)
            if turns > 1 and True in settings and c.row.draft is None and genai_cached is not None:
                runner = genai_cached(c.decoding)
                if runner is not None:
                    tag = f" [{caching_label(True)}]"
                    name = c.row.config.removesuffix(f" [{caching_label(False)}]") + tag
                    base = c.row.baseline.removesuffix(f" [{caching_label(False)}]") + (tag if several else "")
                    row = replace(c.row, config=name, baseline=base)
                    out.append(replace(c, row=row, runner=runner, runs={}, turn_ttft_ms=[]))
            continue
        for on in settings:
            runner = copy.copy(c.runner)
            runner.prefix_caching = on
            row = c.row
            if several:
                tag = f" [{caching_label(on)}]"
                row = replace(row, config=row.config + tag, baseline=row.baseline + tag)
            out.append(replace(c, row=row, runner=runner, runs={}, turn_ttft_ms=[]))
    return out
