"""The GPU training job's data + train path on CPU (tiny fixture target), and the shipped SmolLM2 draft."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.export.dflash_v1 import load_checkpoint
from engine.training import corpus, gpu_job
from engine.training.target_loader import _reverse_permute

SHIPPED = Path(__file__).resolve().parents[1] / "resources" / "drafts" / "smollm2-dflash-b8"


def _write_prompts(hf_dir: Path, path: Path, n: int = 28) -> list[corpus.PromptRow]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(hf_dir)
    rows, _ = corpus.build_corpus(n // 2, n // 2, seed=1)
    rows = corpus.tokenize_rows(tok, rows, 160)
    corpus.write_rows(rows, path)
    return rows


def _job_args(hf: Path, prompts: Path, out: Path, *extra: str) -> list[str]:
    return ["--target", str(hf), "--prompts", str(prompts), "--out", str(out), "--device", "cpu",
            "--heldout", "4", "--new-tokens", "20", "--gen-batch", "16", "--layers", "1", "--block-size", "4",
            "--taps", "0,2", "--batch", "8", "--anchors", "8", "--lr", "3e-3", "--warmup", "3", "--log-every", "5",
            "--eval-cands", "1,3", "--eval-rows", "4", *extra]


def test_corpus_prompts_are_chat_turns_and_not_benchmarks(tiny_llama_hf: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    rows = _write_prompts(tiny_llama_hf, tmp_path / "p.jsonl.gz")
    back = corpus.read_rows(tmp_path / "p.jsonl.gz")
    assert [r.ids for r in back] == [r.ids for r in rows] and len(rows) >= 20
    assert {r.kind for r in rows} == {"code", "chat"}
    tok = AutoTokenizer.from_pretrained(tiny_llama_hf)
    start = tok.convert_tokens_to_ids("<|im_start|>")
    for r in rows:
        assert r.ids[0] == start  # template text encoded without a BOS of its own
        assert tok.decode(r.ids).endswith("<|im_start|>assistant\n")
    markers = corpus.benchmark_markers()
    assert not any(m in r.prompt for r in rows for m in markers)


def test_job_trains_on_tiny_target_and_lowers_loss(tiny_llama_hf: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl.gz"
    _write_prompts(tiny_llama_hf, prompts)
    out = tmp_path / "out"
    m = gpu_job.main(_job_args(tiny_llama_hf, prompts, out, "--steps", "30", "--save-every", "0", "--split-mib", "0",
                               "--short-block-frac", "0.3"))
    losses = [loss for _, loss in m["train"]["losses"]]
    assert m["train"]["steps"] == 30
    assert losses[-1] < 0.8 * losses[0], losses
    assert m["data"]["teacher_forced_agreement"] > 0.99  # features and answers belong together
    for n in ("1", "3"):
        tps = m["heldout"][n]["tokens_per_step"]["all"]
        assert 1.0 <= tps <= int(n) + 1
    draft, cfg = load_checkpoint(out / "draft")
    assert cfg["block_size"] == 4 and cfg["dflash_config"]["target_layer_ids"] == [0, 2]
    assert cfg["dflash_config"]["mask_token_id"] == 3  # the fixture tokenizer's <|mask|>
    assert cfg["torch_dtype"] == "float16"
    assert json.loads((out / "metrics.json").read_text())["train"]["steps"] == 30
    assert (out / "log.txt").read_text().count("held-out acceptance") == 2


def test_job_resumes_from_checkpoint_and_reuses_answers(tiny_llama_hf: Path, tmp_path: Path) -> None:
    prompts = tmp_path / "p.jsonl.gz"
    _write_prompts(tiny_llama_hf, prompts, n=16)
    out, work = tmp_path / "out", tmp_path / "work"
    first = gpu_job.main(_job_args(tiny_llama_hf, prompts, out, "--work", str(work), "--steps", "6",
                                   "--save-every", "3"))
    assert first["train"]["steps"] == 6 and (work / "ckpt.pt").is_file()
    second = gpu_job.main(_job_args(tiny_llama_hf, prompts, out, "--work", str(work), "--steps", "10", "--resume"))
    assert second["train"]["steps"] == 10 and second["train"]["steps_this_run"] == 4
    assert "generation" not in second  # answers came from the cache
    assert "reused from" in (out / "log.txt").read_text()


def test_sample_anchors_stay_inside_the_answer() -> None:
    gen = torch.Generator().manual_seed(0)
    p, g = torch.tensor([5, 10, 3]), torch.tensor([8, 20, 4])
    a = gpu_job.sample_anchors_varlen(p, g, 4, 500, gen)
    assert (a >= p[:, None]).all() and (a + 3 <= (p + g - 1)[:, None]).all()
    assert a[1].min() == 10 and a[1].max() == 10 + 20 - 4  # the whole range is reachable


def test_replay_walks_the_greedy_decode() -> None:
    # accepted lengths per anchor offset: round 1 at 0 accepts 2 -> next anchor 3 accepts 1 -> 5 accepts 0 -> 6 ...
    acc = torch.tensor([2, 0, 0, 1, 0, 0, 3, 0, 0, 0])
    rounds, tokens, per = gpu_job.replay(acc, 0)
    assert per == [2, 1, 0, 3] and rounds == 4 and tokens == 10


def test_gguf_unpermute_inverts_llama_cpp_permute() -> None:
    def llama_cpp_permute(w: torch.Tensor, n_head: int) -> torch.Tensor:  # convert_hf_to_gguf's permute
        return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)

    w = torch.randn(3 * 64, 40)
    assert torch.equal(_reverse_permute(llama_cpp_permute(w, 3), 3), w)


@pytest.mark.skipif(not (SHIPPED / "config.json").is_file(), reason="no shipped SmolLM2 draft")
def test_shipped_smollm2_draft_loads_with_smollm2_dims() -> None:
    files = sorted(SHIPPED.glob("*.safetensors"))
    assert [f.name for f in files] == ["model.safetensors"]
    assert files[0].stat().st_size < 20 * 10**6
    draft, cfg = load_checkpoint(SHIPPED)
    c = draft.cfg
    assert c.hidden_size == 576 and cfg["vocab_size"] == 49152 and cfg["num_target_layers"] == 30
    assert c.num_attention_heads == 9 and c.num_key_value_heads == 3 and c.head_dim == 64
    assert c.block_size == 8 and c.mask_token_id == 16
    assert max(c.target_layer_ids) <= 28 and len(c.target_layer_ids) == 5
    assert c.rope["rope_theta"] == 100000.0
    assert cfg["torch_dtype"] in ("float16", "bfloat16")
    assert all(torch.isfinite(p).all() for p in draft.parameters())
    # A trained draft, not a random one: the fc projection moved away from its N(0, 0.02) init.
    assert abs(float(draft.fc.weight.std()) - 0.02) > 1e-3
