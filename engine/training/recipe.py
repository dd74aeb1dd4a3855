"""Training recipes as data: resources/recipes/<name>.toml, read with tomllib and checked here.

A recipe says where the prompts come from (``[[sources]]``: type, count, seed, ...; the types are
engine/training/sources.py's), how the target answers them (``[data]``), the draft (``[draft]``:
anything left out gets a default from the target alone), the training and evaluation settings
(``[train]``, ``[eval]``) and the stages that made a shipped draft (``[[stages]]``: the sources each
trains on, its own settings over ``[train]``, where its weights start). Every mistake is a
RecipeError that names the file, the table and the key.
"""
from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from engine.drafts import VARIANTS
from engine.training.losses import LossWeights
from engine.training.trainer import TrainSettings

RECIPES_DIR = Path(__file__).resolve().parents[2] / "resources" / "recipes"
OFFLINE_SOURCES = ("stdlib_code", "package_code", "composed_chat", "functions", "file")
SAMPLED_SOURCES = ("magpie", "primed")
SOURCE_TYPES = OFFLINE_SOURCES + SAMPLED_SOURCES
# [data] keys a stage may set for itself; the others (seed, held-out rows, prompt length) define the rows
# every stage shares, so changing them in one stage would change the held-out set its τ is measured on.
STAGE_DATA_KEYS = ("max_feature_gib", "gen_batch", "features")
FEATURE_MODES = ("stored", "online")


class RecipeError(ValueError):
    """A recipe that cannot be used; the message names the file and the field."""


@dataclass(frozen=True)
class Source:
    name: str
    type: str
    count: int
    seed: int = 0
    kind: str = ""  # PromptRow.kind of its rows (default: from the type)
    packages: tuple[str, ...] = ()  # package_code / functions: which installed packages (default: all known)
    system: str = ""  # magpie / primed: system prompt of the template the target continues
    shares: dict[str, float] = field(default_factory=dict)  # primed: task-type shares
    temperature: float = 1.0
    top_p: float = 0.95
    max_new: int = 200
    min_tokens: int = 8
    max_tokens: int = 200
    path: str = ""  # file: JSONL of prompts or chat logs
    new_tokens: int = 0  # answer length for this source's rows (0: [data] new_tokens)

    @property
    def sampled(self) -> bool:
        return self.type in SAMPLED_SOURCES


@dataclass(frozen=True)
class DataSettings:
    seed: int = 0
    heldout: int = 256
    max_prompt_tokens: int = 384
    new_tokens: int = 256
    gen_batch: int = 512
    gen_dtype: str = "bfloat16"  # of the static generator on a GPU (float32 on CPU)
    max_feature_gib: float = 0.0  # per rank; 0: all rows (stored features only)
    feature_tokens: int = 131072
    features: str = "stored"  # stored: once per row, within max_feature_gib | online: per batch, every row


INT8_SHIP = "int8"  # wide weights as int8 rows (engine/drafts/checkpoint.py), the rest float16
SHIP_DTYPES = ("float16", "bfloat16", "float32", INT8_SHIP)


@dataclass(frozen=True)
class DraftSettings:
    layers: int = 0  # 0: the largest of 1..2 that fits max_mb
    block_size: int = 8
    taps: tuple[int, ...] = ()  # () : spread over the target (engine/training/defaults.py)
    mask_token: str = ""  # "": the first unused special token the target has
    max_mb: float = 0.0  # 0: from the target's size
    markov_rank: int = 0  # DSpark Markov head / DFlash v2 selector rank (0: the largest that fits, at most 64)
    head: str = "vanilla"  # DSpark: vanilla | gated | none
    confidence: str = "markov"  # DSpark: none | hidden | markov
    selector_top_k: int = 16
    conv_group_size: int = 16
    conv_kernel_size: int = 2
    ship_dtype: str = "float16"  # or int8: wide weights as int8 rows (engine/drafts/checkpoint.py), the rest float16


@dataclass(frozen=True)
class EvalSettings:
    rows: int = 256
    candidates: tuple[int, ...] = (1, 3, 5, 7, 8)
    top_k: int = 8
    every: int = 0  # held-out τ every N steps during training (0: at the end of each stage)
    during_rows: int = 32  # held-out rows of the τ logged during training


