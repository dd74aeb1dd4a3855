"""The `dflash-studio` console script: the desktop app (no subcommand, `gui`, or an option first) or
the engine's command line (every other subcommand, engine/cli.py).

It sits above both packages so that engine/ never imports app/: only this launcher knows both.
"""
from __future__ import annotations

import sys

# The engine's subcommands (engine/cli.py build_parser); anything else opens the app.
CLI_COMMANDS = frozenset({"generate", "bench", "humaneval", "row-invariance", "export", "prepare", "draft-vocab", "train-draft",
                          "devices", "serve"})
GUI_COMMAND = "gui"


def wants_gui(argv: list[str]) -> bool:
    """No subcommand, `gui`, or the app's own options first (--target DIR ...; -h/--help list the
    subcommands, --version prints the version)."""
    if not argv or argv[0] == GUI_COMMAND:
        return True
    return argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")


def gui_args(argv: list[str]) -> list[str]:
    """The app's arguments: what follows `gui`, or everything."""
    return argv[1:] if argv[:1] == [GUI_COMMAND] else argv


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if wants_gui(argv):
        # The app parses its own options (--target, --draft, --device, ...) and leaves the rest to Qt.
        from app.__main__ import main as gui_main

        return gui_main(gui_args(argv))
    from engine.cli import main as cli_main

    return cli_main(argv)
