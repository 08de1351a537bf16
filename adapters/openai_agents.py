"""OpenAI Agents SDK: bind one run of an unchanged agent to one proxy session.

Run as a command, an agent finds its session in OPENAI_BASE_URL / OPENAI_API_KEY.
In-process, many episodes share one process and one event loop, and the SDK's
process-wide default client can carry only one session (and is tied to the loop
that first used it). So each episode gets its own AsyncOpenAI client, handed to
the SDK either as a run configuration,

    await Runner.run(agent, task["question"], run_config=session_run_config(base_url, api_key))

or as a model (`agent.clone(model=session_model(base_url, api_key))`); the Agent
itself stays as written. Both API styles work: the SDK's default Responses API and
Chat Completions. Tracing is switched off for the whole process, because the SDK
would otherwise upload every trace, with the session key, to api.openai.com.
"""

from __future__ import annotations

from typing import Any, Literal

from agents import (
    Model,
    OpenAIChatCompletionsModel,
    OpenAIProvider,
    OpenAIResponsesModel,
    RunConfig,
    set_tracing_disabled,
)
from openai import AsyncOpenAI

Api = Literal["responses", "chat_completions"]
DEFAULT_MODEL = "smollm2-135m-instruct"


def _check_model_name(model: str) -> str:
    # the SDK's default provider reads "prefix/name" as a provider prefix and fails before any request
    if "/" in model:
        raise ValueError(
            f"model {model!r} contains '/': the Agents SDK would read {model.split('/')[0]!r} as a provider "
            "prefix; use the proxy's slash-free id from GET /v1/models, e.g. 'smollm2-135m-instruct'"
        )
    return model


def _use_responses(api: Api) -> bool:
    if api not in ("responses", "chat_completions"):
        raise ValueError(f"api must be 'responses' or 'chat_completions', not {api!r}")
    return api == "responses"


def session_client(base_url: str, api_key: str, *, max_retries: int = 2) -> AsyncOpenAI:
    """An AsyncOpenAI client of its own for one session (`base_url` ends with /v1)."""
    set_tracing_disabled(True)
    return AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=max_retries)


def session_model(base_url: str, api_key: str, model: str = DEFAULT_MODEL, *, api: Api = "responses") -> Model:
    """A model bound to one session: for `agent.clone(model=...)` or `RunConfig(model=...)`."""
    client = session_client(base_url, api_key)
    name = _check_model_name(model)
    if _use_responses(api):
        return OpenAIResponsesModel(model=name, openai_client=client)
    return OpenAIChatCompletionsModel(model=name, openai_client=client)


def session_run_config(
    base_url: str, api_key: str, *, api: Api = "responses", model: str | None = None, **run_config: Any
) -> RunConfig:
    """A RunConfig whose model calls go to one session, with tracing disabled.

    The agent's own model name is kept unless `model` overrides it; any other
    RunConfig field can be passed through `run_config`.
    """
    provider = OpenAIProvider(openai_client=session_client(base_url, api_key), use_responses=_use_responses(api))
    if model is not None:
        run_config["model"] = _check_model_name(model)
    return RunConfig(model_provider=provider, tracing_disabled=True, **run_config)
