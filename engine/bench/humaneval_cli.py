"""`dflash-studio humaneval`: its options, the HumanEvalSpec they make, and the run that prints the table.

engine/cli.py adds --target, --draft DIR..., --device and --precision and calls `run_cli`.
"""
from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import TYPE_CHECKING

from engine.bench.humaneval_report import as_json, markdown, write_results
from engine.bench.humaneval_tasks import MODES
from engine.catalog import resolve_models
from engine.console import progress_printer

if TYPE_CHECKING:  # the run imports the engine (OpenVINO) when it runs: train-draft's parser builds without it
    from engine.bench.pass_at_1 import HumanEvalSpec


def add_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mode", nargs="+", default=list(MODES), choices=list(MODES),
                   help="completion: the prompt as plain text, stopped at the next top-level line; chat: "
                        "EvalPlus's instruct prompt through the chat template (default: both)")
    p.add_argument("--problems", type=int, default=0, help="the first N problems (0: all 164)")
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--timeout", type=float, default=3.0, help="the checker's time limit per problem, seconds")
    p.add_argument("--out", help="folder for samples.jsonl (appended as they are scored; started over unless --resume), "
                        "results.md, results.json")
    p.add_argument("--resume", action="store_true", help="keep the samples already in --out and run the rest")
    p.add_argument("--json", action="store_true", help="print the rows as JSON (progress on stderr)")


def spec_from_args(args: argparse.Namespace) -> "HumanEvalSpec":
    """No --draft: the target alone and its best shipped draft (a catalogue model); 'none' is the target alone."""
    target, drafts = resolve_models(args.target, args.draft or None)
    chosen: list[Path | None]
    if args.draft:
        chosen = [None if d.lower() == "none" else Path(d) for d in args.draft]
    else:
        chosen = [None] + drafts[:1]
    from engine.bench.pass_at_1 import HumanEvalSpec

    return HumanEvalSpec(target, chosen, list(dict.fromkeys(args.mode)), args.problems or None, args.max_new_tokens,
                         args.device, args.precision, args.timeout, Path(args.out) if args.out else None, args.resume)


def command_line(args: argparse.Namespace) -> str:
    parts = ["dflash-studio", "humaneval"]
    if args.target:
        parts += ["--target", args.target]
    if args.draft:
        parts += ["--draft", *args.draft]
    parts += ["--mode", *args.mode]
    if args.problems:
        parts += ["--problems", str(args.problems)]
    parts += ["--max-new-tokens", str(args.max_new_tokens)]
    if args.timeout != 3.0:
        parts += ["--timeout", f"{args.timeout:g}"]
    if args.precision != "default":
        parts += ["--precision", args.precision]
    if args.device != "CPU":
        parts += ["--device", args.device]
    return shlex.join(parts)


def run_cli(args: argparse.Namespace) -> int:
    spec = spec_from_args(args)
    from engine.bench.pass_at_1 import run_pass_at_1

    result = run_pass_at_1(spec, progress=progress_printer())
    command = command_line(args)
    if spec.out is not None:
        write_results(result, spec.out, command)
    print(as_json(result) if args.json else markdown(result, command), end="" if not args.json else "\n")
    return 0
