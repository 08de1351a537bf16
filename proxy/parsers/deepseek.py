"""DeepSeek V3 / R1 / V3.1 calls, framed by marker tokens.

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜><｜tool▁calls▁end｜>                        (V3, R1)
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜>...   (V3.1)

A call is read when its `<｜tool▁call▁end｜>` arrives.
"""

from __future__ import annotations

from proxy.parsers.base import BAD, MORE, Step, ToolFormat, arguments_call, named_arguments_grammar, tool_format

CALLS_BEGIN, CALLS_END = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CALL_BEGIN, CALL_END, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


@tool_format("deepseek_v3", "deepseek_r1", "deepseek_v31")
class DeepSeek(ToolFormat):
    markers = (CALLS_BEGIN,)
    special_tokens = True

    def next_call(self, section: str, final: bool) -> Step:
        begin = section.find(CALL_BEGIN)
        if begin < 0:
            return Step("done", len(section)) if final else MORE
        end = section.find(CALL_END, begin)
        if end < 0:
            return BAD if final else MORE
        head, sep, rest = section[begin + len(CALL_BEGIN) : end].partition(SEP)
        if not sep:
            return BAD
        if head.strip() == "function":  # V3: type, name on the first line, arguments in a json fence
            name, _, raw = rest.partition("\n")
            raw = raw.strip().removeprefix("```json").removesuffix("```")
        else:
            name, raw = head, rest
        call = arguments_call(name.strip(), raw.strip(), self.tool_names)
        return BAD if call is None else Step("call", end + len(CALL_END), call)

    @classmethod
    def forced_prefix(cls, name: str | None) -> str:
        head = f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}"
        return head if name is None else f"{head}{name}\n```json\n{{"

    @classmethod
    def call_grammar(cls, tools: list[dict]) -> tuple[str, str]:
        head = f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}"
        return head, named_arguments_grammar(tools, "\n```json\n", f"\n```{CALL_END}{CALLS_END}")
