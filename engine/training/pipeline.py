"""`dflash-studio train-draft`: a recipe, start to end, for one target (docs/training.md).

Phases, each kept under OUT/work so that a killed or split run resumes where it stopped:
  1. plan: the target and the recipe are checked and the draft's shape fixed (nothing is loaded
     that a refusal would waste); what the run will take is printed;
  2. prompts: the offline sources (prompts.jsonl.gz) and the benchmark 8-gram hashes;
  3. per stage: the sampled sources the stage adds (the target writes user turns), the target's
     answers in a seeded random order until the features are full (answers.jsonl.gz), the tapped
     features, held-out τ of loaded starting weights, training (stage-N.pt checkpoints), held-out
     τ; a finished stage writes stage-N.json and its public-format weights (stage-N/);
  4. output: OUT/checkpoint (the public layout `export --kind draft` reads), OUT/openvino (the draft
     folder the app loads, with the sub-vocabulary of the answers) and OUT/training.json.

Under torchrun every rank answers and trains on its own shard; rank 0 writes the shared files.
"""
from __future__ import annotations

import copy
import json
import random
import shutil
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from engine.drafts import VARIANT_DFLASH_V1, VARIANT_DSPARK, load_draft, save_draft
from engine.training import distributed as ddp
from engine.training import prompts as P
from engine.training.defaults import DraftShape, draft_shape
from engine.training.recipe import INT8_SHIP, DraftSettings, Recipe, Source, Stage
from engine.training.sources import PromptRow
from engine.training.target_loader import TargetInfo, inspect_target

# Rates measured on one H200 for SmolLM2-135M (docs/training.md), scaled by target size for the
# estimate; CPU rates are rough (2-core machine).
GPU_GEN_TOKENS_S = 19_000.0
GPU_STEP_ROWS_S = 12.0 * 32 * 120 * 8
CPU_FACTOR = 1 / 60
ANSWER_CHUNK_BATCHES = 8
REF_PARAMS = 135e6


class TrainDraftError(ValueError):
    """A run that cannot start or go on; the message says what to do."""


@dataclass
class RunOptions:
    target: str
    variant: str
    out: Path
    recipe: Recipe
    prompts_file: Path | None = None
    only_prompts_file: bool = False
    prompts: int = 0  # at most this many prompts per stage (0: the recipe's)
    steps: int = 0  # at most this many steps per stage (0: the recipe's)
    device: str = "auto"
    resume: bool = False
    stage: str = ""  # run only this stage
    init: Path | None = None  # starting weights of the first stage run
    stop_after: str = ""  # "prompts": the offline prompts; "answers": the next stage's answers too (then --resume)
    export: bool = True
    time_budget_s: float = 0.0  # per stage, over the recipe's


@dataclass
class Plan:
    info: TargetInfo
    shape: DraftShape
    stages: list[Stage]
    counts: dict[str, int] = field(default_factory=dict)
    estimate: dict[str, Any] = field(default_factory=dict)


