"""The hand-off to a serving cluster: a draft written as the public checkpoint vLLM / SGLang load, with a
README that gives the launch command and speculative config those engines document.

Layouts (docs/draft-contract.md, /work/shared/docs/dflash-spec.md §1.1, §3.1, §4):
  DFlash v1  z-lab    architectures ["DFlashDraftModel"], dflash_config {mask_token_id, target_layer_ids},
                      block_size; unprefixed weights, no embed_tokens / lm_head (taken from the target)
  DSpark     DeepSpec architectures ["Qwen3DSparkModel"], top-level mask_token_id / target_layer_ids /
                      block_size / markov_*; the checkpoint also stores embed_tokens and lm_head, copies
                      of the target's (written here from the target's Hugging Face weights)
  DFlash v2  z-lab    architectures ["DFlash2DraftModel"], dflash_config {block_size, conv_*, selector_*, ...}

Self-contained on purpose (safetensors + json only): it reads and checks the checkpoint's tensors by
name and shape, it does not build the torch draft modules. Neither engine runs on this machine, so
the README cites the page each command comes from.
"""
from __future__ import annotations

import json
import os
import shlex
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import DraftMismatchError, ModelFolderError

ENGINES = ("vllm", "sglang")
VOCAB_FILE = "draft_vocabulary.json"  # engine/models/draft_vocab.py: our sub-vocabulary (the engines ignore it)
COPIED = (VOCAB_FILE, "training.json", "generation_config.json")
RESOURCES_DRAFTS = Path(__file__).resolve().parents[2] / "resources" / "drafts"

_LAYER = ("input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.q_proj.weight",
          "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
          "self_attn.q_norm.weight", "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
          "mlp.down_proj.weight")
_DFLASH2_LAYER = ("attention_conv.base_kernel", "attention_conv.kernel_projection.weight", "mlp_conv.base_kernel",
                  "mlp_conv.kernel_projection.weight")
_COPIES = ("embed_tokens.weight", "lm_head.weight")

# Where each command comes from (the search corpora of this project; neither engine runs here).
SOURCES = {
    "vllm-dflash": "z-lab/dflash README, 'Run DFlash with vLLM' (https://github.com/z-lab/dflash); "
                   "vLLM Neuron DFlash design page (https://awsdocs-neuron.readthedocs-hosted.com/en/latest/"
                   "vllm-neuron/docs/design/speculation/dflash_speculative_decoding_design.html); "
                   "num_speculative_tokens = block_size - 1: NVIDIA-NeMo/Automodel#2913",
    "vllm-dspark": "vllm-project/vllm#47093 (DSpark speculators checkpoint support: method dspark, "
                   "draft_sample_method probabilistic); vllm-project/vllm#50012 (num_speculative_tokens >= the "
                   "DSpark block size)",
    "vllm-dflash2": "vllm-project/recipes#837 (method dflash, DFlash2 chosen by the draft's architecture, "
                    "num_speculative_tokens = block_size - 1; needs a vLLM with vllm-project/vllm#52816)",
    "sglang-dflash": "SGLang speculative decoding docs, DFlash section (https://docs.sglang.io/docs/advanced_features/"
                     "speculative_decoding.md, sgl-project/sglang#23553); z-lab model cards: "
                     "'--speculative-num-draft-tokens sets the block size'",
    "sglang-dspark": "sgl-project/sglang#29538 (--speculative-algorithm DSPARK, --speculative-dspark-block-size); "
                     "DSpark takes no num-steps / draft-tokens flags (lm-sys/lm-sys.github.io#413 review)",
    "sglang-dflash2": "sgl-project/sglang#35371 (DFlash2 selector walk) and #35655 (DFLASH2 with "
                      "--speculative-num-draft-tokens 8, the block size)",
}


@dataclass
class Launch:
    engine: str
    variant: str
    method: str
    num_speculative_tokens: int
    command: str
    source: str
    notes: list[str]


def resolve_target(target: Path) -> Path:
    """The target's Hugging Face folder: itself, or the folder an OpenVINO target was exported from."""
    target = Path(target)
    if not (target / "config.json").is_file():
        raise ModelFolderError(f"{target} has no config.json: give the target's Hugging Face folder "
                               "(or the OpenVINO folder exported from it).")
    if (target / "openvino_model.xml").is_file():
        marker = target / "dflash_export.json"
        source = json.loads(marker.read_text()).get("source") if marker.is_file() else None
        if source and (Path(source) / "config.json").is_file():
            return Path(source)
        raise ModelFolderError(f"{target} is an OpenVINO IR: a serving engine loads the Hugging Face checkpoint it "
                               "was exported from. Pass that folder as --target.")
    if not list(target.glob("*.safetensors")):
        raise ModelFolderError(f"{target} has no .safetensors weights: give the target's Hugging Face folder.")
    return target


