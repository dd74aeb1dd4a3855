"""The import graph of engine/ and app/, read from the source with `ast` (nothing is imported).

Every import counts, at module level or inside a function, except those under `if TYPE_CHECKING:`
(never run, so they tie nothing at run time). Checked: no import cycle among the project's modules,
and nothing under engine/ imports app/, PySide6 or pyqtgraph (the engine runs without Qt).
"""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "app", "dflash_studio")
FORBIDDEN_IN_ENGINE = ("app", "dflash_studio", "PySide6", "shiboken6", "pyqtgraph")
# Cycles tolerated for now, each with the issue that breaks it (none: the export draft <-> dspark <->
# dflash2 cycle went with the train-draft issue's shared engine/export/ir.py).
KNOWN_CYCLES: list[frozenset[str]] = []


def _modules() -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            mods[name.removesuffix(".__init__")] = path
    return mods


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or \
        (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported(path: Path, module: str) -> list[str]:
    """Every name an import in the file brings in (`from a import b` gives a and a.b), TYPE_CHECKING blocks aside."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.append(base)
            names.extend(f"{base}.{a.name}" for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _graph() -> tuple[dict[str, set[str]], dict[str, list[str]]]:
    mods = _modules()

    def own(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    edges: dict[str, set[str]] = {}
    imports: dict[str, list[str]] = {}
    for m, path in mods.items():
        imports[m] = _imported(path, m)
        edges[m] = {t for t in map(own, imports[m]) if t and t != m}
    return edges, imports


def _cycles(edges: dict[str, set[str]]) -> list[frozenset[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[frozenset[str]] = []
    for start in edges:
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            v, children = work[-1]
            w = next(children, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    x = stack.pop()
                    on_stack.discard(x)
                    comp.add(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(frozenset(comp))
    return out


def test_no_import_cycles() -> None:
    edges, _ = _graph()
    cycles = _cycles(edges)
    unknown = [sorted(c) for c in cycles if c not in KNOWN_CYCLES]
    assert not unknown, f"import cycles: {unknown}"
    stale = [sorted(c) for c in KNOWN_CYCLES if c not in cycles]
    assert not stale, f"{stale} is no longer a cycle: remove it from KNOWN_CYCLES"


def test_engine_imports_neither_the_app_nor_qt() -> None:
    _, imports = _graph()
    bad = sorted(f"{m} imports {n}" for m, names in imports.items() if m.split(".")[0] == "engine"
                 for n in names if n.split(".")[0] in FORBIDDEN_IN_ENGINE)
    assert not bad, bad


def test_the_check_sees_lazy_imports_and_skips_type_checking_ones(tmp_path) -> None:
    """The reader itself: an import inside a function counts, one under `if TYPE_CHECKING:` does not."""
    f = tmp_path / "mod.py"
    f.write_text("from typing import TYPE_CHECKING\n"
                 "if TYPE_CHECKING:\n    from app.worker import X\nelse:\n    import engine.config\n"
                 "def f():\n    from app import settings\n    from .sibling import y\n")
    names = _imported(f, "engine.pkg.mod")
    assert "app.worker" not in names and "engine.config" in names
    assert "app" in names and "app.settings" in names and "engine.pkg.sibling" in names
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [frozenset({"a", "b", "c"})]
