"""The DSpark GPU job's data + train path on CPU (tiny Llama fixture), its batched walks against the
torch reference walks, and the shipped SmolLM2 DSpark draft."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.export.dflash_v1 import DFlashV1Draft, random_draft_config, save_checkpoint
from engine.export.dspark import load_dspark_checkpoint, reference_walk
from engine.training import corpus, gpu_job, gpu_job_dspark
from engine.training.dflash_train import target_weights

SHIPPED = Path(__file__).resolve().parents[1] / "resources" / "drafts" / "smollm2-dspark-b8"


def _prompts(hf_dir: Path, path: Path, n: int = 24) -> Path:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    rows, _ = corpus.build_corpus(n // 2, n // 2, seed=2)
    corpus.write_rows(corpus.tokenize_rows(tok, rows, 160), path)
    return path


def _args(hf: Path, out: Path, cache: Path, *extra: str) -> list[str]:
    return ["--target", str(hf), "--data-cache", str(cache), "--out", str(out), "--device", "cpu",
            "--heldout", "4", "--new-tokens", "24", "--gen-batch", "16", "--layers", "1", "--block-size", "4",
            "--taps", "0,2", "--markov-rank", "8", "--batch", "8", "--anchors", "8", "--lr", "3e-3", "--warmup", "3",
            "--log-every", "5", "--eval-cands", "2,4", "--eval-rows", "4", "--save-every", "0", "--no-bf16", *extra]


@pytest.fixture(scope="module")
def tiny_v1_draft(tiny_llama_hf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random DFlash v1 draft of the shape the tiny job trains (to warm-start the DSpark backbone)."""
    from transformers import AutoConfig

    cfg = random_draft_config(AutoConfig.from_pretrained(tiny_llama_hf).to_dict(), 1, 4, [0, 2], 3)
    torch.manual_seed(5)
    return save_checkpoint(DFlashV1Draft(cfg), cfg, tmp_path_factory.mktemp("v1") / "draft")


def test_dspark_job_trains_on_tiny_target_and_lowers_loss(tiny_llama_hf: Path, tiny_v1_draft: Path,
                                                          tmp_path: Path) -> None:
    prompts = _prompts(tiny_llama_hf, tmp_path / "p.jsonl.gz")
    out, cache = tmp_path / "out", tmp_path / "answers.jsonl.gz"
    m = gpu_job_dspark.main(_args(tiny_llama_hf, out, cache, "--prompts", str(prompts), "--steps", "40",
                                  "--init-backbone", str(tiny_v1_draft), "--short-block-frac", "0.3"))
    losses = [loss for _, loss, _ in m["train"]["losses"]]
    assert m["train"]["steps"] == 40
    assert losses[-1] < 0.8 * losses[0], losses
    assert m["data"]["teacher_forced_agreement"] > 0.99
    assert m["init_backbone"]["tensors"] > 0
    for n in ("2", "4"):
        assert set(m["heldout"][n]) == {"none", "topk", "dense"}
        for walk in m["heldout"][n].values():
            assert 1.0 <= walk["tokens_per_step"]["all"] <= int(n) + 1
    draft, cfg = load_dspark_checkpoint(out / "draft")
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["block_size"] == 4 and cfg["markov_rank"] == 8
    assert cfg["markov_head_type"] == "vanilla" and cfg["mask_token_id"] == 3 and cfg["target_layer_ids"] == [0, 2]
    assert cfg["torch_dtype"] == "float16"
    assert float(draft.markov_head.markov_w2.weight.detach().abs().max()) > 0  # the head learned (it starts at zero)
    assert json.loads((out / "draft" / "training.json").read_text())["steps"] == 40
    # A second run reads the cached answers (no generation) and the rows' order from the cache alone.
    m2 = gpu_job_dspark.main(_args(tiny_llama_hf, tmp_path / "out2", cache, "--steps", "2", "--eval-cands", "2"))
    assert "generation" not in m2 and m2["data"]["prompts_heldout"] == m["data"]["prompts_heldout"]


