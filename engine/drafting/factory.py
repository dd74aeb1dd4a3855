"""Which batch runner serves a compiled draft: host-side KV when its masks can be trusted, else its state."""
from __future__ import annotations

from engine.drafting.draft_batch import DraftBatch
from engine.drafting.host_kv_batch import HostKVBatch, host_padding_is_exact
from engine.models.draft import DraftModel


def make_draft_batch(model: DraftModel) -> DraftBatch | HostKVBatch:
    """HostKVBatch for a draft whose KV cache moved to the host and whose masking is exact; else the
    stateful DraftBatch (which itself falls back to one request per sequence for mask-ignoring IRs)."""
    if model.kv is not None:
        if host_padding_is_exact(model):
            return HostKVBatch(model)
        model.use_state()
    return DraftBatch(model)
