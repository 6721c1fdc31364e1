"""The import graph of the ``realtime_gw`` package, read with ``ast`` (nothing is imported or run)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "realtime_gw"
PACKAGE = "realtime_gw"


@dataclass
class ModuleImports:
    internal: set[str] = field(default_factory=set)
    """Modules of the package this module imports (anywhere in it, function bodies included)."""
    external: set[str] = field(default_factory=set)
    """Top-level names of everything else it imports."""


def _module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE_ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _all_modules() -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(PACKAGE_ROOT.rglob("*.py"))}


_MODULES = _all_modules()


def module_of(dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is a module or package of ours (None: not ours)."""
    parts = dotted.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in _MODULES:
            return candidate
    return None


def imports_in(tree: ast.AST, module: str) -> Iterator[str]:
    """Every dotted name imported in ``tree`` (``from a import b`` yields ``a.b``), relative forms resolved."""
    is_package = _MODULES.get(module, Path("x.py")).name == "__init__.py"
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".")
                drop = node.level - 1 if is_package else node.level
                anchor = anchor[: len(anchor) - drop] if drop else anchor
                base = ".".join([*anchor, base]) if base else ".".join(anchor)
            for alias in node.names:
                yield f"{base}.{alias.name}"


def import_graph() -> dict[str, ModuleImports]:
    graph: dict[str, ModuleImports] = {}
    for module, path in _MODULES.items():
        entry = graph.setdefault(module, ModuleImports())
        for name in imports_in(ast.parse(path.read_text()), module):
            target = module_of(name) if name.split(".")[0] == PACKAGE else None
            if target is None:
                entry.external.add(name.split(".")[0] if name.split(".")[0] != PACKAGE else name)
            elif target != module:
                entry.internal.add(target)
    return graph


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's strongly connected components."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            out.append(component)

    for v in graph:
        if v not in index:
            visit(v)
    return out


def largest_classes() -> list[tuple[str, int]]:
    """(module.Class, lines) for every class of the package, largest first."""
    sizes = []
    for module, path in _MODULES.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                sizes.append((f"{module}.{node.name}", node.end_lineno - node.lineno + 1))
    return sorted(sizes, key=lambda s: -s[1])