def test_backbone_warm_start_copies_the_v1_weights(tiny_llama_hf: Path, tiny_v1_draft: Path) -> None:
    from transformers import AutoConfig

    from engine.export.dflash_v1 import load_checkpoint

    draft, _ = gpu_job_dspark.new_dspark_draft(AutoConfig.from_pretrained(tiny_llama_hf).to_dict(), 1, 4, [0, 2], 3,
                                               8, "vanilla", True, True, 64)
    assert float(draft.markov_head.markov_w2.weight.detach().abs().max()) == 0  # a zero bias at the start
    gpu_job_dspark.init_backbone_from_v1(draft, tiny_v1_draft)
    v1, _ = load_checkpoint(tiny_v1_draft)
    assert torch.equal(draft.fc.weight, v1.fc.weight)
    assert torch.equal(draft.layers[0].mlp.down_proj.weight, v1.layers[0].mlp.down_proj.weight)


def test_batched_walks_match_the_reference_walks(tiny_llama_hf: Path) -> None:
    """walk_blocks over packed blocks = engine.export.dspark.reference_walk run block by block."""
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_llama_hf).eval()
    torch.manual_seed(0)
    seq = torch.randint(4, target.config.vocab_size, (1, 30))
    data, _ = gpu_job.build_flat_data(target, [seq[0, :10].tolist()], [seq[0, 10:].tolist()], ["code"], [0, 2])
    embed, lm_head = target_weights(target)
    for head in ("vanilla", "gated"):
        draft, _ = gpu_job_dspark.new_dspark_draft(target.config.to_dict(), 1, 5, [0, 2], 3, 8, head, True, True, 64)
        with torch.no_grad():  # a head that matters: random W2 at the scale of the unary logits
            draft.markov_head.markov_w2.weight.normal_(0.0, 3.0)
        draft.eval()
        n = 4
        accs = gpu_job_dspark.accepted_lengths_dspark(draft, data, [0], n, embed, lm_head, gpu_job_dspark.WALKS, 3,
                                                      bf16=False, max_blocks=7)
        feats, toks = data.features, data.tokens
        for a in range(10, 30 - n):
            labels = toks[a + 1 : a + 1 + n]
            for mode in gpu_job_dspark.WALKS:
                ref = torch.from_numpy(reference_walk(draft, embed, lm_head, int(toks[a]), feats[:a], n, mode, 3))
                want = int((ref == labels).long().cumprod(0).sum())
                assert int(accs[mode][0][a - 10]) == want, (head, mode, a)
        assert len(accs["none"][0]) == 20 - n


def test_loss_parts_and_short_blocks(tiny_llama_hf: Path) -> None:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(tiny_llama_hf).eval()
    torch.manual_seed(1)
    seq = torch.randint(4, target.config.vocab_size, (2, 24))
    data, _ = gpu_job.build_flat_data(target, [s[:8].tolist() for s in seq], [s[8:].tolist() for s in seq],
                                      ["code", "chat"], [0, 2])
    embed, lm_head = target_weights(target)
    draft, _ = gpu_job_dspark.new_dspark_draft(target.config.to_dict(), 1, 4, [0, 2], 3, 8, "vanilla", True, True, 64)
    toks, feats = data.rows(torch.tensor([0, 1]))
    anchors = torch.tensor([[8, 12, 19], [9, 10, 11]])
    lens = torch.tensor([[4, 1, 2], [3, 4, 4]])
    loss, parts = gpu_job_dspark.dspark_batch_loss(draft, toks, feats, anchors, embed, lm_head,
                                                   gpu_job_dspark.LossWeights(), lens)
    assert set(parts) == {"ce", "tv", "ce_unary", "conf"}
    assert torch.isfinite(loss) and 0 <= float(parts["tv"]) <= 2
    # the head starts at zero: the unary CE equals the head CE
    assert abs(float(parts["ce"]) - float(parts["ce_unary"])) < 1e-5
    loss.backward()
    assert draft.markov_head.markov_w2.weight.grad.abs().sum() > 0


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped SmolLM2 DSpark draft")
def test_shipped_smollm2_dspark_draft_loads_with_smollm2_dims() -> None:
    files = sorted(SHIPPED.glob("*.safetensors"))
    assert [f.name for f in files] == ["model.safetensors"]
    assert files[0].stat().st_size < 20 * 10**6
    draft, cfg = load_dspark_checkpoint(SHIPPED)
    c = draft.cfg
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    assert c.hidden_size == 576 and cfg["vocab_size"] == 49152 and cfg["num_target_layers"] == 30
    assert c.num_attention_heads == 9 and c.num_key_value_heads == 3 and c.head_dim == 64
    assert c.block_size == 8 and c.mask_token_id == 16 and list(c.target_layer_ids) == [1, 8, 15, 22, 27]
    assert cfg["markov_rank"] > 0 and cfg["markov_head_type"] in ("vanilla", "gated")
    assert draft.markov_head.markov_w1.weight.shape == (49152, cfg["markov_rank"])
    assert cfg["torch_dtype"] in ("float16", "bfloat16")
    assert all(torch.isfinite(p).all() for p in draft.parameters())
    assert float(draft.markov_head.markov_w2.weight.detach().abs().max()) > 0  # trained: W2 starts at zero


