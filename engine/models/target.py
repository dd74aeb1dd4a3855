"""The target model: a stateful optimum-intel IR, edited so one inference returns what a step needs.

Edits made before compiling (docs/engine.md):
- `logits_indices` (i64 [n]) gathers the rows whose logits are needed before the lm_head, so a
  prefill computes one row of logits instead of one per prompt token;
- `next_token_ids` (TopK k=1 inside the graph) so greedy steps read token ids, not
  full-vocabulary logits;
- `target_hidden` = concat of the tapped decoder-layer outputs (the draft's context rows).
The KV cache lives in the model's state; after a rejection it is cut back to the committed length.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openvino as ov
import openvino.opset13 as ops

from engine.errors import ModelFolderError

HIDDEN_ANNOTATION = "hidden_states_decoder_layers"
REQUIRED_TARGET_FILES = ("openvino_model.xml", "openvino_model.bin", "openvino_tokenizer.xml", "openvino_detokenizer.xml")


@dataclass
class TargetOutput:
    """One target inference: token ids (argmax) of the gathered rows, optional logits and hidden rows."""

    next_ids: np.ndarray  # [rows] int
    logits: np.ndarray | None  # [rows, V] float32 (a view into the request's output; copy to keep)
    hidden: np.ndarray | None  # [tokens, n*H] float32, one row per input token


def check_target_dir(path: Path) -> None:
    """Raise ModelFolderError naming the missing file and the fix."""
    path = Path(path)
    if not path.is_dir():
        raise ModelFolderError(f"Target folder {path} does not exist: choose an OpenVINO model folder "
                               "(export one with `dflash-studio export --kind target`).")
    missing = [f for f in REQUIRED_TARGET_FILES if not (path / f).is_file()]
    if missing:
        raise ModelFolderError(
            f"Target folder {path} lacks {', '.join(missing)}: it is not a complete OpenVINO LLM export. "
            "Export the Hugging Face model again with `dflash-studio export --kind target`.")


def layer_outputs(model: ov.Model) -> dict[int, ov.Output]:
    """Decoder-layer outputs of the target (annotation first, else a graph search)."""
    from engine.models.hidden_taps import find_decoder_layer_outputs

    return find_decoder_layer_outputs(model)


def num_decoder_layers(model: ov.Model) -> int:
    return len(layer_outputs(model))


def _lm_head(model: ov.Model) -> ov.Node:
    node = model.output("logits").get_node().input_value(0).get_node()
    if node.get_type_name() != "MatMul":
        raise ModelFolderError("The target's logits do not come straight from an lm_head MatMul; "
                               "this architecture is not supported yet.")
    return node


def edit_target_graph(model: ov.Model, tap_layers: list[int] | None) -> ov.Model:
    """Add logits_indices, next_token_ids and (with taps) target_hidden to the read model."""
    lm_head = _lm_head(model)
    hidden_in = lm_head.input_value(0)
    indices = ops.parameter([-1], ov.Type.i64, name="logits_indices")
    indices.output(0).get_tensor().set_names({"logits_indices"})
    gathered = ops.gather(hidden_in, indices, ops.constant(1, ov.Type.i64))
    lm_head.input(0).replace_source_output(gathered.output(0))
    model.add_parameters([indices])
    topk = ops.topk(model.output("logits").get_node().input_value(0), 1, -1, "max", "none", ov.Type.i32)
    ids = ops.result(topk.output(1))
    ids.output(0).get_tensor().set_names({"next_token_ids"})
    results = [ids]
    if tap_layers:
        taps = layer_outputs(model)
        last = max(taps)
        for layer in tap_layers:
            if layer not in taps:
                raise ModelFolderError(f"Target layer {layer} does not exist: the target has layers 0..{last}.")
            if layer == last:
                raise ModelFolderError(
                    f"Target layer {layer} is the last decoder layer, whose output is taken after the final "
                    "norm; DFlash drafts must tap earlier layers. The draft does not fit this target.")
        cat = ops.concat([taps[i] for i in tap_layers], -1)
        hid = ops.result(cat)
        hid.output(0).get_tensor().set_names({"target_hidden"})
        results.append(hid)
    model.add_results(results)
    model.validate_nodes_and_infer_types()
    return model


class TargetModel:
    """A compiled stateful target with one infer request (one sequence at a time).

    Rollback is lazy: rejected tokens stay in the KV cache, masked out by `attention_mask` (their
    keys get the mask's large negative bias, i.e. exactly zero weight), while `position_ids` carry
    the logical positions. Cutting 60 KV states after every rejection would cost about a decode
    step on a small model; instead the cache is compacted only when masked slots pile up.
    """

    COMPACT_MIN_SLOTS = 256  # compact when masked slots exceed this and the committed length

    def __init__(self, folder: Path, core: ov.Core, device: str, properties: dict[str, str],
                 tap_layers: list[int] | None = None) -> None:
        check_target_dir(folder)
        self.folder = Path(folder)
        self.device = device
        self.config = json.loads((self.folder / "config.json").read_text()) if (self.folder / "config.json").is_file() else {}
        model = core.read_model(self.folder / "openvino_model.xml")
        self.num_layers = num_decoder_layers(model)
        self.vocab_size = int(model.output("logits").get_partial_shape()[2].get_length())
        self.hidden_size = int(_lm_head(model).input_value(0).get_partial_shape()[2].get_length())
        self.tap_layers = list(tap_layers) if tap_layers else []
        edit_target_graph(model, self.tap_layers)
        self.compiled = core.compile_model(model, device, properties)
        self.request = self.compiled.create_infer_request()
        self._beam = np.zeros(1, np.int32)
        self._mask = np.ones((1, 4096), np.int64)  # attention_mask over physical cache slots
        self.length = 0  # committed tokens (logical length)
        self.physical = 0  # slots in the KV cache, masked ones included
        self.compactions = 0

    def reset(self) -> None:
        self.request.reset_state()
        self.length = 0
        self.physical = 0
        self._mask[:] = 1

    def infer(self, ids: list[int] | np.ndarray, logit_rows: int = 1, want_logits: bool = False) -> TargetOutput:
        """Append `ids` at positions length.. and return argmax ids of the last `logit_rows` rows."""
        ids = np.asarray(ids, dtype=np.int64).reshape(1, -1)
        n = ids.shape[1]
        total = self.physical + n
        if total > self._mask.shape[1]:
            grown = np.ones((1, max(total, 2 * self._mask.shape[1])), np.int64)
            grown[:, : self.physical] = self._mask[:, : self.physical]
            self._mask = grown
        self._mask[:, self.physical: total] = 1
        inputs = {
            "input_ids": ids,
            "attention_mask": self._mask[:, :total],
            "position_ids": np.arange(self.length, self.length + n, dtype=np.int64).reshape(1, -1),
            "beam_idx": self._beam,
            "logits_indices": np.arange(n - logit_rows, n, dtype=np.int64),
        }
        self.request.infer(inputs, share_inputs=True, share_outputs=True)
        self.length += n
        self.physical = total
        next_ids = self.request.get_tensor("next_token_ids").data.reshape(-1)
        logits = self.request.get_tensor("logits").data[0] if want_logits else None
        hidden = self.request.get_tensor("target_hidden").data[0] if self.tap_layers else None
        return TargetOutput(next_ids=next_ids.copy(), logits=logits, hidden=hidden)

    def trim(self, new_length: int) -> None:
        """Forget the last `length - new_length` tokens (after a rejection): mask their slots."""
        drop = self.length - new_length
        if drop <= 0:
            return
        self._mask[:, self.physical - drop: self.physical] = 0
        self.length = new_length
        masked = self.physical - self.length
        if masked > max(self.COMPACT_MIN_SLOTS, self.length):
            self.compact()

    def compact(self) -> None:
        """Drop the masked slots from every KV state (an occasional copy instead of one per rejection)."""
        keep = np.flatnonzero(self._mask[0, : self.physical])
        for state in self.request.query_state():
            data = state.state.data
            state.state = ov.Tensor(np.ascontiguousarray(data[:, :, keep]))
        self.physical = len(keep)
        self._mask[:, : self.physical] = 1
        self.compactions += 1