@dataclass(frozen=True)
class Stage:
    name: str
    sources: tuple[str, ...]
    init: str = "previous"  # previous | fresh | v1_backbone:<draft folder> | <checkpoint folder>
    train: dict[str, Any] = field(default_factory=dict)  # over [train]
    data: dict[str, Any] = field(default_factory=dict)  # over [data]: only STAGE_DATA_KEYS
    note: str = ""


@dataclass(frozen=True)
class Recipe:
    name: str
    variant: str
    path: Path
    sources: tuple[Source, ...]
    stages: tuple[Stage, ...]
    data: DataSettings = field(default_factory=DataSettings)
    draft: DraftSettings = field(default_factory=DraftSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    loss: LossWeights = field(default_factory=LossWeights)
    eval: EvalSettings = field(default_factory=EvalSettings)
    description: str = ""
    raw: dict[str, Any] = field(default_factory=dict)

    def source(self, name: str) -> Source:
        return next(s for s in self.sources if s.name == name)

    def stage(self, name: str) -> Stage:
        for s in self.stages:
            if s.name == name:
                return s
        raise RecipeError(f"{self.path}: no stage {name!r} (stages: {', '.join(s.name for s in self.stages)})")

    def stage_settings(self, stage: Stage) -> TrainSettings:
        return _fill(TrainSettings, stage.train, f"{self.path}: [[stages]] {stage.name!r}", self.train)

    def stage_data(self, stage: Stage) -> DataSettings:
        return _fill(DataSettings, stage.data, f"{self.path}: [[stages]] {stage.name!r} data", self.data)


def _fill(cls: Any, table: dict[str, Any], where: str, base: Any = None) -> Any:
    """cls(**table) with the keys checked against its fields and the values against their types."""
    if not isinstance(table, dict):
        raise RecipeError(f"{where} must be a table")
    known = {f.name: f for f in fields(cls)}
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise RecipeError(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(known)})")
    base = base if base is not None else cls()
    values = {}
    for k, v in table.items():
        want = getattr(base, k)
        if isinstance(want, bool):
            if not isinstance(v, bool):
                raise RecipeError(f"{where}: {k} must be true or false, got {v!r}")
        elif want is None or isinstance(want, (int, float)):
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise RecipeError(f"{where}: {k} must be a number, got {v!r}")
            if isinstance(want, int) and not float(v).is_integer():
                raise RecipeError(f"{where}: {k} must be a whole number, got {v!r}")
            if v < 0:
                raise RecipeError(f"{where}: {k} must not be negative, got {v!r}")
            v = type(want)(v) if want is not None else float(v)
        elif isinstance(want, str) and not isinstance(v, str):
            raise RecipeError(f"{where}: {k} must be a string, got {v!r}")
        elif isinstance(want, tuple):
            if not isinstance(v, list):
                raise RecipeError(f"{where}: {k} must be a list, got {v!r}")
            v = tuple(v)
        values[k] = v
    return replace(base, **values)


def load_recipe(path: Path | str) -> Recipe:
    """Read and check a recipe file; RecipeError says what is wrong and where."""
    path = Path(path)
    if not path.is_file():
        names = ", ".join(sorted(p.stem for p in RECIPES_DIR.glob("*.toml")))
        raise RecipeError(f"no recipe file {path} (the shipped ones: {names})")
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RecipeError(f"{path} is not valid TOML: {exc}") from exc
    return parse_recipe(raw, path)


