"""A chat template that takes ``tools`` (Hermes style, as Qwen 2.5/3 write calls) renders
the tools, the history's calls and results itself, and its replies are read in its own call
format; a generated call sent back is rendered as it was written (ADR 0018)."""

from __future__ import annotations

import re
from typing import Any

import pytest

from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.adapters.tool_formats.template import hermes, llama3
from semantic.application.chat.tool_replies import ReplyReader
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError
from semantic.domain.tools import MAX_CALLS_PER_REPLY, ToolCall, ToolChoice, checked_tools, tool_use
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


ALTERNATING = """
{%- for message in messages %}
{%- if (message.role == 'user') != (loop.index0 % 2 == 0) %}
{{- raise_exception('Conversation roles must alternate user/assistant') }}
{%- endif %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}"""
"""Gemma's rule, as its template raises it: no system turn, user and assistant by turns."""

NINE_CHARACTER_IDS = """
{%- if tools %}{{ tools | tojson }}{% endif %}
{%- for message in messages %}
{%- if message.tool_calls %}[TOOL_CALLS][
{%- for call in message.tool_calls %}
{%- if call.id | length != 9 %}{{ raise_exception('Tool call IDs: length 9!') }}{% endif %}
{{- {"name": call.function.name, "arguments": call.function.arguments, "id": call.id} | tojson }}
{%- endfor %}]
{%- elif message.role == 'tool' %}[TOOL_RESULTS]{{ message.tool_call_id }}: {{ message.content }}
{%- else %}[{{ message.role }}]{{ message.content }}
{%- endif %}
{%- endfor %}"""
"""Mistral's rule: a call's id is nine letters and digits."""


def test_a_template_that_wants_turns_by_turns_takes_a_tools_results_and_words_as_one(
    real_model: RealModel,
) -> None:
    """A tool's results come back as a user turn in the default format; the user's words
    after them are a second, which Gemma's template refuses: they go as one turn. What the
    template refuses all the same is a 400 in its own words, never a 500."""
    tokenizer = MlxTokenizer(WithTemplate(real_model.loaded.tokenizer, ALTERNATING))
    call = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
    history = [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "Sunny", tool_call_id="call_1"),
        ChatMessage("user", "And tomorrow?"),
    ]
    text = tokenizer.decode(tokenizer.render_chat(history))
    assert "Sunny\n</tool_response>\n\nAnd tomorrow?<|im_end|>" in text
    assert text.count("<|im_start|>user") == 2
    with pytest.raises(InvalidRequestError, match="refuses the conversation: Conversation roles"):
        tokenizer.render_chat([ChatMessage("assistant", "Hi"), ChatMessage("user", "Hi")])


def test_mistral_reads_each_call_by_a_nine_character_id_the_same_each_turn(
    real_model: RealModel,
) -> None:
    tokenizer = MlxTokenizer(WithTemplate(real_model.loaded.tokenizer, NINE_CHARACTER_IDS))
    assert tokenizer.tool_format.name == "mistral"
    tools = checked_tools([("get_weather", "Weather in a city", WEATHER, None)])
    call = ToolCall("call_0123456789abcdef01234567", "get_weather", '{"city": "Paris"}')
    history = [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(call,)),
        ChatMessage("tool", "Sunny", tool_call_id=call.id),
    ]
    first = tokenizer.render_chat(history, tools=tools)
    later = tokenizer.render_chat([*history, ChatMessage("user", "Thanks")], tools=tools)
    assert later[: len(first) - 1] == first[: len(first) - 1]  # the same ids: a cached prefix
    [nine] = re.findall(r'"id": "(\w+)"', tokenizer.decode(first))
    assert len(nine) == 9
    assert f"[TOOL_RESULTS]{nine}: Sunny" in tokenizer.decode(first)


def test_llama3_calls_one_tool_a_reply_as_its_template_reads_no_more() -> None:
    tools = checked_tools([("get_weather", "Weather in a city", WEATHER, None)])
    parallel = tool_use(tools, ToolChoice.REQUIRED, None, True)
    assert parallel is not None
    assert parallel.parallel
    for fmt, most in ((llama3(), 1), (hermes(), MAX_CALLS_PER_REPLY)):
        constraint = fmt.constraint(parallel)
        assert constraint is not None
        assert constraint.max_calls == most
