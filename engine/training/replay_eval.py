"""Replay τ of the shipped drafts on a benchmark's prompts, in torch on CPU (evaluation only).

The held-out τ of the training jobs is measured on answers to the corpus's own prompts. This asks
the same question on the bench's prompts (HumanEval / MT-Bench first turns, the first N as the bench
takes them): the float32 target answers them greedily (HF generate, <= --new-tokens), its tapped
features are recorded, and the jobs' replay gives τ per number of candidates. Comparing it with the
bench's tokens per step separates "the draft does not know this kind of text" (low here too) from
"the engine/IR loses acceptance" (high here, low in the bench). Nothing here is ever trained on.

    python -m engine.training.replay_eval --dataset mt-bench --prompts 20 --new-tokens 128
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Sequence

import torch

from engine.training import gpu_job_dspark  # noqa: F401  (stubs openvino where it is missing)
from engine.export.dflash_v1 import load_checkpoint
from engine.export.dspark import load_dspark_checkpoint
from engine.training.corpus import chat_ids, load_tokenizer
from engine.training.dflash_train import target_weights
from engine.training.gpu_job import build_flat_data, generate_answers, heldout_acceptance
from engine.training.gpu_job_dspark import heldout_acceptance_dspark
from engine.training.target_loader import load_target

DRAFTS = Path(__file__).resolve().parents[2] / "resources" / "drafts"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dataset", default="mt-bench")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--cands", default="3,5,7")
    ap.add_argument("--v1", default=str(DRAFTS / "smollm2-dflash-b8"), help="a DFlash v1 draft folder, or 'none'")
    ap.add_argument("--dspark", default=str(DRAFTS / "smollm2-dspark-b8"))
    args = ap.parse_args(argv)
    from engine.bench.datasets import load_prompts

    t0 = time.time()
    tok = load_tokenizer("smollm2")
    prompts = load_prompts(args.dataset, args.prompts)
    ids = [chat_ids(tok, p.text) for p in prompts]
    target, info = load_target("smollm2", torch.float32, torch.device("cpu"))
    answers = generate_answers(target, ids, args.new_tokens, len(ids), info.eos_id, info.pad_id, log=lambda s: None)
    v1, v1cfg = load_checkpoint(Path(args.v1)) if args.v1 != "none" else (None, None)
    ds, dscfg = load_dspark_checkpoint(Path(args.dspark))
    tcfg = v1cfg if v1cfg is not None else dscfg
    taps = list(tcfg["dflash_config"]["target_layer_ids"]) if "dflash_config" in tcfg else tcfg["target_layer_ids"]
    data, stats = build_flat_data(target, ids, answers, [args.dataset] * len(ids), taps, 8192, torch.float32,
                                  log=lambda s: None)
    embed, lm_head = target_weights(target)
    rows = list(range(len(ids)))
    cands = [int(x) for x in args.cands.split(",")]
    out = {"dataset": args.dataset, "prompts": len(ids), "answer_tokens_mean": float(data.gen_lens.float().mean()),
           "v1": {n: r["tokens_per_step"]["all"] for n, r in heldout_acceptance(v1, data, rows, embed, lm_head, cands,
                                                                                  bf16=False).items()} if v1 else None,
           "dspark_topk8": {n: per["topk"]["tokens_per_step"]["all"] for n, per in heldout_acceptance_dspark(
               ds, data, rows, embed, lm_head, cands, ("topk",), 8, False, 4).items()},
           "seconds": round(time.time() - t0, 1)}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
