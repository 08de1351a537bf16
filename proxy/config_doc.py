"""docs/configuration.md, generated from the config models' field docstrings.

Walks the pydantic model tree rooted at `proxy.config.Config` without knowing its
sections: every field whose type is a model is a `[section]` (or `[section.sub]`; a
`Model | None` one is a strategy section, on when present), every other field a row of
its section's table — key, type, default and the
field's docstring. `python -m proxy.config_doc > docs/configuration.md`
regenerates the page; `tests/test_docs.py` fails when it is out of date.
"""

from __future__ import annotations

import json
import sys
import types
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from proxy.config import Config

REGENERATE = "python -m proxy.config_doc > docs/configuration.md"

HEADER = f"""# Configuration

Every key of `config.toml`, section by section. A run reads one file (`--config FILE`, or the
path given to `areal-proxy train`), then applies `--set section.key=value` overrides
(`--set trainer.optim.lr=1e-5`; the value is a TOML literal, or else a plain string);
command-line flags such as `--port` are shortcuts for such overrides. Unknown keys are refused.

This page is generated from the docstrings of the config models (`proxy.config.Config`);
regenerate it with `{REGENERATE}`.
"""

_BOUNDS = (("gt", ">"), ("ge", "≥"), ("lt", "<"), ("le", "≤"))


def _section_model(annotation: Any) -> type[BaseModel] | None:
    """The model of a section field: `Model`, or `Model | None` for a strategy section."""
    args = get_args(annotation) if get_origin(annotation) in (Union, types.UnionType) else (annotation,)
    models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
    return models[0] if len(models) == 1 and all(a is type(None) for a in args if a is not models[0]) else None


def _is_section(annotation: Any) -> bool:
    return _section_model(annotation) is not None


def _type_name(tp: Any) -> str:
    origin, args = get_origin(tp), get_args(tp)
    if origin is Literal:
        return " | ".join(json.dumps(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join("None" if a is type(None) else _type_name(a) for a in args)
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(_type_name(a) for a in args)}]" if args else name
    return tp.__name__ if isinstance(tp, type) else str(tp)


def _bounds(field: FieldInfo) -> str:
    found = [f"{sym} {getattr(m, attr)}" for m in field.metadata for attr, sym in _BOUNDS if hasattr(m, attr)]
    return f" ({', '.join(found)})" if found else ""


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    return "required" if value is PydanticUndefined else _literal(value)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _table(fields: list[tuple[str, FieldInfo]]) -> list[str]:
    lines = ["| key | type | default | description |", "|---|---|---|---|"]
    for name, field in fields:
        kind = _type_name(field.annotation) + _bounds(field)
        lines.append(f"| `{name}` | {_cell(kind)} | `{_cell(_default(field))}` | {_cell(field.description or '')} |")
    return lines


def _section(model: type[BaseModel], path: str, description: str | None) -> list[str]:
    lines = ["", f"## [{path}]" if path else "## Top level", ""]
    own_doc = model.__dict__.get("__doc__")
    for text in (description, own_doc):
        if text:
            lines += [" ".join(text.split()), ""]
    items = list(model.model_fields.items())
    scalars = [(n, f) for n, f in items if not _is_section(f.annotation)]
    if scalars:
        lines += _table(scalars)
    for name, field in items:
        if _is_section(field.annotation):
            lines += _section(_section_model(field.annotation), f"{path}.{name}" if path else name, field.description)
    return lines


def markdown() -> str:
    """The whole page, ending in one newline."""
    lines = [HEADER.rstrip("\n")]
    root_fields = Config.model_fields.items()
    if any(not _is_section(f.annotation) for _, f in root_fields):
        lines += _section(Config, "", None)
    else:
        for name, field in root_fields:
            lines += _section(_section_model(field.annotation), name, field.description)
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.buffer.write(markdown().encode("utf-8"))
