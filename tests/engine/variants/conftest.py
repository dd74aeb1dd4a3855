"""Session fixtures for DSpark / DFlash v2 drafts (builders in tests/fixtures/tiny_variant_drafts.py)."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_variant_drafts(tiny_qwen3_hf: Path) -> dict[str, Path]:
    """name -> exported draft folder for the tiny Qwen3 target (tiny_qwen3_target is its IR).

    dspark_vanilla, dspark_gated, dspark_nohead, dflash2: random weights (heads that matter);
    dspark_trained, dflash2_trained: self-distilled on tests/fixtures/tiny_drafts.TRAIN_PROMPTS.
    Each folder's checkpoint sits beside it at <folder>-ckpt (load the torch module with
    fixtures.tiny_variant_drafts.load_torch_draft for the reference walks).
    """
    from fixtures.tiny_variant_drafts import build_variant_drafts

    return build_variant_drafts(tiny_qwen3_hf, tiny_qwen3_hf.parent / "variant-drafts")
