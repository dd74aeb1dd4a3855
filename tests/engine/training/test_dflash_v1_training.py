"""Self-distillation training pieces and the tiny draft fixtures."""
from __future__ import annotations

import json
from pathlib import Path

import openvino as ov
import pytest

torch = pytest.importorskip("torch")

from engine.drafts.dflash_v1 import DFlashV1Draft, load_checkpoint, random_draft_config  # noqa: E402
from engine.training.evaluate import simulate_acceptance  # noqa: E402
from engine.training.packing import packed_inputs, tapped_hidden  # noqa: E402
from fixtures import tiny_drafts  # noqa: E402

TARGET = {
    "num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "intermediate_size": 64, "vocab_size": 50, "rope_theta": 10000.0,
}


@pytest.mark.parametrize("sliding", [False, True], ids=["full", "swa"])
def test_packed_training_forward_equals_inference_per_block(sliding: bool) -> None:
    """Each packed block (also shortened ones) sees exactly what one inference call would."""
    cfg = random_draft_config(TARGET, 2, 5, [1, 2], 49)
    if sliding:
        cfg["layer_types"], cfg["sliding_window"] = ["sliding_attention", "full_attention"], 4
    torch.manual_seed(0)
    model = DFlashV1Draft(cfg).eval()
    emb = torch.randn(50, 32)
    tokens, feats = torch.randint(0, 49, (2, 20)), torch.randn(2, 20, 64)
    anchors, lens = torch.tensor([[3, 9, 14], [1, 7, 15]]), torch.tensor([[5, 3, 2], [4, 5, 5]])
    b = packed_inputs(tokens, feats, anchors, 5, 49, emb, lens)
    assert b["labels"].shape == (2, 3, 4) and b["label_weights"][0, 2].tolist() == [1, 0, 0, 0]
    with torch.no_grad():
        h = model.forward_packed(
            b["noise_embedding"], b["target_hidden"], b["block_position_ids"], b["context_position_ids"], b["allowed"]
        ).view(2, 3, 5, -1)
        for i in range(2):
            for j in range(3):
                a, n = int(anchors[i, j]), int(lens[i, j])
                blk = torch.tensor([[int(tokens[i, a])] + [49] * (n - 1)])
                ref, _ = model(emb[blk], feats[i : i + 1, :a], torch.arange(a + n)[None])
                assert (ref[0] - h[i, j, :n]).abs().max() < 1e-5
                assert torch.equal(b["labels"][i, j], tokens[i, a + 1 : a + 5])


def test_tapping_the_last_layer_is_refused() -> None:
    hs = [torch.zeros(1, 2, 4)] * 5  # embeddings + 4 layers
    assert tapped_hidden(hs, [0, 2]).shape == (1, 2, 8)
    with pytest.raises(ValueError, match="cannot tap layer 3"):
        tapped_hidden(hs, [3])


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_tiny_draft_fixtures(kind: str, request: pytest.FixtureRequest) -> None:
    drafts: dict[str, Path] = request.getfixturevalue(f"tiny_{kind}_drafts")
    assert set(drafts) == {"b4_random", "b8_random", "b16_random", "b8_trained"}
    seen_layers = set()
    for name, folder in drafts.items():
        rt = ov.Core().read_model(str(folder / "openvino_model.xml")).get_rt_info()
        cfg = json.loads((folder / "config.json").read_text())
        assert rt["dflash"]["block_size"].value == str(cfg["block_size"]) == name[1:].split("_")[0]
        assert rt["dflash"]["mask_token_id"].value == "3"  # <|mask|>
        seen_layers.add(rt["dflash"]["target_layer_ids"].value)
    assert seen_layers == {"1,2", "0,1,2"}


@pytest.mark.parametrize("kind", ["qwen3", "llama"])
def test_trained_tiny_draft_is_accepted_far_more_than_random(kind: str, request: pytest.FixtureRequest) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf: Path = request.getfixturevalue(f"tiny_{kind}_hf")
    drafts: dict[str, Path] = request.getfixturevalue(f"tiny_{kind}_drafts")
    target = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
    prompts = tiny_drafts.prompt_ids(AutoTokenizer.from_pretrained(hf))[2:4]  # PROMPTS[1], plain and chat
    trained, _ = load_checkpoint(drafts["b8_trained"].parent / "b8_trained-ckpt")
    rand, _ = load_checkpoint(drafts["b8_random"].parent / "b8_random-ckpt")
    t = simulate_acceptance(target, trained, prompts, 40)
    r = simulate_acceptance(target, rand, prompts, 40)
    assert r.tokens_per_round < 1.1
    assert t.tokens_per_round > 2.0, (t, r)  # accepted often on its own prompts (it memorises them)