def test_dspark_job_static_generator_and_feature_budget(tiny_llama_hf: Path, tmp_path: Path) -> None:
    """--gen-impl static (float32) writes the same answers as HF generate; --max-feature-gib trims training rows."""
    prompts = _prompts(tiny_llama_hf, tmp_path / "p.jsonl.gz")
    caches = {}
    for impl in ("hf", "static"):
        cache = tmp_path / f"answers-{impl}.jsonl.gz"
        gpu_job_dspark.main(_args(tiny_llama_hf, tmp_path / f"out-{impl}", cache, "--prompts", str(prompts),
                                  "--steps", "2", "--eval-cands", "2", "--gen-impl", impl, "--gen-dtype", "float32"))
        caches[impl] = gpu_job.load_data_tokens(cache)
    assert caches["hf"] == caches["static"] and len(caches["hf"]) >= 20
    m = gpu_job_dspark.main(_args(tiny_llama_hf, tmp_path / "out-small", tmp_path / "answers-hf.jsonl.gz",
                                  "--prompts", str(prompts), "--steps", "2", "--eval-cands", "2",
                                  "--max-feature-gib", "0.0005"))
    assert 0 < m["data"]["prompts_train"] < len(caches["hf"]) - 4


# --------------------------------------------------------------------------------------------
# --variant dflash_v2 (the same job, DFlash v2's draft and loss)
# --------------------------------------------------------------------------------------------
SHIPPED_V2 = Path(__file__).resolve().parents[1] / "resources" / "drafts" / "smollm2-dflash2-b8"


def test_dflash2_job_trains_on_tiny_target_and_lowers_loss(tiny_llama_hf: Path, tmp_path: Path) -> None:
    """A few v2 steps on the tiny target: the loss falls, the selector learns, the backbone is the first
    layer of a 2-layer v1 draft, the folder reloads as DFlash v2, held-out walks none + topk."""
    from transformers import AutoConfig

    from engine.export.dflash2 import load_dflash2_checkpoint

    v1_cfg = random_draft_config(AutoConfig.from_pretrained(tiny_llama_hf).to_dict(), 2, 4, [0, 2], 3)
    torch.manual_seed(6)
    v1_dir = save_checkpoint(DFlashV1Draft(v1_cfg), v1_cfg, tmp_path / "v1")
    prompts = _prompts(tiny_llama_hf, tmp_path / "p.jsonl.gz")
    out, cache = tmp_path / "out", tmp_path / "answers.jsonl.gz"
    m = gpu_job_dspark.main(_args(tiny_llama_hf, out, cache, "--prompts", str(prompts), "--steps", "40",
                                  "--variant", "dflash_v2", "--selector-top-k", "4", "--eval-top-k", "4,2",
                                  "--init-backbone", str(v1_dir), "--short-block-frac", "0.3"))
    losses = [loss for _, loss, _ in m["train"]["losses"]]
    assert m["train"]["steps"] == 40
    assert losses[-1] < 0.8 * losses[0], losses
    assert set(m["train"]["losses"][-1][2]) == {"loss", "ce", "selector", "covered"}
    assert m["init_backbone"]["layers_copied"] == 1 and m["init_backbone"]["v1_layers"] == 2
    for n in ("2", "4"):
        if n == "4":  # block 4 = 3 candidates (offset 1): n = 4 is not evaluated
            assert n not in m["heldout"]
            continue
        assert set(m["heldout"][n]) == {"none", "topk"}
        for walk in m["heldout"][n].values():
            assert 1.0 <= walk["tokens_per_step"]["all"] <= int(n) + 1
        assert set(m["heldout_topk"]["2"][n]) == {"topk"}
    draft, cfg = load_dflash2_checkpoint(out / "draft")
    assert cfg["architectures"] == ["DFlash2DraftModel"] and cfg["torch_dtype"] == "float16"
    dc = cfg["dflash_config"]
    assert dc["block_size"] == 4 and dc["selector_rank"] == 8 and dc["selector_top_k"] == 4 and dc["mask_token_id"] == 3
    assert cfg["num_hidden_layers"] == 1
    assert float(draft.candidate_selector.successor_codebook.detach().abs().max()) > 0  # starts at zero
    assert float(draft.layers[0].mlp_conv.kernel_projection.weight.detach().abs().max()) > 0  # starts at zero
    assert json.loads((out / "draft" / "training.json").read_text())["steps"] == 40