def resolve_draft(draft: Path) -> Path:
    """The draft's checkpoint folder: itself, or for an exported IR the shipped checkpoint of the same name."""
    draft = Path(draft)
    if list(draft.glob("*.safetensors")) and (draft / "config.json").is_file():
        return draft
    if (draft / "openvino_model.xml").is_file():
        shipped = RESOURCES_DRAFTS / draft.name
        if list(shipped.glob("*.safetensors")):
            return shipped
        raise ModelFolderError(f"{draft} is an OpenVINO draft IR: the serving engines load the checkpoint it was "
                               "exported from (config.json + model.safetensors). Pass that folder as --draft.")
    raise ModelFolderError(f"{draft} is not a draft checkpoint (config.json + *.safetensors).")


def _read_tensors(folder: Path) -> dict[str, Any]:
    from safetensors import safe_open

    tensors: dict[str, Any] = {}
    for f in sorted(folder.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as st:
            for k in st.keys():
                tensors[k.removeprefix("model.")] = st.get_tensor(k)
    return tensors


def _variant(cfg: dict[str, Any]) -> str:
    arch = (cfg.get("architectures") or [None])[0]
    variants = {"DFlashDraftModel": "dflash_v1", "Qwen3DSparkModel": "dspark", "DFlash2DraftModel": "dflash_v2"}
    if arch not in variants:
        raise ModelFolderError(f"not a DFlash-family draft checkpoint: architectures={cfg.get('architectures')!r} "
                               f"(expected one of {', '.join(variants)}).")
    return variants[arch]


def _fields(cfg: dict[str, Any], variant: str) -> tuple[int, int, list[int]]:
    """(block_size, mask_token_id, target_layer_ids) wherever this layout keeps them."""
    d = cfg.get("dflash_config") or {}
    block = cfg.get("block_size", d.get("block_size"))
    mask = d.get("mask_token_id", cfg.get("mask_token_id"))
    layers = d.get("target_layer_ids", cfg.get("target_layer_ids"))
    if not isinstance(block, int) or not isinstance(mask, int) or not isinstance(layers, list):
        raise ModelFolderError(f"the {variant} config lacks block_size / mask_token_id / target_layer_ids.")
    return block, mask, [int(i) for i in layers]


def _expected(cfg: dict[str, Any], variant: str) -> set[str]:
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    for i in range(int(cfg["num_hidden_layers"])):
        names |= {f"layers.{i}.{n}" for n in _LAYER}
        if variant == "dflash_v2":
            names |= {f"layers.{i}.{n}" for n in _DFLASH2_LAYER}
    if variant == "dspark" and int(cfg.get("markov_rank", 0)) > 0:
        names |= {"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"}
        if cfg.get("markov_head_type") == "gated":
            names |= {"markov_head.gate_proj.weight", "markov_head.gate_proj.bias"}
    if variant == "dspark" and cfg.get("enable_confidence_head"):
        names |= {"confidence_head.proj.weight", "confidence_head.proj.bias"}
    if variant == "dflash_v2":
        names |= {"candidate_selector.predecessor_codebook", "candidate_selector.successor_codebook",
                  "candidate_selector.hidden_projection.weight"}
    return names


def _check_fit(cfg: dict[str, Any], tcfg: dict[str, Any], layers: list[int], mask: int) -> None:
    t = tcfg.get("text_config") or tcfg
    problems = []
    for key in ("hidden_size", "vocab_size"):
        if cfg.get(key) != t.get(key):
            problems.append(f"{key}: draft {cfg.get(key)}, target {t.get(key)}")
    n = int(t.get("num_hidden_layers", 0))
    if any(not 0 <= i < n - 1 for i in layers):
        problems.append(f"target_layer_ids {layers} must lie in 0..{n - 2} (the target has {n} layers; its last "
                        "layer's output is after the final norm)")
    if not 0 <= mask < int(t.get("vocab_size", 0)):
        problems.append(f"mask_token_id {mask} is outside the target's vocabulary")
    if problems:
        raise DraftMismatchError("The draft does not fit the target:\n- " + "\n- ".join(problems))


def public_config(cfg: dict[str, Any], variant: str) -> dict[str, Any]:
    """config.json in the layout's own place for each field (both places where readers differ)."""
    out = {k: v for k, v in cfg.items() if k != "weight_storage"}  # the layout's tensors are float
    block, mask, layers = _fields(cfg, variant)
    if variant in ("dflash_v1", "dflash_v2"):
        d = dict(cfg.get("dflash_config") or {})
        d.update(mask_token_id=mask, target_layer_ids=layers)
        if variant == "dflash_v2":
            d["block_size"] = block
        out["dflash_config"] = d
        out["block_size"] = block
    else:
        out.update(mask_token_id=mask, target_layer_ids=layers, block_size=block)
    out.setdefault("num_target_layers", cfg.get("num_target_layers"))
    return out


def launch(variant: str, engine: str, block: int, target: str, draft: str) -> Launch:
    """The launch command and speculative config the engine's documentation gives for this variant."""
    t, d = shlex.quote(target), shlex.quote(draft)
    if engine == "vllm":
        method = "dspark" if variant == "dspark" else "dflash"
        n = block if variant == "dspark" else block - 1  # DSpark drafts a token per block row; z-lab layouts one fewer
        spec: dict[str, Any] = {"method": method, "model": draft, "num_speculative_tokens": n}
        notes = ["Drafting is greedy (argmax) in the z-lab layout whatever the sampling temperature; the target's "
                 "rejection sampling keeps the output distribution exact."]
        if variant == "dspark":
            spec["draft_sample_method"] = "probabilistic"
            notes = ["draft_sample_method probabilistic: the draft samples its Markov-corrected distribution and the "
                     "target verifies by rejection sampling (exact for temperature > 0)."]
        if variant == "dflash_v2":
            notes.append("DFlash2 is chosen by the draft's architectures (DFlash2DraftModel); it needs a vLLM build "
                         "with vllm-project/vllm#52816.")
        if variant == "dflash_v1":
            notes.append("vLLM's DFlash drafter wants the flash_attn attention backend for the draft "
                         "(\"attention_backend\": \"flash_attn\" in the speculative config, as z-lab's README shows).")
        command = f"vllm serve {t} \\\n  --speculative-config {shlex.quote(json.dumps(spec))}"
        return Launch(engine, variant, method, n, command, SOURCES[f"vllm-{_key(variant)}"], notes)
    algorithm = {"dflash_v1": "DFLASH", "dspark": "DSPARK", "dflash_v2": "DFLASH2"}[variant]
    size_flag = "--speculative-dspark-block-size" if variant == "dspark" else "--speculative-num-draft-tokens"
    command = (f"python -m sglang.launch_server --model-path {t} \\\n  --speculative-algorithm {algorithm} \\\n"
               f"  --speculative-draft-model-path {d} \\\n  {size_flag} {block}")
    notes = ["SGLang's DFlash path: no DP attention, pp_size 1, the overlap scheduler off (SGLang docs)."]
    if variant == "dflash_v2":
        notes.append("DFLASH2 needs an SGLang release that contains sgl-project/sglang#35371.")
    return Launch(engine, variant, algorithm, block, command,
                  SOURCES[f"sglang-{_key(variant)}"], notes)


def _key(variant: str) -> str:
    return {"dflash_v1": "dflash", "dspark": "dspark", "dflash_v2": "dflash2"}[variant]


def export_serving(target: Path, draft: Path, engine: str, output: Path) -> Path:
    """Write `output`: config.json + model.safetensors in the public layout, README.md, serving.json."""
    from safetensors.torch import save_file

    if engine not in ENGINES:
        raise ValueError(f"engine={engine!r}: use one of {', '.join(ENGINES)}.")
    target_hf, ckpt = resolve_target(Path(target)), resolve_draft(Path(draft))
    cfg = json.loads((ckpt / "config.json").read_text(encoding="utf-8"))
    variant = _variant(cfg)
    block, mask, layers = _fields(cfg, variant)
    tcfg = json.loads((target_hf / "config.json").read_text(encoding="utf-8"))
    _check_fit(cfg, tcfg, layers, mask)
    from engine.drafts.checkpoint import read_state

    tensors = read_state(ckpt)  # the draft's own reader: int8-stored rows come back as their float values
    expected = _expected(cfg, variant)
    missing = sorted(expected - set(tensors))
    if missing:
        raise ModelFolderError(f"{ckpt} lacks {len(missing)} {variant} tensors, e.g. {', '.join(missing[:4])}.")
    unknown = sorted(set(tensors) - expected - set(_COPIES))
    if unknown:
        raise ModelFolderError(f"{ckpt} has tensors the {variant} layout does not know: {', '.join(unknown[:4])}.")
    out_tensors = {k: tensors[k].contiguous() for k in sorted(expected)}
    if cfg.get("weight_storage"):  # int8 rows: every tensor in the checkpoint's float dtype
        import torch

        out_tensors = {k: v.to(getattr(torch, cfg.get("torch_dtype") or "float16")) for k, v in out_tensors.items()}
    if variant == "dspark":  # DeepSpec stores the target's embedding and lm_head with the draft
        tw = _read_tensors(target_hf)
        embed = tw.get("embed_tokens.weight")
        head = tw.get("lm_head.weight", embed if (tcfg.get("text_config") or tcfg).get("tie_word_embeddings") else None)
        if embed is None or head is None:
            raise ModelFolderError(f"{target_hf} lacks embed_tokens / lm_head weights for the DSpark copies.")
        dtype = out_tensors["fc.weight"].dtype
        out_tensors["embed_tokens.weight"] = embed.to(dtype).contiguous()
        out_tensors["lm_head.weight"] = head.to(dtype).contiguous().clone()
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{output.name}.partial-", dir=output.parent))
    tmp.chmod(0o755)
    try:
        save_file(out_tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "model.safetensors").chmod(0o644)
        (tmp / "config.json").write_text(json.dumps(public_config(cfg, variant), indent=2) + "\n", encoding="utf-8")
        for name in COPIED:
            if (ckpt / name).is_file():
                shutil.copy2(ckpt / name, tmp / name)
        plan = launch(variant, engine, block, str(target_hf.resolve()), str(output.resolve()))
        (tmp / "serving.json").write_text(json.dumps({
            "engine": engine, "variant": variant, "method": plan.method,
            "num_speculative_tokens": plan.num_speculative_tokens, "block_size": block,
            "target": str(target_hf.resolve()), "draft": str(output.resolve()), "command": plan.command,
            "source": plan.source}, indent=2) + "\n", encoding="utf-8")
        (tmp / "README.md").write_text(_readme(plan, ckpt, target_hf, block), encoding="utf-8")
        if output.exists():
            old = output.with_name(f".{output.name}.old-{os.getpid()}")
            output.rename(old)
            tmp.rename(output)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(output)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return output


def _readme(plan: Launch, ckpt: Path, target: Path, block: int) -> str:
    layout = {"dflash_v1": "z-lab DFlash (DFlashDraftModel)", "dspark": "DeepSpec DSpark (Qwen3DSparkModel)",
              "dflash_v2": "z-lab DFlash2 (DFlash2DraftModel)"}[plan.variant]
    engine = {"vllm": "vLLM", "sglang": "SGLang"}[plan.engine]
    notes = "\n".join(f"- {n}" for n in plan.notes)
    return f"""# {ckpt.name} for {engine}

A DFlash-family draft exported by `dflash-studio export --kind serving` in the public {layout}
checkpoint layout, for the target `{target}` (block size {block}).

## Launch

Copy this folder and the target's Hugging Face folder to the serving machine (fix the two paths
if they move), then:

```bash
{plan.command}
```

- method / algorithm: `{plan.method}`, speculative tokens per step: {plan.num_speculative_tokens}
{notes}

Source of this command: {plan.source}.

## Files

- `config.json`, `model.safetensors`: the draft in the public layout (safetensors, the checkpoint's dtype).
- `draft_vocabulary.json` (when present): DFlash Studio's sub-vocabulary for its own lm_head; the
  serving engines ignore it. `serving.json`: this command as data.
- Back to DFlash Studio: `dflash-studio export --kind draft --input THIS_FOLDER --output IR_FOLDER`.
"""


def run_cli(args: Any) -> int:
    """`dflash-studio export --kind serving --target DIR --draft DIR --engine vllm|sglang --output DIR`."""
    if not args.draft or not args.engine:
        raise ValueError("export --kind serving needs --draft DIR and --engine vllm|sglang (and --output DIR).")
    target = Path(args.target) if args.target else _default_target()
    out = export_serving(target, Path(args.draft), args.engine, Path(args.output))
    plan = json.loads((out / "serving.json").read_text())
    print(f"{out}\n\n{plan['command']}")
    return 0


def _default_target() -> Path:
    from engine.paths import default_target_dir

    return default_target_dir()
