"""Only `proxy/store/` writes SQL: no other package imports SQLAlchemy's query constructs or the tables.

Outside the store a module may import the `Connection` type from SQLAlchemy, to annotate
the functions it hands to `Database.transaction` / `write` / `read`; everything else
(select, update, func, text, the `sessions` / `completions` tables of `proxy.store.schema`)
is the store's, and so is telling SQLite from PostgreSQL (`conn.dialect`). Checked on
the source with `ast`, so nothing is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGES = ("proxy", "trainer", "rewards", "adapters")
STORE = Path("proxy/store")
TYPE_ONLY = {"sqlalchemy": {"Connection"}, "sqlalchemy.engine": {"Connection"}}


def _is_sqlalchemy(module: str) -> bool:
    return module == "sqlalchemy" or module.startswith("sqlalchemy.")


def import_violations(source: str) -> list[str]:
    """The imports (and dialect checks) in `source` that only the store may make."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr == "dialect":
            found.append(f"line {node.lineno}: .dialect")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if _is_sqlalchemy(alias.name) or alias.name.startswith("proxy.store.schema"):
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = {alias.name for alias in node.names}
            if _is_sqlalchemy(node.module) and not names <= TYPE_ONLY.get(node.module, set()):
                found.append(f"line {node.lineno}: from {node.module} import {', '.join(sorted(names))}")
            elif node.module == "proxy.store.schema" or (node.module == "proxy.store" and "schema" in names):
                found.append(f"line {node.lineno}: from {node.module} import {', '.join(sorted(names))}")
    return found


def layer_violations(root: Path) -> dict[str, list[str]]:
    """Module path → its forbidden imports, for every module outside `proxy/store/`."""
    out = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if STORE in relative.parents:
                continue
            found = import_violations(path.read_text())
            if found:
                out[str(relative)] = found
    return out


def test_only_the_store_writes_sql():
    assert layer_violations(REPO) == {}


def test_the_check_catches_query_constructs_and_tables():
    assert import_violations("from sqlalchemy import Connection\nfrom sqlalchemy.engine import Connection") == []
    bad = [
        "from sqlalchemy import select",
        "from sqlalchemy import Connection, update",
        "import sqlalchemy",
        "import sqlalchemy.orm as orm",
        "from sqlalchemy.sql import func",
        "from proxy.store.schema import sessions",
        "from proxy.store import schema",
        "def f():\n    from sqlalchemy import text",
        "if conn.dialect.name == 'postgresql':\n    pass",
    ]
    for source in bad:
        assert import_violations(source), source
