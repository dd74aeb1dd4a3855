"""Package the one-dir bundle as a .deb with dpkg-deb.

    .venv/bin/python installer/linux/make_deb.py BUNDLE_DIR OUT_DIR [--work DIR]   (prints the .deb path)

Layout: /opt/dflash-studio/ (the bundle), /usr/bin/dflash-studio (a launcher that finds the bundle
relative to itself, so it also works from a `dpkg -x` root), a desktop entry, the icon in the
hicolor theme (SVG + PNG sizes), and a copyright file.

The X11/XCB libraries Qt's xcb platform plugin needs are *declared* (Depends) and taken from the
system rather than shipped: PyInstaller copies whatever the build machine had, but the system's
libxcb.so.1 is never bundled, so its extension libraries (libxcb-cursor0, -icccm4, ...) must come
from the same distribution to match it. Everything else in the bundle stays as PyInstaller laid it.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
NAME = "dflash-studio"
INSTALL_DIR = f"/opt/{NAME}"

# Bundled soname -> the Debian package that provides it. These are removed from the packaged bundle
# and declared instead (Qt >= 6.5's xcb plugin: libxcb-cursor0, -icccm4, -keysyms1, xkbcommon-x11 ...).
SYSTEM_XCB = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-render.so.0": "libxcb-render0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-shm.so.0": "libxcb-shm0",
    "libxcb-sync.so.1": "libxcb-sync1",
    "libxcb-util.so.1": "libxcb-util1",
    "libxcb-xfixes.so.0": "libxcb-xfixes0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-glx.so.0": "libxcb-glx0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libX11.so.6": "libx11-6",
}
# Libraries the bundle links but PyInstaller never ships (system ABI, GL/EGL, Wayland).
SYSTEM_OTHER = ["libxcb1", "libgl1", "libegl1", "libdrm2", "libwayland-client0",
                "libwayland-cursor0", "libwayland-egl1"]
# The GPU plugin needs an OpenCL loader (with Intel's compute runtime for a GPU to show up); fonts.
RECOMMENDS = ["ocl-icd-libopencl1", "fonts-dejavu-core | fonts-freefont-ttf"]

LAUNCHER = """#!/bin/sh
# DFlash Studio launcher: the bundle lives in ../../opt/dflash-studio relative to this file.
here=$(dirname "$(readlink -f "$0")")
exec "$here/../../opt/dflash-studio/dflash-studio" "$@"
"""

DESKTOP = """[Desktop Entry]
Type=Application
Name=DFlash Studio
GenericName=Speculative decoding lab
Comment=Block speculative decoding (DFlash) on OpenVINO: chat, live acceptance plots, benchmarks
Exec=dflash-studio %F
TryExec=dflash-studio
Icon=dflash-studio
Terminal=false
Categories=Development;Science;ArtificialIntelligence;
Keywords=LLM;OpenVINO;speculative;decoding;DFlash;
StartupWMClass=dflash-studio
"""

COPYRIGHT = """Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/
Upstream-Name: dflash-studio
License: Apache-2.0

Files: *
License: Apache-2.0
Comment: The bundle also contains Python, Qt (LGPL-3.0) through PySide6, OpenVINO, OpenVINO GenAI and
 OpenVINO Tokenizers (Apache-2.0), numpy (BSD-3-Clause), pyqtgraph (MIT), platformdirs (MIT) and the
 shared libraries PyInstaller collected; their license files are under /opt/dflash-studio/_internal.
 The bundled SmolLM2-135M-Instruct weights are Apache-2.0 (HuggingFaceTB).
