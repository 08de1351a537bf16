"""Reasoning markers by name: Qwen3 and DeepSeek-R1 think between `<think>` and `</think>`.

Their templates may open the block in the generation prompt (Qwen3 thinking-2507, DeepSeek-R1),
so a reply can begin inside it; `proxy/parsers/stream.py` is told so by the renderer.
"""

from __future__ import annotations

from proxy.parsers.base import ReasoningFormat, reasoning_format

THINK = ReasoningFormat("<think>", "</think>")

reasoning_format(THINK, "qwen3", "deepseek_r1", "think")
