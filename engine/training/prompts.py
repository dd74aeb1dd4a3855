"""The prompt rows of a recipe's sources, tokenized through the target's chat template.

Offline sources are built where the run starts (deterministic for their seeds); the sampled ones
(the target writes user turns itself) need the target and run with the answers. Every row passes the
benchmark filters of engine/training/sources.py. User files (`--prompts-file`, a recipe `file`
source) are JSONL, one object a line: {"prompt": "..."} or {"messages": [{"role", "content"}, ...]}
(a chat log: every user turn becomes a prompt with the conversation before it).
"""
from __future__ import annotations

import gzip
import json
import random
from pathlib import Path
from typing import Any, Callable, Sequence

from engine.training import sources as S
from engine.training.recipe import RecipeError, Source
from engine.training.sources import PromptRow

Log = Callable[[str], None]
KIND_OF = {"stdlib_code": "code", "package_code": "code", "composed_chat": "chat", "functions": "func",
           "magpie": "magpie", "primed": "primed", "file": "user"}


def chat_ids(tokenizer: Any, messages: Sequence[dict[str, str]]) -> list[int]:
    """Token ids of a conversation through the chat template, as the engine builds them (template
    text, then encode without special tokens)."""
    text = tokenizer.apply_chat_template(list(messages), tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def read_user_file(path: Path, name: str = "user") -> list[tuple[str, list[dict[str, str]]]]:
    """(row id, messages ending with a user turn) of a JSONL prompts / chat-log file."""
    path = Path(path)
    if not path.is_file():
        raise RecipeError(f"prompts file {path} does not exist")
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                d = json.loads(line)
            except json.JSONDecodeError as exc:
                raise RecipeError(f"{path}:{n} is not JSON ({exc})") from exc
            if isinstance(d, dict) and isinstance(d.get("prompt"), str):
                out.append((f"{name}-{n}", [{"role": "user", "content": d["prompt"]}]))
            elif isinstance(d, dict) and isinstance(d.get("messages"), list):
                msgs = d["messages"]
                for k, m in enumerate(msgs):
                    if not isinstance(m, dict) or "role" not in m or "content" not in m:
                        raise RecipeError(f"{path}:{n}: every message needs a role and a content")
                    if m["role"] == "user":
                        out.append((f"{name}-{n}.{k}", list(msgs[: k + 1])))
            else:
                raise RecipeError(f"{path}:{n}: expected {{\"prompt\": ...}} or {{\"messages\": [...]}}")
    if not out:
        raise RecipeError(f"prompts file {path} holds no prompt")
    return out


def offline_rows(src: Source, tokenizer: Any, max_tokens: int, markers: Sequence[str], bench: set[int],
                 log: Log) -> list[PromptRow]:
    """The rows of one offline source, filtered and tokenized (ids `<source>-<i>`)."""
    rng = random.Random(src.seed)
    kind = src.kind or KIND_OF[src.type]
    if src.type == "file":
        rows = []
        for rid, msgs in read_user_file(Path(src.path), src.name):
            text = "\n".join(m["content"] for m in msgs if m["role"] == "user")
            if any(m in text for m in markers) or S.overlaps(text, bench):
                continue
            ids = chat_ids(tokenizer, msgs)
            if len(ids) <= max_tokens:
                rows.append(PromptRow(rid, kind, f"file:{src.path}", text, ids))
        return rows[: src.count] if src.count else rows
    if src.type == "stdlib_code":
        made = S.code_prompts(src.count, rng)
    elif src.type == "package_code":
        made = S.code_prompts(src.count, rng, items=S.package_items(src.packages or S.PACKAGES))
    elif src.type == "composed_chat":
        made = S.chat_prompts(src.count, rng)
    elif src.type == "functions":
        made, _ = S.function_prompts(src.count, src.seed, src.packages or S.PACKAGES, bench, markers)
    else:
        raise ValueError(f"{src.type} is not an offline source")
    kept = [r for r in made if not any(m in r.prompt for m in markers) and not S.overlaps(r.prompt, bench)]
    rng.shuffle(kept)
    rows = []
    for i, r in enumerate(kept):
        ids = chat_ids(tokenizer, [{"role": "user", "content": r.prompt}])
        if len(ids) <= max_tokens:
            rows.append(PromptRow(f"{src.name}-{i}", kind, r.source, r.prompt, ids))
    log(f"prompts: {src.name} ({src.type}): {len(rows)} kept of {len(made)} "
        f"({len(made) - len(kept)} dropped by the benchmark filters)")
    return rows


def turn_prefix(tokenizer: Any, system: str) -> list[int]:
    """The chat template up to where the user's words begin (with `system`, if any): what the target
    continues to write a user turn."""
    mark = "\u2063TURN\u2063"
    msgs = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": mark}]
    text = tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=False)
    if mark not in text:
        raise RecipeError("the target's chat template drops the user's text: it cannot sample user turns")
    return list(tokenizer(text[: text.index(mark)], add_special_tokens=False)["input_ids"])


