"""engine.prepare: completion markers, partial-folder detection, and (slow) the real build."""
from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from engine import prepare
from engine.errors import ModelFolderError
from engine import markers
from engine.markers import MARKER, is_prepared, write_marker


def _fake_folder(root: Path) -> Path:
    folder = root / "model"
    (folder / "sub").mkdir(parents=True)
    (folder / "openvino_model.xml").write_text("<net/>")
    (folder / "openvino_model.bin").write_bytes(b"\x01" * 64)
    (folder / "sub" / "extra.json").write_text("{}")
    return folder


def test_marker_round_trip(tmp_path: Path) -> None:
    folder = _fake_folder(tmp_path)
    assert not is_prepared(folder), "no marker yet: partial"
    write_marker(folder, extra={"weight_format": "int8"})
    assert is_prepared(folder)
    data = json.loads((folder / MARKER).read_text())
    assert set(data["files"]) == {"openvino_model.xml", "openvino_model.bin", "sub/extra.json"}
    assert data["weight_format"] == "int8" and data["builder_version"] == markers.BUILDER_VERSION
    assert not list(folder.glob(f"{MARKER}.tmp-*"))


def test_changed_file_same_size_is_detected(tmp_path: Path) -> None:
    folder = _fake_folder(tmp_path)
    write_marker(folder)
    (folder / "openvino_model.bin").write_bytes(b"\x02" * 64)
    assert not is_prepared(folder)
    assert is_prepared(folder, verify_checksums=False), "sizes alone cannot see it"


@pytest.mark.parametrize(
    "damage",
    ["delete_file", "truncate_file", "delete_marker", "garbage_marker", "old_builder", "empty_file_list"],
)
def test_partial_or_corrupt_folders_are_not_prepared(tmp_path: Path, damage: str) -> None:
    folder = _fake_folder(tmp_path)
    write_marker(folder)
    marker = folder / MARKER
    if damage == "delete_file":
        (folder / "sub" / "extra.json").unlink()
    elif damage == "truncate_file":
        (folder / "openvino_model.bin").write_bytes(b"\x01" * 10)
    elif damage == "delete_marker":
        marker.unlink()
    elif damage == "garbage_marker":
        marker.write_text("{not json")
    elif damage == "old_builder":
        data = json.loads(marker.read_text())
        data["builder_version"] = markers.BUILDER_VERSION - 1
        marker.write_text(json.dumps(data))
    elif damage == "empty_file_list":
        data = json.loads(marker.read_text())
        data["files"] = {}
        marker.write_text(json.dumps(data))
    assert not is_prepared(folder)


def test_missing_folder_is_not_prepared(tmp_path: Path) -> None:
    assert not is_prepared(tmp_path / "nothing")


def test_prepared_target_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path))
    from engine.paths import default_target_dir

    target = default_target_dir()
    target.mkdir(parents=True)
    (target / "openvino_model.xml").write_text("<net/>")
    write_marker(target, extra={"weight_format": "int8"})

    def no_build() -> Path:
        raise AssertionError("a prepared folder must not be rebuilt")

    monkeypatch.setattr(prepare, "find_gguf", no_build)
    drafts_for: list[Path] = []
    monkeypatch.setattr(prepare, "prepare_drafts", lambda t, force, progress, notice: drafts_for.append(t))
    messages: list[tuple[str, float]] = []
    assert prepare.prepare_default(progress=lambda m, f: messages.append((m, f))) == target
    assert messages and messages[-1][1] == 1.0
    assert drafts_for == [target]  # shipped drafts are still brought up to date


@pytest.mark.parametrize("case", ["other_format", "force", "partial"])
def test_rebuild_when_needed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path))
    from engine.paths import default_target_dir

    target = default_target_dir()
    target.mkdir(parents=True)
    (target / "openvino_model.xml").write_text("<net/>")
    if case != "partial":
        write_marker(target, extra={"weight_format": "int8"})

    class Rebuilding(Exception):
        pass

    def start_build() -> Path:
        raise Rebuilding

    monkeypatch.setattr(prepare, "find_gguf", start_build)
    with pytest.raises(Rebuilding):
        prepare.prepare_default(force=case == "force", weight_format="fp16" if case == "other_format" else "int8")


