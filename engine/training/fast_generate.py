"""Batched generation for Llama, Qwen2 (q/k/v biases) and Qwen3 (q/k norms) targets with a static KV cache.

HF `generate` with a growing DynamicCache ran ~8.5k new tokens/s on the H200 for SmolLM2-135M at
batch 2,048: every step re-copies the whole cache (`torch.cat`) and expands the 3 KV heads to the 9
query heads (`repeat_kv`), in float32. Here the cache is allocated once ([B, kv_heads, P + N, d] per
layer, bf16 by default), a decode step writes one slot and attends over the filled prefix with the
query heads grouped onto their KV head (no repeat), and finished rows are dropped from the batch
(cache compaction) once enough of them have hit EOS, so the long tail of a batch runs on few rows.

Same semantics as HF `generate` (engine/training/data.py `generate_answers_hf`): greedy, left padding (a pad key is never attended;
positions count from each row's first real token, like HF's `cumsum(attention_mask) - 1`), answers
end at EOS (kept) or after `new_tokens`. In float32 it reproduces HF `generate` token for token
(tests/test_training_fast_generate.py); in bf16 near-ties can fall the other way, which the job's
teacher-forced agreement check (float32 forward over the answers) measures.
"""
from __future__ import annotations

import random
import time
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

Log = Callable[[str], None]