def test_dflash2_batched_walks_match_the_reference_walks(tiny_llama_hf: Path) -> None:
    """accepted_lengths_dspark on a DFlash v2 draft (offset 1, packed blocks of n+1 rows, the convs per
    block) = engine.export.dflash2.reference_walk block by block, for the none and selector walks."""
    from transformers import AutoModelForCausalLM

    from engine.export.dflash2 import reference_walk as reference_walk_v2

    target = AutoModelForCausalLM.from_pretrained(tiny_llama_hf).eval()
    torch.manual_seed(0)
    seq = torch.randint(4, target.config.vocab_size, (1, 30))
    data, _ = gpu_job.build_flat_data(target, [seq[0, :10].tolist()], [seq[0, 10:].tolist()], ["code"], [0, 2])
    embed, lm_head = target_weights(target)
    draft, _ = gpu_job_dspark.new_dflash2_draft(target.config.to_dict(), 1, 6, [0, 2], 3, 8, 3, 16, 2)
    with torch.no_grad():  # a selector and convs that matter
        draft.candidate_selector.successor_codebook.normal_(0.0, 3.0)
        for layer in draft.layers:
            layer.attention_conv.kernel_projection.weight.normal_(0.0, 0.3)
            layer.mlp_conv.base_kernel.normal_(0.0, 0.5)
    draft.eval()
    assert gpu_job_dspark.has_head(draft)
    modes = ("none", "topk")
    for n in (3, 5):
        accs = gpu_job_dspark.accepted_lengths_dspark(draft, data, [0], n, embed, lm_head, modes, 3, bf16=False,
                                                      max_blocks=7)
        feats, toks = data.features, data.tokens
        for a in range(10, 30 - n):
            labels = toks[a + 1 : a + 1 + n]
            for mode in modes:
                ref = torch.from_numpy(reference_walk_v2(draft, embed, lm_head, int(toks[a]), feats[:a], n, mode, 3))
                want = int((ref == labels).long().cumprod(0).sum())
                assert int(accs[mode][0][a - 10]) == want, (n, mode, a)
        assert len(accs["none"][0]) == 20 - n


@pytest.mark.skipif(not (SHIPPED_V2 / "config.json").is_file(), reason="no shipped SmolLM2 DFlash v2 draft")
def test_shipped_smollm2_dflash2_draft_loads_with_smollm2_dims() -> None:
    from engine.export.dflash2 import load_dflash2_checkpoint

    files = sorted(SHIPPED_V2.glob("*.safetensors"))
    assert [f.name for f in files] == ["model.safetensors"]
    assert files[0].stat().st_size <= 12.5 * 10**6
    drafts = SHIPPED_V2.parent
    assert sum(f.stat().st_size for f in drafts.rglob("*") if f.is_file()) < 50 * 10**6  # the whole folder
    draft, cfg = load_dflash2_checkpoint(SHIPPED_V2)
    c, vc = draft.cfg, draft.v2
    assert cfg["architectures"] == ["DFlash2DraftModel"]
    assert c.hidden_size == 576 and cfg["vocab_size"] == 49152 and cfg["num_target_layers"] == 30
    assert c.num_attention_heads == 9 and c.num_key_value_heads == 3 and c.head_dim == 64
    assert c.block_size == 8 and c.mask_token_id == 16 and list(c.target_layer_ids) == [1, 8, 15, 22, 27]
    assert draft.candidate_selector.successor_codebook.shape == (49152, vc.selector_rank)
    assert cfg["torch_dtype"] in ("float16", "bfloat16")
    assert all(torch.isfinite(p).all() for p in draft.parameters())
    assert float(draft.candidate_selector.successor_codebook.detach().abs().max()) > 0  # trained: starts at zero