def test_bad_weight_format() -> None:
    with pytest.raises(ValueError, match="weight_format"):
        prepare.prepare_default(weight_format="int3")


def test_verify_gguf_rejects_wrong_file(tmp_path: Path) -> None:
    fake = tmp_path / prepare.GGUF_NAME
    fake.write_bytes(b"GGUF" + b"\0" * 100)
    with pytest.raises(ModelFolderError, match="--force-reinstall"):
        prepare.verify_gguf(fake)


def test_byte_map_is_gpt2_style() -> None:
    m = prepare._byte_to_char()
    assert len(set(m.values())) == 256
    assert m[ord("A")] == "A" and m[ord(" ")] == "\u0120" and m[ord("\n")] == "\u010a"


def test_stale_staging_is_cleaned(tmp_path: Path) -> None:
    old = tmp_path / ".SmolLM2-135M-Instruct-ov.partial-deadbeef"
    fresh = tmp_path / ".SmolLM2-135M-Instruct-ov.partial-cafecafe"
    keep = tmp_path / "SmolLM2-135M-Instruct-ov"
    for d in (old, fresh, keep):
        d.mkdir()
    past = time.time() - 7 * 3600
    import os

    os.utime(old, (past, past))
    prepare._clean_stale_staging(tmp_path)
    assert not old.exists() and fresh.exists() and keep.exists()


def _gguf_or_skip() -> Path:
    try:
        return prepare.find_gguf()
    except ModelFolderError as exc:
        pytest.skip(str(exc))


def test_tokenizer_from_gguf_matches_independent_bpe() -> None:
    """Rebuilt tokenizer == a separate BPE pass over the GGUF merges; no BOS; ChatML template."""
    gguf = _gguf_or_skip()
    tok = prepare.build_tokenizer_from_gguf(gguf)
    prepare.check_tokenizer_against_gguf(tok, gguf)
    assert tok("The capital of France is Paris.")["input_ids"] == [504, 3575, 282, 4649, 314, 7042, 30]
    assert tok.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [1, 2]
    assert tok.eos_token == "<|im_end|>" and len(tok) == 49152


@pytest.mark.slow
def test_prepare_default_end_to_end(smollm2_fresh_build, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real build (about 1.5 min on 2 cores, the session's one: tests/engine/conftest.py): GGUF -> HF ->
    int8 IR, sanity answer, skip, damage (on a copy: other tests load the build)."""
    import shutil

    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(smollm2_fresh_build.home))
    from engine.export.target import check_target_folder
    from engine.models.hidden_taps import read_annotation

    target, fractions = smollm2_fresh_build.target, smollm2_fresh_build.fractions
    check_target_folder(target)
    assert is_prepared(target) and is_prepared(prepare.default_hf_dir())
    assert fractions == sorted(fractions) and fractions[-1] == 1.0
    marker = json.loads((target / MARKER).read_text())
    assert marker["weight_format"] == "int8" and "Paris" in marker["sanity_answer"]

    import openvino as ov

    model = ov.Core().read_model(target / "openvino_model.xml")
    assert len(read_annotation(model)["layers"]) == 30

    started = time.perf_counter()
    assert prepare.prepare_default() == target
    assert time.perf_counter() - started < 10, "a prepared target must be reused"

    copy = Path(shutil.copytree(target, tmp_path / target.name))
    assert is_prepared(copy)
    with open(copy / "openvino_model.bin", "r+b") as fh:
        fh.seek(1000)
        byte = fh.read(1)
        fh.seek(1000)
        fh.write(bytes([byte[0] ^ 0xFF]))
    assert not is_prepared(copy)