class StaticLlama:
    """The decoder weights of a HF Llama / Qwen2 / Qwen3 CausalLM, cast once to `dtype`."""

    def __init__(self, model: Any, dtype: torch.dtype = torch.bfloat16) -> None:
        cfg = model.config
        inner = model.model
        self.dtype = dtype
        self.n_heads = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.n_heads
        self.eps = cfg.rms_norm_eps
        self.rotary = inner.rotary_emb  # HF's own RoPE (cos/sin per position, any rope scaling)
        self.embed = inner.embed_tokens.weight.detach().to(dtype)
        self.norm = inner.norm.weight.detach().float()
        self.lm_head = model.lm_head.weight.detach().to(dtype)
        self.layers = []
        self.qkv_bias: list[torch.Tensor | None] = []  # Qwen2: q/k/v biases
        self.qk_norm: list[tuple[torch.Tensor, torch.Tensor] | None] = []  # Qwen3: per-head RMSNorm of q and k
        for layer in inner.layers:
            a, m = layer.self_attn, layer.mlp
            qkv = torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight], 0).detach().to(dtype)
            gu = torch.cat([m.gate_proj.weight, m.up_proj.weight], 0).detach().to(dtype)
            for proj in (a.o_proj, m.gate_proj, m.up_proj, m.down_proj):
                if getattr(proj, "bias", None) is not None:
                    raise ValueError("static generation supports biases on q/k/v only (Llama, Qwen2, Qwen3)")
            biases = [getattr(x, "bias", None) for x in (a.q_proj, a.k_proj, a.v_proj)]
            self.qkv_bias.append(torch.cat([b.detach() if b is not None else torch.zeros(x.out_features, device=x.weight.device)
                                            for b, x in zip(biases, (a.q_proj, a.k_proj, a.v_proj))]).to(dtype)
                                 if any(b is not None for b in biases) else None)
            qn, kn = getattr(a, "q_norm", None), getattr(a, "k_norm", None)
            self.qk_norm.append((qn.weight.detach().float(), kn.weight.detach().float()) if qn is not None else None)
            self.layers.append((layer.input_layernorm.weight.detach().float(), qkv, a.o_proj.weight.detach().to(dtype),
                                layer.post_attention_layernorm.weight.detach().float(), gu,
                                m.down_proj.weight.detach().to(dtype)))
        self.n_inter = self.layers[0][4].shape[0] // 2

    def _rms(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype) if x.dtype == torch.float32 else (w * xf).to(x.dtype)

    @staticmethod
    def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        rot = torch.cat((-x[..., h:], x[..., :h]), -1)
        return x * cos + rot * sin

    def forward(self, ids: torch.Tensor, pos: torch.Tensor, caches: list[tuple[torch.Tensor, torch.Tensor]],
                start: int, key_ok: torch.Tensor, slot: torch.Tensor | None = None) -> torch.Tensor:
        """ids/pos [B, q] written at cache slots start..start+q-1; key_ok [B, start+q] (False: pad key).
        Returns the last position's logits [B, V] (float32).

        With `slot` (a one-element long tensor; q must be 1) the step is shape-fixed for CUDA graph
        replay: the token is written at cache slot `slot` and attends over every slot up to it of the
        whole cache (key_ok [B, T]), so no shape depends on the step and `start` is not read."""
        b, q = ids.shape
        nh, nk, d = self.n_heads, self.n_kv, self.head_dim
        rep = nh // nk
        x = F.embedding(ids, self.embed)
        cos, sin = self.rotary(x, pos)
        cos, sin = cos.to(self.dtype)[:, None], sin.to(self.dtype)[:, None]  # [B, 1, q, d]
        if slot is not None:
            total = caches[0][0].shape[2]
            end = total
            # mask [B, 1, 1, T]: the slots written so far that are not padding (the query's own slot is
            # real); unwritten slots are read with weight 0, so the cache must hold finite numbers there
            upto = torch.arange(total, device=ids.device) <= slot
            mask = (key_ok & upto[None])[:, None, None]
        else:
            end = start + q
            # mask [B, 1, q, end]: causal over the written slots, pad keys never (a pad query sees itself: no NaN rows)
            causal = torch.ones(q, end, dtype=torch.bool, device=ids.device).tril(start)
            mask = causal[None] & key_ok[:, None, :end]
            diag = torch.zeros(q, end, dtype=torch.bool, device=ids.device)
            diag[torch.arange(q), start + torch.arange(q)] = True
            mask = (mask | diag[None])[:, None]
        for li, (w_in, qkv_w, o_w, w_post, gu_w, down_w) in enumerate(self.layers):
            h = self._rms(x, w_in)
            qkv = h @ qkv_w.T
            if self.qkv_bias[li] is not None:
                qkv = qkv + self.qkv_bias[li]
            qh = qkv[..., : nh * d].view(b, q, nh, d)
            kh = qkv[..., nh * d : (nh + nk) * d].view(b, q, nk, d)
            if self.qk_norm[li] is not None:
                qh, kh = self._rms(qh, self.qk_norm[li][0]), self._rms(kh, self.qk_norm[li][1])
            qh, kh = qh.transpose(1, 2), kh.transpose(1, 2)
            vh = qkv[..., (nh + nk) * d :].view(b, q, nk, d).transpose(1, 2)
            qh, kh = self._rope(qh, cos, sin), self._rope(kh, cos, sin)
            kc, vc = caches[li]
            if slot is not None:
                kc.index_copy_(2, slot, kh)
                vc.index_copy_(2, slot, vh)
            else:
                kc[:, :, start:end] = kh
                vc[:, :, start:end] = vh
            # query head j*rep + r uses KV head j (HF repeat_kv): group the rep heads as extra query rows
            qg = qh.reshape(b, nk, rep * q, d)
            mg = mask if (rep == 1 or slot is not None) else mask.expand(b, 1, q, end).repeat(1, 1, rep, 1)
            att = F.scaled_dot_product_attention(qg, kc[:, :, :end], vc[:, :, :end], attn_mask=mg)
            att = att.reshape(b, nh, q, d).transpose(1, 2).reshape(b, q, nh * d)
            x = x + att @ o_w.T
            h = self._rms(x, w_post)
            gu = h @ gu_w.T
            x = x + (F.silu(gu[..., : self.n_inter]) * gu[..., self.n_inter :]) @ down_w.T
        last = self._rms(x[:, -1], self.norm)
        return (last @ self.lm_head.T).float()


