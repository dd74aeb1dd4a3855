"""Qwen2.5-Coder-0.5B-Instruct (the catalogue's second target) for the tests that need the real model.

Uses the user's prepared copy (`dflash-studio prepare --model qwen2.5-coder-0.5b`, several minutes
and a 478 MB download); the tests are skipped when it is not prepared, so CI's time stays as it is.
"""
from __future__ import annotations

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
    """An untrained 1-layer DFlash draft of the target's dimensions (block 8): exercises shapes, not acceptance."""
    from fixtures.random_draft import export_random_draft

    return export_random_draft(qwen_target, [1, 12, 22], 151643, tmp_path_factory.mktemp("qwen-random-draft"))
