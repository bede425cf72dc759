"""OpenAI's logit_bias and presence and frequency penalties through its SDK: a bias of 100
draws its token every time, penalties are served on both doors and change a repetitive
reply, out-of-range values are refused naming the field."""

from __future__ import annotations

import openai
import pytest
from reliability.server import ServerProcess

from tests.e2e.sdk_types import openai_messages
from tests.e2e.test_openai_anthropic import oai

REPEAT = openai_messages([{"role": "user", "content": "Write the word cat twenty times."}])


def test_a_bias_of_100_draws_its_token_every_time(server: ServerProcess) -> None:
    forced = oai(server).chat.completions.create(
        model="default",
        messages=REPEAT,
        max_tokens=3,
        logit_bias={"1000": 100},
        logprobs=True,
    )
    choice = forced.choices[0]
    assert choice.logprobs is not None
    assert choice.logprobs.content is not None
    shown = [entry.token for entry in choice.logprobs.content]
    assert len(shown) == 3
    assert len(set(shown)) == 1
    assert choice.message.content == shown[0] * 3


def test_penalties_change_a_repetitive_reply_on_chat_and_completions(server: ServerProcess) -> None:
    client = oai(server)

    def reply(frequency: float, presence: float) -> str | None:
        done = client.chat.completions.create(
            model="default",
            messages=REPEAT,
            max_tokens=24,
            temperature=0,
            frequency_penalty=frequency,
            presence_penalty=presence,
        )
        return done.choices[0].message.content

    assert reply(1.5, 1.0) != reply(0.0, 0.0)
    streamed = client.completions.create(
        model="default", prompt="cat cat cat", max_tokens=8, frequency_penalty=1.0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in streamed if chunk.choices)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("frequency_penalty", 2.5),
        ("presence_penalty", -2.5),
        ("logit_bias", {"1000": 101}),
        ("logit_bias", {"5": 60, "05": 60}),  # one id twice would add up past 100
        ("logit_bias", {"-5": 1}),
    ],
)
def test_out_of_range_adjustments_are_refused_naming_them(
    server: ServerProcess, field: str, value: object
) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        oai(server).chat.completions.create(  # type: ignore[call-overload]  # test passthrough
            model="default", messages=REPEAT, max_tokens=2, **{field: value}
        )
    body = refused.value.body
    assert isinstance(body, dict)
    assert body["param"] == field
