"""engine.devices with a fake OpenVINO core, and the device picker it fills."""
from __future__ import annotations

import pytest
from PySide6.QtGui import QStandardItemModel

from engine.devices import NPU_NOTICE, check_device, describe, list_devices
from engine.errors import DeviceError

SEED_NOTICE = "DFlash runs on the continuous batching backend only, which NPU pipelines do not use"


def test_fake_core_lists_cpu_gpus_and_npu_by_full_name(fake_core):
    devs = list_devices(fake_core)
    assert [d.name for d in devs] == ["CPU", "GPU.0", "GPU.1", "NPU"]
    by = {d.name: d for d in devs}
    assert by["GPU.1"].full_name == "Intel(R) Arc(TM) A770 Graphics (dGPU)"
    assert by["GPU.1"].kind == "GPU" and by["GPU.1"].device_type == "discrete"
    assert by["GPU.0"].device_type == "integrated"
    assert by["GPU.1"].label == "GPU.1 — Intel(R) Arc(TM) A770 Graphics (dGPU)"
    assert all(by[n].speculative_ok and not by[n].notice for n in ("CPU", "GPU.0", "GPU.1"))
    npu = by["NPU"]
    assert npu.kind == "NPU" and not npu.speculative_ok
    assert SEED_NOTICE in npu.notice and npu.notice == NPU_NOTICE


def test_device_without_full_name_keeps_its_short_name(fake_core):
    devs = list_devices(type(fake_core)({"CPU": {}, "GPU": {"FULL_DEVICE_NAME": "  "}}))
    assert [(d.name, d.full_name, d.label) for d in devs] == [("CPU", "CPU", "CPU"), ("GPU", "GPU", "GPU")]


def test_real_core_lists_cpu():
    devs = list_devices()
    assert devs and devs[0].name == "CPU" and devs[0].speculative_ok


def test_check_device(fake_devices):
    with pytest.raises(DeviceError, match="continuous batching backend only"):
        check_device("NPU", with_draft=True, devices=fake_devices)
    assert check_device("NPU", with_draft=False, devices=fake_devices).kind == "NPU"
    assert check_device("GPU.1", with_draft=True, devices=fake_devices).full_name.startswith("Intel(R) Arc")
    assert check_device("GPU", with_draft=True, devices=fake_devices).name == "GPU.0"
    with pytest.raises(DeviceError, match="not available here"):
        check_device("GPU.7", with_draft=False, devices=fake_devices)
    with pytest.raises(DeviceError, match="No device"):
        check_device("", with_draft=False)
    # Without a device list, only the kind is checked.
    with pytest.raises(DeviceError):
        check_device("NPU", with_draft=True)
    assert describe("FPGA").speculative_ok is False


def _combo_rows(combo):
    model = combo.model()
    assert isinstance(model, QStandardItemModel)
    return [(combo.itemText(i), model.item(i).isEnabled()) for i in range(combo.count())]


def test_device_picker_fills_from_fake_core(make_window):
    w = make_window(load=False)
    mp = w.model_panel
    texts = [t for t, _ in _combo_rows(mp.device_combo)]
    assert texts == ["CPU — Intel(R) Core(TM) Ultra 7 155H", "GPU.0 — Intel(R) Arc(TM) Graphics (iGPU)",
                     "GPU.1 — Intel(R) Arc(TM) A770 Graphics (dGPU)", "NPU — Intel(R) AI Boost"]
    assert SEED_NOTICE in mp.device_combo.itemData(3, 3)  # tooltip role carries the notice


def test_choosing_npu_shows_notice_and_npu_is_refused_with_a_draft(make_window, model_dirs, qtbot):
    w = make_window(load=False)
    mp = w.model_panel
    target, draft = model_dirs
    mp.set_target(str(target))
    mp.set_draft(None)
    assert mp.set_device("NPU")
    assert mp.device_notice.isVisible()
    assert SEED_NOTICE in mp.device_notice.text()
    assert "LLMPipeline" in mp.device_notice.text()
    assert mp.load_button.isEnabled()  # the target alone may run on NPU

    # Choosing a draft while NPU is selected: NPU becomes unselectable, CPU is picked, and the
    # notice says why.
    mp.set_draft(str(draft))
    rows = _combo_rows(mp.device_combo)
    assert rows[3] == ("NPU — Intel(R) AI Boost", False)
    assert all(enabled for _t, enabled in rows[:3])
    assert mp.device() == "CPU"
    assert SEED_NOTICE in mp.device_notice.text() and "Switched to CPU" in mp.device_notice.text()
    assert not mp.set_device("NPU")
    assert mp.device() == "CPU"
    # With a draft and a speculative device, the notice still explains why NPU is greyed out.
    mp.set_device("GPU.1")
    assert "not selectable with a draft" in mp.device_notice.text()


def test_loaded_device_is_shown_in_status_line(make_window, model_dirs, qtbot):
    w = make_window(load=False)
    mp = w.model_panel
    target, draft = model_dirs
    mp.set_target(str(target))
    mp.set_draft(str(draft))
    mp.set_device("GPU.1")
    with qtbot.waitSignal(w.controller.loaded, timeout=5000):
        mp.load_button.click()
    assert "Device in use: GPU.1 — Intel(R) Arc(TM) A770 Graphics (dGPU)" in w.device_label.text()
