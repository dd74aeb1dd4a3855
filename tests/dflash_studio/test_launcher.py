"""The `dflash-studio` launcher (dflash_studio/): the app for no subcommand / `gui` / app options, else the engine CLI."""
from __future__ import annotations

import json

import pytest

import dflash_studio
from engine.cli import build_parser


def test_which_words_open_the_app() -> None:
    assert dflash_studio.wants_gui([]) and dflash_studio.wants_gui(["gui", "--device", "GPU"])
    assert dflash_studio.wants_gui(["--target", "/models/x"])  # the app's own options
    assert not dflash_studio.wants_gui(["-h"]) and not dflash_studio.wants_gui(["bench", "--prompts", "1"])
    assert dflash_studio.gui_args(["gui", "--device", "GPU"]) == ["--device", "GPU"]
    assert dflash_studio.gui_args(["--device", "GPU"]) == ["--device", "GPU"]


def test_the_command_list_is_the_engine_cli_s() -> None:
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert set(sub.choices) - {"gui"} == dflash_studio.CLI_COMMANDS


def test_subcommands_run_the_engine_cli_and_it_does_not_open_the_app(capsys) -> None:
    assert dflash_studio.main(["devices", "--json"]) == 0
    assert any(d["name"] == "CPU" for d in json.loads(capsys.readouterr().out))
    from engine.cli import main as cli_main

    with pytest.raises(SystemExit):
        cli_main(["gui"])
    assert "dflash-studio" in capsys.readouterr().err
