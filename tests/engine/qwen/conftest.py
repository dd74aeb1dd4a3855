"""Qwen2.5-Coder-0.5B-Instruct (the catalogue's second target) for the tests that need the real model.

Uses the user's prepared copy (`dflash-studio prepare --model qwen2.5-coder-0.5b`, several minutes
and a 478 MB download); the tests are skipped when it is not prepared, so CI's time stays as it is.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def qwen_target() -> Path:
    from engine.catalog import QWEN_CODER

    if not QWEN_CODER.is_prepared(verify_checksums=True):
        pytest.skip(f"{QWEN_CODER.title} is not prepared: run `dflash-studio prepare --model {QWEN_CODER.name}`")
    return QWEN_CODER.target_dir()


@pytest.fixture(scope="session")
def qwen_random_draft(tmp_path_factory: pytest.TempPathFactory, qwen_target: Path) -> Path:
    """An untrained 1-layer DFlash draft of Qwen2.5-Coder-0.5B's dimensions (block 8): shapes, not acceptance."""
    import torch

    from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config, save_checkpoint
    from engine.export.draft import export_draft

    cfg = json.loads((qwen_target / "config.json").read_text())
    dcfg = random_draft_config(cfg, 1, 8, [1, 12, 22], 151643)
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("qwen-random-draft")
    ckpt = save_checkpoint(DFlashV1Draft(dcfg), dcfg, root / "hf")
    return export_draft(ckpt, root / "ov")
