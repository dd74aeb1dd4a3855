"""The embedded default target (SmolLM2-135M-Instruct, int8 IR) for the engine tests that need a real model.

Uses the user's prepared copy when it is complete; otherwise the one `prepare_default()` builds under
pytest's tmp path in this session (about 1.5 min, once), which is also what the end-to-end test of
`prepare` checks (tests/engine/test_prepare.py): one real build per test run, not two.
"""
from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pytest


@dataclass
class FreshBuild:
    """A `prepare_default()` run of this session: its data folder, target folder and progress fractions."""

    home: Path
    target: Path
    fractions: list[float]


@contextmanager
def data_folder(home: Path) -> Iterator[None]:
    """DFLASH_STUDIO_HOME set to `home` for the block, restored after."""
    old = os.environ.get("DFLASH_STUDIO_HOME")
    os.environ["DFLASH_STUDIO_HOME"] = str(home)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DFLASH_STUDIO_HOME")
        else:
            os.environ["DFLASH_STUDIO_HOME"] = old


@pytest.fixture(scope="session")
def smollm2_fresh_build(tmp_path_factory: pytest.TempPathFactory) -> FreshBuild:
    from engine.errors import ModelFolderError
    from engine.prepare import find_gguf, prepare_default

    try:
        find_gguf()
    except ModelFolderError as exc:
        pytest.skip(str(exc))
    home = tmp_path_factory.mktemp("dflash-home")
    fractions: list[float] = []
    with data_folder(home):
        target = prepare_default(progress=lambda message, fraction: fractions.append(fraction))
    return FreshBuild(home, target, fractions)


@pytest.fixture(scope="session")
def smollm2_target(request: pytest.FixtureRequest) -> Path:
    from engine.paths import default_target_dir
    from engine.prepare import is_prepared

    prepared = default_target_dir()
    if is_prepared(prepared):
        return prepared
    return request.getfixturevalue("smollm2_fresh_build").target


@pytest.fixture
def smollm2_home(smollm2_target: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """DFLASH_STUDIO_HOME set, for the test, to the data folder SmolLM2 was prepared in (its shipped drafts
    exported beside it), so that default_target_dir() and best_draft_dir() find that build."""
    home = smollm2_target.parents[1]
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(home))
    return home


@pytest.fixture(scope="session")
def smollm2_random_draft(tmp_path_factory: pytest.TempPathFactory, smollm2_target: Path) -> Path:
    """An untrained 1-layer DFlash draft of the target's dimensions (block 8): exercises shapes, not acceptance."""
    from fixtures.random_draft import export_random_draft

    return export_random_draft(smollm2_target, [1, 14, 27], 0, tmp_path_factory.mktemp("smollm2-random-draft"))
