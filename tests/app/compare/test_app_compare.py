"""The Compare tab: runs the shared bench runner on the engine thread; table, charts, cancel, export."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QImage

from app import settings as S
from app.compare.charts import SLOW_COLOR
from app.compare.panel import COLUMNS, short_label
from engine.bench.report import BenchResult, RequestRun, Row

MACHINE = {"machine": "test machine", "device": "CPU (test)", "openvino": "test"}


def _panel(make_window, model_dirs, options=None, **kw):
    w = make_window(options, bench_machine=MACHINE, **kw)
    p = w.compare
    w.tabs.setCurrentIndex(1)
    p.genai_target_check.setChecked(False)  # no openvino_genai peers on the fake engine
    p.genai_dflash_check.setChecked(False)
    p.set_drafts_checked([str(model_dirs[1])])
    p.set_dataset("smoke")
    return w, p


def _col(name: str) -> int:
    return [c[0] for c in COLUMNS].index(name)


def test_compare_run_fills_table_and_charts(make_window, model_dirs, qtbot):
    w, p = _panel(make_window, model_dirs, {"step_delay_s": 0.001})
    assert not w.plots_dock.isVisible()  # the chat's live plots step aside while Compare is shown
    assert "tiny-target" in p.session_label.text() and "CPU" in p.session_label.text()
    assert p.checked_drafts() == [str(model_dirs[1])]
    p.n_edit.setText("3 7")
    p.count.setValue(2)
    p.max_new.setValue(40)
    assert not p.csv_button.isEnabled()
    with qtbot.waitSignal(p.run_finished, timeout=30000) as blocker:
        assert p.run()
        assert not p.run_button.isEnabled() and p.cancel_button.isEnabled()
        assert not w.send_button.isEnabled()  # the engine thread is busy with the comparison
    res: BenchResult = blocker.args[0]
    assert not res.cancelled and [r.config for r in res.rows] == [
        "target alone (this engine)", "tiny-draft (dflash_v1) n=3 (this engine)",
        "tiny-draft (dflash_v1) n=7 (this engine)"]
    assert p.table.rowCount() == 3 and p.progress.value() == 1000
    assert "Done: 2 prompts × 3 configurations" in p.status.text()
    assert p.csv_button.isEnabled() and p.run_button.isEnabled() and w.send_button.isEnabled()
    shown = p.table_rows()
    assert shown[0][0] == "target alone (this engine)" and shown[0][_col("speedup")] == "1.00x"
    assert shown[1][_col("matches target")] == "2/2"
    # The charts draw the same numbers as the table, one bar per row.
    rows = [r.as_dict() for r in res.rows]
    assert p.charts.tok_s.values == [r["tok_s"] for r in rows]
    assert p.charts.tokens_per_step.values == [r["tokens_per_step"] for r in rows]
    assert p.charts.speedup.values == [r["speedup"] for r in rows]
    # Sortable: clicking "tok/s" orders the rows by the number, not the text.
    p.table.sortItems(_col("tok/s"), Qt.SortOrder.DescendingOrder)
    tok_s = [float(r[_col("tok/s")]) for r in p.table_rows()]
    assert tok_s == sorted(tok_s, reverse=True)
    p.table.sortItems(_col("tokens/step"), Qt.SortOrder.AscendingOrder)
    assert p.table_rows()[0][0] == "target alone (this engine)"
    # Settings are remembered for the next window.
    w.close()
    w2 = make_window(load=False, bench_machine=MACHINE)
    assert w2.compare.n_edit.text() == "3 7" and w2.compare.count.value() == 2
    w2.tabs.setCurrentIndex(0)
    assert w2.plots_dock.isVisible()


def test_compare_cancel_mid_run(make_window, model_dirs, qtbot):
    w, p = _panel(make_window, model_dirs, {"step_delay_s": 0.01})
    p.count.setValue(4)
    p.max_new.setValue(400)
    seen: list = []
    w.controller.bench_progress.connect(lambda m, f: seen.append(f))
    assert p.run()
    qtbot.waitUntil(lambda: any(isinstance(f, float) for f in seen), timeout=20000)
    with qtbot.waitSignal(p.run_finished, timeout=20000) as blocker:
        p.cancel_button.click()
        assert "Cancelling" in p.status.text()
    res = blocker.args[0]
    assert res.cancelled and res.prompts_done < 4
    assert "Cancelled after" in p.status.text()
    assert p.run_button.isEnabled() and not p.cancel_button.isEnabled()
    assert not w.controller.benchmarking
    # The engine thread is free again: the chat works.
    w.tabs.setCurrentIndex(0)
    w.gen_panel.max_new_tokens.setValue(5)
    with qtbot.waitSignal(w.controller.finished, timeout=10000):
        assert w.send("after the comparison")


def test_chat_waits_while_comparing_and_closing_mid_run_is_clean(make_window, model_dirs, qtbot):
    w, p = _panel(make_window, model_dirs, {"step_delay_s": 0.01})
    p.count.setValue(4)
    p.max_new.setValue(400)
    assert p.run()
    assert not w.send("hello")
    assert "comparison run" in w.state_label.text()
    w.close()  # the runner is cancelled and the engine thread stops (checked by make_window)
    assert not w.controller.thread.isRunning()


def test_compare_export_csv_markdown_png(make_window, model_dirs, qtbot, tmp_path):
    w, p = _panel(make_window, model_dirs, {"step_delay_s": 0.001})
    p.count.setValue(1)
    p.max_new.setValue(20)
    with qtbot.waitSignal(p.run_finished, timeout=30000):
        p.run()
    rows = list(csv.DictReader(io.StringIO(p.export_csv(tmp_path / "r.csv").read_text())))
    assert [r["config"] for r in rows] == [r.config for r in p.result.rows]
    assert {"tokens_per_step", "tok_s", "speedup", "matches_target", "draft_step_ms"} <= set(rows[0])
    md = p.export_markdown(tmp_path / "r.md").read_text()
    assert "machine: test machine" in md and "| target alone (this engine) |" in md
    png = p.export_png(tmp_path / "r.png")
    img = QImage(str(png))
    assert not img.isNull() and img.width() > 300 and img.height() > 200


def test_bad_choices_are_explained(make_window, model_dirs, qtbot):
    w, p = _panel(make_window, model_dirs)
    p.greedy_check.setChecked(False)
    assert not p.run()
    assert "Greedy" in p.status.text()
    p.greedy_check.setChecked(True)
    p.k_edit.setText("8 x")
    assert not p.run() and "Markov head K" in p.status.text() and "'x'" in p.status.text()
    p.k_edit.setText("")
    p.temps_edit.setText("0")
    assert not p.run() and "temperature" in p.status.text()
    assert not w.controller.benchmarking


def test_draft_list_marks_drafts_that_do_not_fit(make_window, model_dirs, qtbot, tmp_path):
    bad = tmp_path / "other-draft"
    bad.mkdir()

    def validator(_t, d):
        return ["hidden size 64 != 32"] if Path(d) == bad else []

    w = make_window(load=False, validator=validator, bench_machine=MACHINE)
    mp = w.model_panel
    mp.set_target(str(model_dirs[0]))
    mp.set_draft(str(model_dirs[1]))
    mp.set_draft(str(bad))
    p = w.compare
    items = {p.draft_list.item(i).text(): p.draft_list.item(i) for i in range(p.draft_list.count())}
    no, yes = items["other-draft  (does not fit this target)"], items["tiny-draft  (fits)"]
    assert not (no.flags() & Qt.ItemFlag.ItemIsEnabled)
    assert "hidden size" in no.toolTip()
    # No tick-like glyph beside a box: whether a draft runs is the box alone.
    assert not any(ch in p.draft_list.item(i).text() for i in range(p.draft_list.count()) for ch in "✓✗")
    assert yes.checkState() == Qt.CheckState.Unchecked


def test_speedup_below_one_is_red():
    from app.compare.charts import BenchCharts

    def row(name, draft, tpot, steps=10, tokens=11):
        # One prompt: 11 tokens, the first after 5 ms, then (tokens - 1) x tpot ms.
        run = RequestRun("p0", list(range(tokens)), "", 5.0, 5.0 + tpot * (tokens - 1), steps, tokens - 1)
        return Row(name, "engine", "t", draft, "smoke", 7 if draft else 0, requests=[run])

    rows = [row("target alone (this engine)", None, 2.0), row("fast", "a", 1.0, steps=4), row("slow", "b", 4.0)]
    for r in rows:
        r.speedup = rows[0].tpot_ms / r.tpot_ms
    charts = BenchCharts()
    charts.set_rows([r.as_dict() for r in rows], short_label)
    assert charts.speedup.values == [1.0, 2.0, 0.5]
    assert charts.speedup.brushes[2] == SLOW_COLOR and charts.speedup.brushes[1] != SLOW_COLOR
    assert short_label(rows[1].as_dict()) == "a n7"
    charts.deleteLater()


@pytest.mark.slow
def test_compare_real_engine_on_tiny_fixture(make_window, qtbot, tiny_qwen3_target, tiny_qwen3_drafts, tmp_path):
    """The panel over the real engine: the same rows as the runner, openvino_genai peers included."""
    from app.worker import default_loader

    draft = tiny_qwen3_drafts["b8_trained"]
    w = make_window(load=False, validator=None,
                    loader=lambda t, d=None, device="CPU", **kw: default_loader(t, d, device=device, **kw))
    mp = w.model_panel
    mp.set_target(str(tiny_qwen3_target))
    mp.set_draft(str(draft))
    p = w.compare
    w.tabs.setCurrentIndex(1)
    p.set_drafts_checked([str(draft)])
    p.set_dataset("smoke")
    p.count.setValue(1)
    p.max_new.setValue(12)
    p.exact_check.setChecked(True)
    with qtbot.waitSignal(p.run_finished, timeout=300000) as blocker:
        p.run()
    res = blocker.args[0]
    assert res is not None, p.status.text()
    names = [r.config for r in res.rows]
    assert names == ["target alone (this engine)", "target alone (openvino_genai)",
                     "b8_trained (dflash_v1) n=7 (this engine)", "b8_trained (dflash_v1) n=7 (openvino_genai DFlash)"]
    assert all(r.matches_target == 1 for r in res.rows)
    assert p.table.rowCount() == 4 and "openvino" in p.summary.toolTip()


def test_until_a_choice_is_made_the_chat_s_draft_is_ticked(make_window, model_dirs, qtbot, tmp_path):
    other = tmp_path / "other-draft"
    other.mkdir()
    w = make_window(load=False, bench_machine=MACHINE)
    mp, p = w.model_panel, w.compare
    key = S.K_COMPARE + "drafts"
    assert not p.settings.contains(key)
    mp.set_target(str(model_dirs[0]))
    mp.set_draft(str(model_dirs[1]))
    assert p.checked_drafts() == [str(model_dirs[1])]  # a first Run compares the draft the chat uses
    mp.set_draft(str(other))
    assert p.checked_drafts() == [str(other)]  # the tick follows the chat's draft, not both
    # A choice a run saved (here: no drafts) is kept: the tick no longer follows.
    p.settings.setValue(key, [])
    mp.set_draft(str(model_dirs[1]))
    assert p.checked_drafts() == [str(other)]
    # So is the user's own tick.
    p.settings.remove(key)
    p.set_drafts_checked([str(model_dirs[1]), str(other)])
    mp.set_draft(str(other))
    assert sorted(p.checked_drafts()) == sorted([str(model_dirs[1]), str(other)])
