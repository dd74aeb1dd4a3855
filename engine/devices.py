"""Device discovery for the engine and the app (Qt-free).

`list_devices()` asks OpenVINO which devices it can use and describes each one: its short name
("CPU", "GPU.0", "NPU"), its marketing name (FULL_DEVICE_NAME, e.g. "Intel(R) Arc(TM) A770
Graphics (dGPU)"), its kind and whether block speculative decoding may run on it. NPU is listed,
never hidden: the target alone can run there through openvino_genai.LLMPipeline, but a DFlash
draft cannot, and `notice` says why.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engine.errors import DeviceError

NPU_NOTICE = (
    "DFlash runs on the continuous batching backend only, which NPU pipelines do not use. "
    "The target alone (no draft) can still run on NPU through openvino_genai.LLMPipeline."
)

# Kinds that the continuous batching backend (and so speculative decoding) runs on.
SPECULATIVE_KINDS = ("CPU", "GPU")


@dataclass(frozen=True)
class DeviceInfo:
    name: str  # OpenVINO device name as passed to compile_model: "CPU", "GPU.1", "NPU"
    full_name: str  # FULL_DEVICE_NAME, or the short name when OpenVINO does not say
    kind: str  # "CPU" | "GPU" | "NPU" | the short name's prefix for anything else
    speculative_ok: bool  # a draft may run on it
    notice: str = ""  # why speculative decoding is refused (empty when it is allowed)
    device_type: str = ""  # "integrated" / "discrete" for GPUs when OpenVINO reports it

    @property
    def label(self) -> str:
        """What a picker shows: "GPU.0 — Intel(R) Arc(TM) A770 Graphics (dGPU)"."""
        if self.full_name and self.full_name != self.name:
            return f"{self.name} — {self.full_name}"
        return self.name


def device_kind(name: str) -> str:
    """"GPU.1" -> "GPU"; "CPU" -> "CPU"; anything unknown keeps its prefix, upper-cased."""
    return name.split(".", 1)[0].strip().upper()


def _notice_for(kind: str) -> str:
    if kind == "NPU":
        return NPU_NOTICE
    if kind not in SPECULATIVE_KINDS:
        return (
            f"{kind} is not a device the continuous batching backend supports, so DFlash cannot "
            "run on it; pick CPU or a GPU."
        )
    return ""


def _property(core: Any, device: str, key: str) -> str:
    try:
        value = core.get_property(device, key)
    except Exception:  # a plugin that does not know the key, or a driver that fails to answer
        return ""
    return str(value).strip() if value is not None else ""


def _default_core() -> Any:
    import openvino as ov  # imported here so that importing this module stays cheap

    return ov.Core()


def describe(name: str, core: Any | None = None, full_name: str | None = None) -> DeviceInfo:
    """A DeviceInfo for one device name; asks `core` for the full name unless given."""
    kind = device_kind(name)
    if full_name is None:
        full_name = _property(core, name, "FULL_DEVICE_NAME") if core is not None else ""
    device_type = ""
    if kind == "GPU" and core is not None:
        raw = _property(core, name, "DEVICE_TYPE").lower()
        if "integrated" in raw:
            device_type = "integrated"
        elif "discrete" in raw:
            device_type = "discrete"
    notice = _notice_for(kind)
    return DeviceInfo(
        name=name,
        full_name=full_name or name,
        kind=kind,
        speculative_ok=not notice,
        notice=notice,
        device_type=device_type,
    )


def _sort_key(info: DeviceInfo) -> tuple[int, str]:
    order = {"CPU": 0, "GPU": 1, "NPU": 2}
    return (order.get(info.kind, 3), info.name)


def list_devices(core: Any | None = None) -> list[DeviceInfo]:
    """Every device OpenVINO reports, CPU first, then GPUs, then NPU and anything else.

    `core` is an openvino.Core (or anything with `available_devices` and `get_property`);
    a fresh Core is made when it is None. A device whose plugin fails to answer is still listed,
    under its short name.
    """
    if core is None:
        core = _default_core()
    names = list(getattr(core, "available_devices", []) or [])
    infos = [describe(str(n), core) for n in names]
    return sorted(infos, key=_sort_key)


def check_device(
    device: str,
    with_draft: bool,
    devices: list[DeviceInfo] | None = None,
    core: Any | None = None,
) -> DeviceInfo:
    """Raise DeviceError when `device` cannot run this configuration; return its DeviceInfo.

    With a draft, only CPU and GPU devices are accepted (NPU gets the seed's notice). When
    `devices` or `core` is given, the device must also be one OpenVINO reports.
    """
    if not isinstance(device, str) or not device.strip():
        raise DeviceError("No device given: pick CPU, a GPU, or (without a draft) NPU.")
    device = device.strip()
    known = devices if devices is not None else (list_devices(core) if core is not None else None)
    info: DeviceInfo | None = None
    if known is not None:
        info = next((d for d in known if d.name.upper() == device.upper()), None)
        if info is None:
            # "GPU" is a valid alias for the first GPU when OpenVINO reports "GPU.0", "GPU.1".
            if device.upper() == "GPU":
                info = next((d for d in known if d.kind == "GPU"), None)
            if info is None:
                listed = ", ".join(d.name for d in known) or "none"
                raise DeviceError(
                    f"Device {device!r} is not available here. OpenVINO reports: {listed}."
                )
    if info is None:
        info = describe(device)
    if with_draft and not info.speculative_ok:
        raise DeviceError(
            f"{info.name} cannot run speculative decoding: {info.notice.split('. ')[0]}. "
            "Pick CPU or a GPU for the draft and target, or choose no draft to run the target "
            f"alone on {info.name}."
        )
    return info
