"""Shared pytest fixtures. The model builders live in tests/fixtures/ (keep this file small)."""
from __future__ import annotations

from pathlib import Path

import pytest

from fixtures import tiny_models


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny byte-level BPE + ChatML tokenizer shared by all tiny models (HF folder)."""
    out = tmp_path_factory.mktemp("tiny-tokenizer")
    tiny_models.build_tokenizer(out)
    return out


def _tokenizer(tokenizer_dir: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tokenizer_dir)


@pytest.fixture(scope="session")
def tiny_qwen3_hf(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("tiny-qwen3")
    return tiny_models.build_tiny_hf("qwen3", root / "hf", _tokenizer(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_llama_hf(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("tiny-llama")
    return tiny_models.build_tiny_hf("llama", root / "hf", _tokenizer(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_qwen2_hf(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_dir: Path) -> Path:
    root = tmp_path_factory.mktemp("tiny-qwen2")
    return tiny_models.build_tiny_hf("qwen2", root / "hf", _tokenizer(tiny_tokenizer_dir))


@pytest.fixture(scope="session")
def tiny_qwen2_target(tiny_qwen2_hf: Path) -> Path:
    """fp32 OpenVINO IR folder of the tiny Qwen2 target (optimum does not annotate Qwen2: our search does)."""
    from engine.export.target import export_target

    return export_target(tiny_qwen2_hf, tiny_qwen2_hf.parent / "ov", weight_format="fp32")


@pytest.fixture(scope="session")
def tiny_qwen3_target(tiny_qwen3_hf: Path) -> Path:
    """fp32 OpenVINO IR folder of the tiny Qwen3 target (annotated by optimum itself)."""
    from engine.export.target import export_target

    return export_target(tiny_qwen3_hf, tiny_qwen3_hf.parent / "ov", weight_format="fp32")


@pytest.fixture(scope="session")
def tiny_llama_target(tiny_llama_hf: Path) -> Path:
    """fp32 OpenVINO IR folder of the tiny Llama target (annotated by our graph search)."""
    from engine.export.target import export_target

    return export_target(tiny_llama_hf, tiny_llama_hf.parent / "ov", weight_format="fp32")


# ---- DFlash v1 drafts for the tiny targets (tests/fixtures/tiny_drafts.py) -------------------
# name -> IR folder: "b4_random", "b8_random", "b16_random" (taps [1,2] / [0,1,2] / [1,2]) and
# "b8_trained" (self-distilled on the target's greedy text of tiny_drafts.TRAIN_PROMPTS: accepted
# often on those prompts, like a random draft elsewhere). Checkpoints sit next to each IR as
# "<name>-ckpt".


@pytest.fixture(scope="session")
def tiny_qwen3_drafts(tiny_qwen3_hf: Path) -> dict[str, Path]:
    from fixtures import tiny_drafts

    return tiny_drafts.build_drafts(tiny_qwen3_hf, tiny_qwen3_hf.parent / "drafts")


@pytest.fixture(scope="session")
def tiny_llama_drafts(tiny_llama_hf: Path) -> dict[str, Path]:
    from fixtures import tiny_drafts

    return tiny_drafts.build_drafts(tiny_llama_hf, tiny_llama_hf.parent / "drafts")
