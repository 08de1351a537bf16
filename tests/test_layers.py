"""The layers of the code, checked: a module imports only from its own layer or the ones below,
and no modules import each other in a circle (imports inside functions count too).

Lowest first: configuration; the store and the model runtime; rendering, engines, wire schemas
and reward scoring; the services a request uses; routes, servers, the trainer, the adapters and evaluation;
launchers and the command line. A module this table does not place fails the test, so a new
module is given its layer when it is added.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("proxy", "trainer", "rewards", "adapters", "evaluation")

LAYERS: list[tuple[str, ...]] = [
    (  # 0: configuration and what every layer shares
        "proxy.sections", "proxy.config", "proxy.engines.config", "proxy.store.config", "rewards.config",
        "adapters.config", "trainer.config", "trainer.launch.config", "evaluation.config", "proxy.errors",
        "proxy.seeds", "proxy.metrics",
    ),
    ("proxy.store", "proxy.runtime"),  # 1: the only SQL; devices, model files, attention
    (  # 2: pure parts: rendering, reply parsers, engines, wire schemas, reward scoring
        "proxy.conversation", "proxy.parsers", "proxy.render", "proxy.prompt_encoder", "proxy.reply",
        "proxy.chat_request", "proxy.schemas",
        "proxy.engines",
        "proxy.tree_view", "rewards",
    ),
    ("proxy.sessions", "proxy.completions", "proxy.rewards_service", "proxy.admission", "proxy.online"),  # 3: services
    (  # 4: HTTP (the web UI included), trainer, adapters, evaluation
        "proxy.state", "proxy.app", "proxy.routes", "proxy.ui", "proxy.servers", "trainer", "adapters", "evaluation",
    ),
    (  # 5: wiring
        "trainer.launch", "proxy.cli", "proxy.serve", "proxy.sessions_cli", "proxy.config_doc", "evaluation.cli",
    ),
]  # fmt: skip


def layer_of(module: str) -> int:
    """The layer of the longest table entry that is `module` or a package above it."""
    best, layer = "", -1
    for i, names in enumerate(LAYERS):
        for name in names:
            if (module == name or module.startswith(name + ".")) and len(name) > len(best):
                best, layer = name, i
    return layer


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            if "migrations/versions" in path.as_posix() or not path.read_text().strip():
                continue  # Alembic revision scripts (loaded by Alembic only), empty package markers
            parts = path.relative_to(REPO).with_suffix("").parts
            name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
            found[name] = path
    return found


def imports(path: Path, known: set[str]) -> set[str]:
    """The project modules `path` imports, anywhere in it (from X import y: X.y when it is a module)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        else:
            continue
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                out.add(name)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(path, known) - {name} for name, path in found.items()}


def test_every_module_has_a_layer():
    unplaced = sorted(m for m in modules() if layer_of(m) < 0)
    assert not unplaced, f"give these modules a layer in tests/test_layers.py: {unplaced}"


def test_no_module_imports_from_a_layer_above_its_own():
    up = []
    for module, targets in graph().items():
        for target in targets:
            if layer_of(target) > layer_of(module) and not module.startswith(target + "."):
                up.append(f"{module} (layer {layer_of(module)}) imports {target} (layer {layer_of(target)})")
    assert not up, "\n".join(sorted(up))


def test_no_import_circles():
    edges = graph()
    for module in edges:  # a package's __init__ importing its own modules is not a circle
        edges[module] = {t for t in edges[module] if not t.startswith(module + ".")}
    circles, state = [], {}

    def visit(node: str, path: list[str]) -> None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                circles.append(" -> ".join([*path[path.index(nxt) :], nxt]))
            elif nxt not in state:
                visit(nxt, [*path, nxt])
        state[node] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert not circles, "\n".join(circles)
