"""A CAMEL-AI ChatAgent that answers two-digit arithmetic questions.

Ordinary CAMEL code: a ChatAgent with a system message, one `astep` per question.
Its model backend is CAMEL's OpenAI-compatible platform bound to this episode's
proxy session (`adapters.camel.session_model`), with an offline token counter so
that building the agent fetches nothing from the network. `math_exact` grades the
reply's number.
"""

from __future__ import annotations

from camel.agents import ChatAgent

from adapters.camel import session_model

SYSTEM = (
    "You are a calculator. Reply in the form: The answer is <number>.\n"
    "Examples:\nWhat is 23 + 45? The answer is 68.\nWhat is 81 - 36? The answer is 45."
)
CONTEXT_WINDOW = 8192  # SmolLM2's; CAMEL trims its memory to fit


async def run(task: dict, base_url: str, api_key: str) -> None:
    model = session_model(base_url, api_key, "smollm2-135m-instruct", model_config={"max_tokens": 24})
    agent = ChatAgent(system_message=SYSTEM, model=model, token_limit=CONTEXT_WINDOW)
    await agent.astep(task["question"])
