"""`--self-test`: prove an installed (or source) DFlash Studio works, without a display or torch.

What it does, in order, each step timed and recorded:
  1. starts Qt offscreen (unless --platform names another one), opens the main window
     (app.main_window.MainWindow) and waits until it is shown (`window_shown_s`: seconds since the
     process started; lists Qt's platform plugins);
  2. imports the engine, OpenVINO, openvino_genai and openvino_tokenizers and lists OpenVINO
     devices (this loads the CPU plugin from the bundle);
  3. loads a tiny target + tiny DFlash draft (IR folders built at bundle-build time from the test
     fixtures; no torch involved) through engine.pipeline.SpeculativePipeline and generates a few
     greedy tokens with the draft (a trained draft must get tokens accepted), and the same tokens
     without it (they must be identical: speculative decoding is exact at f32);
  4. runs one chat turn through the window itself (its worker thread, the same path a person uses);
  5. prints one JSON object on stdout and exits 0; on any failure the JSON says which step failed
     and why, and the exit code is 1.

It never touches the person's settings, history or models: everything goes to a temporary
DFLASH_STUDIO_HOME that is removed afterwards (--keep-home keeps it).

    dflash-studio --self-test                 (the bundle; installer/entry.py dispatches it)
    python -m app.selftest --models DIR       (a source checkout; DIR from installer/make_testdata.py)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

T_IMPORT = time.perf_counter()
PROMPT = "def parse(text):\n    "  # one of the tiny trained draft's training prompts (tests/fixtures/tiny_drafts.py)
CHAT_PROMPT = "Write a loop over a list."
TARGET_NAME = "tiny-qwen3-ov"
DRAFT_NAME = "tiny-draft"


def process_age_s() -> float | None:
    """Seconds since this process started (Linux: /proc), or None where that is not known."""
    try:
        stat = Path("/proc/self/stat").read_text()
        start_ticks = int(stat.rsplit(")", 1)[1].split()[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        return round(uptime - start_ticks / os.sysconf("SC_CLK_TCK"), 3)
    except (OSError, ValueError, IndexError, AttributeError):
        return None


def default_models_dir() -> Path:
    """Where the tiny self-test models are: inside the bundle, or the build folder of a checkout."""
    env = os.environ.get("DFLASH_SELFTEST_MODELS")
    if env:
        return Path(env)
    if getattr(sys, "frozen", False):
        return Path(getattr(sys, "_MEIPASS", Path(sys.executable).parent)) / "resources" / "selftest"
    return Path(__file__).resolve().parents[1] / "build" / "installer" / "testdata"


class SelfTestError(RuntimeError):
    pass


class SelfTest:
    def __init__(self, models: Path, max_new_tokens: int, timeout_s: float, platform_name: str,
                 screenshot: Path | None = None) -> None:
        self.models = models
        self.screenshot = screenshot
        self.max_new_tokens = max_new_tokens
        self.timeout_s = timeout_s
        self.platform_name = platform_name
        self.report: dict[str, Any] = {"ok": False, "steps": {}, "frozen": bool(getattr(sys, "frozen", False)),
                                       "python": platform.python_version(), "executable": sys.executable}
        self.qapp = None
        self.window = None

    # -- helpers ---------------------------------------------------------------------------------
    def step(self, name: str, fn: Callable[[], dict[str, Any] | None]) -> None:
        t0 = time.perf_counter()
        try:
            out = fn() or {}
        except BaseException as exc:  # noqa: BLE001 - every failure must end up in the report
            self.report["steps"][name] = {"ok": False, "s": round(time.perf_counter() - t0, 3)}
            self.report["failed_step"] = name
            self.report["error"] = f"{type(exc).__name__}: {exc}"
            self.report["traceback"] = traceback.format_exc()
            raise SelfTestError(name) from exc
        self.report["steps"][name] = {"ok": True, "s": round(time.perf_counter() - t0, 3), **out}

    def wait_for(self, what: str, ok, *failures) -> list:
        """Run the event loop until `ok` fires (its arguments), a failure signal fires, or time runs out."""
        from PySide6.QtCore import QEventLoop, QTimer

        got: list = []
        loop = QEventLoop()
        slots = []
        for kind, sig in [("ok", ok)] + [("failed", f) for f in failures]:
            def fired(*args, _kind=kind) -> None:
                got.append((_kind, args))
                loop.quit()
            sig.connect(fired)
            slots.append((sig, fired))
        timer = QTimer()
        timer.setSingleShot(True)
        timer.timeout.connect(loop.quit)
        timer.start(int(self.timeout_s * 1000))
        loop.exec()
        timer.stop()
        for sig, fired in slots:
            sig.disconnect(fired)
        if not got:
            raise SelfTestError(f"timed out after {self.timeout_s:.0f} s waiting for {what}")
        kind, args = got[0]
        if kind != "ok":
            err = args[-1]
            raise SelfTestError(f"{what} failed: {getattr(err, 'message', err)}\n{getattr(err, 'details', '')}")
        return list(args)

    # -- steps -----------------------------------------------------------------------------------
    def imports(self) -> dict[str, Any]:
        import openvino as ov
        import openvino_genai
        import openvino_tokenizers

        from engine.devices import list_devices

        if not openvino_tokenizers.is_openvino_tokenizers_compatible:
            raise SelfTestError("openvino_tokenizers' extension does not load into this OpenVINO")
        devices = list_devices()
        names = [d.name for d in devices]
        if "CPU" not in names:
            raise SelfTestError(f"OpenVINO lists no CPU device (got {names}): the CPU plugin is missing")
        return {"openvino": ov.get_version(), "openvino_genai": openvino_genai.__version__,
                "openvino_tokenizers": openvino_tokenizers.__version__,
                "tokenizers_extension": str(openvino_tokenizers._ext_path),
                "devices": [{"name": d.name, "full_name": d.full_name} for d in devices]}

    def window_shown(self) -> dict[str, Any]:
        from PySide6.QtCore import QLibraryInfo
        from PySide6.QtGui import QGuiApplication
        from PySide6.QtWidgets import QApplication

        from app import settings as S
        from app.worker import default_loader

        qapp = QApplication.instance() or QApplication(["dflash-studio"])
        self.qapp = qapp
        qapp.setOrganizationName(S.ORG_NAME)
        qapp.setApplicationName(S.APP_NAME)
        from app.main_window import RESOURCES, MainWindow

        style = RESOURCES / "style.qss"
        if style.exists():
            qapp.setStyleSheet(style.read_text(encoding="utf-8"))
        plugin_dir = Path(QLibraryInfo.path(QLibraryInfo.LibraryPath.PluginsPath)) / "platforms"
        plugins = sorted(p.name for p in plugin_dir.glob("*")) if plugin_dir.is_dir() else []
        w = MainWindow(settings=S.open_settings(), autoload=False,
                       loader=lambda t, d=None, device="CPU", **kw: default_loader(t, d, device=device, precision="f32"))
        self.window = w
        w.show()
        deadline = time.perf_counter() + self.timeout_s
        while not w.isVisible() or not w.windowHandle() or not w.windowHandle().isExposed():
            qapp.processEvents()
            if time.perf_counter() > deadline:
                raise SelfTestError("the main window was not shown")
            time.sleep(0.005)
        qapp.processEvents()
        age = process_age_s()
        self.report["window_shown_s"] = age if age is not None else round(time.perf_counter() - T_IMPORT, 3)
        return {"platform": QGuiApplication.platformName(), "platform_plugins": plugins,
                "icon": not w.windowIcon().isNull(), "title": w.windowTitle()}

    def testdata_info(self) -> dict[str, Any]:
        try:
            return json.loads((self.models / "testdata.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}

    def paths(self) -> tuple[Path, Path]:
        target, draft = self.models / TARGET_NAME, self.models / DRAFT_NAME
        for p in (target, draft):
            if not (p / "openvino_model.xml").is_file():
                raise SelfTestError(f"no self-test model at {p} (build it with installer/make_testdata.py)")
        return target, draft

    def pipeline(self) -> dict[str, Any]:
        from engine.config import GenerationConfig
        from engine.pipeline import SpeculativePipeline

        target, draft = self.paths()
        cfg = GenerationConfig(max_new_tokens=self.max_new_tokens, min_new_tokens=self.max_new_tokens)
        t0 = time.perf_counter()
        pipe = SpeculativePipeline.load(target, draft, device="CPU", precision="f32")
        load_s = time.perf_counter() - t0
        res = pipe.generate(PROMPT, cfg, chat=False)
        m = res.metrics
        if not res.token_ids:
            raise SelfTestError("the pipeline generated no tokens")
        if m.draft_name != pipe.draft_name or not pipe.draft_name:
            raise SelfTestError(f"the draft was not used (metrics say draft {m.draft_name!r})")
        if m.drafted_total <= 0:
            raise SelfTestError("the draft proposed no tokens")
        trained = self.testdata_info().get("draft_trained", False)
        if trained and m.accepted_total <= 0:
            raise SelfTestError("the trained tiny draft had no token accepted on its own training prompt: "
                                "the draft IR does not compute what it should in this build")
        alone = SpeculativePipeline.load(target, None, device="CPU", precision="f32").generate(PROMPT, cfg, chat=False)
        if alone.token_ids != res.token_ids:
            raise SelfTestError(f"draft and target-alone outputs differ: {res.token_ids} vs {alone.token_ids}")
        return {"target": target.name, "draft": m.draft_name, "device": pipe.device, "load_s": round(load_s, 3),
                "tokens": len(res.token_ids), "token_ids": res.token_ids, "text": res.text,
                "finish_reason": res.finish_reason, "target_steps": m.target_steps, "draft_trained": trained,
                "drafted": m.drafted_total, "accepted": m.accepted_total,
                "tokens_per_step": round(m.tokens_per_step, 3), "ttft_ms": round(m.ttft_ms, 2),
                "decode_tok_s": round(m.decode_tok_s, 1), "same_as_target_alone": True}

    def window_chat(self) -> dict[str, Any]:
        from app.chat.model import DONE

        w = self.window
        target, draft = self.paths()
        w.model_panel.set_target(str(target))
        w.model_panel.set_draft(str(draft))
        problems = w.model_panel.problems()
        if problems:
            raise SelfTestError(f"the window refuses the self-test models: {problems}")
        # Signals from the worker thread are queued: connecting right after the call misses nothing.
        w.load_models(str(target), str(draft), "CPU")
        (info,) = self.wait_for("loading the models", w.controller.loaded, w.controller.load_failed)
        if info.draft_name is None:
            raise SelfTestError(f"the window loaded no draft ({info})")
        w.gen_panel.max_new_tokens.setValue(self.max_new_tokens)
        if not w.send(CHAT_PROMPT):
            raise SelfTestError(f"the window did not send the message: {w.state_label.text()}")
        self.wait_for("the chat turn", w.controller.finished, w.controller.failed)
        reply = w.current.messages[-1]
        if reply.status != DONE or not reply.content:
            raise SelfTestError(f"the reply ended as {reply.status!r} ({reply.error or 'empty'})")
        stats = reply.stats or {}
        shot = None
        if self.screenshot is not None:
            self.qapp.processEvents()
            if not w.grab().save(str(self.screenshot)):
                raise SelfTestError(f"could not save the screenshot to {self.screenshot}")
            shot = str(self.screenshot)
        return {"screenshot": shot, "device_label": w.device_label.text(), "reply_chars": len(reply.content),
                "stats": {k: stats.get(k) for k in ("tokens", "target_steps", "tokens_per_step",
                                                     "acceptance_rate", "draft", "device", "source")}}

    def close(self) -> dict[str, Any]:
        if self.window is not None:
            self.window.close()
            self.qapp.processEvents()
            if self.window.controller.busy:
                raise SelfTestError("the engine thread is still busy after closing the window")
        return {}

    def run(self) -> int:
        try:
            self.step("window_shown", self.window_shown)  # first, as in the app: window, then the engine
            self.step("imports", self.imports)
            self.step("pipeline", self.pipeline)
            self.step("window_chat", self.window_chat)
            self.step("close", self.close)
            self.report["ok"] = True
        except SelfTestError:
            try:
                if self.window is not None:
                    self.window.close()
            except Exception:  # noqa: BLE001 - the first failure is the one reported
                pass
        self.report["total_s"] = process_age_s() or round(time.perf_counter() - T_IMPORT, 3)
        return 0 if self.report["ok"] else 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="dflash-studio --self-test", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", type=Path, default=None, help="folder with tiny-qwen3-ov/ and tiny-draft/")
    p.add_argument("--max-new-tokens", type=int, default=12)
    p.add_argument("--timeout", type=float, default=180.0, help="seconds to wait for any one step")
    p.add_argument("--platform", default="offscreen",
                   help="Qt platform plugin (default offscreen; 'xcb' under a display checks the xcb plugin)")
    p.add_argument("--home", type=Path, default=None, help="user data folder to use (default: a temporary one)")
    p.add_argument("--keep-home", action="store_true", help="do not remove the temporary user data folder")
    p.add_argument("--output", type=Path, default=None, help="also write the JSON report here")
    p.add_argument("--screenshot", type=Path, default=None, help="save a PNG of the window after the chat turn")
    args = p.parse_args(argv)

    os.environ["QT_QPA_PLATFORM"] = args.platform
    home = args.home or Path(tempfile.mkdtemp(prefix="dflash-selftest-"))
    os.environ["DFLASH_STUDIO_HOME"] = str(home)
    test = SelfTest((args.models or default_models_dir()).resolve(), args.max_new_tokens, args.timeout, args.platform,
                    args.screenshot.resolve() if args.screenshot else None)
    test.report["home"] = str(home)
    try:
        code = test.run()
    finally:
        if args.home is None and not args.keep_home:
            shutil.rmtree(home, ignore_errors=True)
    text = json.dumps(test.report, ensure_ascii=False)
    if args.output:
        args.output.write_text(text + "\n", encoding="utf-8")
    print(text, flush=True)
    if not test.report["ok"]:
        print(f"self-test FAILED at {test.report.get('failed_step')}: {test.report.get('error')}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
