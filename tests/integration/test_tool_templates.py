"""A chat template that takes ``tools`` (Hermes style, as Qwen 2.5/3 write calls) renders
the tools, the history's calls and results itself, and its replies are read in its own call
format; a generated call sent back is rendered as it was written (ADR 0018)."""

from __future__ import annotations

from typing import Any

import pytest

from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.application.chat.tool_replies import ReplyReader
from semantic.domain.chat import ChatMessage
from semantic.domain.tools import ToolCall, ToolChoice, checked_tools, tool_use
from tests.integration.conftest import RealModel

pytestmark = pytest.mark.model

HERMES_STYLE = """
{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}Tools:
<tools>
{% for tool in tools %}{{ tool | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": ..., "arguments": ...}
</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'system' and tools %}
{%- elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% elif message.tool_calls %}<|im_start|>assistant
{{ message.content }}{% for call in message.tool_calls %}<tool_call>
{"name": "{{ call.function.name }}", "arguments": {{ call.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""


class WithTemplate:
    """The real tokenizer with another chat template, as a model that ships one has."""

    def __init__(self, wrapper: Any, template: str) -> None:
        self._wrapper = wrapper
        self.chat_template = template

    def apply_chat_template(self, *args: Any, **kwargs: Any) -> Any:
        hf = self._wrapper._tokenizer  # noqa: SLF001 - the Hugging Face tokenizer behind mlx-lm's wrapper
        return hf.apply_chat_template(*args, chat_template=self.chat_template, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._wrapper, name)


WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}}


def test_a_template_that_takes_tools_renders_them_and_reads_its_own_calls(
    real_model: RealModel,
) -> None:
    tokenizer = MlxTokenizer(WithTemplate(real_model.loaded.tokenizer, HERMES_STYLE))
    fmt = tokenizer.tool_format
    assert fmt.name == "hermes"
    tools = checked_tools([("get_weather", "Weather in a city", WEATHER, None)])
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    history = [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "Sunny", tool_call_id="call_1"),
    ]
    text = tokenizer.decode(tokenizer.render_chat(history, tools=tools))
    assert '"name": "get_weather"' in text.split("</tools>")[0]  # listed by the template
    assert (
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in text
    )
    assert "<tool_response>\nSunny\n</tool_response>" in text
    use = tool_use(tools, ToolChoice.REQUIRED, None, True)
    assert use is not None
    constraint = fmt.constraint(use)
    assert constraint is not None
    [tagged] = constraint.calls
    written = tagged.begin + '{"city": "Oslo"}' + tagged.end
    reader = ReplyReader(fmt, lambda: "call_2")
    reader.feed(written)
    _, reply = reader.finish()
    assert [(c.name, c.arguments) for c in reply.calls] == [("get_weather", '{"city": "Oslo"}')]
    asked = history[:2]
    prompt = tokenizer.render_chat(asked, tools=tools)
    again = tokenizer.render_chat([*asked, ChatMessage("assistant", reply.raw)], tools=tools)
    generated = [*tokenizer.encode(reply.raw), min(tokenizer.eos_token_ids)]
    assert again[: len(prompt) + len(generated)] == prompt + generated
