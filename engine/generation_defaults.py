"""A target's own recommended decoding: its generation_config.json where it gives one, else a preset.

Greedy decoding sends small chat models into loops within a few lines; a chat app's default is the
sampling the model's authors ship (`do_sample`, `temperature`, `top_p`, `top_k`, `min_p`,
`repetition_penalty` in generation_config.json, read with the Hugging Face meaning: a file that asks
for sampling and leaves a field out means that field's transformers default). A folder without a
recommendation (or with one this engine cannot use) gets PRESET, and says so.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

FILE_NAME = "generation_config.json"


@dataclass(frozen=True)
class DecodingDefaults:
    do_sample: bool = True
    temperature: float = 0.7
    top_k: int = 0  # 0 = off
    top_p: float = 0.9
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    source: str = "preset"  # "generation_config.json" when the target's file gave it
    note: str = ""  # why the preset was used, in words

    def describe(self) -> str:
        """e.g. "T=0.6, top-p 0.95, top-k 20 (the model's generation_config.json)"."""
        if not self.do_sample:
            return "greedy"
        parts = [f"T={self.temperature:g}"]
        if self.top_p < 1.0:
            parts.append(f"top-p {self.top_p:g}")
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.min_p:
            parts.append(f"min-p {self.min_p:g}")
        if self.repetition_penalty != 1.0:
            parts.append(f"repetition penalty {self.repetition_penalty:g}")
        return ", ".join(parts)


# Used when the target recommends nothing: moderate sampling with nucleus cut-off, a common chat default.
PRESET = DecodingDefaults()
# transformers' GenerationConfig defaults for fields a sampling generation_config.json leaves out.
_HF_DEFAULTS = {"temperature": 1.0, "top_k": 50, "top_p": 1.0, "min_p": 0.0, "repetition_penalty": 1.0}
_SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p")


def _field(cfg: dict, key: str) -> float:
    v = cfg.get(key)
    if v is None:
        return float(_HF_DEFAULTS[key])
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{key}={v!r} is not a number")
    return float(v)


def recommended_decoding(target_dir: str | Path) -> DecodingDefaults:
    """The target folder's recommended decoding (generation_config.json), else PRESET with a note."""
    path = Path(target_dir) / FILE_NAME
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return replace(PRESET, note=f"the target has no {FILE_NAME}")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        return replace(PRESET, note=f"{path} could not be read ({e})")
    if not isinstance(cfg, dict):
        return replace(PRESET, note=f"{path} is not a JSON object")
    do_sample = cfg.get("do_sample")
    if do_sample is False:
        # The authors chose greedy; a chat still needs sampling to avoid loops, so the preset applies.
        return replace(PRESET, note=f"{FILE_NAME} asks for greedy decoding (do_sample=false)")
    if do_sample is not True and not any(cfg.get(k) is not None for k in _SAMPLING_KEYS):
        return replace(PRESET, note=f"{FILE_NAME} recommends no sampling settings")
    try:
        temperature = _field(cfg, "temperature")
        top_k = _field(cfg, "top_k")
        top_p = _field(cfg, "top_p")
        min_p = _field(cfg, "min_p")
        rep = _field(cfg, "repetition_penalty")
    except ValueError as e:
        return replace(PRESET, note=f"{FILE_NAME}: {e}")
    if not (temperature > 0 and 0 < top_p <= 1 and 0 <= min_p <= 1 and top_k >= 0 and top_k == int(top_k)
            and rep > 0):
        return replace(PRESET, note=f"{FILE_NAME}'s sampling settings are out of range "
                                    f"(temperature={temperature:g}, top_p={top_p:g}, top_k={top_k:g})")
    return DecodingDefaults(do_sample=True, temperature=temperature, top_k=int(top_k), top_p=top_p, min_p=min_p,
                            repetition_penalty=rep, source=FILE_NAME)
