"""Compile properties per device and precision mode.

Both modes are lossless on CPU: a target row's logits do not depend on how many other rows share
its inference (its own candidates, other requests' rows, padding), so greedy speculative output
equals the target alone's token for token (docs/engine.md, "Row invariance"). Two things make a
row depend on its neighbours, and both are dealt with:
- the CPU plugin's PagedAttention scores a one-row sequence with other kernels than a multi-row
  one, and which one-row kernel depends on what else shares the call; engine/models/paged_target.py
  gives every position the same kernel whatever shares its call (`row_mode`: "split");
- a u8 key cache quantized by channel shares each channel's scale over the tokens of a block, so a
  token's stored key depends on which tokens were written with it: keys are quantized by token.
"default" computes in f32 with int8 dynamic quantization (the CPU default of bf16 together with
dynamic quantization breaks SmolLM2's int8 answers; f32 with dynamic quantization makes a window of
candidates cheap to verify, without it a window costs several one-row steps) and a u8 KV cache.
"f32" is the reference: f32 compute, f32 KV cache, no dynamic quantization (slower to verify).
"""
from __future__ import annotations

PRECISIONS = ("default", "f32")

EXACT_PROPERTIES: dict[str, str] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "f32",
    "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
}

# u8 keys quantized by channel depend on the other tokens of their block (written in the same call)
CPU_DEFAULT_PROPERTIES: dict[str, str] = {
    "INFERENCE_PRECISION_HINT": "f32",
    "KV_CACHE_PRECISION": "u8",
    "KEY_CACHE_QUANT_MODE": "BY_TOKEN",
}


def compile_properties(device: str, precision: str = "default") -> dict[str, str]:
    """Properties for core.compile_model; raises ValueError for an unknown precision."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r} is not one of {', '.join(PRECISIONS)}.")
    props: dict[str, str] = {"PERFORMANCE_HINT": "LATENCY"}
    if precision == "f32":
        props.update(EXACT_PROPERTIES)
    elif is_cpu(device):
        props.update(CPU_DEFAULT_PROPERTIES)
    return props


def row_mode(device: str) -> str:
    """How the paged target lays out rows (engine/models/paged_target.py): "split" makes a row's logits
    independent of its neighbours on CPU; other devices' kernels are other kernels ("plain")."""
    return "split" if is_cpu(device) else "plain"


def is_cpu(device: str) -> bool:
    return device.upper().startswith("CPU")


def is_lossless(device: str, precision: str) -> bool:
    """Whether greedy speculative output equals the target alone's token for token in this mode."""
    return precision == "f32" or is_cpu(device)


def precision_label(device: str, precision: str) -> str:
    """What the app and the bench show for a mode: what it computes and whether it is lossless."""
    if precision == "f32":
        return "f32 reference (f32 compute and KV cache, no dynamic quantization): lossless"
    if is_cpu(device):
        return "default (f32 compute, int8 dynamic quantization, u8 KV cache, row-invariant): lossless"
    return f"default ({device} plugin defaults): greedy output may differ from the target alone's at near-ties"
