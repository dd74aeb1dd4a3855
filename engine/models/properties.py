"""Compile properties per device and precision mode.

"exact" pins f32 inference, an f32 KV cache and no dynamic quantization: only then does a target
that scores k tokens in one inference give the same argmax as k one-token steps, so greedy
speculative output equals the target alone's token for token (docs/openvino-notes: bf16/u8/int8
near-ties differ legitimately). "default" is the fast mode: on CPU it keeps int8 dynamic
quantization and the u8 KV cache but computes in f32, because the CPU default of bf16 together with
dynamic quantization breaks SmolLM2's int8 answers (measured: "What is the capital of France?"
-> "L'Étoile, la Marseillaise" instead of "Paris"; either change alone fixes it, and f32 + dynamic
quantization verifies 8 tokens at about 1.3x the cost of 1, against 2x without it).
"""
from __future__ import annotations

PRECISIONS = ("default", "f32")

EXACT_PROPERTIES: dict[str, str] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
}


def compile_properties(device: str, precision: str = "default") -> dict[str, str]:
    """Properties for core.compile_model; raises ValueError for an unknown precision."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}.")
    props: dict[str, str] = {"PERFORMANCE_HINT": "LATENCY"}
    if precision == "f32":
        props.update(EXACT_PROPERTIES)
    elif device.upper().startswith("CPU"):
        props["INFERENCE_PRECISION_HINT"] = "f32"
    return props