class Log:
    """Progress on stderr (rank 0) and in OUT/log.txt; other ranks only to their own file."""

    def __init__(self, path: Path, world: ddp.World) -> None:
        self.t0 = time.time()
        self.world = world
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path if world.main else path.with_name(f"log.rank{world.rank}.txt")

    def __call__(self, msg: str) -> None:
        line = f"[{time.time() - self.t0:7.1f}s] {msg}"
        if self.world.main:
            print(line, file=sys.stderr, flush=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(line + "\n")


# --------------------------------------------------------------------------------------------
# Plan
# --------------------------------------------------------------------------------------------
def stage_list(opts: RunOptions) -> list[Stage]:
    stages = list(opts.recipe.stages)
    if opts.stage:
        stages = [opts.recipe.stage(opts.stage)]
    extra = []
    if opts.prompts_file:
        extra = ["--prompts-file"]
    return [replace(s, sources=(tuple(extra) if opts.only_prompts_file else s.sources + tuple(extra))) for s in stages]


def source(opts: RunOptions, name: str) -> Source:
    if name == "--prompts-file":
        return Source(name="user", type="file", count=0, path=str(opts.prompts_file))
    return opts.recipe.source(name)


def make_plan(opts: RunOptions, tokenizer_vocab: dict[str, int] | None) -> Plan:
    """Refuses a target / recipe / option that cannot work, before any weight is loaded."""
    r = opts.recipe
    if r.variant != opts.variant:
        raise TrainDraftError(f"the recipe {r.path.name} trains a {r.variant} draft, not {opts.variant}: pass "
                              f"--variant {r.variant} or another --recipe")
    info = inspect_target(opts.target)
    shape = draft_shape(r.variant, r.draft, info, tokenizer_vocab)
    stages = stage_list(opts)
    if opts.init is not None and not (Path(opts.init) / "config.json").is_file():
        raise TrainDraftError(f"--init {opts.init} is not a draft checkpoint folder (no config.json)")
    counts = {}
    for st in stages:
        n = sum(source(opts, s).count for s in st.sources if s != "--prompts-file")
        counts[st.name] = min(n, opts.prompts) if opts.prompts else n
    plan = Plan(info, shape, stages, counts)
    plan.estimate = estimate(opts, plan)
    return plan


def device_name(opts: RunOptions) -> str:
    import torch

    if opts.device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if opts.device == "cuda" and not torch.cuda.is_available():
        raise TrainDraftError("--device cuda: torch sees no CUDA GPU here (install a CUDA build of torch: "
                              "docs/training.md), or use --device cpu")
    if opts.device == "xpu" and not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        raise TrainDraftError("--device xpu: torch sees no Intel GPU here (install an XPU build of torch)")
    return opts.device


def estimate(opts: RunOptions, plan: Plan) -> dict[str, Any]:
    """What the run will take (order of magnitude: rates measured on SmolLM2, scaled by size)."""
    r, info = opts.recipe, plan.info
    dev = device_name(opts)
    scale = REF_PARAMS / max(info.num_params, 1)
    fast = 1.0 if dev != "cpu" else CPU_FACTOR
    rows = max(plan.counts.values() or [0])
    ranks = ddp.world_from_env().size
    token_bytes = feature_token_bytes(plan, info, dev)
    row_bytes = (r.data.new_tokens * 0.8 + 100) * token_bytes
    datas = [r.stage_data(s) for s in plan.stages]
    stored = any(d.features == "stored" for d in datas)
    caps = [d.max_feature_gib if d.features == "stored" else 0.0 for d in datas]  # online: no cap
    cap_gib = 0.0 if not all(caps) else max(caps)  # the largest stage's; 0: every row
    cap_rows = cap_gib * ranks * 2**30 / row_bytes if cap_gib else float("inf")
    answer_tokens = sum(min(c, cap_rows) for c in plan.counts.values()) * r.data.new_tokens * 0.8  # answered until full
    steps = sum(opts.steps or r.stage_settings(s).steps for s in plan.stages)
    budgets = [opts.time_budget_s or r.stage_settings(s).time_budget_s or 0 for s in plan.stages]
    st = r.train
    step_s = st.batch_size * st.num_anchors * plan.shape.block_size / (GPU_STEP_ROWS_S * fast * min(4.0, scale))
    train_s = sum(min(b, steps_i * step_s) if b else steps_i * step_s
                  for b, steps_i in zip(budgets, [opts.steps or r.stage_settings(s).steps for s in plan.stages]))
    sampled = {n for st in plan.stages for n in st.sources if source(opts, n).sampled}
    answer_tokens += sum(source(opts, n).count * source(opts, n).max_new * 0.6 for n in sampled)
    gen_s = answer_tokens / (GPU_GEN_TOKENS_S * fast * scale) / ranks
    feat_gib = rows * (r.data.new_tokens + 100) * token_bytes / 2**30 if stored else 0.0
    if cap_gib:
        feat_gib = min(feat_gib, cap_gib)
    target_gib = info.num_params * 4 / 2**30
    return {"device": dev, "ranks": ranks, "rows": rows, "steps": steps, "generation_s": round(gen_s), "training_s": round(train_s),
            "total_s": round(gen_s + train_s + 30), "memory_gib": round(target_gib + feat_gib + 1.0, 1),
            "features_gib": round(feat_gib, 2),
            "disk_mb": round(sum(plan.counts.values()) * (r.data.new_tokens + 150) * 4 / 1e6 * 0.4
                             + plan.shape.estimated_mb * 4, 1)}


def feature_token_bytes(plan: Plan, info: TargetInfo, device_type: str) -> int:
    """Bytes of one token's features: every tapped layer's hidden state, bf16 on a GPU, f32 on the CPU."""
    return len(plan.shape.taps) * info.hidden_size * (2 if device_type != "cpu" else 4)


def describe(opts: RunOptions, plan: Plan) -> str:
    e, s = plan.estimate, plan.shape
    lines = [f"train-draft: {opts.variant} draft for {plan.info.source} ({plan.info.architecture}, "
             f"{plan.info.num_layers} layers, {plan.info.num_params / 1e6:.0f}M parameters), recipe {opts.recipe.name}",
             f"  draft: {s.layers} layers, block {s.block_size}, taps {s.taps}, mask id {s.mask_id}"
             + (f", head rank {s.rank}" if s.rank else "") + f", ~{s.estimated_mb} MB (budget {s.budget_mb} MB)",
             "  stages: " + ", ".join(f"{st.name} ({plan.counts[st.name]} prompts)" for st in plan.stages),
             f"  on {e['device']} x {e['ranks']}: {e['steps']} steps at most, about {e['total_s'] // 60} min "
             f"({e['generation_s']} s sampling and answers, {e['training_s']} s training), ~{e['memory_gib']} GiB memory "
             f"({e['features_gib']} GiB features), ~{e['disk_mb']} MB disk in {opts.out}"]
    return "\n".join(lines)


# --------------------------------------------------------------------------------------------
# Rows of a stage
# --------------------------------------------------------------------------------------------
def stage_rows(opts: RunOptions, stage_index: int, by_source: dict[str, list[PromptRow]]) -> tuple[list, list]:
    """(held-out rows, training rows) of a stage: the held-out set is the first `heldout` rows of the
    shuffled first stage's sources (the same for every stage, so τ compares across stages); the
    training rows are this stage's new sources shuffled together, then the earlier stages' rows
    (newest first), so a `--prompts` cap trims the oldest rows first (the feature cap samples)."""
    r = opts.recipe
    all_stages = stage_list(RunOptions(**{**opts.__dict__, "stage": ""}))
    first = [row for s in all_stages[0].sources for row in by_source.get(s, [])]
    random.Random(r.data.seed).shuffle(first)
    target_stage = stage_list(opts)[0] if opts.stage else all_stages[stage_index]
    idx = next(i for i, s in enumerate(all_stages) if s.name == target_stage.name)
    n_total = sum(len(by_source.get(s, [])) for s in target_stage.sources)
    cap = min(n_total, opts.prompts) if opts.prompts else n_total
    n_held = min(r.data.heldout, max(1, cap // 10))
    held = first[:n_held]
    held_ids = {x.id for x in held}
    seen: set[str] = set()
    blocks = []
    for i in range(idx, -1, -1):
        prev = set(all_stages[i - 1].sources) if i > 0 else set()
        srcs = [s for s in all_stages[i].sources if s not in prev and s in target_stage.sources]
        if i == idx:
            srcs = [s for s in target_stage.sources if s not in prev] or list(target_stage.sources)
        block = [row for s in srcs for row in by_source.get(s, []) if row.id not in held_ids and row.id not in seen]
        random.Random(r.data.seed + i + 1).shuffle(block)
        seen |= {row.id for row in block}
        blocks.append(block)
    train = [row for b in blocks for row in b]
    return held, train[: max(0, cap - n_held)]


# --------------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------------
def run(opts: RunOptions) -> Path | None:
    """The whole run; returns the OpenVINO draft folder (None when stopped early or on a rank > 0)."""
    world = ddp.world_from_env()
    opts.out.mkdir(parents=True, exist_ok=True)
    work = opts.out / "work"
    work.mkdir(exist_ok=True)
    log = Log(opts.out / "log.txt", world)
    if not opts.resume and (work / "plan.json").is_file():
        raise TrainDraftError(f"{opts.out} holds an earlier run: add --resume to continue it, or choose another --out")
    from engine.training.target_loader import load_tokenizer

    tok = load_tokenizer(opts.target)
    plan = make_plan(opts, tok.get_vocab())
    if world.main:
        print(describe(opts, plan), file=sys.stderr, flush=True)
    dev = ddp.rank_device(world, device_name(opts))
    ddp.init(world, dev)
    t_run = time.time()
    try:
        if world.main:
            (work / "plan.json").write_text(json.dumps({"target": str(plan.info.source), "variant": opts.variant,
                                                        "recipe": str(opts.recipe.path), "shape": asdict(plan.shape)},
                                                       indent=1), encoding="utf-8")
        by_source, bench = offline_prompts(opts, plan, tok, work, log, world)
        if opts.stop_after == "prompts":
            log(f"prompts written to {work}: continue with the same command and --resume")
            return None
        return train_stages(opts, plan, tok, by_source, bench, work, log, world, dev, t_run)
    finally:
        ddp.close(world)


def offline_prompts(opts: RunOptions, plan: Plan, tok: Any, work: Path, log: Log,
                    world: ddp.World) -> tuple[dict[str, list[PromptRow]], set[int]]:
    from engine.training import sources as S

    path, hpath = work / "prompts.jsonl.gz", work / "bench8.json"
    names = sorted({s for st in plan.stages for s in st.sources if not source(opts, s).sampled})
    if world.main and not path.is_file():
        markers = S.benchmark_markers()
        bench = S.benchmark_hashes()
        hpath.write_text(json.dumps({"n": 8, "hashes": sorted(f"{h:016x}" for h in bench)}), encoding="utf-8")
        rows = []
        for name in names:
            src = source(opts, name)
            if src.type == "file":
                src = replace(src, name="user" if name == "--prompts-file" else src.name)
            got = P.offline_rows(src, tok, opts.recipe.data.max_prompt_tokens, markers, bench, log)
            if opts.prompts:
                got = got[: opts.prompts]
            rows += [replace_source(r, name) for r in got]
        P.write_rows(rows, path)
        log(f"prompts: {len(rows)} rows from {len(names)} offline sources ({len(bench)} benchmark 8-grams)")
    ddp.barrier(world)
    by_source: dict[str, list[PromptRow]] = {}
    for r in P.read_rows(path):
        by_source.setdefault(r.source.split("|", 1)[0], []).append(r)
    bench = {int(h, 16) for h in json.loads(hpath.read_text(encoding="utf-8"))["hashes"]}
    return by_source, bench


def replace_source(row: PromptRow, name: str) -> PromptRow:
    """Tag a row with its recipe source (`name|origin`), so the stage rows can be picked by source."""
    row.source = f"{name}|{row.source}"
    return row


def train_stages(opts: RunOptions, plan: Plan, tok: Any, by_source: dict[str, list[PromptRow]], bench: set[int],
                 work: Path, log: Log, world: ddp.World, dev: Any, t_run: float) -> Path | None:
    import torch

    from engine.training.data import (answering_order, build_flat_data, features_full, generate_answers, load_answers,
                                      rows_within_feature_budget, save_answers)
    from engine.training.evaluate import WALKS, heldout_acceptance, tau
    from engine.training.packing import target_weights
    from engine.training.target_loader import load_target
    from engine.training.trainer import train

    r = opts.recipe
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    target, info = load_target(opts.target, torch.float32, dev)
    log(f"target loaded on {dev} ({time.time() - t_run:.0f}s)")
    cache = work / "answers.jsonl.gz"
    answers = {k: v["answer"] for k, v in load_answers(cache).items()}
    static = dev.type != "cpu"
    gen_dtype = getattr(torch, r.data.gen_dtype) if static else torch.float32
    record: dict[str, Any] = {"recipe": r.raw, "recipe_file": str(r.path), "variant": r.variant,
                              "target": {"source": info.source, "architecture": info.architecture,
                                         "sha256": plan.info.sha256}, "draft": asdict(plan.shape), "stages": [],
                              "loss": [], "device": {"type": dev.type, "ranks": world.size}}
    if world.main and (work / "record.json").is_file():
        record["stages"] = json.loads((work / "record.json").read_text(encoding="utf-8"))["stages"]
    draft = cfg = None
    prev_dir: Path | None = None
    for si, stage in enumerate(plan.stages):
        done = work / f"stage-{si}.json"
        sdir = work / f"stage-{si}"
        if done.is_file():
            log(f"stage {stage.name}: done earlier ({done})")
            prev_dir = sdir
            continue
        t_stage = time.time()
        sdata = r.stage_data(stage)
        # ---- sampled sources this stage needs
        for name in stage.sources:
            src = source(opts, name)
            if src.sampled and name not in by_source:
                by_source[name] = sampled_source(opts, src, tok, target, info, bench, by_source, work, log, world,
                                                 sdata.gen_batch)
        held, train_rows = stage_rows(opts, si, by_source)
        # ---- answers (each rank its share of the rows not answered yet), until the features are full
        per_token = feature_token_bytes(plan, info, dev.type)
        online = sdata.features == "online"
        gib = 0.0 if online else sdata.max_feature_gib * world.size  # online: no cap, every row is answered
        order = answering_order(held, train_rows, r.data.seed)
        chunk = ANSWER_CHUNK_BATCHES * sdata.gen_batch * world.size  # saved after each: a kill loses one chunk
        asked = 0
        for c0 in range(0, len(order), chunk):
            if features_full(order[:c0], answers, gib, per_token):
                log(f"answers: the features of the first {c0} rows fill {gib:g} GiB; the other {len(order) - c0} "
                    "are not answered")
                break
            todo = [x for x in order[c0: c0 + chunk] if x.id not in answers]
            if not todo:
                continue
            mine = ddp.shard(todo, world)
            t0 = time.time()
            got = generate_answers(target, [x.ids for x in mine], r.data.new_tokens, sdata.gen_batch, info.eos_id,
                                   info.pad_id, None, log, r.data.seed, static, gen_dtype)
            new = {x.id: a for x, a in zip(mine, got) if a is not None}
            answers.update(ddp.gather_dicts(world, new))
            asked += len(todo)
            n_tok = sum(len(a) for a in new.values())
            log(f"answers: {min(c0 + chunk, len(order))} of {len(order)} rows ({len(new)} on this rank, {n_tok} tokens, "
                f"{time.time() - t0:.0f}s)")
            if world.main:
                save_answers(cache, [x for rows_ in by_source.values() for x in rows_], answers)
            ddp.barrier(world)
        if opts.stop_after == "answers":  # a lease too short for the whole stage: the next one starts from here
            log(f"stage {stage.name}: sampled turns and answers written to {work}: continue with the same command "
                "and --resume")
            return None
        held = [x for x in held if x.id in answers]
        train_rows = [x for x in train_rows if x.id in answers]
        budget_rows = rows_within_feature_budget(held, train_rows, answers, gib, per_token, log, r.data.seed)
        mine = ddp.shard(budget_rows, world)
        rows = held + mine
        feat_dtype = torch.bfloat16 if dev.type != "cpu" else torch.float32  # as feature_token_bytes counts them
        data, fstats = build_flat_data(target, [x.ids for x in rows], [answers[x.id] for x in rows],
                                       [x.kind for x in rows], plan.shape.taps, r.data.feature_tokens, feat_dtype, log,
                                       online=online, online_dtype=gen_dtype if gen_dtype != torch.float32 else None)
        embed, lm_head = (t.to(dev) for t in target_weights(target))
        # ---- the draft's starting weights
        draft, cfg, init_note, loaded = stage_draft(opts, plan, stage, si, prev_dir, target.config.to_dict(), log)
        settings = r.stage_settings(stage)
        if opts.steps:
            settings = replace(settings, steps=min(settings.steps, opts.steps))
        if opts.time_budget_s:
            settings = replace(settings, time_budget_s=opts.time_budget_s)
        settings = replace(settings, bf16=settings.bf16 and dev.type == "cuda", seed=settings.seed + r.data.seed)
        vocab = stage_vocab(settings, answers, info.vocab_size, lm_head, log)
        held_idx = list(range(len(held)))
        cands = [n for n in r.eval.candidates if 0 < n <= plan.shape.block_size - (0 if opts.variant == VARIANT_DSPARK else 1)]
        main_walk = "none" if opts.variant == VARIANT_DFLASH_V1 else "topk"

        def during(step: int) -> dict[str, float]:
            res = heldout_acceptance(draft, data, held_idx[: r.eval.during_rows], embed, lm_head, cands, (main_walk,),
                                     r.eval.top_k, settings.bf16, vocab=vocab)
            return tau(res, main_walk)

        start = starting_tau(loaded, work / f"stage-{si}", world,
                             lambda: tau(heldout_acceptance(draft.to(dev), data, held_idx[: r.eval.rows], embed, lm_head, cands,
                                                            (main_walk,), r.eval.top_k, settings.bf16, vocab=vocab),
                                         main_walk))
        if start:
            log(f"stage {stage.name}: held-out tau of the starting weights: "
                + ", ".join(f"{n} {v:.3f}" for n, v in start.items()))
        def snapshot(step: int, stem: Path = work / f"stage-{si}") -> None:
            # the weights so far as a draft folder (an --init for a later run), small enough to copy off a
            # machine whose lease can end mid-stage (launch.sh snapshot); replaced atomically
            tmp = stem.with_name(stem.name + ".latest.tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            save_draft(ship_copy(draft, r.draft.ship_dtype), cfg, tmp)
            (tmp / "snapshot.json").write_text(json.dumps({"stage": stage.name, "step": step}), encoding="utf-8")
            latest = stem.with_name(stem.name + ".latest")
            shutil.rmtree(latest, ignore_errors=True)
            tmp.replace(latest)

        res = train(draft, data, torch.arange(len(held), len(rows)), embed, lm_head, settings, r.loss,
                    work / f"stage-{si}.pt", True, log, world, during if settings.eval_every else None, vocab,
                    on_save=snapshot)
        if not world.main:
            prev_dir = sdir
            ddp.barrier(world)
            continue
        acc = heldout_acceptance(draft, data, held_idx[: r.eval.rows], embed, lm_head, cands, WALKS, r.eval.top_k,
                                 settings.bf16, vocab=vocab)
        for n, per in acc.items():
            log(f"stage {stage.name}: held-out tau at {n} candidates: "
                + ", ".join(f"{m} {v['tokens_per_step'].get('all', 0):.3f}" for m, v in per.items()))
        save_draft(ship_copy(draft, r.draft.ship_dtype), cfg, sdir)
        entry = {"name": stage.name, "sources": list(stage.sources), "init": init_note, "steps": res["steps"],
                 "seconds": res["seconds"], "gpu_seconds": round(res["seconds"] * world.size, 1) if dev.type != "cpu" else 0,
                 "wall_seconds": round(time.time() - t_stage, 1), "settings": asdict(settings),
                 "data": {**fstats, "heldout": len(held), "train_rows": len(budget_rows),
                          "kinds": _count(x.kind for x in budget_rows), "answered": len(held) + len(train_rows),
                          "answered_this_run": asked},
                 "loss": [[s, l] for s, l, _ in res["losses"]], "loss_parts": [p for _, _, p in res["losses"]],
                 "heldout_during": res["evals"], "heldout_start": start, "heldout": acc,
                 "logits_vocab": int(vocab.ids.numel()) if vocab is not None else info.vocab_size,
                 "heldout_tau": tau(acc, main_walk), "walk": main_walk}
        record["stages"] = [s for s in record["stages"] if s["name"] != stage.name] + [entry]
        (work / "record.json").write_text(json.dumps({"stages": record["stages"]}), encoding="utf-8")
        done.write_text(json.dumps({"name": stage.name, "steps": res["steps"]}), encoding="utf-8")
        prev_dir = sdir
        ddp.barrier(world)
        del data
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    if not world.main:
        return None
    return finish(opts, plan, prev_dir, record, answers, info, log, t_run)


def starting_tau(loaded: bool, stem: Path, world: ddp.World,
                 measure: Callable[[], dict[str, float]]) -> dict[str, float]:
    """Held-out τ of the weights a stage starts from (a loaded draft, not a fresh one), so a
    fine-tuning stage shows what it gained. Measured once, before the first step, and kept beside
    the stage's checkpoint so that a resumed run still reports it."""
    keep = stem.with_suffix(".start.json")
    if not loaded or not world.main:
        return {}
    if keep.is_file():
        return json.loads(keep.read_text(encoding="utf-8"))
    if stem.with_suffix(".pt").is_file():
        return {}
    got = measure()
    keep.write_text(json.dumps(got), encoding="utf-8")
    return got


def sub_vocab_size(vocab_size: int, rows: int = 0) -> int:
    """The size of the sub-vocabulary the draft ships with (0: none; it pays off on large vocabularies only).
    `rows` is the stage's `vocab_rows` (TrainSettings): a larger vocabulary needs more rows than the default to cover
    a chat answer's tokens (docs/training.md, "Stage 7"); 0 keeps the default rule."""
    from engine.models.draft_vocab import DEFAULT_SIZE

    if rows:
        return rows if rows < vocab_size else 0
    return DEFAULT_SIZE if vocab_size > 2 * DEFAULT_SIZE else 0


def stage_vocab(settings: Any, answers: dict[str, list[int]], vocab_size: int, lm_head: Any, log: Log) -> Any:
    """The sub-vocabulary a stage trains its logits over: the one the finished draft will ship with
    (the most frequent tokens of the answers so far, as `finish` writes it), or None."""
    size = sub_vocab_size(vocab_size, settings.vocab_rows)
    if not (settings.sub_vocab and size):
        return None
    import torch

    from engine.models.draft_vocab import count_answer_tokens, top_ids
    from engine.training.losses import SubVocab

    counts = count_answer_tokens(answers.values(), vocab_size)
    ids = top_ids(counts, size)
    log(f"logits over the draft's {size}-token sub-vocabulary ({counts[ids].sum() / max(1, counts.sum()):.2%} of "
        "the answer tokens)")
    return SubVocab.of(torch.from_numpy(ids), lm_head)


def _count(kinds: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for k in kinds:
        out[k] = out.get(k, 0) + 1
    return out


def sampled_source(opts: RunOptions, src: Source, tok: Any, target: Any, info: TargetInfo, bench: set[int],
                   by_source: dict[str, list[PromptRow]], work: Path, log: Log, world: ddp.World,
                   gen_batch: int) -> list[PromptRow]:
    """A sampled source's rows (kept in work/sampled-<name>.jsonl.gz once made), sampled `gen_batch` at a time."""
    import torch

    from engine.training.data import generate_answers

    path = work / f"sampled-{src.name}.jsonl.gz"
    if not path.is_file():
        static = next(target.parameters()).device.type != "cpu"
        count = min(src.count, opts.prompts) if opts.prompts else src.count
        src = replace(src, count=count)

        def sample(prompts: list[list[int]], end: int) -> list[list[int] | None]:
            return generate_answers(target, prompts, src.max_new, gen_batch, end, info.pad_id, None,
                                    log, src.seed * 1000 + world.rank, True,
                                    getattr(torch, opts.recipe.data.gen_dtype) if static else torch.float32,
                                    src.temperature, src.top_p)

        seen = [x.prompt for rows in by_source.values() for x in rows if x.kind in ("magpie", "primed")]
        mine = P.sampled_rows(src, tok, sample, info.eos_id, opts.recipe.data.max_prompt_tokens, bench, seen, log,
                              (world.rank, world.size))
        allrows = [x for part in ddp.gather_objects(world, mine) for x in part]
        if world.main:
            from engine.training import sources as S

            kept, _ = S.dedupe_rounds([allrows], seen)
            P.write_rows([replace_source(x, src.name) for x in kept], path)
        ddp.barrier(world)
    return P.read_rows(path)


def stage_draft(opts: RunOptions, plan: Plan, stage: Stage, si: int, prev_dir: Path | None, tcfg: dict[str, Any],
                log: Log) -> tuple[Any, dict[str, Any], str, bool]:
    """The draft a stage starts from: --init (first stage run), the previous stage, a v1 backbone, or fresh;
    with a note of where it came from and whether all its weights were loaded."""
    init = stage.init
    if opts.init is not None and (si == 0 or opts.stage):
        init = str(opts.init)
    elif init == "previous" and prev_dir is None:
        init = "fresh"
    if init == "previous":
        draft, cfg, _ = load_draft(prev_dir)
        return draft.float(), ship_config(cfg, opts.recipe.draft), f"the weights of the previous stage ({prev_dir})", True
    if init not in ("fresh",) and not init.startswith("v1_backbone:"):
        path = Path(init)
        if not path.is_absolute() and not path.exists():
            path = Path(__file__).resolve().parents[2] / init
        draft, cfg, variant = load_draft(path)
        if variant != opts.variant:
            raise TrainDraftError(f"{path} is a {variant} draft; this run trains {opts.variant}")
        check_fits(cfg, plan)
        note = f"all weights of {path}"
        from engine.training.warm_start import grow_to_shape

        try:
            draft, cfg, grown = grow_to_shape(draft, cfg, plan.shape.layers,
                                              plan.shape.rank if opts.variant == VARIANT_DSPARK else 0)
        except ValueError as e:
            raise TrainDraftError(f"{path}: {e}") from None
        if grown:
            note += f", {grown}"
            log(f"draft: {note}")
        return draft.float(), ship_config(cfg, opts.recipe.draft), note, True
    draft, cfg = fresh_draft(opts.variant, plan, tcfg, opts.recipe)
    note = "fresh"
    if init.startswith("v1_backbone:"):
        from engine.training.warm_start import copy_v1_backbone

        path = Path(init.split(":", 1)[1])
        if not path.is_absolute():
            path = Path(__file__).resolve().parents[2] / path
        info = copy_v1_backbone(draft, path)
        note = f"backbone from the DFlash v1 draft {path} ({info['tensors']} tensors)"
    log(f"draft: {note}")
    return draft, ship_config(cfg, opts.recipe.draft), note, False


def ship_config(cfg: dict[str, Any], d: DraftSettings) -> dict[str, Any]:
    """The config the stage saves with: `weight_storage` says int8 rows when the recipe ships them."""
    from engine.drafts.checkpoint import INT8_STORAGE

    out = {k: v for k, v in cfg.items() if k != "weight_storage"}
    if d.ship_dtype == INT8_SHIP:
        out["weight_storage"] = INT8_STORAGE
    return out


def ship_copy(draft: Any, ship_dtype: str) -> Any:
    """A CPU copy of the draft to save, in the recipe's ship dtype (float32 for int8 rows: they are
    quantized from full precision when saved)."""
    import torch

    return copy.deepcopy(draft).to("cpu", torch.float32 if ship_dtype == INT8_SHIP else getattr(torch, ship_dtype))


def check_fits(cfg: dict[str, Any], plan: Plan) -> None:
    dc = cfg.get("dflash_config") or {}
    taps = list(dc.get("target_layer_ids") or cfg.get("target_layer_ids") or [])
    if cfg.get("hidden_size") != plan.info.hidden_size or any(t > plan.info.num_layers - 2 for t in taps):
        raise TrainDraftError(f"the starting draft (hidden {cfg.get('hidden_size')}, taps {taps}) does not fit the "
                              f"target (hidden {plan.info.hidden_size}, {plan.info.num_layers} layers)")


def fresh_draft(variant: str, plan: Plan, tcfg: dict[str, Any], recipe: Recipe) -> tuple[Any, dict[str, Any]]:
    """A new draft of the plan's shape; fresh heads start as a zero bias so a warm backbone is unchanged."""
    import torch

    from engine.drafts.dflash2 import DFlash2Draft, random_dflash2_config
    from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config
    from engine.drafts.dspark import DSparkDraft, random_dspark_config

    s, d = plan.shape, recipe.draft
    torch.manual_seed(recipe.data.seed)
    if variant == VARIANT_DFLASH_V1:
        cfg = random_draft_config(tcfg, s.layers, s.block_size, s.taps, s.mask_id)
        return DFlashV1Draft(cfg), cfg
    if variant == VARIANT_DSPARK:
        rank = 0 if d.head == "none" else s.rank
        cfg = random_dspark_config(tcfg, s.layers, s.block_size, s.taps, s.mask_id, markov_rank=rank,
                                   markov_head_type=d.head if rank else "vanilla",
                                   enable_confidence_head=d.confidence != "none",
                                   confidence_head_with_markov=d.confidence == "markov",
                                   num_anchors=recipe.train.num_anchors)
        draft = DSparkDraft(cfg)
        if draft.markov_head is not None:
            with torch.no_grad():
                draft.markov_head.markov_w1.weight.normal_(0.0, rank ** -0.5)
                draft.markov_head.markov_w2.weight.zero_()
        return draft, cfg
    cfg = random_dflash2_config(tcfg, s.layers, s.block_size, s.taps, s.mask_id, conv_group_size=d.conv_group_size,
                                conv_kernel_size=d.conv_kernel_size, selector_rank=s.rank,
                                selector_top_k=d.selector_top_k)
    draft = DFlash2Draft(cfg)
    with torch.no_grad():
        draft.candidate_selector.predecessor_codebook.normal_(0.0, s.rank ** -0.5)
    return draft, cfg


# --------------------------------------------------------------------------------------------
# Output
# --------------------------------------------------------------------------------------------
def finish(opts: RunOptions, plan: Plan, last: Path | None, record: dict[str, Any], answers: dict[str, list[int]],
           info: TargetInfo, log: Log, t_run: float) -> Path | None:
    """OUT/checkpoint, OUT/training.json, the sub-vocabulary, then OUT/openvino (needs OpenVINO)."""
    if last is None:
        raise TrainDraftError("no stage was trained")
    ckpt = opts.out / "checkpoint"
    if ckpt.exists():
        shutil.rmtree(ckpt)
    shutil.copytree(last, ckpt)
    cfg = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    cfg.setdefault("num_assistant_tokens", min(3, plan.shape.block_size - 1))
    (ckpt / "config.json").write_text(json.dumps(cfg, indent=2) + "\n", encoding="utf-8")
    stages = record["stages"]
    record["loss"] = [l for s in stages for _, l in s["loss"]]
    record["loss_steps"] = [[s["name"], st] for s in stages for st, _ in s["loss"]]
    record["heldout_tau"] = stages[-1]["heldout_tau"] if stages else {}
    record["gpu_seconds"] = round(sum(s.get("gpu_seconds", 0) for s in stages), 1)
    record["train_seconds"] = round(sum(s["seconds"] for s in stages), 1)
    record["data"] = {s["name"]: s["data"] for s in stages}
    record["wall_seconds"] = round(time.time() - t_run, 1)
    (opts.out / "training.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    (ckpt / "training.json").write_text(json.dumps({k: record[k] for k in ("variant", "target", "heldout_tau",
                                                                            "gpu_seconds", "loss")}, indent=1) + "\n",
                                        encoding="utf-8")
    try:
        from engine.models.draft_vocab import count_answer_tokens, write_draft_vocabulary
    except ImportError:
        log(f"OpenVINO is not installed here: {ckpt} is the trained draft; run the same command with --resume on a "
            "machine with OpenVINO (it only exports), or `dflash-studio export --kind draft`")
        return None
    size = sub_vocab_size(info.vocab_size, opts.recipe.stage_settings(plan.stages[-1]).vocab_rows)
    if size:
        counts = count_answer_tokens(answers.values(), info.vocab_size)
        write_draft_vocabulary(ckpt, counts, size, source=f"answers of {opts.out / 'work' / 'answers.jsonl.gz'}")
    if not opts.export:
        return ckpt
    from engine.export.draft import export_draft
    from engine.prepare import DRAFT_WEIGHT_FORMAT

    out = export_draft(ckpt, opts.out / "openvino", weight_format=DRAFT_WEIGHT_FORMAT)  # as the app ships its drafts
    log(f"done in {time.time() - t_run:.0f}s: {out}")
    return out

