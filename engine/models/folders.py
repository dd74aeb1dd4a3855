"""A target folder read and checked once: what the loaders of one engine pass on to each other.

Loading a target with a draft needs the target's files checked, its config, its IR (the fit check
reads its sizes, the paged target compiles an edited copy, the draft grafts its embedding and
lm_head) and its tokenizer. `read_target_folder` does the checks and reads the IR once; each loader
edits its own `fresh_model()` (a clone, a fraction of a read's cost). The draft's side of this is
engine/models/draft.py's `DraftInfo`, which keeps the draft IR it read the same way.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import openvino as ov

from engine.models.files import read_ir, read_optional_json_object
from engine.models.target import _lm_head, check_target_dir, num_decoder_layers

IR_FILE = "openvino_model.xml"
TOKENIZER_FILE = "openvino_tokenizer.xml"
_FIX = "export the target again with `dflash-studio export --kind target` (or copy the folder again)."


@dataclass(frozen=True)
class TargetFolder:
    """A checked target folder: its config, its IR as read, and the sizes a draft must fit."""

    path: Path
    config: dict
    vocab_size: int
    hidden_size: int  # width of the lm_head's input (and of each tapped layer's rows)
    num_layers: int  # decoder layers whose outputs can be tapped (the last one only after the final norm)
    model: ov.Model = field(repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def ir(self) -> Path:
        return self.path / IR_FILE

    @property
    def weights_bytes(self) -> int:
        """The IR's weights file size: about what another compiled copy of the model takes."""
        weights = self.ir.with_suffix(".bin")
        return weights.stat().st_size if weights.is_file() else 0

    @property
    def tokenizer(self) -> Path:
        return self.path / TOKENIZER_FILE

    def fresh_model(self) -> ov.Model:
        """A copy of the IR to edit (the paged rewrite, the draft graft) without touching the one read."""
        return self.model.clone()


def read_target_folder(path: Path | str, core: ov.Core | None = None) -> TargetFolder:
    """Check the folder and read it once; a missing, empty or damaged file is a ModelFolderError that
    names it and the fix (engine/models/files.py)."""
    path = Path(path)
    check_target_dir(path)
    config = read_optional_json_object(path / "config.json", _FIX)
    model = read_ir(core or ov.Core(), path / IR_FILE, _FIX)
    return TargetFolder(path, config, int(model.output("logits").get_partial_shape()[2].get_length()),
                        int(_lm_head(model).input_value(0).get_partial_shape()[2].get_length()),
                        num_decoder_layers(model), model)


def as_target_folder(target: TargetFolder | Path | str, core: ov.Core | None = None) -> TargetFolder:
    return target if isinstance(target, TargetFolder) else read_target_folder(target, core)
