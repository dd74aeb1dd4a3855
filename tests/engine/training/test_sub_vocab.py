"""Training and measuring a draft over its sub-vocabulary (losses.SubVocab): what the exported draft scores."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine.drafts.dflash2 import DFlash2Draft, random_dflash2_config  # noqa: E402
from engine.drafts.dflash_v1 import DFlashV1Draft, random_draft_config  # noqa: E402
from engine.drafts.dspark import DSparkDraft, random_dspark_config  # noqa: E402
from engine.training.evaluate import walk_blocks  # noqa: E402
from engine.training.losses import LossWeights, SubVocab, variant_loss  # noqa: E402
from fixtures.tiny_variant_drafts import randomize_heads  # noqa: E402

V, H = 60, 32
TARGET = {"num_hidden_layers": 4, "hidden_size": H, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 64, "vocab_size": V, "rope_theta": 10000.0}


def _draft(kind: str):
    torch.manual_seed(0)
    if kind == "dspark":
        m = DSparkDraft(random_dspark_config(TARGET, 1, 5, [1, 2], V - 1, markov_rank=8))
    elif kind == "dflash_v2":
        m = DFlash2Draft(random_dflash2_config(TARGET, 1, 5, [1, 2], V - 1, conv_group_size=16, selector_rank=8,
                                               selector_top_k=4))
    else:
        m = DFlashV1Draft(random_draft_config(TARGET, 1, 5, [1, 2], V - 1))
    if kind != "dflash_v1":
        randomize_heads(m, 1)
    return m.eval()


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V - 1, (2, 24), generator=g)
    feats = torch.randn(2, 24, 2 * H, generator=g)
    anchors = torch.tensor([[3, 9, 14], [1, 7, 15]])
    return tokens, feats, anchors, torch.randn(V, H, generator=g), torch.randn(V, H, generator=g)


@pytest.mark.parametrize("kind", ["dflash_v1", "dspark", "dflash_v2"])
def test_the_whole_vocabulary_as_a_sub_vocabulary_gives_the_same_loss_and_gradients(kind: str) -> None:
    draft = _draft(kind)
    tokens, feats, anchors, embed, lm_head = _batch()
    loss, parts = variant_loss(draft, tokens, feats, anchors, embed, lm_head, LossWeights())
    grads = torch.autograd.grad(loss, [p for p in draft.parameters() if p.requires_grad], allow_unused=True)
    shuffled = torch.randperm(V, generator=torch.Generator().manual_seed(3))  # any order: ids are sorted inside
    loss2, parts2 = variant_loss(draft, tokens, feats, anchors, embed, lm_head, LossWeights(),
                                 vocab=SubVocab.of(shuffled, lm_head))
    grads2 = torch.autograd.grad(loss2, [p for p in draft.parameters() if p.requires_grad], allow_unused=True)
    assert torch.allclose(loss, loss2, atol=1e-5) and parts.keys() == parts2.keys()
    for a, b in zip(grads, grads2):
        assert (a is None) == (b is None) and (a is None or torch.allclose(a, b, atol=1e-5))


def test_labels_outside_the_sub_vocabulary_carry_no_ce() -> None:
    """A row whose label the draft can never propose is not trained: changing such labels (the
    anchors kept) leaves the loss over a sub-vocabulary unchanged, where over the whole vocabulary
    it moves."""
    draft = _draft("dflash_v1")
    tokens, feats, anchors, embed, lm_head = _batch(1)
    vocab = SubVocab.of(torch.arange(0, V, 2), lm_head)  # even ids only
    odd = tokens % 2 == 1
    odd[torch.arange(2)[:, None], anchors] = False  # the blocks' first rows stay as they were
    moved = torch.where(odd, (tokens + 2) % (V - 2) | 1, tokens)  # every other odd token to another odd one
    loss = lambda t, v: variant_loss(draft, t, feats, anchors, embed, lm_head, LossWeights(), vocab=v)[0]  # noqa: E731
    assert not torch.allclose(loss(tokens, None), loss(moved, None))
    assert torch.allclose(loss(tokens, vocab), loss(moved, vocab), atol=1e-6)


@pytest.mark.parametrize("kind", ["dflash_v1", "dspark", "dflash_v2"])
def test_a_batch_with_every_label_outside_has_no_ce(kind: str) -> None:
    draft = _draft(kind)
    tokens, feats, anchors, embed, lm_head = _batch(2)
    tokens = tokens % 30  # every label below 30, the sub-vocabulary above
    _, parts = variant_loss(draft, tokens, feats, anchors, embed, lm_head, LossWeights(),
                            vocab=SubVocab.of(torch.arange(30, V), lm_head))
    assert float(parts["ce"]) == 0.0
    for k in ("tv", "ce_unary", "selector"):
        if k in parts:
            assert float(parts[k]) == 0.0


@pytest.mark.parametrize("kind,mode", [("dflash_v1", "none"), ("dspark", "none"), ("dspark", "topk"),
                                       ("dspark", "dense"), ("dflash_v2", "topk")])
def test_a_walk_over_the_sub_vocabulary_is_the_full_walk_with_the_rest_ruled_out(kind: str, mode: str) -> None:
    draft = _draft(kind)
    g = torch.Generator().manual_seed(5)
    m, n = 6, 4
    h = torch.randn(m, n, H, generator=g)
    unary = torch.randn(m, n, V, generator=g) * 3
    anchors = torch.randint(0, V, (m,), generator=g)
    ids = torch.randperm(V, generator=g)[:20].sort().values
    outside = torch.ones(V, dtype=torch.bool)
    outside[ids] = False
    with torch.no_grad():
        full = walk_blocks(draft, h, unary.masked_fill(outside, float("-inf")), anchors, mode, 4)
        sub = walk_blocks(draft, h, unary[..., ids], anchors, mode, 4, ids)
    assert torch.equal(full, sub)
    assert not outside[sub].any()
