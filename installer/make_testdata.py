"""Build the self-test's tiny models with the dev venv (torch/transformers/optimum), at build time.

Output (a few hundred KB, no torch needed to use it):
    <out>/tiny-qwen3-ov/     fp32 target IR + tokenizer/detokenizer IRs + config (engine contract)
    <out>/tiny-draft/        a DFlash v1 draft IR for it: tiny_drafts' "b8_trained" (block 8,
                             self-distilled on the target's continuations of TRAIN_PROMPTS, ~12 s)
    <out>/testdata.json      what was built, with which versions

The models come from the test fixtures (tests/fixtures/tiny_models.py, tests/fixtures/tiny_drafts.py),
so the bundle's self-test runs the same kind of folders the engine's tests run. The trained draft is
accepted often on the fixture's training prompts, which the self-test uses: accepted draft tokens
prove the draft IR really computes inside the bundle, not only that it loads. Without
tests/fixtures/tiny_drafts.py (older checkouts) a random block-4 draft is built by hand instead and
testdata.json says so (the self-test then does not expect acceptance).

    .venv/bin/python installer/make_testdata.py OUT_DIR
"""
from __future__ import annotations

import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

DRAFT_NAME = "tiny-draft"
TARGET_NAME = "tiny-qwen3-ov"
TRAINED_SPEC = "b8_trained"
BLOCK_SIZE, TAPS, DRAFT_LAYERS, DRAFT_SEED = 4, (1, 2), 1, 1  # the fallback = tiny_drafts' "b4_random"


def _build_draft(hf_dir: Path, work: Path, out: Path) -> dict:
    """The trained tiny draft from tests/fixtures/tiny_drafts.py; a random one by hand without it."""
    try:
        from fixtures.tiny_drafts import DRAFT_SPECS, build_drafts
    except ImportError:
        DRAFT_SPECS = None
    if DRAFT_SPECS is not None:
        spec = next(s for s in DRAFT_SPECS if s.name == TRAINED_SPEC)
        built = build_drafts(hf_dir, work / "drafts", specs=(spec,))[spec.name]
        info = {"draft_spec": spec.name, "draft_trained": True, "draft_block_size": spec.block_size}
    else:
        import torch
        from transformers import AutoConfig, AutoTokenizer

        from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config, save_checkpoint
        from engine.export.draft import export_draft

        cfg_t = AutoConfig.from_pretrained(hf_dir)
        tok = AutoTokenizer.from_pretrained(hf_dir)
        mask_id = int(tok.convert_tokens_to_ids("<|mask|>"))
        cfg = random_draft_config(cfg_t, DRAFT_LAYERS, BLOCK_SIZE, list(TAPS), mask_id)
        torch.manual_seed(DRAFT_SEED)
        ckpt = save_checkpoint(DFlashV1Draft(cfg), cfg, work / "drafts" / "b4_random-ckpt")
        built = export_draft(ckpt, work / "drafts" / "b4_random", weight_format="fp32")
        info = {"draft_spec": "b4_random", "draft_trained": False, "draft_block_size": BLOCK_SIZE}
    shutil.copytree(built, out / DRAFT_NAME)
    return info


def build(out: Path) -> dict:
    from fixtures import tiny_models

    from engine.export.target import export_target, package_versions

    t0 = time.perf_counter()
    out.mkdir(parents=True, exist_ok=True)
    work = out / ".work"
    shutil.rmtree(work, ignore_errors=True)
    for name in (TARGET_NAME, DRAFT_NAME, "tiny-draft-b4"):
        shutil.rmtree(out / name, ignore_errors=True)
    hf_dir = tiny_models.build_tiny_hf("qwen3", work / "tiny-qwen3-hf")
    export_target(hf_dir, out / TARGET_NAME, weight_format="fp32")
    draft_info = _build_draft(hf_dir, work, out)
    shutil.rmtree(work, ignore_errors=True)
    info = {
        "target": TARGET_NAME,
        "draft": DRAFT_NAME,
        **draft_info,
        "built_s": round(time.perf_counter() - t0, 1),
        "versions": package_versions(("openvino", "openvino-tokenizers", "optimum-intel", "transformers", "torch")),
    }
    (out / "testdata.json").write_text(json.dumps(info, indent=2) + "\n", encoding="utf-8")
    return info


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print(json.dumps(build(Path(sys.argv[1]).resolve())))
