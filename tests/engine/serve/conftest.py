"""A real server on a free loopback port over the tiny Qwen3 target and its trained draft."""
from __future__ import annotations

from pathlib import Path

import pytest

from serve_helpers import Served, start_server


@pytest.fixture(scope="module")
def tiny_draft(tiny_qwen3_drafts: dict[str, Path]) -> Path:
    return tiny_qwen3_drafts["b8_trained"]


@pytest.fixture(scope="module")
def served(tiny_qwen3_target: Path, tiny_draft: Path):
    s = start_server(tiny_qwen3_target, tiny_draft)
    yield s
    s.stop()


@pytest.fixture(scope="module")
def reference(tiny_qwen3_target: Path):
    """The target alone, in this thread: every greedy answer must equal its output token for token."""
    from engine.pipeline import SpeculativePipeline

    return SpeculativePipeline.load(tiny_qwen3_target, None, precision="f32")


__all__ = ["Served"]
