"""The main window: conversations, chat, model/device pickers, generation settings, live plots.

The window binds widgets to a ChatSession (app/chat/session.py: the conversations, their streaming
replies and their files, without Qt) and sends intent to the engine through EngineController;
everything that runs a model happens on the worker thread. Several conversations can have a reply
streaming at once (the engine serves them in shared steps); each conversation has at most one.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path

import shiboken6
from PySide6.QtCore import QSettings, QSize, Qt, QTimer, QUrl
from PySide6.QtGui import QAction, QCloseEvent, QDesktopServices, QIcon, QKeySequence, QShortcut
from PySide6.QtWidgets import (QCheckBox, QDockWidget, QFrame, QHBoxLayout, QLabel, QListWidgetItem, QMainWindow,
                               QMessageBox, QPushButton, QScrollArea, QSizePolicy, QTabWidget, QVBoxLayout, QWidget)

from app import logs
from app import settings as S
from app.chat.conversation_list import ConversationList
from app.chat.input import ChatInput
from app.chat.model import Conversation, Message
from app.chat.session import LATE, TEXT, ChatSession
from app.chat.store import HistoryStore
from app.chat.view import DRAFT_BG, ChatView
from app.compare.panel import ComparePanel
from app.generation_panel import GenerationPanel
from app.models.catalog_actions import install_catalog_actions
from app.models.child_process import show_one
from app.models.import_action import install_import_action
from app.models.train_dialog import install_train_action
from app.models.pickers import ModelPanel, default_target_ready
from app.models.prepare import PrepareDialog
from app.models.validation import DraftValidator
from app.plots.live import LivePlots
from app.qt_tracking import TrackedTimer
from app.server.panel import ServerPanel
from app.widgets import Banner, ElidedLabel
from app.worker import EngineController, EngineInfo, ErrorInfo, FinishInfo, GenerateRequest, Loader
from engine import paths
from engine.devices import DeviceInfo
from engine.draft_policy import ADAPTIVE
from engine.generation_defaults import recommended_decoding
from engine.models.properties import is_lossless, precision_label

RESOURCES = Path(__file__).resolve().parents[1] / "resources"
TEXT_FLUSH_MS = 33  # fastest text refresh (~30 Hz)
MAX_TEXT_FLUSH_MS = 200
TEXT_SHARE = 0.25  # inserting text may use at most ~this share of the GUI thread
AUTOSAVE_MS = 2000  # a streaming reply is saved this often: a kill loses at most ~2 s of its text
log = logging.getLogger("dflash.window")


class MainWindow(QMainWindow):
    def __init__(self, settings: QSettings | None = None, loader: Loader | None = None,
                 devices: list[DeviceInfo] | None = None, history_root: Path | None = None,
                 draft_validator: DraftValidator | None = None, autoload: bool = True,
                 prepare_command: tuple[str, list[str]] | None = None,
                 flush_interval_s: float = 0.033, engine_label: str = "",
                 bench_machine: dict[str, str] | None = None, read_only: bool = False,
                 lock_holder: str = "") -> None:
        super().__init__()
        self.setWindowTitle("DFlash Studio")
        self.setObjectName("mainWindow")
        icon = RESOURCES / "icons" / "dflash.svg"
        if icon.exists():
            self.setWindowIcon(QIcon(str(icon)))
        self.settings = settings or S.open_settings()
        self.log_path = logs.setup_logging()
        self.read_only = read_only  # another window owns this data folder: nothing here is saved
        self.lock_holder = lock_holder
        self.session = ChatSession(HistoryStore(history_root or paths.history_dir(), read_only=read_only), read_only)
        self.session.on_error = lambda title, text: self.show_error(ErrorInfo(title, text))
        self.session.on_notice = lambda title, text: self.notice_banner.show_message(title, text)
        self.session.on_list_changed = self._fill_conv_list
        self.controller = EngineController(loader, flush_interval_s=flush_interval_s, parent=self)
        self.prepare_command = prepare_command
        self.engine_label = engine_label  # e.g. "demo engine" when running the fake one
        self.engine_info: EngineInfo | None = None
        self._closing = False
        self._closed = False
        self._prepare_dialog: PrepareDialog | None = None
        # Streamed text waits in the session until the next flush; the flush interval adapts to how long
        # inserting took (qtconsole's approach), so long replies never starve the event loop.
        self.text_interval_ms = TEXT_FLUSH_MS
        self._text_timer = TrackedTimer(self)
        self._text_timer.setSingleShot(True)
        self._text_timer.timeout.connect(self._flush_text)
        # Streaming replies are saved every AUTOSAVE_MS (their conversations, once they got new text).
        self._autosave_timer = TrackedTimer(self)
        self._autosave_timer.setInterval(AUTOSAVE_MS)
        self._autosave_timer.timeout.connect(self._autosave)

        self._build_central()
        self._build_docks(devices, draft_validator)
        self._build_compare(bench_machine)
        self._build_menus()
        self._build_status()
        self._wire()
        self._restore_window()
        self._load_history()
        self._update_actions()
        if autoload:
            QTimer.singleShot(0, self, self.autoload)

    @property
    def current(self) -> Conversation | None:
        """The conversation on screen."""
        return self.session.current

    @property
    def conversations(self) -> list[Conversation]:
        return self.session.conversations

    # -- construction ----------------------------------------------------------------------------
    def _build_central(self) -> None:
        central = QWidget()
        v = QVBoxLayout(central)
        v.setContentsMargins(6, 6, 6, 6)
        v.setSpacing(6)
        self.error_banner = Banner("error")
        self.notice_banner = Banner("notice")
        self.readonly_banner = Banner("notice")  # its own strip: it stays while other notices come and go
        self.readonly_banner.setObjectName("readOnlyBanner")
        v.addWidget(self.readonly_banner)
        v.addWidget(self.error_banner)
        v.addWidget(self.notice_banner)

        legend = QHBoxLayout()
        legend.setSpacing(8)
        self.mark_switch = QCheckBox("Mark accepted draft tokens")
        self.mark_switch.setObjectName("markSwitch")
        self.mark_switch.setChecked(S.get_bool(self.settings, S.K_MARK_DRAFT, True))
        legend.addWidget(self.mark_switch)
        self.legend_draft = QLabel(" accepted from the draft ")
        self.legend_draft.setObjectName("legendDraft")
        self.legend_draft.setStyleSheet(f"background:{DRAFT_BG.name()}; color:#0b3d17; border-radius:3px;")
        self.legend_target = QLabel(" produced by the target ")
        self.legend_target.setObjectName("legendTarget")
        self.legend_target.setStyleSheet("background:#ffffff; border:1px solid #d0d5dd; border-radius:3px;")
        legend.addWidget(self.legend_draft)
        legend.addWidget(self.legend_target)
        self.conv_title = ElidedLabel()
        self.conv_title.setObjectName("convTitle")
        legend.addWidget(self.conv_title, 1)
        v.addLayout(legend)

        self.chat = ChatView()
        self.chat.set_mark_draft(self.mark_switch.isChecked())
        v.addWidget(self.chat, 1)

        # Why a message was not sent, right above the box it stays in (the status bar is easy to miss).
        self.input_notice = QLabel()
        self.input_notice.setObjectName("inputNotice")
        self.input_notice.setWordWrap(True)
        self.input_notice.setStyleSheet("QLabel#inputNotice { background:#fffaeb; color:#93370d; border:1px solid "
                                        "#fec84b; border-radius:4px; padding:4px 8px; }")
        self.input_notice.hide()
        v.addWidget(self.input_notice)
        row = QHBoxLayout()
        self.input = ChatInput()
        row.addWidget(self.input, 1)
        buttons = QVBoxLayout()
        self.send_button = QPushButton("Send")
        self.send_button.setObjectName("sendButton")
        self.send_button.setToolTip("Send (Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setObjectName("stopButton")
        self.stop_button.setToolTip("Stop generating (Esc)")
        for b in (self.send_button, self.stop_button):
            b.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Expanding)
            b.setMinimumWidth(84)
            buttons.addWidget(b)
        row.addLayout(buttons)
        v.addLayout(row)
        # Chat and Compare share the centre as tabs; the live plots dock belongs to the chat.
        self.tabs = QTabWidget()
        self.tabs.setObjectName("centralTabs")
        self.tabs.setDocumentMode(True)
        self.tabs.addTab(central, "Chat")
        self.setCentralWidget(self.tabs)
        self._plots_hidden_by_tab = False
        self._hidden_by_tab: list[QDockWidget] = []

    def _build_compare(self, machine: dict[str, str] | None) -> None:
        self.compare = ComparePanel(self.controller, self.model_panel, self.settings, machine=machine)
        self.tabs.addTab(self.compare, "Compare")
        self.tabs.setTabToolTip(1, "Run the same prompts through the target alone and each draft: "
                                   "tokens per step, tok/s, speedup")
        self.tabs.currentChanged.connect(self._tab_changed)
        self.compare.run_started.connect(self._update_actions)
        self.compare.run_finished.connect(lambda _r: self._update_actions())

    def _tab_changed(self, index: int) -> None:
        """Conversations and live plots belong to the chat: they step aside while Compare is shown (its
        table and charts need the room) and come back with the chat. The Session panel stays: the
        comparison runs on its target and device."""
        if index == 1:
            self._hidden_by_tab = [d for d in (self.conv_dock, self.plots_dock) if d.isVisible()]
            for d in self._hidden_by_tab:
                d.hide()
            self._plots_hidden_by_tab = bool(self._hidden_by_tab)
        elif self._plots_hidden_by_tab:
            self._plots_hidden_by_tab = False
            for d in self._hidden_by_tab:
                d.show()
            self._hidden_by_tab = []

    def _build_docks(self, devices: list[DeviceInfo] | None, validator: DraftValidator | None) -> None:
        self.setDockOptions(QMainWindow.DockOption.AnimatedDocks | QMainWindow.DockOption.AllowTabbedDocks)
        # Side panels run the full height; the plots sit under the chat.
        self.setCorner(Qt.Corner.BottomLeftCorner, Qt.DockWidgetArea.LeftDockWidgetArea)
        self.setCorner(Qt.Corner.BottomRightCorner, Qt.DockWidgetArea.RightDockWidgetArea)
        # Conversations (left)
        conv_w = QWidget()
        cv = QVBoxLayout(conv_w)
        cv.setContentsMargins(4, 4, 4, 4)
        self.conv_list = ConversationList()
        cv.addWidget(self.conv_list, 1)
        hb = QHBoxLayout()
        self.new_button = QPushButton("New")
        self.new_button.setToolTip("New conversation (Ctrl+N)")
        self.delete_button = QPushButton("Delete")
        hb.addWidget(self.new_button)
        hb.addWidget(self.delete_button)
        cv.addLayout(hb)
        self.conv_dock = self._dock("Conversations", "conversationsDock", conv_w, Qt.DockWidgetArea.LeftDockWidgetArea)

        # Models, device and generation settings (right)
        side = QWidget()
        sv = QVBoxLayout(side)
        sv.setContentsMargins(4, 4, 4, 4)
        self.model_panel = ModelPanel(self.settings, devices=devices, validator=validator)
        self.gen_panel = GenerationPanel(self.settings)
        sv.addWidget(self.model_panel)
        sv.addWidget(self.gen_panel)
        sv.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setWidget(side)
        scroll.setMinimumWidth(330)
        self.side_dock = self._dock("Session", "sessionDock", scroll, Qt.DockWidgetArea.RightDockWidgetArea)

        # Live plots (bottom)
        self.plots = LivePlots()
        self.plots_dock = self._dock("Live plots", "plotsDock", self.plots, Qt.DockWidgetArea.BottomDockWidgetArea)

        # The local OpenAI-compatible server (docs/serving.md), a tab beside the Session panel
        self.server_panel = ServerPanel(self.controller, self.settings)
        self.server_dock = self._dock("Server", "serverDock", self.server_panel, Qt.DockWidgetArea.RightDockWidgetArea)
        self.tabifyDockWidget(self.side_dock, self.server_dock)
        self.side_dock.raise_()

    def _dock(self, title: str, name: str, w: QWidget, area: Qt.DockWidgetArea) -> QDockWidget:
        d = QDockWidget(title, self)
        d.setObjectName(name)
        d.setWidget(w)
        d.setFeatures(QDockWidget.DockWidgetFeature.DockWidgetMovable
                      | QDockWidget.DockWidgetFeature.DockWidgetFloatable
                      | QDockWidget.DockWidgetFeature.DockWidgetClosable)
        self.addDockWidget(area, d)
        return d

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        self.act_new = QAction("&New conversation", self, shortcut=QKeySequence.StandardKey.New)
        self.act_open_target = QAction("Choose &target folder…", self)
        self.act_open_draft = QAction("Choose &draft folder…", self)
        self.act_prepare = QAction("&Prepare the default model…", self)
        self.act_quit = QAction("&Quit", self, shortcut=QKeySequence.StandardKey.Quit)
        for a in (self.act_new, self.act_open_target, self.act_open_draft, self.act_prepare):
            m.addAction(a)
        self.act_import_hf = install_import_action(self)  # File → Import Hugging Face folder… (docs/import.md)
        install_train_action(self)  # File → Train a draft… (docs/training.md)
        m.addSeparator()
        m.addAction(self.act_quit)
        m = self.menuBar().addMenu("&View")
        self.act_mark = QAction("&Mark accepted draft tokens", self, checkable=True)
        self.act_mark.setChecked(self.mark_switch.isChecked())
        m.addAction(self.act_mark)
        self.act_chat_tab = QAction("&Chat", self, shortcut=QKeySequence("Ctrl+1"))
        self.act_compare_tab = QAction("C&ompare (target alone vs drafts)", self, shortcut=QKeySequence("Ctrl+2"))
        self.act_chat_tab.triggered.connect(lambda: self.tabs.setCurrentIndex(0))
        self.act_compare_tab.triggered.connect(lambda: self.tabs.setCurrentIndex(1))
        m.addAction(self.act_chat_tab)
        m.addAction(self.act_compare_tab)
        m.addSeparator()
        for d in (self.conv_dock, self.side_dock, self.plots_dock, self.server_dock):
            m.addAction(d.toggleViewAction())
        m.addSeparator()
        self.act_clear_cache = QAction("Clear prefix cache", self)  # its text shows the memory it holds
        self.act_clear_cache.setToolTip("Forget the KV of earlier prompts that a next turn would reuse")
        self.act_clear_cache.triggered.connect(self.controller.clear_prefix_cache)
        m.addAction(self.act_clear_cache)
        m = self.menuBar().addMenu("&Help")
        where = str(self.log_path) if self.log_path else "not written (the data folder is not writable)"
        self.act_log_file = QAction(f"Log file: {where}", self)
        self.act_log_file.setToolTip("Copies the path: attach this file when you report a problem")
        self.act_log_file.triggered.connect(self._copy_log_path)
        self.act_open_log = QAction("Open &log folder", self)
        self.act_open_log.setEnabled(self.log_path is not None)
        self.act_open_log.triggered.connect(self.open_log_folder)
        m.addAction(self.act_log_file)
        m.addAction(self.act_open_log)
        m.addSeparator()
        self.act_about = QAction("&About DFlash Studio", self)
        m.addAction(self.act_about)
        self.stop_shortcut = QShortcut(QKeySequence(Qt.Key.Key_Escape), self)
        self.stop_shortcut.setContext(Qt.ShortcutContext.WindowShortcut)

    def _build_status(self) -> None:
        self.device_label = QLabel("No model loaded")
        self.device_label.setObjectName("deviceLabel")
        self.state_label = QLabel("")
        self.state_label.setObjectName("stateLabel")
        self.statusBar().addWidget(self.state_label, 1)
        self.statusBar().addPermanentWidget(self.device_label)

    def _wire(self) -> None:
        c = self.controller
        c.loaded.connect(self._on_loaded)
        c.load_failed.connect(self._on_load_failed)
        c.events_ready.connect(self._on_events)
        c.finished.connect(self._on_finished)
        c.failed.connect(self._on_failed)
        c.cache_cleared.connect(self._on_cache_cleared)
        c.busy_changed.connect(lambda _b: self._update_actions())
        self.input.submitted.connect(self.send)
        self.send_button.clicked.connect(self.input.submit)
        self.stop_button.clicked.connect(self.stop)
        self.stop_shortcut.activated.connect(self.stop)
        self.mark_switch.toggled.connect(self._set_mark)
        self.act_mark.toggled.connect(self._set_mark)
        self.new_button.clicked.connect(self.new_conversation)
        self.act_new.triggered.connect(self.new_conversation)
        self.delete_button.clicked.connect(self.delete_current)
        self.conv_list.currentItemChanged.connect(self._on_conv_selected)
        self.conv_list.itemChanged.connect(self._on_conv_renamed)
        self.model_panel.load_requested.connect(self.load_models)
        self.model_panel.prepare_requested.connect(self.prepare_default)
        install_catalog_actions(self)  # the catalogue's Prepare / Remove buttons in the target picker
        self.model_panel.selection_changed.connect(self._update_actions)
        self.act_open_target.triggered.connect(self.model_panel._browse_target)
        self.act_open_draft.triggered.connect(self.model_panel._browse_draft)
        self.act_prepare.triggered.connect(self.prepare_default)
        self.act_quit.triggered.connect(self.close)
        self.act_about.triggered.connect(self._about)
        self.gen_panel.system_prompt_edited.connect(self._on_system_prompt)

    # -- window state ----------------------------------------------------------------------------
    def _restore_window(self) -> None:
        geo = S.get_bytes(self.settings, S.K_GEOMETRY)
        if geo is None or not self.restoreGeometry(geo):
            self.resize(QSize(1440, 900))
        state = S.get_bytes(self.settings, S.K_STATE)
        if state is not None:
            self.restoreState(state)
        else:
            self.resizeDocks([self.conv_dock], [220], Qt.Orientation.Horizontal)
            self.resizeDocks([self.side_dock], [360], Qt.Orientation.Horizontal)
            self.resizeDocks([self.plots_dock], [250], Qt.Orientation.Vertical)

    def _save_window(self) -> None:
        if self._plots_hidden_by_tab:  # remember the docks as the chat shows them
            self.tabs.setCurrentIndex(0)
        self.settings.setValue(S.K_GEOMETRY, self.saveGeometry())
        self.settings.setValue(S.K_STATE, self.saveState())
        self.settings.sync()

    # -- history ---------------------------------------------------------------------------------
    def _load_history(self) -> None:
        if self.read_only:
            self.readonly_banner.show_message(
                "Read-only: DFlash Studio is already open for this data folder",
                f"{paths.user_data_dir()} is in use by {self.lock_holder or 'another window'}, which did not "
                "answer. This window shows the conversations but saves nothing (chats here are lost when "
                "it closes). Close it and use the other window, or close that one and start again.")
        shown = self.session.load(S.get_str(self.settings, S.K_LAST_CONVERSATION),
                                  S.get_str(self.settings, S.K_SYSTEM_PROMPT))
        corrupt = self.session.corrupt
        if corrupt:
            lines = []
            for c in corrupt:
                where = f"moved to {c.moved_to}" if c.moved_to else "left where it is"
                lines.append(f"{c.path.name}: {c.reason} ({where})")
            n = len(corrupt)
            self.notice_banner.show_message(
                f"{n} conversation file{'s' if n != 1 else ''} could not be read",
                "Set aside, not deleted: " + "; ".join(lines),
                details="\n".join(f"{c.path} -> {c.moved_to}: {c.reason}" for c in corrupt),
            )
        self._fill_conv_list()
        self.select_conversation(shown)

    def _make_conversation(self) -> Conversation:
        conv = self.session.new_conversation(S.get_str(self.settings, S.K_SYSTEM_PROMPT))
        self._fill_conv_list()
        return conv

    def _fill_conv_list(self) -> None:
        self.conv_list.fill(self.session.conversations, self.current, self.session.streaming_ids())

    def select_conversation(self, conv: Conversation) -> None:
        self.input_notice.hide()  # it was about the conversation that was on screen
        if self._text_timer.isActive():
            self._flush_text()  # the text that arrived goes to the view it was meant for first
        self.session.current = conv
        self.settings.setValue(S.K_LAST_CONVERSATION, conv.id)
        self.chat.set_conversation(conv)
        self.gen_panel.set_system_prompt(conv.system_prompt)
        self.conv_title.setText(conv.title)
        self.conv_list.select(conv)
        tag = self.session.plotted_reply(conv)  # its streaming reply, else its latest one from this session
        if tag is not None:
            self._follow(tag)
        self._update_actions()

    def new_conversation(self) -> None:
        if self.current is not None and not self.current.messages:
            self.input.setFocus()
            return  # the current one is still empty: use it
        self.select_conversation(self._make_conversation())
        self.input.setFocus()

    def delete_current(self, confirm: bool = True) -> None:
        conv = self.current
        if conv is None:
            return
        if confirm and conv.messages:
            ans = QMessageBox.question(self, "Delete conversation",
                                       f"Delete “{conv.title}” and its {len(conv.messages)} messages?")
            if ans != QMessageBox.StandardButton.Yes:
                return
        for tag in self.session.delete(conv):
            self.controller.cancel(tag)
        self._update_stream_marks()
        if not self.session.conversations:
            self._make_conversation()
        self._fill_conv_list()
        self.select_conversation(self.session.conversations[0])

    def _on_conv_selected(self, item: QListWidgetItem | None, _prev=None) -> None:
        if item is None:
            return
        conv = self.session.find(item.data(Qt.ItemDataRole.UserRole))
        if conv is not None and conv is not self.current:
            self.select_conversation(conv)

    def _on_conv_renamed(self, item: QListWidgetItem) -> None:
        conv = self.session.find(item.data(Qt.ItemDataRole.UserRole))
        if conv is not None and self.session.rename(conv, item.text()) and conv is self.current:
            self.conv_title.setText(conv.title)

    def _on_system_prompt(self, text: str) -> None:
        if self.current is not None:
            self.current.system_prompt = text
            self.settings.setValue(S.K_SYSTEM_PROMPT, text)

    def _autosave(self) -> None:
        """Save the conversations whose streaming replies got text since their last save."""
        self.session.autosave()
        if not self.session.live_tags():
            self._autosave_timer.stop()

    # -- help ------------------------------------------------------------------------------------
    def _copy_log_path(self) -> None:
        if self.log_path is not None:
            from PySide6.QtWidgets import QApplication

            QApplication.clipboard().setText(str(self.log_path))
            self.state_label.setText(f"Copied the log file's path: {self.log_path}")

    def open_log_folder(self) -> bool:
        if self.log_path is None:
            return False
        return QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.log_path.parent)))

    def bring_forward(self) -> None:
        """Another launch for this data folder asked for this window (app/single_instance.py)."""
        if self.isMinimized():
            self.showNormal()
        self.show()
        self.raise_()
        self.activateWindow()
        self.state_label.setText("DFlash Studio was started again: this window is the one for your data folder.")

    # -- models ----------------------------------------------------------------------------------
    def autoload(self) -> None:
        """Load what was used last time, or the embedded default (and its default draft)."""
        if self._closing:
            return
        mp = self.model_panel
        last_t = S.get_str(self.settings, S.K_LAST_TARGET)
        if last_t and Path(last_t).is_dir():
            mp.set_target(last_t)
        elif default_target_ready():
            mp.set_target(str(paths.default_target_dir()))
        else:
            self.notice_banner.show_message(
                "The embedded default model is not prepared yet",
                "DFlash Studio converts SmolLM2-135M-Instruct to OpenVINO once, into your user data "
                "folder. Prepare it now, or choose a target folder in the Session panel.",
                action=("Prepare now", self.prepare_default))
            return
        last_d = S.get_str(self.settings, S.K_LAST_DRAFT, "-")
        if last_d != "-" and (not last_d or Path(last_d).is_dir()):
            mp.set_draft(last_d or None)
        else:
            mp.set_draft(mp.preferred_draft())
        if mp.draft_fit_reasons():
            mp.set_draft(None)
        last_dev = S.get_str(self.settings, S.K_LAST_DEVICE)
        if last_dev:
            mp.set_device(last_dev)
        if not mp.problems():
            self.load_models(mp.target_dir(), mp.draft_dir(), mp.device())

    def load_models(self, target: str, draft: str | None, device: str) -> None:
        if self._closing:
            return
        if self.controller.generating:
            self.stop_all()  # the replies of every conversation: the engine they run on goes away
        self.state_label.setText(f"Loading {Path(target).name}" + (f" + {Path(draft).name}" if draft else "")
                                 + f" on {device}…")
        self.model_panel.set_loading("Loading…")
        self.controller.load(target, draft, device)
        self._update_actions()

    def _on_loaded(self, info: EngineInfo) -> None:
        if self._closing:
            return
        self.engine_info = info
        self.settings.setValue(S.K_LAST_TARGET, info.target_dir)
        self.settings.setValue(S.K_LAST_DRAFT, info.draft_dir or "")
        self.settings.setValue(S.K_LAST_DEVICE, info.requested_device)
        self.gen_panel.set_chat_template(info.has_chat_template)
        self.gen_panel.set_recommended(recommended_decoding(info.target_dir))
        d = info.draft
        if d is None:
            self.gen_panel.set_draft_loaded(False)
        else:
            self.gen_panel.set_draft_loaded(True, d.max_candidates, d.variant, d.has_head, d.default_top_k,
                                            d.default_candidates, d.candidates_for(ADAPTIVE))
        self.state_label.setText(f"Ready ({info.load_s:.1f} s to load).")
        label = (f"{info.target_name}" + (f" + {info.draft_name}" if info.draft_name else " (no draft)")
                 + f" on {info.device}")
        self.model_panel.set_applied(info.target_dir, info.draft_dir, info.requested_device, label)
        log.info("loaded %s (asked for %s) in %.1f s", label, info.requested_device, info.load_s)
        if "Load a model" in self.input_notice.text() or "finish loading" in self.input_notice.text():
            self.input_notice.hide()
        self.error_banner.hide()
        if self.notice_banner.isVisible() and not self.session.corrupt:
            self.notice_banner.hide()
        self._update_device_label()
        self._update_actions()
        self.input.setFocus()

    def _update_device_label(self) -> None:
        info = self.engine_info
        if info is None:
            self.device_label.setText("No model loaded")
            return
        d = self.model_panel.device_info(info.device)
        dev = d.label if d else info.device
        text = f"Device in use: {dev}"
        if info.device.upper() != info.requested_device.upper():
            text += f" (asked for {info.requested_device}; the engine fell back)"
        text += f"  ·  {info.target_name}" + (f" + {info.draft_name}" if info.draft_name else " (no draft)")
        if self.engine_label:
            text += f"  ·  {self.engine_label}"
        text += "  ·  default precision" + (", lossless" if is_lossless(info.device, "default") else "")
        self.device_label.setToolTip(precision_label(info.device, "default"))
        self.device_label.setText(text)

    def _on_load_failed(self, err: ErrorInfo) -> None:
        if self._closing:
            return
        log.error("loading failed: %s\n%s", err.message, err.details)
        self.state_label.setText("Loading failed." + (" The previous model is still loaded." if self.engine_info else ""))
        self.model_panel.set_load_failed()
        self.show_error(err)
        self._update_actions()

    def prepare_default(self) -> None:
        def make() -> PrepareDialog:
            dlg = PrepareDialog(self.prepare_command, self)
            dlg.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
            dlg.succeeded.connect(self._prepared)
            return dlg

        dlg, new = show_one(self, "_prepare_dialog", make)
        if new:
            dlg.start()

    def _prepared(self) -> None:
        self.notice_banner.hide()
        self.model_panel.refresh_targets()
        self.model_panel.set_target(str(paths.default_target_dir()))
        self.autoload()

    # -- chat ------------------------------------------------------------------------------------
    def send(self, text: str) -> bool:
        """Send `text` as the next user message. False (and a reason shown) when it cannot go."""
        text = text.rstrip()
        if not text.strip():
            return False
        if self.engine_info is None:
            return self._not_sent("Load a model first (Session panel → Load).")
        if self.controller.loading:
            return self._not_sent("Wait for the model to finish loading.")
        if self.current is not None and self.session.live_tag(self.current) is not None:
            return self._not_sent("This conversation's reply is still streaming: wait for it or press Esc "
                                  "to stop it (other conversations can chat meanwhile). Your message stays here.")
        if self.controller.benchmarking:
            return self._not_sent("A comparison run is using the engine (Compare tab): cancel it there or "
                                  "wait for it; your message stays here.")
        info = self.engine_info
        try:
            config = self.gen_panel.config(with_draft=info.draft is not None)
        except ValueError as e:
            self._bad_setting(str(e))
            return False
        conv = self.current or self._make_conversation()
        turn = self.session.start_turn(conv, text, info.has_chat_template, on_added=self.chat.message_added)
        self.input.clear()
        self._refresh_title(conv)
        self._follow(turn.tag)
        self._update_stream_marks()
        self._show_streaming_state()
        self.controller.generate(GenerateRequest(turn.tag, turn.prompt, config, turn.chat))
        self.input_notice.hide()
        self._autosave_timer.start()
        self._update_actions()
        return True

    def _not_sent(self, why: str) -> bool:
        """Say why a message was not sent where the person looks: right above the box it stays in."""
        self.input_notice.setText(why)
        self.input_notice.show()
        self.state_label.setText(why)
        return False

    def _show_streaming_state(self) -> None:
        n = len(self.session.live_tags())
        if n:
            self.state_label.setText("Generating…" if n == 1 else f"Generating {n} replies…")

    def _follow(self, tag: str) -> None:
        """Show `tag`'s steps in the live plots (replaying what it did so far)."""
        conv, events = self.session.events.get(tag, (None, []))
        if conv is not None:
            self.plots_dock.setWindowTitle(f"Live plots: {conv.title}")
        if tag == self.session.plot_tag:
            return
        self.session.plot_tag = tag
        self.plots.reset()
        self.plots.add_events(events)
        self.plots.stop()  # draws the replay now
        if self.session.is_live(tag):
            self.plots.start()

    def _update_stream_marks(self) -> None:
        """A dot beside every conversation with a reply streaming."""
        self.conv_list.mark_streaming(self.session.streaming_ids())

    def stop(self) -> None:
        """Stop the shown conversation's streaming reply now (Esc, Stop): the text stops at once, the
        engine cancels it before its next step; replies of other conversations go on."""
        tag = self.session.live_tag(self.current) if self.current is not None else None
        if tag is not None:
            self._stop([tag])

    def stop_all(self) -> None:
        """Stop every streaming reply (loading another model)."""
        self._stop(self.session.live_tags())

    def _stop(self, live: list[str]) -> None:
        if not live:
            return
        self._flush_text()  # what arrived before the stop is shown; nothing after it
        for tag in live:
            self.controller.cancel(tag)
        for _conv, msg in self.session.stop(live):
            self.chat.message_changed(msg)
        if self.session.plot_tag in live:
            self.plots.stop()
        self._update_stream_marks()
        n = len(self.session.live_tags())
        self.state_label.setText("Stopped." + (f" {n} repl{'y' if n == 1 else 'ies'} in other conversations still "
                                               "streaming." if n else ""))
        self._update_actions()

    def _on_events(self, tag: str, events: list) -> None:
        if self._closing:
            return
        what = self.session.add_events(tag, events)
        if what == TEXT and not self._text_timer.isActive():
            self._text_timer.start(self.text_interval_ms)
        if tag == self.session.plot_tag and what != "ignored":
            self.plots.add_events(events)
            if what == LATE:
                self.plots.stop()

    def _flush_text(self) -> None:
        """Show the text that arrived since the last flush (one edit block per message)."""
        self._text_timer.stop()
        pending = self.session.take_pending()
        if not pending:
            return
        t0 = time.perf_counter()
        for msg, pieces in pending:
            self.chat.pieces_added(msg, pieces)  # a no-op unless its conversation is shown
        cost_ms = (time.perf_counter() - t0) * 1000.0
        self.text_interval_ms = int(min(MAX_TEXT_FLUSH_MS, max(TEXT_FLUSH_MS, cost_ms / TEXT_SHARE)))

    def _on_finished(self, tag: str, fin: FinishInfo) -> None:
        # Show what is pending first: a redraw of the shown conversation (message_changed) draws its
        # messages from the model, and pending text drawn after that would appear twice.
        self._flush_text()
        if self._closing:
            return
        ended = self.session.finish(tag, fin.reason, fin.stats)
        if ended is None:
            return
        conv, msg, was_stopped = ended
        if (fin.stats or {}).get("prefix_cache_mb") is not None:
            self.act_clear_cache.setText(f"Clear prefix cache ({fin.stats['prefix_cache_mb']:.1f} MB)")
        self.chat.message_changed(msg)  # drawn now when its conversation is shown, else when it is next
        self._stream_ended(tag)
        if not was_stopped:
            n = len(self.session.live_tags())
            done = "Done." if fin.reason != "length" else "Done (max new tokens reached)."
            if conv is not self.current:
                done = f"“{conv.title}”: " + done[0].lower() + done[1:]
            self.state_label.setText(done + (f" {n} repl{'y' if n == 1 else 'ies'} still streaming." if n else ""))
        self._update_actions()

    def _on_cache_cleared(self, freed: int) -> None:
        self.act_clear_cache.setText("Clear prefix cache (0.0 MB)")
        self.state_label.setText(f"Prefix cache cleared ({freed / (1 << 20):.1f} MB).")

    def _stream_ended(self, tag: str) -> None:
        """The plots stop with the reply they follow (keeping its picture); the dots follow the streams."""
        if tag == self.session.plot_tag:
            self.plots.stop()
        self._update_stream_marks()
        if not self.session.live_tags():
            self._autosave()  # saves what is left and stops the timer
        if (self.current is not None and self.session.live_tag(self.current) is None
                and "streaming" in self.input_notice.text()):
            self.input_notice.hide()

    def _bad_setting(self, message: str) -> None:
        """A ValueError about a setting: shown under its field in the Generation panel (else a banner)."""
        if self.gen_panel.show_error(message):
            self.side_dock.show()
            self.state_label.setText("Not sent: a generation setting needs a change (see the Generation "
                                     "panel). Your message is still in the box.")
        else:
            self.show_error(ErrorInfo("Bad setting", message))

    def _refused(self, conv: Conversation, reply: Message, err: ErrorInfo) -> None:
        """The engine refused the request before any step: take the turn back, nothing typed is lost."""
        text = self.session.take_back(conv, reply)
        self._refresh_title(conv)
        if conv is self.current:
            self.chat.set_conversation(conv)
        elif any(c is conv for c in self.session.conversations) and not self.input.toPlainText().strip():
            # Refused within one step of sending, but the person already switched: go back to where
            # the text belongs, so the restored message is sent there once the setting is changed.
            self.select_conversation(conv)
        if text and not self.input.toPlainText().strip():
            self.input.setPlainText(text)
        self._stream_ended(reply.id)
        self._bad_setting(err.message)
        self._update_actions()

    def _on_failed(self, tag: str, err: ErrorInfo) -> None:
        self._flush_text()  # as in _on_finished
        if self._closing:
            self.session.end(tag)
            return
        if err.stage == "start" and err.kind == "ValueError":
            entry = self.session.end(tag)
            if entry is not None:
                log.info("the engine refused a request: %s", err.message)
                self._refused(entry[0], entry[1], err)
                return
        log.error("a reply failed: %s\n%s", err.message, err.details)
        ended = self.session.fail(tag, err.message)
        if ended is not None:
            self.chat.message_changed(ended[1])
        self._stream_ended(tag)
        self.state_label.setText("The engine reported an error; the chat is intact.")
        self.show_error(err)
        self._update_actions()

    def show_error(self, err: ErrorInfo) -> None:
        self.error_banner.show_message(err.title, err.message, err.details)

    def _set_mark(self, on: bool) -> None:
        for w in (self.mark_switch, self.act_mark):
            if w.isChecked() != on:
                w.blockSignals(True)
                w.setChecked(on)
                w.blockSignals(False)
        self._flush_text()  # the view is redrawn from the model
        self.chat.set_mark_draft(on)
        self.legend_draft.setEnabled(on)
        self.settings.setValue(S.K_MARK_DRAFT, on)

    def _refresh_title(self, conv: Conversation) -> None:
        self.conv_list.set_title(conv)
        if conv is self.current:
            self.conv_title.setText(conv.title)

    def _update_actions(self) -> None:
        # Send and Stop are about the conversation on screen: others may stream meanwhile.
        streaming = self.current is not None and self.session.live_tag(self.current) is not None
        ready = self.engine_info is not None and not self.controller.loading
        self.send_button.setEnabled(ready and not streaming and not self.controller.benchmarking)
        self.stop_button.setEnabled(streaming)
        self.model_panel.load_button.setEnabled(not self.model_panel.problems() and not self.controller.loading)
        if self.engine_info is None and not self.controller.loading:
            hint = "Load a model in the Session panel, then type a message here."
        else:
            hint = "Type a message. Enter sends, Shift+Enter adds a line, Esc stops."
        if self.input.placeholderText() != hint:
            self.input.setPlaceholderText(hint)
            self.input.viewport().update()  # an empty box does not repaint its placeholder by itself

    def _about(self) -> None:
        QMessageBox.about(self, "About DFlash Studio",
                          "DFlash Studio runs block speculative decoding (DFlash / DSpark drafts verified "
                          "by a target LLM) on OpenVINO and shows what it does: accepted draft tokens "
                          "are marked in the chat and the plots show tokens per step as they happen.")

    # -- closing ---------------------------------------------------------------------------------
    def closeEvent(self, e: QCloseEvent) -> None:  # noqa: N802
        if self._closed:
            e.accept()
            return
        self._closing = True
        self._save_window()
        self.plots.stop()
        self._text_timer.stop()
        self._autosave_timer.stop()
        if self._prepare_dialog is not None and shiboken6.isValid(self._prepare_dialog):
            self._prepare_dialog.stop()
        self.hide()
        self.server_panel.stop()  # clients' running requests finish (a few seconds) before the engine stops
        self.controller.shutdown()  # cancels the running request and waits for the thread
        self.session.close()  # streaming replies end as cancelled; every touched conversation is saved
        self._closed = True
        e.accept()

