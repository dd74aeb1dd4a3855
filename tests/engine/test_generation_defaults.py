"""engine.generation_defaults: the target's generation_config.json sampling, else the preset (with why)."""
from __future__ import annotations

import json

import pytest

from engine.generation_defaults import FILE_NAME, PRESET, recommended_decoding


def _write(tmp_path, cfg) -> None:
    (tmp_path / FILE_NAME).write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))


def test_sampling_from_generation_config(tmp_path):
    _write(tmp_path, {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "eos_token_id": 2})
    d = recommended_decoding(tmp_path)
    assert (d.do_sample, d.temperature, d.top_p, d.top_k, d.min_p) == (True, 0.6, 0.95, 20, 0.0)
    assert d.source == FILE_NAME and d.describe() == "T=0.6, top-p 0.95, top-k 20"


def test_fields_left_out_take_the_transformers_defaults(tmp_path):
    _write(tmp_path, {"do_sample": True, "temperature": 0.8})
    d = recommended_decoding(tmp_path)
    assert (d.temperature, d.top_p, d.top_k, d.repetition_penalty) == (0.8, 1.0, 50, 1.0)


@pytest.mark.parametrize("cfg, why", [
    (None, "has no generation_config.json"),
    ({"bos_token_id": 1, "eos_token_id": 2}, "recommends no sampling settings"),  # SmolLM2's file
    ({"do_sample": False, "temperature": 0.6}, "asks for greedy decoding"),
    ({"do_sample": True, "temperature": 0}, "out of range"),
    ({"do_sample": True, "top_p": "high"}, "top_p='high' is not a number"),
    ("{not json", "could not be read"),
    ([1, 2], "is not a JSON object"),
])
def test_no_usable_recommendation_gives_the_preset_and_says_why(tmp_path, cfg, why):
    if cfg is not None:
        _write(tmp_path, cfg)
    d = recommended_decoding(tmp_path)
    assert d.source == "preset" and d.do_sample and d.temperature == PRESET.temperature
    assert why in d.note
