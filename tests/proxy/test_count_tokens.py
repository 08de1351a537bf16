"""`POST /v1/messages/count_tokens` with the real `anthropic` client: the count is exactly the
prompt a real Messages call with the same body starts from, and counting records nothing."""

from __future__ import annotations

import anthropic
import pytest

from tests.proxy.test_messages_api import SYSTEM, WEATHER, client_for

pytestmark = pytest.mark.agents  # also run on the newest client releases (.ci/run)

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
CALL = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}
RESULT = {"type": "tool_result", "tool_use_id": "toolu_1", "content": "Sunny, 21 C"}
HISTORY = [*ASK, {"role": "assistant", "content": [CALL]}, {"role": "user", "content": [RESULT]}]
BODIES = {
    "plain": {"messages": ASK},
    "system-and-tools": {"system": SYSTEM, "tools": [WEATHER], "messages": ASK},
    "forced-tool": {"system": SYSTEM, "tools": [WEATHER], "tool_choice": {"type": "any"}, "messages": ASK},
    "tool-history": {"system": [{"type": "text", "text": SYSTEM}], "tools": [WEATHER], "messages": HISTORY},
}


@pytest.mark.parametrize("name", list(BODIES))
def test_count_is_the_real_calls_input_tokens(proxy, name):
    body = BODIES[name]
    session = proxy.new_session()
    client = client_for(proxy, session)
    counted = client.messages.count_tokens(model="claude-x", thinking={"type": "disabled"}, **body)
    assert proxy.session(session["session_id"])["completions"] == [], "counting records nothing"
    message = client.messages.create(model="claude-x", max_tokens=2, **body)
    assert counted.input_tokens == message.usage.input_tokens > 0
    [node] = proxy.session(session["session_id"])["completions"]
    assert len(node["prompt_ids"]) == counted.input_tokens


def test_errors_in_anthropic_shape(sqlite_proxy):
    session = sqlite_proxy.new_session()
    client = client_for(sqlite_proxy, session)
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.count_tokens(model="m", messages=[])
    assert err.value.body["type"] == "error" and err.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):
        client.messages.count_tokens(model="m", messages=[{"role": "user", "content": [{"type": "image"}]}])
    missing = anthropic.Anthropic(base_url=f"{sqlite_proxy.url}/sessions/sess_nope", api_key="x", max_retries=0)
    with pytest.raises(anthropic.NotFoundError):
        missing.messages.count_tokens(model="m", messages=ASK)
