"""engine/checksums.py: the one sha256 / GGUF helper (prepare, the catalogue, inspect, training)."""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from engine.checksums import find_gguf, gguf_files, installed_package_file, sha256_file, verify_file
from engine.errors import ModelFolderError


def test_sha256_of_a_file_larger_than_one_block(tmp_path: Path) -> None:
    data = bytes(range(256)) * 9000  # > 1 MiB: read in several blocks
    f = tmp_path / "x.bin"
    f.write_bytes(data)
    assert sha256_file(f) == hashlib.sha256(data).hexdigest()


def test_verify_file_names_the_wrong_size_or_digest_and_the_fix(tmp_path: Path) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 60)
    good = hashlib.sha256(f.read_bytes()).hexdigest()
    verify_file(f, 64, good)  # the right file passes
    with pytest.raises(ModelFolderError, match=r"has 64 bytes, expected 65.*damaged\. Reinstall it"):
        verify_file(f, 65, good, fix="Reinstall it.")
    with pytest.raises(ModelFolderError, match=f"the model has sha256 {good}, expected 0+: the file is damaged"):
        verify_file(f, 64, "0" * 64, what="the model")


def test_gguf_lookup_in_a_folder(tmp_path: Path) -> None:
    assert find_gguf(tmp_path) is None and gguf_files(tmp_path) == []
    a = tmp_path / "a.gguf"
    a.write_bytes(b"GGUF")
    (tmp_path / "notes.txt").write_text("x")
    assert find_gguf(tmp_path) == a and find_gguf(a) == a and find_gguf(tmp_path / "notes.txt") is None
    (tmp_path / "b.gguf").write_bytes(b"GGUF")
    assert [p.name for p in gguf_files(tmp_path)] == ["a.gguf", "b.gguf"]
    with pytest.raises(ValueError, match="several GGUF files.*a.gguf, b.gguf"):
        find_gguf(tmp_path)


def test_installed_package_file_finds_data_without_importing(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "house_fake_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("raise ImportError('importing me is not allowed')\n")
    (pkg / "weights.gguf").write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert installed_package_file("house_fake_pkg", "weights.gguf") == pkg / "weights.gguf"
    assert installed_package_file("house_fake_pkg", "other.gguf") is None
    assert installed_package_file("no_such_package_here", "weights.gguf") is None
