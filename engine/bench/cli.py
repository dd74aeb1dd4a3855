"""`dflash-studio bench`: its options, the BenchSpec they make, and the run that prints the report.

engine/cli.py adds --target, --draft DIR..., --device and --precision and calls `run_cli`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from engine.bench.reliability import check_reliability_path, write_reliability
from engine.bench.report import print_report, write_reports
from engine.bench.spec import SCHEDULER_FIELDS, BenchSpec, Decoding
from engine.catalog import resolve_models
from engine.console import progress_printer
from engine.draft_policy import DEFAULT_POLICY, POLICIES


def add_bench_args(p: argparse.ArgumentParser) -> None:
    """The bench's own options."""
    p.add_argument("--dataset", default="smoke",
                   help="humaneval | mt-bench | a set in resources/prompts (smoke, ...) | FILE.jsonl")
    p.add_argument("--prompts", type=int, default=4, help="number of prompts (0: the whole set)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--num-assistant-tokens", type=int, nargs="+", default=[None], metavar="N",
                   help="candidates the draft proposes per window, one row each (default: the draft's own count, "
                        "its config's num_assistant_tokens)")
    p.add_argument("--markov-head-top-k", type=int, nargs="+", default=[None], metavar="K",
                   help="drafts with a Markov head: K of the Top-K scorer, one row each (0 = dense walk, DSpark)")
    p.add_argument("--temperature", type=float, nargs="+", default=[], metavar="T",
                   help="add sampled rows at these temperatures (greedy rows stay unless --no-greedy)")
    p.add_argument("--no-greedy", action="store_true", help="only the sampled rows")
    p.add_argument("--top-k", type=int, default=0, help="sampled rows: top-k (0 = off)")
    p.add_argument("--top-p", type=float, default=1.0, help="sampled rows: top-p")
    p.add_argument("--min-p", type=float, default=0.0, help="sampled rows: min-p")
    p.add_argument("--repetition-penalty", type=float, default=1.0, help="every row (greedy and sampled)")
    p.add_argument("--seed", type=int, default=0, help="sampled rows: random seed (default 0)")
    p.add_argument("--no-genai", action="store_true", help="skip both openvino_genai peers")
    p.add_argument("--no-genai-target", action="store_true", help="skip the target alone in openvino_genai")
    p.add_argument("--no-genai-dflash", action="store_true", help="skip openvino_genai's DFlash")
    p.add_argument("--turns", type=int, default=1, choices=range(1, 9), metavar="N",
                   help="user turns per conversation, each answer the next turn's history; rows report the last "
                        "(2: MT-Bench's second turn; more: --dataset chat-turns)")
    p.add_argument("--prefix-caching", nargs="+", default=["on"], choices=["on", "off"],
                   help="this engine's prefix cache (cleared before every conversation); both: one row each "
                        "(one request at a time; the --concurrency rows run without it)")
    p.add_argument("--json", action="store_true", help="print the rows as a JSON list (machine on stderr)")
    p.add_argument("--out", help="folder to write results.md / results.csv / results.json")
    p.add_argument("--concurrency", type=int, nargs="+", default=None, metavar="N",
                   help="run the prompts with N requests in flight through one pipeline, one row per N "
                        "(aggregate tok/s, per-request TPOT/TTFT); the peer is openvino_genai's "
                        "ContinuousBatchingPipeline with the target alone")
    p.add_argument("--max-num-batched-tokens", type=int, default=None, metavar="T",
                   help="scheduler: target rows per step (prompt chunks + validation rows)")
    p.add_argument("--max-num-seqs", type=int, default=None, metavar="S", help="scheduler: requests per step")
    p.add_argument("--num-kv-blocks", type=int, default=None, metavar="B", help="scheduler: KV cache size in blocks")
    p.add_argument("--cache-size-mb", type=int, default=None, metavar="MB",
                   help="scheduler: KV cache size in MB (when --num-kv-blocks is not given)")
    p.add_argument("--window-models-mb", type=int, default=None, metavar="MB",
                   help="scheduler: memory the target's extra compiled copies for the adaptive cut's two window "
                        "sizes may take (default 512: a small target gets both; each costs about the weights file; "
                        "0: one compiled model)")
    p.add_argument("--draft-policy", nargs="+", default=[DEFAULT_POLICY], choices=list(POLICIES), metavar="P",
                   help="how much of each drafted window the target verifies: 'adaptive' (default) the candidates "
                        "that pay for their rows, from the draft's calibrated peak probabilities and the measured "
                        "cost of rows (engine/draft_policy.py); 'always' every one; several: each draft row under each")
    p.add_argument("--reliability", metavar="FILE.svg", default=None,
                   help="write the draft's confidence against observed acceptance (per position, and after the "
                        "adaptive policy's calibration) as an SVG plot (`python -m app.plots.svg_png FILE.svg` renders a PNG), and its data as FILE.json "
                        "beside it")


def scheduler_options(args: argparse.Namespace) -> dict[str, int | None]:
    return {k: getattr(args, k, None) for k in SCHEDULER_FIELDS}


def spec_from_args(args: argparse.Namespace) -> BenchSpec:
    # No --draft: a catalogue target's drafts, all of them, the best first.
    target, drafts = resolve_models(args.target, args.draft or None)
    decodings: list[Decoding] = []
    if not args.no_greedy:
        decodings.append(Decoding(repetition_penalty=args.repetition_penalty))
    for t in args.temperature:
        decodings.append(Decoding(True, t, args.top_k, args.top_p, args.min_p, args.repetition_penalty,
                                  rng_seed=args.seed))
    return BenchSpec(target, drafts, args.dataset, args.prompts or None, args.max_new_tokens, args.device,
                     args.precision, list(args.num_assistant_tokens), list(args.markov_head_top_k), decodings,
                     genai_target=not (args.no_genai or args.no_genai_target),
                     genai_dflash=not (args.no_genai or args.no_genai_dflash),
                     concurrency=list(args.concurrency) if getattr(args, "concurrency", None) else None,
                     scheduler=scheduler_options(args),
                     draft_policies=list(getattr(args, "draft_policy", None) or [DEFAULT_POLICY]),
                     turns=args.turns, prefix_caching=[x == "on" for x in dict.fromkeys(args.prefix_caching)])


def run_cli(args: argparse.Namespace) -> int:
    if getattr(args, "reliability", None):
        check_reliability_path(Path(args.reliability))
    from engine.bench.runner import run_bench  # the runtime (openvino_genai): not needed to build the parser

    res = run_bench(spec_from_args(args), progress=progress_printer())
    if args.out:
        write_reports(res, Path(args.out))
    if getattr(args, "reliability", None):
        write_reliability(res, Path(args.reliability))
    print_report(res, args.json)
    return 0
