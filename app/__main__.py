"""`python -m app` (and `dflash-studio gui`): open the DFlash Studio window."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

NO_DISPLAY_HELP = """\
DFlash Studio needs a display, and none was found (DISPLAY and WAYLAND_DISPLAY are not set,
and QT_QPA_PLATFORM does not name another platform).

Ways to get one:
  * run it from a desktop session (X11 or Wayland);
  * over SSH, forward X:            ssh -X host, then python -m app
  * on a headless machine, use a virtual display:
        sudo apt-get install -y xvfb && xvfb-run -a python -m app
  * for automated tests only (nothing is shown on screen):
        QT_QPA_PLATFORM=offscreen python -m app
"""


def has_display(env: dict[str, str] | None = None, platform: str | None = None) -> bool:
    """True when Qt can open a window: always on Windows/macOS; on Linux/BSD a display or platform."""
    env = os.environ if env is None else env
    platform = sys.platform if platform is None else platform
    if platform.startswith(("win", "darwin")) or platform == "cygwin":
        return True
    return any(env.get(k) for k in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"))


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="dflash-studio gui", description="Open the DFlash Studio window.")
    p.add_argument("--target", help="target model folder to load at start")
    p.add_argument("--draft", help="draft folder to load with it (default: the last one, or none)")
    p.add_argument("--device", help="device to load on (CPU, GPU.0, NPU, ...)")
    p.add_argument("--demo-engine", action="store_true",
                   help="use the built-in fake engine (no model; for trying the interface)")
    p.add_argument("--demo-devices", action="store_true",
                   help="list a demo CPU, Arc GPU and NPU instead of this machine's devices")
    args, qt_args = p.parse_known_args(argv)
    args.qt_args = qt_args  # anything else (-style, -platform ...) is Qt's
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    if not has_display():
        print(NO_DISPLAY_HELP, file=sys.stderr, end="")
        return 2

    from PySide6.QtCore import Qt
    from PySide6.QtGui import QGuiApplication
    from PySide6.QtWidgets import QApplication

    from app import settings as S

    QGuiApplication.setHighDpiScaleFactorRoundingPolicy(Qt.HighDpiScaleFactorRoundingPolicy.PassThrough)
    qapp = QApplication.instance() or QApplication(["dflash-studio", *args.qt_args])
    qapp.setOrganizationName(S.ORG_NAME)
    qapp.setApplicationName(S.APP_NAME)
    qapp.setApplicationDisplayName("DFlash Studio")
    qapp.setDesktopFileName("dflash-studio")
    style = Path(__file__).resolve().parents[1] / "resources" / "style.qss"
    if style.exists():
        qapp.setStyleSheet(style.read_text(encoding="utf-8"))

    from app import logs
    from app.main_window import MainWindow
    from app.single_instance import InstanceGuard
    from engine import paths

    data_dir = paths.user_data_dir()
    logs.setup_logging(data_dir)
    logs.install_hooks()
    guard = InstanceGuard(data_dir)
    read_only = False
    if not guard.acquire():
        if guard.bring_forward():
            print(f"DFlash Studio is already open for the data folder {data_dir}: its window was brought "
                  "forward.", file=sys.stderr)
            return 0
        read_only = True  # the owner does not answer: look, but never write its history
        print(f"DFlash Studio is already open for {data_dir} ({guard.holder()}) and does not answer; this "
              "window opens read-only.", file=sys.stderr)

    settings = S.open_settings()
    loader = None
    validator = None
    label = ""
    if args.demo_engine:
        from app.fake_engine import fake_loader

        loader = fake_loader(tokens_per_second=120.0, prefill_delay_s=0.05)
        validator = lambda _t, _d: []  # noqa: E731 - the demo engine takes any folder as a draft
        label = "demo engine (no model)"
    if args.target:
        settings.setValue(S.K_LAST_TARGET, str(Path(args.target).resolve()))
        settings.setValue(S.K_LAST_DRAFT, str(Path(args.draft).resolve()) if args.draft else "")
    if args.device:
        settings.setValue(S.K_LAST_DEVICE, args.device)
    devices = None
    if args.demo_devices:
        from app.fake_engine import demo_devices

        devices = demo_devices()
    win = MainWindow(settings=settings, loader=loader, devices=devices, draft_validator=validator,
                     engine_label=label, read_only=read_only, lock_holder=guard.holder() if read_only else "")
    guard.activate.connect(win.bring_forward)
    win.show()
    try:
        return int(qapp.exec())
    finally:
        guard.release()


if __name__ == "__main__":
    sys.exit(main())
