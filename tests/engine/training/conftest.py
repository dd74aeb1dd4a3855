"""Fixtures of the training tests: a tiny Qwen2 target beside the shared tiny Qwen3 / Llama ones."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_qwen2_hf(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    from transformers import AutoTokenizer

    from fixtures.tiny_qwen2 import build_tiny_qwen2

    root = tmp_path_factory.mktemp("tiny-qwen2")
    return build_tiny_qwen2(root / "hf", AutoTokenizer.from_pretrained(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_qwen2_target(tiny_qwen2_hf: Path) -> Path:
    from engine.export.target import export_target

    return export_target(tiny_qwen2_hf, tiny_qwen2_hf.parent / "ov", weight_format="fp32")
