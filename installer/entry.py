"""Entry point of the bundled DFlash Studio (PyInstaller one-dir); the source checkout never uses it.

    dflash-studio                      the desktop app (app.__main__; its flags: --target, --draft, ...)
    dflash-studio --self-test [...]    offscreen self-test, JSON on stdout, exit 0 when it passes
    dflash-studio prepare [...]        install the bundled default model into the user data folder
                                       (engine/bundled.py; `generate` and `bench` do it too on first use)
    dflash-studio generate|bench|devices|export|draft-vocab|serve|row-invariance ...   the engine CLI
    dflash-studio gui [...]            the desktop app, as with no subcommand
    dflash-studio -m engine.cli ARGS   the same (the app's "Prepare now" dialog runs this form)
    dflash-studio --version

`export` is listed for completeness: it needs torch/optimum, which the bundle leaves out, and says so.
Which words are subcommands and which open the app is the launcher's rule (dflash_studio/), the same
as in a source checkout; this file adds only what the bundle does differently.
"""
from __future__ import annotations

import os
import sys

from dflash_studio import gui_args, wants_gui


def _usable_streams() -> None:
    """A windowed Windows build starts with sys.stdout/stderr = None: use the inherited handles if any
    (QProcess pipes, a console redirect), else discard, so printing never raises."""
    for name, fd in (("stdout", 1), ("stderr", 2)):
        if getattr(sys, name) is None:
            try:
                setattr(sys, name, open(fd, "w", encoding="utf-8", errors="replace", closefd=False))
            except OSError:
                setattr(sys, name, open(os.devnull, "w", encoding="utf-8"))


def _cli(argv: list[str]) -> int:
    if argv and argv[0] == "export":
        try:
            import torch  # noqa: F401 - only to give a clear message
        except ImportError:
            print("dflash-studio export: converting models needs torch, transformers and optimum-intel, which the "
                  "installed app does not include. Run it from a source checkout (scripts/bootstrap.sh, then "
                  ".venv/bin/dflash-studio export ...) and open the resulting folder in the app; see "
                  "docs/installer.md.", file=sys.stderr)
            return 2
    from engine.cli import main as cli_main

    return cli_main(argv)


def main(argv: list[str] | None = None) -> int:
    _usable_streams()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--self-test"]:
        from app.selftest import main as selftest_main

        return selftest_main(argv[1:])
    if argv[:1] == ["--version"]:
        from engine import __version__

        print(f"dflash-studio {__version__}")
        return 0
    if argv[:2] == ["-m", "engine.cli"]:
        return _cli(argv[2:])
    if argv[:2] == ["-m", "app"]:
        argv = argv[2:]
    elif not wants_gui(argv):
        return _cli(argv)
    from app.__main__ import main as gui_main

    return gui_main(gui_args(argv))


if __name__ == "__main__":
    sys.exit(main())
