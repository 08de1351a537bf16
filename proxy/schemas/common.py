"""What every wire schema shares: bounded field types and the 400 a failed validation becomes.

Each route's body and query is a pydantic model (in this package), so FastAPI validates it
before the route runs and the OpenAPI document describes the real bodies. Every field is
bounded: numbers to the ranges the engines can honour, strings and lists to sizes a real
client sends, and free-form JSON (tool schemas, tool arguments, metadata) to a nesting depth,
since a deeply nested value can exhaust the stack of whatever renders or serializes it later.
A validation error becomes one `APIError(400)` naming the offending field the way clients
write it (`messages[2].tool_calls[0].id`).
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from proxy.errors import APIError

MAX_JSON_DEPTH = 32
"""Nesting depth allowed in free-form JSON values (tool schemas and arguments, metadata)."""
MAX_ID = 256
"""Ids, names and model names."""
MAX_STOP = 1024
"""Characters of one stop string."""
MAX_MESSAGES = 16_384
MAX_TOOLS = 256
MAX_PARTS = 4_096
MAX_CALLS = 256
MAX_TOKENS = 2**31 - 1
INT64 = (-(2**63), 2**63 - 1)


class Wire(BaseModel):
    """A request object: unknown fields are accepted and ignored, as the upstream APIs do; known
    ones are strict (no "10" for 10, no true for 1, no NaN)."""

    model_config = ConfigDict(extra="ignore", strict=True, allow_inf_nan=False)


def _depth(value: Any, limit: int = MAX_JSON_DEPTH) -> Any:
    """`value` if nested at most `limit` levels; level by level, looking only at containers (a tool's
    parameter schema is walked on every call)."""
    level = [value] if isinstance(value, (dict, list)) else []
    depth = 0
    while level:
        depth += 1
        if depth > limit:
            raise ValueError(f"nested deeper than {limit} levels")
        below = []
        for item in level:
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, (dict, list)):
                    below.append(child)
        level = below
    return value


JsonValue = Annotated[Any, AfterValidator(_depth)]
"""Any JSON value, nested at most `MAX_JSON_DEPTH` levels."""
JsonObject = Annotated[dict[str, Any], AfterValidator(_depth)]
"""A JSON object, nested at most `MAX_JSON_DEPTH` levels."""
Id = Annotated[str, Field(min_length=1, max_length=MAX_ID)]
Name = Annotated[str, Field(max_length=MAX_ID)]
Seed = Annotated[int, Field(ge=INT64[0], le=INT64[1])]
TokenCount = Annotated[int, Field(ge=1, le=MAX_TOKENS)]
TopP = Annotated[float, Field(gt=0.0, le=1.0)]
TopK = Annotated[int, Field(ge=-1, le=MAX_TOKENS)]
TopLogprobs = Annotated[int, Field(ge=0, le=20)]
StopString = Annotated[str, Field(min_length=1, max_length=MAX_STOP)]
Stop = StopString | Annotated[list[StopString], Field(max_length=16)] | None


# -- validation errors -> one 400 -------------------------------------------------------
_LABEL = re.compile(r"^(str|int|float|bool|none|dict|list|.*[-\[].*|[A-Z].*)$")


def _param(loc: tuple[Any, ...]) -> str:
    """('body', 'messages', 2, 'ToolCall', 'id') -> 'messages[2].id': union branch labels dropped."""
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif not _LABEL.match(str(part)):
            out += f".{part}" if out else str(part)
    return out


def validation_error(errors: list[dict[str, Any]], skip: tuple[str, ...] = ("body", "query", "path")) -> APIError:
    """The most specific of pydantic's errors as a 400: the deepest location wins; errors of a
    union's branches at that location are joined ("a string, or a list")."""
    if not errors:
        return APIError(400, "invalid request", code="invalid_request")
    located = []
    for err in errors:
        loc = tuple(err.get("loc") or ())
        if loc and loc[0] in skip:
            loc = loc[1:]
        located.append((_param(loc), err))
    if any(err.get("type") == "json_invalid" for _, err in located):
        detail = next(err for _, err in located if err.get("type") == "json_invalid").get("ctx", {}).get("error", "")
        return APIError(400, f"the request body is not valid JSON: {detail}".rstrip(": "), code="invalid_json")
    deepest = max(located, key=lambda pe: pe[0].count(".") + pe[0].count("["))[0]
    messages = list(dict.fromkeys(_message(err) for param, err in located if param == deepest))
    where = deepest or "body"
    if not deepest and any(err.get("type") in ("model_attributes_type", "dict_type") for _, err in located):
        return APIError(400, "the request body must be a JSON object", code="invalid_request")
    return APIError(400, f"{where}: {'; or '.join(messages)}", param=deepest or None, code="invalid_value")


def _message(err: dict[str, Any]) -> str:
    if err.get("type") == "missing":
        return "required"
    return str(err.get("msg", "invalid value"))