@torch.no_grad()
def sample_tokens(logits: torch.Tensor, temperature: float, top_p: float,
                  generator: torch.Generator | None = None) -> torch.Tensor:
    """One token per row: argmax when temperature <= 0, else nucleus sampling (softmax(logits / T),
    the smallest set of most likely tokens whose probability reaches top_p; the top token always stays)."""
    if temperature <= 0:
        return logits.argmax(-1)
    probs = torch.softmax(logits.float() / temperature, -1)
    if top_p < 1.0:
        sp, si = probs.sort(-1, descending=True)
        drop = (sp.cumsum(-1) - sp) >= top_p  # mass before this token already reaches top_p
        sp = sp.masked_fill(drop, 0.0)
        pick = torch.multinomial(sp, 1, generator=generator)
        return si.gather(-1, pick).squeeze(-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


class DecodeStep:
    """One decode step on static input buffers.

    On CUDA it is the shape-fixed step (`StaticLlama.forward` with `slot`), captured once as a CUDA
    graph and replayed: a step of a small target is hundreds of short kernels, and launching them one
    by one from Python left the GPU mostly idle. A new batch shape (a new batch, or rows dropped by
    compaction) needs a new `DecodeStep`. Elsewhere, or with `graph=False`, it is the growing-prefix
    step (attention over the written slots only); the shape-fixed step attends over the whole cache
    with the unwritten slots masked, the same sums in another order
    (tests/engine/training/test_fast_generate.py compares the two)."""

    def __init__(self, sm: StaticLlama, caches: list[tuple[torch.Tensor, torch.Tensor]], key_ok: torch.Tensor,
                 graph: bool) -> None:
        dev = key_ok.device
        b = key_ok.shape[0]
        self.sm, self.caches, self.key_ok = sm, caches, key_ok
        self.tok = torch.zeros((b, 1), dtype=torch.long, device=dev)
        self.pos = torch.zeros((b, 1), dtype=torch.long, device=dev)
        self.slot = torch.zeros(1, dtype=torch.long, device=dev)
        self.graph: torch.cuda.CUDAGraph | None = None
        self.out: torch.Tensor | None = None
        self.want_graph = graph and dev.type == "cuda"

    def _eager(self) -> torch.Tensor:
        return self.sm.forward(self.tok, self.pos, self.caches, 0, self.key_ok, slot=self.slot)

    def _capture(self) -> None:
        # warm up on a side stream (cuBLAS handles, SDPA kernel choice), then record one step; both
        # write this step's keys at this step's slot, which the replay writes again with the same values
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._eager()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.out = self._eager()

    def __call__(self, tok: torch.Tensor, pos: torch.Tensor, slot: int) -> torch.Tensor:
        """Logits [B, V] (float32) of writing `tok` [B] at positions `pos` [B] into cache slot `slot`.
        On the graph path the result is the graph's output buffer: read it before the next call."""
        if self.want_graph:
            self.tok.copy_(tok[:, None])
            self.pos.copy_(pos[:, None])
            self.slot.fill_(slot)
            if self.graph is None:
                try:
                    self._capture()
                except RuntimeError as e:  # an op this torch cannot capture: the eager step still works
                    torch.cuda.synchronize()
                    self.want_graph, self.graph = False, None
                    print(f"fast_generate: CUDA graph capture failed ({e}); decoding eagerly", flush=True)
            if self.graph is not None:
                self.graph.replay()
                return self.out
        # the growing-prefix step: on CPU it matches HF generate token for token
        return self.sm.forward(tok[:, None], pos[:, None], self.caches, slot, self.key_ok)


def static_generate_batch(sm: StaticLlama, prompts: Sequence[Sequence[int]], new_tokens: int, eos_id: int,
                          pad_id: int, compact_frac: float = 0.25, temperature: float = 0.0, top_p: float = 1.0,
                          generator: torch.Generator | None = None, cuda_graph: bool = True) -> list[list[int]]:
    """Answers (EOS kept, nothing after it) for one left-padded batch: greedy by default, sampled
    (temperature, top_p; `generator` on the model's device) when temperature > 0. Decode steps are
    replayed as CUDA graphs on a GPU (`cuda_graph`); a graph is captured per batch shape, so rows
    are dropped less often there (when half of them have finished)."""
    dev = sm.embed.device
    graphed = cuda_graph and dev.type == "cuda"
    if graphed:
        compact_frac = max(compact_frac, 0.5)
    b = len(prompts)
    width = max(len(p) for p in prompts)
    total = width + new_tokens
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    ok = torch.zeros((b, total), dtype=torch.bool)
    for j, p in enumerate(prompts):
        ids[j, width - len(p):] = torch.tensor(list(p), dtype=torch.long)
        ok[j, width - len(p):] = True  # the answer slots are real keys once written
    ids, ok = ids.to(dev), ok.to(dev)
    n_pad = width - ok[:, :width].sum(1)
    pos = (torch.arange(width, device=dev)[None] - n_pad[:, None]).clamp(min=0)
    # zeroed: the shape-fixed step reads unwritten slots with weight 0, and 0 * NaN would be NaN
    caches = [(torch.zeros(b, sm.n_kv, total, sm.head_dim, dtype=sm.dtype, device=dev),
               torch.zeros(b, sm.n_kv, total, sm.head_dim, dtype=sm.dtype, device=dev)) for _ in sm.layers]
    logits = sm.forward(ids, pos, caches, 0, ok)
    rows = torch.arange(b, device=dev)  # original row of each live batch row
    out = torch.full((b, new_tokens), -1, dtype=torch.long, device=dev)
    done = torch.zeros(b, dtype=torch.bool, device=dev)
    next_pos = pos[:, -1] + 1
    step = DecodeStep(sm, caches, ok, graphed)
    for t in range(new_tokens):
        tok = sample_tokens(logits, temperature, top_p, generator)
        out[rows, t] = tok
        done = done | (tok == eos_id)
        if t == new_tokens - 1:
            break
        n_done = int(done.sum()) if (t % 8 == 7) else 0
        if n_done == done.shape[0]:
            break
        if n_done and n_done >= compact_frac * done.shape[0]:
            keep = (~done).nonzero().squeeze(1)
            rows, tok, next_pos, ok, done = rows[keep], tok[keep], next_pos[keep], ok[keep], done[keep]
            caches = [(k[keep], v[keep]) for k, v in caches]
            graphed = step.want_graph  # a capture that failed is not tried again for this batch
            del step
            step = DecodeStep(sm, caches, ok, graphed)
        logits = step(tok, next_pos, width + t)
        next_pos = next_pos + 1
    res = out.cpu().tolist()
    answers = []
    for row in res:
        row = [x for x in row if x >= 0]
        if eos_id in row:
            row = row[: row.index(eos_id) + 1]
        answers.append(row)
    return answers


@torch.no_grad()
def generate_answers_static(target: Any, prompts: Sequence[Sequence[int]], new_tokens: int, batch_size: int,
                            eos_id: int, pad_id: int, deadline: float | None = None, log: Log = print, seed: int = 0,
                            dtype: torch.dtype = torch.bfloat16, temperature: float = 0.0,
                            top_p: float = 1.0) -> list[list[int] | None]:
    """Like data.generate_answers_hf (same batching, order and deadline rule) on StaticLlama.
    temperature > 0 samples (nucleus top_p, seeded by `seed`) instead of the greedy default."""
    sm = StaticLlama(target, dtype)
    gen = None
    if temperature > 0:
        gen = torch.Generator(device=sm.embed.device)
        gen.manual_seed(seed)
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = [order[i: i + batch_size] for i in range(0, len(order), batch_size)]
    random.Random(seed).shuffle(batches)
    out: list[list[int] | None] = [None] * len(prompts)
    t0 = time.time()
    done = new = 0
    for bi, chunk in enumerate(batches):
        if deadline is not None and time.time() > deadline:
            log(f"generation: time budget reached after {bi}/{len(batches)} batches ({done} answers)")
            break
        got = static_generate_batch(sm, [prompts[i] for i in chunk], new_tokens, eos_id, pad_id,
                                    temperature=temperature, top_p=top_p, generator=gen)
        for i, a in zip(chunk, got):
            out[i] = a
            new += len(a)
        done += len(chunk)
        el = time.time() - t0
        mode = f"sampled T={temperature} top_p={top_p}" if temperature > 0 else "greedy"
        log(f"generation (static {str(dtype).replace('torch.', '')}, {mode}): batch {bi + 1}/{len(batches)} "
            f"({len(chunk)} x prompt<={max(len(prompts[i]) for i in chunk)}) done, {done} answers, {new} tokens, "
            f"{el:.1f}s ({new / max(el, 1e-9):.0f} tokens/s)")
    return out
