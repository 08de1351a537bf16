"""Schema-driven fuzzing: schemathesis reads the proxy's OpenAPI document (generated from the wire
schemas every route validates with) and sends bodies, queries and paths built from it, valid and
invalid, to a real `areal-proxy serve` with an admin key. No answer may be a server error.

The budget is fixed and the generation derandomized, so a run is the same every time; model
calls are capped at a few tokens so the engine's time goes to variety, not length.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode

from tests.conftest import Server, run_server

ADMIN = "fuzz-admin-key"
EXAMPLES = 12  # per operation and generation mode
LENGTH_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens")


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("fuzz")
    with run_server(tmp, f"sqlite:///{tmp}/areal.db", "--set", "proxy.default_max_tokens=4", admin_key=ADMIN) as s:
        yield s


def _short(body: object) -> None:
    """Keep generation short: a few tokens and choices at most (the bounds stay exercised by the
    hostile-input table)."""
    if isinstance(body, dict):
        for name in LENGTH_FIELDS:
            if isinstance(body.get(name), int) and not isinstance(body[name], bool) and body[name] > 4:
                body[name] = 4
        if isinstance(body.get("n"), int) and not isinstance(body["n"], bool) and body["n"] > 2:
            body["n"] = 2


def test_no_input_makes_a_server_error(fuzzed: Server):
    schema = schemathesis.openapi.from_url(f"{fuzzed.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 16, [op.label for op in operations]
    errors: list[str] = []
    for operation in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case) -> None:  # noqa: ANN001
                _short(case.body)
                response = case.call(headers={"authorization": f"Bearer {ADMIN}"}, timeout=120)
                if response.status_code >= 500:
                    errors.append(f"{case.method} {case.formatted_path} {case.body!r:.300}: {response.status_code}")

            try:
                call()
            except Unsatisfiable:  # nothing to make invalid (an operation without parameters)
                assert mode is GenerationMode.NEGATIVE, operation.label
    assert not errors, "\n".join(errors[:20])
    log = fuzzed.log.read_text()
    assert "unhandled error" not in log and "Traceback" not in log, log[-3000:]
