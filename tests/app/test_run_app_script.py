"""scripts/run-app.sh --check-qt: names the missing Qt xcb libraries' packages and the exact install command,
or installs them when run as root (fake ldd / id / apt-get on PATH stand in for the system)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MISSING = ["libxcb-cursor.so.0", "libxcb-icccm.so.4", "libxcb-keysyms.so.1", "libxkbcommon-x11.so.0"]

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the check is for Linux")


def _fake(bin_dir: Path, name: str, body: str) -> None:
    p = bin_dir / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)


def _run(tmp_path: Path, uid: int, missing: list[str]) -> tuple[subprocess.CompletedProcess, Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    lines = "".join(f"echo '\t{lib} => not found'\n" for lib in missing)
    _fake(bin_dir, "ldd", "echo '\tlibc.so.6 => /lib/libc.so.6 (0x0)'\n" + lines)
    _fake(bin_dir, "id", f"echo {uid}")
    record = tmp_path / "apt-get.args"
    _fake(bin_dir, "apt-get", f'echo "$@" >> {record}')
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PYTHON": sys.executable}
    r = subprocess.run(["bash", str(REPO / "scripts" / "run-app.sh"), "--check-qt"], env=env,
                       capture_output=True, text=True, timeout=60)
    return r, record


def test_missing_libraries_give_the_exact_apt_command(tmp_path):
    r, record = _run(tmp_path, 1000, MISSING)
    assert r.returncode == 1
    assert "sudo apt-get install -y libxcb-cursor0 libxcb-icccm4 libxcb-keysyms1 libxkbcommon-x11-0" in r.stderr
    assert "libxcb-cursor.so.0" in r.stderr and not record.exists()


def test_as_root_it_installs_them(tmp_path):
    r, record = _run(tmp_path, 0, MISSING[:2])
    assert r.returncode == 0, r.stderr
    assert record.read_text().splitlines() == ["update -qq", "install -y libxcb-cursor0 libxcb-icccm4"]


def test_nothing_missing_says_nothing(tmp_path):
    r, record = _run(tmp_path, 1000, [])
    assert r.returncode == 0 and r.stderr == "" and not record.exists()