"""


def project_version() -> str:
    text = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    return re.search(r'^version\s*=\s*"([^"]+)"', text, re.M).group(1)


def arch() -> str:
    return subprocess.run(["dpkg", "--print-architecture"], capture_output=True, text=True, check=True).stdout.strip()


def glibc_needed(tree: Path) -> str:
    """The newest GLIBC_x.y symbol version any bundled ELF file asks for (libc6's lower bound)."""
    best = (2, 17)
    for f in tree.rglob("*"):
        if not f.is_file() or f.is_symlink() or not (".so" in f.name or os.access(f, os.X_OK)):
            continue
        with open(f, "rb") as fh:
            if fh.read(4) != b"\x7fELF":
                continue
        out = subprocess.run(["objdump", "-T", str(f)], capture_output=True, text=True).stdout
        for m in re.finditer(r"GLIBC_(\d+)\.(\d+)", out):
            best = max(best, (int(m.group(1)), int(m.group(2))))
    return f"{best[0]}.{best[1]}"


def depends(removed: list[str], glibc: str) -> list[str]:
    return [f"libc6 (>= {glibc})"] + SYSTEM_OTHER + sorted({SYSTEM_XCB[n] for n in removed} | set(SYSTEM_XCB.values()))


def stage(bundle: Path, root: Path) -> list[str]:
    """Lay out the package tree under root; return the sonames moved to system Depends."""
    if root.exists():
        shutil.rmtree(root)
    opt = root / INSTALL_DIR.lstrip("/")
    shutil.copytree(bundle, opt, symlinks=True)
    removed = []
    for f in sorted((opt / "_internal").iterdir()):
        if f.name in SYSTEM_XCB:
            f.unlink()
            removed.append(f.name)
    launcher = root / "usr/bin" / NAME
    launcher.parent.mkdir(parents=True)
    launcher.write_text(LAUNCHER)
    launcher.chmod(0o755)
    apps = root / "usr/share/applications"
    apps.mkdir(parents=True)
    (apps / f"{NAME}.desktop").write_text(DESKTOP)
    icons = root / "usr/share/icons/hicolor"
    (icons / "scalable/apps").mkdir(parents=True)
    shutil.copy2(ROOT / "resources/icons/dflash.svg", icons / "scalable/apps" / f"{NAME}.svg")
    sys.path.insert(0, str(HERE.parent))
    from make_icons import SIZES, render

    for s in SIZES:
        d = icons / f"{s}x{s}/apps"
        d.mkdir(parents=True)
        (d / f"{NAME}.png").write_bytes(render(s))
    doc = root / "usr/share/doc" / NAME
    doc.mkdir(parents=True)
    (doc / "copyright").write_text(COPYRIGHT)
    for p in root.rglob("*"):  # root:root 0755/0644, keep the executables' x bits
        if p.is_symlink():
            continue
        p.chmod(0o755 if p.is_dir() or os.access(p, os.X_OK) else 0o644)
    return removed


def control(root: Path, removed: list[str]) -> str:
    size_kb = sum(f.stat().st_size for f in root.rglob("*") if f.is_file() and not f.is_symlink()) // 1024
    fields = {
        "Package": NAME,
        "Version": project_version(),
        "Architecture": arch(),
        "Maintainer": "DFlash Studio developers <dflash-studio@example.invalid>",
        "Installed-Size": str(size_kb),
        "Depends": ", ".join(depends(removed, glibc_needed(root / INSTALL_DIR.lstrip("/")))),
        "Recommends": ", ".join(RECOMMENDS),
        "Section": "science",
        "Priority": "optional",
        "Description": "Block speculative decoding (DFlash) on OpenVINO, with a desktop app\n"
                       " DFlash Studio runs DFlash-family drafts against a target model on the OpenVINO\n"
                       " runtime (CPU, Intel GPU) and shows per-step acceptance, tokens per step and\n"
                       " timings live. Self-contained: Python, Qt and OpenVINO are bundled under\n"
                       " /opt/dflash-studio; run `dflash-studio --self-test` to check an install.",
    }
    text = "".join(f"{k}: {v}\n" for k, v in fields.items())
    (root / "DEBIAN").mkdir(exist_ok=True)
    (root / "DEBIAN/control").write_text(text)
    return text


def build(bundle: Path, out: Path, work: Path) -> Path:
    root = work / "root"
    removed = stage(bundle, root)
    control(root, removed)
    out.mkdir(parents=True, exist_ok=True)
    deb = out / f"{NAME}_{project_version()}_{arch()}.deb"
    # gzip: fast to build on two cores and readable by every dpkg (xz: smaller, much slower to build).
    subprocess.run(["dpkg-deb", "--root-owner-group", "-Zgzip", "-z6", "--build", str(root), str(deb)],
                   check=True, stdout=subprocess.DEVNULL)
    return deb


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bundle", type=Path)
    p.add_argument("out", type=Path)
    p.add_argument("--work", type=Path, default=ROOT / "build/installer/deb")
    a = p.parse_args()
    if not (a.bundle / NAME).is_file():
        sys.exit(f"make_deb: {a.bundle} is not a built bundle (no {NAME} executable in it)")
    print(build(a.bundle.resolve(), a.out.resolve(), a.work.resolve()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
