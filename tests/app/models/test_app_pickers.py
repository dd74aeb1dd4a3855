"""Model pickers: a draft that does not fit shows the engine's reasons; recent folders; prepare."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app import settings as S
from app.models.pickers import ModelPanel
from app.models.prepare import PrepareDialog
from app.models.validation import engine_draft_reasons

REASONS = ["vocabulary: the draft has 32000 tokens, the target 151936",
           "missing head file: markov_head.xml is named in dflash.json but not in the folder"]


def reasons_for_broken(target: str, draft: str) -> list[str]:
    return REASONS if draft.endswith("broken-draft") else []


def test_broken_draft_shows_its_reasons(qtbot, settings, fake_devices, model_dirs, tmp_path):
    target, good = model_dirs
    broken = tmp_path / "models" / "broken-draft"
    broken.mkdir()
    mp = ModelPanel(settings, devices=fake_devices, validator=reasons_for_broken)
    qtbot.addWidget(mp)
    mp.show()
    mp.set_target(str(target))
    mp.set_draft(str(broken))
    assert mp.draft_dir() == str(broken)
    text = mp.draft_reasons.text()
    assert "does not fit" in text and REASONS[0] in text and REASONS[1] in text
    assert mp.draft_reasons.property("state") == "error"
    assert not mp.load_button.isEnabled()
    assert REASONS[0] in mp.load_button.toolTip()
    assert mp.draft_combo.currentText() == "✗ broken-draft"  # listed, marked, never hidden
    mp.set_draft(str(good))
    assert mp.draft_reasons.text() == "✓ This draft fits the target." and mp.load_button.isEnabled()


def test_draft_check_without_a_target_or_folder_gives_reasons(tmp_path):
    assert engine_draft_reasons("", str(tmp_path)) == ["Pick a target first: a draft is checked against its target."]
    assert "does not exist" in engine_draft_reasons(str(tmp_path), str(tmp_path / "nope"))[0]


def test_real_engine_draft_check_explains_a_broken_folder(tmp_path):
    """Through engine.models.draft.check_draft_fits (whatever it says, it must say something)."""
    target = tmp_path / "t"
    draft = tmp_path / "d"
    target.mkdir()
    draft.mkdir()
    reasons = engine_draft_reasons(str(target), str(draft))
    assert reasons and all(isinstance(r, str) and r for r in reasons)


def test_recent_folders_are_remembered(qtbot, settings, fake_devices, model_dirs):
    target, draft = model_dirs
    mp = ModelPanel(settings, devices=fake_devices, validator=lambda t, d: [])
    qtbot.addWidget(mp)
    mp.set_target(str(target))
    mp.set_draft(str(draft))
    with qtbot.waitSignal(mp.load_requested) as blocker:
        mp.load_button.click()
    assert blocker.args == [str(target), str(draft), "CPU"]
    settings.sync()
    assert S.get_list(settings, S.K_RECENT_TARGETS) == [str(target)]
    assert S.get_list(settings, S.K_RECENT_DRAFTS) == [str(draft)]
    mp2 = ModelPanel(settings, devices=fake_devices, validator=lambda t, d: [])
    qtbot.addWidget(mp2)
    targets = [mp2.target_combo.itemData(i) for i in range(mp2.target_combo.count())]
    assert str(target) in targets
    mp2.set_target(str(target))
    drafts = [mp2.draft_combo.itemData(i) for i in range(mp2.draft_combo.count())]
    assert str(draft) in drafts


def _prepared_default(home: Path, drafts: list[str], best: str | None) -> dict[str, Path]:
    """The layout `prepare` leaves: the default target, exported drafts, and best.txt naming one."""
    target = home / "models" / "SmolLM2-135M-Instruct-ov"
    target.mkdir(parents=True)
    (target / "openvino_model.xml").write_text("<net/>")
    out = {}
    for name in drafts:
        d = home / "models" / "drafts" / name
        d.mkdir(parents=True)
        (d / "openvino_model.xml").write_text("<net/>")
        out[name] = d
    if best:
        (home / "models" / "drafts" / "best.txt").write_text(best + "\n")
    return out


@pytest.mark.parametrize("best, unfit, expected", [
    ("z-best", "", "z-best"),  # the best draft, though another sorts first
    (None, "", "a-first"),  # no best.txt: the first draft that fits
    ("z-best", "z-best", "a-first"),  # the best one does not fit this target: the first that does
    ("gone", "", "a-first"),  # best.txt names a draft that was never exported
])
def test_first_start_loads_the_draft_prepare_marked_best(make_window, app_home, qtbot, best, unfit, expected):
    drafts = _prepared_default(app_home, ["a-first", "z-best"], best)
    w = make_window(load=False, validator=lambda t, d: ["does not fit"] if unfit and d.endswith(unfit) else [])
    with qtbot.waitSignal(w.controller.loaded, timeout=5000):
        w.autoload()
    assert w.model_panel.target_dir().endswith("SmolLM2-135M-Instruct-ov")
    assert w.model_panel.draft_dir() == str(drafts[expected])


def test_missing_default_target_offers_to_prepare(make_window, qtbot):
    w = make_window(load=False)
    w.autoload()
    assert w.notice_banner.isVisible() and "not prepared" in w.notice_banner.label.text()
    assert w.notice_banner.action_button.text() == "Prepare now"
    assert w.model_panel.prepare_button.isVisibleTo(w.model_panel)
    assert w.engine_info is None and not w.send_button.isEnabled()


def test_prepare_dialog_streams_the_log(qtbot):
    script = "import sys,time\nfor i in range(3):\n    print(f'step {i}', flush=True); time.sleep(0.05)\n"
    dlg = PrepareDialog((sys.executable, ["-c", script]))
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.succeeded, timeout=10000):
        dlg.start()
    assert "step 0\nstep 1\nstep 2" in dlg.log.toPlainText()
    assert "ready" in dlg.info.text()


def test_prepare_log_keeps_a_progress_bar_on_one_line(qtbot):
    dlg = PrepareDialog((sys.executable, ["-c", "pass"]))
    qtbot.addWidget(dlg)
    dlg.write("Converting:   0%\rConverting:  50%")
    dlg.write("\rConverting: 100%\nDone\r\n")
    assert dlg.log.toPlainText() == "Converting: 100%\nDone\n"


def test_prepare_dialog_reports_failure(qtbot):
    dlg = PrepareDialog((sys.executable, ["-c", "import sys; print('no network'); sys.exit(3)"]))
    qtbot.addWidget(dlg)
    with qtbot.waitSignal(dlg.proc.finished, timeout=10000):
        dlg.start()
    assert dlg.exit_code == 3 and "failed (exit code 3)" in dlg.info.text()
    assert "no network" in dlg.log.toPlainText()


def test_a_new_target_trades_a_draft_that_does_not_fit_for_one_that_does(qtbot, settings, fake_devices, app_home,
                                                                          tmp_path):
    """Picking another target (the SmolLM2 default -> Qwen2.5-Coder) takes that target's draft instead of leaving
    the last one's selected, marked as not fitting; a draft that fits, "none", or nothing better are kept."""
    targets = {k: tmp_path / f"target-{k}" for k in "abc"}
    drafts = {k: app_home / "models" / "drafts" / f"{k}-draft" for k in "ab"}
    for d in [*targets.values(), *drafts.values()]:
        d.mkdir(parents=True)

    def validator(t: str, d: str) -> list[str]:  # a draft fits the target of its letter
        return [] if Path(d).name[0] == Path(t).name[-1] else ["built for another target's vocabulary"]

    mp = ModelPanel(settings, devices=fake_devices, validator=validator)
    qtbot.addWidget(mp)
    mp.set_target(str(targets["a"]))
    mp.set_draft(str(drafts["a"]))
    mp.set_target(str(targets["b"]))
    assert mp.draft_dir() == str(drafts["b"]) and mp.draft_reasons.text() == "✓ This draft fits the target."
    assert mp.load_button.isEnabled()
    mp.set_target(str(targets["c"]))  # nothing fits: the draft stays, with its reasons
    assert mp.draft_dir() == str(drafts["b"]) and "does not fit" in mp.draft_reasons.text()
    mp.set_draft(None)
    mp.set_target(str(targets["a"]))  # "none" was chosen: kept
    assert mp.draft_dir() is None
    mp.set_draft(str(drafts["b"]))  # a draft chosen for this very target is never swapped behind one's back
    assert mp.draft_dir() == str(drafts["b"]) and not mp.load_button.isEnabled()
