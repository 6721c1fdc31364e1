"""The house rules of ``realtime_gw``, read from the code's own imports (docs/architecture.md, "Layers").

protocols < records < sessions | models < server < app: an import may only go down (or sideways within
one package), sessions and models never import each other, and the pure layers import no I/O or torch.
Function-local imports count too: hiding an upward import inside a function is still an arrow up.
"""

from __future__ import annotations

import ast

import pytest

from tests.import_graph import (
    PACKAGE_ROOT,
    import_graph,
    imports_in,
    largest_classes,
    module_of,
    strongly_connected,
)

# What each part of the package may import from the package (besides itself).
ALLOWED: dict[str, set[str]] = {
    "protocols": set(),
    "records": {"protocols"},
    "config": set(),
    "sessions": {"protocols", "records"},
    "models": {"protocols", "records", "config"},
    "client": {"protocols"},
    "web": set(),
    "server": {"protocols", "records", "config", "sessions", "models", "web"},
    "app": {"protocols", "records", "config", "sessions", "models", "server", "web"},
    "cli": {"config", "app", "client"},
    # launcher, load client, bystander and speech for tests and load scripts; nothing imports it
    "testing": {"protocols", "records", "config", "models", "client"},
    "__main__": {"cli"},
}
# Third-party modules the pure layers must not touch: they do no I/O and never need torch.
PURE_LAYERS = {"protocols", "records", "sessions"}
IMPURE_MODULES = {"torch", "starlette", "uvicorn", "websockets", "asyncio", "socket", "httpx", "onnxruntime"}

MAX_MODULE_LINES = 500
MAX_CLASS_LINES = 300


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


GRAPH = import_graph()


def test_every_package_module_has_a_layer() -> None:
    assert {layer_of(m) for m in GRAPH} - {"__init__"} <= set(ALLOWED)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_imports_only_go_down(module: str) -> None:
    layer = layer_of(module)
    if layer == "__init__":
        return
    wrong = sorted(
        target
        for target in GRAPH[module].internal
        if layer_of(target) != layer and layer_of(target) not in ALLOWED[layer]
    )
    assert not wrong, f"{module} ({layer}) imports from a layer it may not: {wrong}"


@pytest.mark.parametrize("module", sorted(m for m in GRAPH if layer_of(m) in PURE_LAYERS))
def test_pure_layers_do_no_io(module: str) -> None:
    bad = sorted(name for name in GRAPH[module].external if name.split(".")[0] in IMPURE_MODULES)
    assert not bad, f"{module} is pure (no I/O, no torch) but imports {bad}"


def test_no_import_circles() -> None:
    circles = [sorted(c) for c in strongly_connected({m: n.internal for m, n in GRAPH.items()}) if len(c) > 1]
    assert not circles, f"modules that import each other in a loop: {circles}"


def test_modules_stay_small() -> None:
    big = {
        str(p.relative_to(PACKAGE_ROOT.parent)): n
        for p in PACKAGE_ROOT.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert not big, f"modules over {MAX_MODULE_LINES} lines: {big}"


def test_classes_stay_small() -> None:
    big = {name: n for name, n in largest_classes() if n > MAX_CLASS_LINES}
    assert not big, f"classes over {MAX_CLASS_LINES} lines: {big}"


def test_the_reader_sees_hidden_and_relative_imports() -> None:
    """Function-local and package-relative imports are arrows too, so the rules above can fail."""
    source = "def f():\n    from realtime_gw.server import gateway\n    from ..app import create_app\n"
    found = {module_of(name) for name in imports_in(ast.parse(source), "realtime_gw.sessions.realtime")}
    assert found == {"realtime_gw.server.gateway", "realtime_gw.app"}


def test_the_gateway_never_imports_its_testing_kit() -> None:
    users = sorted(
        m
        for m, n in GRAPH.items()
        if layer_of(m) != "testing" and any(layer_of(t) == "testing" for t in n.internal)
    )
    assert not users, f"realtime_gw.testing is for tests and load scripts only, yet imported by {users}"
