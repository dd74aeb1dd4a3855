"""The CLI's error boundary over the catalogue of bad input a new user's first hour finds (issue 20).

Each case builds its bad input under tmp_path, runs `dflash-studio` in this process (engine.cli.main:
an uncaught exception fails the test, so "a traceback" cannot pass) and asserts exit code 2 and the
message: what is wrong, naming the file, and what to do.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Callable

import pytest

from engine.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_draft(tiny_qwen3_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One random DFlash v1 draft of the tiny Qwen3 target (its fit is all these cases need)."""
    from fixtures import tiny_drafts

    specs = tuple(s for s in tiny_drafts.DRAFT_SPECS if s.name == "b4_random")
    return tiny_drafts.build_drafts(tiny_qwen3_hf, tmp_path_factory.mktemp("cli-draft"), specs)["b4_random"]


def _linked_copy(src: Path, dest: Path, replace: dict[str, bytes | str] | None = None) -> Path:
    """dest holds symlinks to src's files, except the files in `replace` (written with that content)."""
    dest.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in (replace or {}):
            (dest / f.name).symlink_to(f)
    for name, data in (replace or {}).items():
        (dest / name).write_bytes(data.encode() if isinstance(data, str) else data)
    return dest


def _unwritable(folder: Path) -> Callable[[], None]:
    """Make `folder` refuse new files, also for root (permission bits do not stop root: the immutable
    attribute does); returns the undo. Skips when neither works here."""
    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folder.chmod(0o555)
        return lambda: folder.chmod(0o755)
    chattr = shutil.which("chattr")
    if chattr and subprocess.run([chattr, "+i", str(folder)], capture_output=True).returncode == 0:
        return lambda: subprocess.run([chattr, "-i", str(folder)], check=False)
    pytest.skip("cannot make a folder unwritable for root here (no chattr +i)")


