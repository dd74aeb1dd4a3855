"""The `dflash-studio train-draft` subcommand: its options and handler (engine/training/pipeline.py runs it).

Runs the same under `torchrun --nproc_per_node=N -m engine.cli train-draft ...` on N GPUs. The last
line on stdout is the OpenVINO draft folder; progress goes to stderr.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from engine.drafts import VARIANTS


def add_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    t = sub.add_parser("train-draft", help="train a DFlash v1 / DSpark / DFlash v2 draft for a target (needs torch)",
                       description="Train a draft for a target from its own answers (docs/training.md). "
                                   "The last line printed is the OpenVINO draft folder.")
    t.add_argument("--target", required=True, help="Hugging Face folder or GGUF (Llama, Qwen2, Qwen3), or 'smollm2'")
    t.add_argument("--variant", required=True, choices=VARIANTS)
    t.add_argument("--out", required=True, help="run folder: checkpoint/, openvino/, training.json, work/")
    t.add_argument("--recipe", help="recipe TOML (default: resources/recipes/default-<variant>.toml)")
    t.add_argument("--prompts-file", help="JSONL of your own prompts ({\"prompt\"}) or chat logs ({\"messages\"}), "
                   "mixed with the recipe's sources")
    t.add_argument("--only-prompts-file", action="store_true", help="train on --prompts-file alone")
    t.add_argument("--prompts", type=int, default=0, help="at most this many prompts per stage (a quick try)")
    t.add_argument("--steps", type=int, default=0, help="at most this many training steps per stage")
    t.add_argument("--time-budget", type=float, default=0, help="seconds of training per stage (cosine over it)")
    t.add_argument("--device", default="auto", choices=("auto", "cuda", "xpu", "cpu"))
    t.add_argument("--max-feature-gib", type=float, default=0,
                   help="GiB of target features a stage keeps per GPU, over the recipe's (a GPU with less memory)")
    t.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    t.add_argument("--stage", default="", help="run only this recipe stage")
    t.add_argument("--init", help="starting weights of the (first) stage: a draft checkpoint folder")
    t.add_argument("--stop-after", default="", choices=("", "prompts", "answers"),
                   help="'prompts': build the offline prompts and stop (finish with --resume, e.g. on a GPU machine); "
                        "'answers': also sample and answer the next stage's rows, and stop before its features")
    t.add_argument("--no-export", action="store_true", help="write the checkpoint folder but no OpenVINO folder")
    t.set_defaults(func=cmd_train_draft)
    return t


def cmd_train_draft(args: argparse.Namespace) -> int:
    try:
        import torch  # noqa: F401
    except ImportError:
        print("dflash-studio train-draft needs torch: pip install torch (a CUDA build for a GPU: docs/training.md)",
              file=sys.stderr)
        return 2
    from engine.training.pipeline import RunOptions, run
    from engine.training.recipe import default_recipe, load_recipe, with_feature_cap

    recipe = load_recipe(Path(args.recipe) if args.recipe else default_recipe(args.variant))
    if args.max_feature_gib:
        recipe = with_feature_cap(recipe, args.max_feature_gib)
    if args.only_prompts_file and not args.prompts_file:
        raise ValueError("--only-prompts-file needs --prompts-file")
    opts = RunOptions(target=args.target, variant=args.variant, out=Path(args.out), recipe=recipe,
                      prompts_file=Path(args.prompts_file) if args.prompts_file else None,
                      only_prompts_file=args.only_prompts_file, prompts=args.prompts, steps=args.steps,
                      device=args.device, resume=args.resume, stage=args.stage,
                      init=Path(args.init) if args.init else None, stop_after=args.stop_after,
                      export=not args.no_export, time_budget_s=args.time_budget)
    out = run(opts)
    if out is not None:
        print(out, flush=True)
    return 0