def end_of_turn_id(tokenizer: Any, eos_id: int) -> int:
    """The token that ends a user turn in the template (<|im_end|> for ChatML), else EOS."""
    mark = "\u2063X\u2063"
    text = tokenizer.apply_chat_template([{"role": "user", "content": mark}], tokenize=False, add_generation_prompt=False)
    after = text[text.index(mark) + len(mark):]
    ids = tokenizer(after, add_special_tokens=False)["input_ids"] if after.strip() else []
    return int(ids[0]) if ids else int(eos_id)


def sampled_rows(src: Source, tokenizer: Any, sample: Callable[[list[list[int]], int], list[list[int] | None]],
                 eos_id: int, max_tokens: int, bench: set[int], seen: Sequence[str], log: Log,
                 shard: tuple[int, int] = (0, 1)) -> list[PromptRow]:
    """User turns the target writes (`sample(prompts, end_id)` runs it), filtered like every prompt,
    for this rank's share (`shard` = (rank, ranks)) of the source's count."""
    end = end_of_turn_id(tokenizer, eos_id)
    prefix = turn_prefix(tokenizer, src.system)
    if src.type == "magpie":
        plan = [("ask", "")] * src.count
    else:
        plan = S.opener_plan(src.count, src.seed, src.shares or None)
    rank, ranks = shard
    plan = plan[rank::ranks]
    opener_ids = {op: list(tokenizer(op, add_special_tokens=False)["input_ids"]) if op else [] for _, op in plan}
    got = sample([prefix + opener_ids[op] for _, op in plan], end)
    full = [None if g is None else opener_ids[op] + list(g) for (_, op), g in zip(plan, got)]
    decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
    texts, stats = S.filter_turns(full, end, decode, bench, src.min_tokens, src.max_tokens)
    kept, dstats = S.dedupe_rounds([[PromptRow(f"{src.name}-{rank}-{i}", src.kind or KIND_OF[src.type], src.type, t)
                                     for i, t in enumerate(texts)]], seen)
    rows = []
    for r in kept:
        ids = chat_ids(tokenizer, [{"role": "user", "content": r.prompt}])
        if len(ids) <= max_tokens:
            r.ids = ids
            rows.append(r)
    log(f"prompts: {src.name} ({src.type}, sampled by the target): {len(rows)} kept of {len(plan)} "
        f"({json.dumps({**stats, **dstats})})")
    return rows


def write_rows(rows: Sequence[PromptRow], path: Path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with gzip.open(tmp, "wt", encoding="utf-8", compresslevel=6) as f:
        for r in rows:
            f.write(json.dumps({"id": r.id, "kind": r.kind, "source": r.source, "prompt": r.prompt, "ids": r.ids},
                               ensure_ascii=False) + "\n")
    tmp.replace(path)


def read_rows(path: Path) -> list[PromptRow]:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [PromptRow(d["id"], d["kind"], d.get("source", ""), d.get("prompt", ""), d["ids"])
                for d in (json.loads(line) for line in f if line.strip())]
