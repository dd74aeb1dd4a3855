"""The installed app's bundled default model (engine/bundled.py): `generate` on a fresh data folder
copies it the way the app's first start does, instead of stopping with "not prepared yet"; the
bundle's `prepare` prints only the path. A stand-in bundle is made from the tiny target with a real
completion marker (the real bundle is built by tests/installer/test_installer.py)."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from engine.cli import main
from engine.markers import is_prepared, write_marker


@pytest.fixture
def bundle(tiny_qwen3_target: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from engine.paths import default_target_dir

    src = tmp_path / "bundle-models"
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path / "home"))
    folder = shutil.copytree(tiny_qwen3_target, src / default_target_dir().name)
    write_marker(folder, extra={"weight_format": "int8"})
    monkeypatch.setenv("DFLASH_BUNDLED_MODELS", str(src))
    return folder


def test_generate_installs_the_bundled_default_on_first_use(bundle: Path, tmp_path: Path, capfd) -> None:
    argv = ["generate", "--prompt", "hi", "--draft", "none", "--max-new-tokens", "3", "--json"]
    assert main(argv) == 0
    out, err = capfd.readouterr()
    target = tmp_path / "home" / "models" / bundle.name
    assert json.loads(out)["target"] == str(target) and is_prepared(target)
    assert "installing the bundled default model" in err and "not prepared" not in err
    assert main(argv) == 0  # the second run uses it as it is
    assert "installing" not in capfd.readouterr().err


def test_without_a_bundle_generate_says_how_to_prepare(tmp_path, monkeypatch, capfd) -> None:
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DFLASH_BUNDLED_MODELS", str(tmp_path / "nothing"))
    assert main(["generate", "--prompt", "hi", "--draft", "none"]) == 2
    err = capfd.readouterr().err
    assert "not prepared yet" in err and "`dflash-studio prepare`" in err and "Traceback" not in err


def test_bundle_prepare_prints_only_the_path(bundle: Path, tmp_path: Path, capfd, monkeypatch) -> None:
    monkeypatch.setattr(sys, "frozen", True, raising=False)  # the installed app: no torch to build with
    assert main(["prepare"]) == 0
    out, err = capfd.readouterr()
    assert out == f"{tmp_path / 'home' / 'models' / bundle.name}\n"
    assert "Prepared" in err
    assert main(["prepare", "--weight-format", "fp16"]) == 2
    assert "carries the default model as int8 only" in capfd.readouterr().err