def _run(capfd: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    rc = main(argv)
    out, err = capfd.readouterr()
    return rc, out, err


# Each case: (name, build(tmp, target, draft, hf) -> argv, words the message must hold).
def _tokenizer_zero(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    bad = _linked_copy(target, tmp / "t", {"openvino_tokenizer.xml": b""})
    return ["generate", "--target", str(bad), "--draft", "none", "--prompt", "hi", "--max-new-tokens", "2"]


def _draft_ir(content: bytes) -> Callable[..., list[str]]:
    def build(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
        bad = _linked_copy(draft, tmp / "d", {"openvino_model.xml": content})
        return ["generate", "--target", str(target), "--draft", str(bad), "--prompt", "hi", "--max-new-tokens", "2"]
    return build


def _draft_config_list(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    bad = _linked_copy(draft, tmp / "d", {"config.json": "[1, 2]"})
    return ["generate", "--target", str(target), "--draft", str(bad), "--prompt", "hi", "--max-new-tokens", "2"]


def _target_config_invalid(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    bad = _linked_copy(target, tmp / "t", {"config.json": '{"max_position_embeddings": 4096,'})
    return ["generate", "--target", str(bad), "--draft", "none", "--prompt", "hi", "--max-new-tokens", "2"]


def _target_ir_corrupt(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    bad = _linked_copy(target, tmp / "t", {"openvino_model.xml": "<?xml version='1.0'?><net name='x'><layers>"})
    return ["generate", "--target", str(bad), "--draft", "none", "--prompt", "hi", "--device", "CPU"]


def _export_no_weights(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    src = tmp / "hf"
    src.mkdir()
    shutil.copy(hf / "config.json", src / "config.json")
    return ["export", "--kind", "target", "--input", str(src), "--output", str(tmp / "out")]


def _answers(name: str, data: bytes) -> Callable[..., list[str]]:
    def build(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
        folder = shutil.copytree(draft, tmp / "d")
        if data:
            (tmp / name).write_bytes(data)
        return ["draft-vocab", "--draft", str(folder), "--answers", str(tmp / name), "--size", "2"]
    return build


def _prepare_read_only(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    home = tmp / "home"
    _UNDO.append(_unwritable(home / "models"))
    os.environ["DFLASH_STUDIO_HOME"] = str(home)  # restored by the test
    return ["prepare"]


def _invalid_utf8_prompt(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    prompt = b"\xff\xfehi".decode("utf-8", "surrogateescape")  # what Python makes of such argv bytes
    return ["generate", "--target", str(target), "--draft", "none", "--prompt", prompt, "--max-new-tokens", "2"]


def _bench_out_unwritable(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    _UNDO.append(_unwritable(tmp / "ro"))
    return ["bench", "--target", str(target), "--draft", "none", "--no-genai", "--prompts", "1",
            "--max-new-tokens", "2", "--out", str(tmp / "ro" / "results")]


def _bench_out_under_file(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    (tmp / "afile").write_text("x")
    return ["bench", "--target", str(target), "--draft", "none", "--no-genai", "--prompts", "1",
            "--max-new-tokens", "2", "--out", str(tmp / "afile" / "results")]


def _target_is_file(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    return ["generate", "--target", str(target / "openvino_model.xml"), "--prompt", "hi"]


def _bench_draft_does_not_fit(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    config = json.loads((draft / "config.json").read_text())
    bad = _linked_copy(draft, tmp / "d", {"config.json": json.dumps({**config, "vocab_size": 999})})
    return ["bench", "--target", str(target), "--draft", str(bad), "--no-genai", "--prompts", "1",
            "--max-new-tokens", "2"]


def _bench_prompt_file_list(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    (tmp / "p.jsonl").write_text('{"prompt": "hi"}\n[1, 2]\n')
    return ["bench", "--target", str(target), "--draft", "none", "--no-genai", "--dataset", str(tmp / "p.jsonl"),
            "--max-new-tokens", "2"]


def _min_over_max(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    return ["generate", "--target", str(target), "--draft", "none", "--prompt", "hi", "--min-new-tokens", "32",
            "--max-new-tokens", "16"]


def _over_context(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    return ["generate", "--target", str(target), "--draft", "none", "--prompt", "hi", "--max-new-tokens", "5000"]


def _over_kv_cache(tmp: Path, target: Path, draft: Path, hf: Path) -> list[str]:
    return ["generate", "--target", str(target), "--draft", "none", "--prompt", "hi", "--max-new-tokens", "4000",
            "--cache-size-mb", "1"]


_UNDO: list[Callable[[], None]] = []
CASES = [
    ("tokenizer IR of zero bytes", _tokenizer_zero, ["openvino_tokenizer.xml", "is empty (0 bytes", "export"]),
    ("draft IR of zero bytes", _draft_ir(b""), ["openvino_model.xml", "is empty (0 bytes", "export the draft again"]),
    ("draft IR that is not an IR", _draft_ir(b"<net>not xml"), ["openvino_model.xml", "not a readable OpenVINO IR",
                                                                "export the draft again"]),
    ("draft config.json that is a JSON list", _draft_config_list, ["config.json", "holds a JSON list"]),
    ("target config.json that is not JSON", _target_config_invalid, ["config.json", "is not valid JSON", "line 1"]),
    ("target IR damaged, on CPU", _target_ir_corrupt, ["openvino_model.xml", "not a readable OpenVINO IR"]),
    ("export from a folder without weights", _export_no_weights, ["cannot be exported", "weights are missing"]),
    ("draft-vocab with a missing file", _answers("nope.jsonl", b""), ["No such file or directory", "nope.jsonl"]),
    ("draft-vocab with a missing field", _answers("a.jsonl", b'{"ids": [1, 2]}\n'),
     ["a.jsonl line 1", "no 'answer' field", "--field"]),
    ("draft-vocab with bad gzip", _answers("a.jsonl.gz", b"not gzip at all"), ["a.jsonl.gz", "not a gzip file"]),
    ("draft-vocab with a truncated gzip", _answers("t.jsonl.gz", gzip.compress(b'{"answer": [1, 2]}\n' * 50)[:40]),
     ["t.jsonl.gz", "damaged gzip"]),
    ("draft-vocab with out-of-range ids", _answers("r.jsonl", b'{"answer": [1, 2, 99999999]}\n'),
     ["outside the vocabulary", "99,999,999", "another tokenizer"]),
    ("prepare on a read-only models folder", _prepare_read_only, ["models", "cannot be written"]),
    ("an invalid UTF-8 prompt", _invalid_utf8_prompt, ["not valid UTF-8", "byte 0xff", "encoding"]),
    ("bench --out to an unwritable folder", _bench_out_unwritable, ["--out folder", "cannot be written"]),
    ("bench --out under a file", _bench_out_under_file, ["--out folder", "cannot be written"]),
    ("--target pointing at a file", _target_is_file, ["is a file, not a folder", "give the folder that holds it"]),
    ("bench with a draft that does not fit", _bench_draft_does_not_fit, ["does not fit", "999 tokens"]),
    ("bench prompt file with a JSON list line", _bench_prompt_file_list, ["p.jsonl line 2", "JSON list"]),
    ("--min-new-tokens above --max-new-tokens", _min_over_max, ["min_new_tokens=32", "max_new_tokens=16"]),
    ("prompt + max_new_tokens over the context", _over_context, ["context of 4,096 tokens", "--max-new-tokens"]),
    ("max_new_tokens over the KV cache", _over_kv_cache, ["KV cache holds", "--cache-size-mb"]),
]


@pytest.mark.parametrize("build,words", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_expected_failures_are_one_message_and_exit_2(build, words, tmp_path, capfd, monkeypatch,
                                                      tiny_qwen3_target, tiny_draft, tiny_qwen3_hf) -> None:
    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path / "data"))
    argv = build(tmp_path, tiny_qwen3_target, tiny_draft, tiny_qwen3_hf)
    try:
        rc, out, err = _run(capfd, argv)
    finally:
        while _UNDO:
            _UNDO.pop()()
    lines = [x for x in err.splitlines() if x.startswith("dflash-studio: ")]
    assert rc == 2, err
    assert "Traceback" not in err and len(lines) == 1, err
    message = err[err.index("dflash-studio: "):]
    for w in words:
        assert w in message, f"{w!r} not in {message!r}"
    assert "Try CPU" not in message  # these all run on CPU
    assert "loading" not in err and "warming up" not in err, "refused before any long work"
    if argv[0] == "draft-vocab":  # nothing written from answers it refused
        assert "coverage" not in out and not (Path(argv[2]) / "draft_vocabulary.json").exists()


def test_lower_case_device_is_accepted(tiny_qwen3_target, capfd) -> None:
    rc, out, err = _run(capfd, ["generate", "--target", str(tiny_qwen3_target), "--draft", "none", "--prompt", "hi",
                                "--max-new-tokens", "3", "--device", "cpu", "--json"])
    assert rc == 0, err
    assert json.loads(out)["device"] == "CPU"


def test_version_does_not_open_the_gui() -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    p = subprocess.run([sys.executable, "-m", "engine.cli", "--version"], cwd=REPO, env=env, capture_output=True,
                       text=True, timeout=60)
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert p.returncode == 0 and p.stdout.strip() == f"dflash-studio {version}", p.stderr


def test_installed_entry_routes_every_cli_command(monkeypatch, capsys) -> None:
    """The bundle's entry point sends each subcommand to the CLI (not the GUI), by the launcher's rule,
    and knows the version."""
    monkeypatch.syspath_prepend(str(REPO / "installer"))
    import entry

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) - {"gui"} and not any(entry.wants_gui([c]) for c in set(sub.choices) - {"gui"})
    assert entry.wants_gui(["gui"])
    assert entry.main(["--version"]) == 0
    assert capsys.readouterr().out.startswith("dflash-studio ")


def test_prepare_prints_only_the_path_on_stdout(tmp_path, capfd, monkeypatch) -> None:
    """`$(dflash-studio prepare)` is the path: library output during the work goes to stderr (here a
    child process and a Python print standing in for optimum's and NNCF's output)."""
    from engine import prepare

    monkeypatch.setenv("DFLASH_STUDIO_HOME", str(tmp_path))

    def noisy(force: bool, weight_format: str, progress, notice) -> Path:
        print("INFO:nncf:Statistics of the bitwidth distribution:")
        subprocess.run([sys.executable, "-c", "print('TracerWarning: from a child')"], check=True)
        notice("a notice")
        progress("Prepared", 1.0)
        return tmp_path / "models" / "X"

    monkeypatch.setattr(prepare, "prepare_default", noisy)
    rc, out, err = _run(capfd, ["prepare"])
    assert rc == 0
    assert out == f"{tmp_path / 'models' / 'X'}\n"
    assert "nncf" in err and "TracerWarning" in err and "a notice" in err


_WITHOUT_OPENVINO = ("import sys\n"
                     "for m in ('openvino', 'openvino_genai', 'openvino_tokenizers'): sys.modules[m] = None\n"
                     "from engine.cli import main\n"
                     "sys.exit(main(sys.argv[1:]))\n")


def test_train_draft_runs_where_openvino_is_not_installed() -> None:
    """A GPU machine that only trains has torch and no OpenVINO: train-draft's parser must still build
    (it once failed there on the bench's and the vocabulary file's imports), and the runtime
    subcommands say what is missing."""
    def run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _WITHOUT_OPENVINO, *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=120)

    helped = run("train-draft", "--help")
    assert helped.returncode == 0, helped.stderr
    assert "--variant" in helped.stdout
    for cmd in (["row-invariance", "--target", "somewhere"], ["bench", "--prompts", "2"]):
        got = run(*cmd)
        assert got.returncode == 2, (cmd, got.stderr)
        assert "openvino" in got.stderr.lower() and "Traceback" not in got.stderr, (cmd, got.stderr)
    import_chain = run("draft-vocab", "--help")
    assert import_chain.returncode == 0, import_chain.stderr