def parse_recipe(raw: dict[str, Any], path: Path) -> Recipe:
    allowed = {"name", "variant", "description", "sources", "stages", "data", "draft", "train", "loss", "eval"}
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise RecipeError(f"{path}: unknown top-level key(s) {', '.join(unknown)} (known: {', '.join(sorted(allowed))})")
    variant = raw.get("variant")
    if variant not in VARIANTS:
        raise RecipeError(f"{path}: variant must be one of {', '.join(VARIANTS)}, got {variant!r}")
    sources = []
    for i, t in enumerate(raw.get("sources") or []):
        where = f"{path}: [[sources]] #{i + 1}"
        if not isinstance(t, dict) or "name" not in t or "type" not in t:
            raise RecipeError(f"{where} needs a name and a type")
        if t["type"] not in SOURCE_TYPES:
            raise RecipeError(f"{where}: type {t['type']!r} is not one of {', '.join(SOURCE_TYPES)}")
        if "count" not in t and t["type"] != "file":
            raise RecipeError(f"{where} ({t['name']}) needs a count")
        s = _fill(Source, t, where, Source(name=t["name"], type=t["type"], count=int(t.get("count", 0))))
        if s.type == "file" and not s.path:
            raise RecipeError(f"{where} ({s.name}): a file source needs a path")
        sources.append(s)
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise RecipeError(f"{path}: two sources share a name ({', '.join(sorted({n for n in names if names.count(n) > 1}))})")
    stages = []
    for i, t in enumerate(raw.get("stages") or [{"name": "train", "sources": names}]):
        where = f"{path}: [[stages]] #{i + 1}"
        if not isinstance(t, dict) or not t.get("name") or not t.get("sources"):
            raise RecipeError(f"{where} needs a name and a list of sources")
        bad = [s for s in t["sources"] if s not in names]
        if bad:
            raise RecipeError(f"{where} ({t['name']}) names unknown sources {', '.join(bad)} (sources: {', '.join(names)})")
        train = t.get("train") or {}
        _fill(TrainSettings, train, f"{where} ({t['name']}) train")
        data = t.get("data") or {}
        if not isinstance(data, dict) or set(data) - set(STAGE_DATA_KEYS):
            raise RecipeError(f"{where} ({t['name']}) data: a stage may set only {', '.join(STAGE_DATA_KEYS)} "
                              "(the other [data] keys are shared by every stage)")
        st = _fill(Stage, {k: v for k, v in t.items() if k not in ("train", "data")}, where,
                   Stage(name=t["name"], sources=tuple(t["sources"])))
        stages.append(replace(st, train=dict(train), data=dict(data)))
    if not stages or not sources:
        raise RecipeError(f"{path}: a recipe needs at least one source")
    recipe = Recipe(
        name=str(raw.get("name") or path.stem), variant=variant, path=path, sources=tuple(sources),
        stages=tuple(stages), data=_fill(DataSettings, raw.get("data") or {}, f"{path}: [data]"),
        draft=_fill(DraftSettings, raw.get("draft") or {}, f"{path}: [draft]"),
        train=_fill(TrainSettings, raw.get("train") or {}, f"{path}: [train]"),
        loss=_fill(LossWeights, raw.get("loss") or {}, f"{path}: [loss]"),
        eval=_fill(EvalSettings, raw.get("eval") or {}, f"{path}: [eval]"),
        description=str(raw.get("description") or ""), raw=raw)
    for st in recipe.stages:
        mode = recipe.stage_data(st).features
        if mode not in FEATURE_MODES:
            raise RecipeError(f"{path}: stage {st.name!r}: features must be one of {', '.join(FEATURE_MODES)}, "
                              f"got {mode!r}")
    d = recipe.draft
    if d.block_size < 2:
        raise RecipeError(f"{path}: [draft] block_size must be at least 2, got {d.block_size}")
    if d.head not in ("vanilla", "gated", "none") or d.confidence not in ("none", "hidden", "markov"):
        raise RecipeError(f"{path}: [draft] head must be vanilla|gated|none and confidence none|hidden|markov")
    if d.ship_dtype not in SHIP_DTYPES:
        raise RecipeError(f"{path}: [draft] ship_dtype must be one of {', '.join(SHIP_DTYPES)}, got {d.ship_dtype!r}")
    if d.ship_dtype == INT8_SHIP and recipe.variant == "dflash_v1":
        raise RecipeError(f"{path}: [draft] ship_dtype int8 is for DSpark and DFlash v2 drafts; a DFlash v1 draft keeps "
                          "z-lab's float layout (float16, bfloat16 or float32)")
    return recipe


def with_feature_cap(recipe: Recipe, gib: float) -> Recipe:
    """The recipe with every stage's feature cap set to `gib` per GPU (train-draft --max-feature-gib): the
    recipe's caps are sized for the GPU its draft was made on, and a smaller one runs the same stages on fewer rows."""
    if gib <= 0:
        raise RecipeError(f"--max-feature-gib must be positive, not {gib}")
    stages = tuple(replace(s, data={**s.data, "max_feature_gib": gib}) for s in recipe.stages)
    return replace(recipe, data=replace(recipe.data, max_feature_gib=gib), stages=stages)


def default_recipe(variant: str) -> Path:
    """The recipe used when --recipe is not given: resources/recipes/default-<variant>.toml."""
    return RECIPES_DIR / f"default-{variant.replace('_', '-')}.toml"
