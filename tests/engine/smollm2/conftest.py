"""The embedded default target (SmolLM2-135M-Instruct, int8 IR) for the tests that need a real model.

Uses the user's prepared copy when it is complete; otherwise prepares one under pytest's tmp path
(a few minutes, once per session).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def smollm2_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.paths import default_target_dir
    from engine.prepare import is_prepared, prepare_default

    prepared = default_target_dir()
    if is_prepared(prepared):
        return prepared
    home = tmp_path_factory.mktemp("dflash-home")
    old = os.environ.get("DFLASH_STUDIO_HOME")
    os.environ["DFLASH_STUDIO_HOME"] = str(home)
    try:
        return prepare_default()
    finally:
        if old is None:
            os.environ.pop("DFLASH_STUDIO_HOME")
        else:
            os.environ["DFLASH_STUDIO_HOME"] = old


@pytest.fixture(scope="session")
def smollm2_random_draft(tmp_path_factory: pytest.TempPathFactory, smollm2_target: Path) -> Path:
    """An untrained 1-layer DFlash draft of SmolLM2's dimensions (block 8): exercises shapes, not acceptance."""
    import torch

    from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config, save_checkpoint
    from engine.export.draft import export_draft

    cfg = json.loads((smollm2_target / "config.json").read_text())
    dcfg = random_draft_config(cfg, 1, 8, [1, 14, 27], 0)
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("smollm2-random-draft")
    ckpt = save_checkpoint(DFlashV1Draft(dcfg), dcfg, root / "hf")
    return export_draft(ckpt, root / "ov")
