"""The one place a request is checked: each refusal names its field (QA: a request that
reached the engine unchecked could ask for more KV than the budget holds)."""

from __future__ import annotations

import re

import pytest

from semantic.application.chat.request_validation import Limits, checked_max_tokens
from semantic.domain.errors import InvalidRequestError, PromptTooLongError

LIMITS = Limits(
    max_context=512, max_tokens_cap=128, default_max_tokens=64, vocab_size=100, kv_tokens=40
)


@pytest.mark.parametrize(
    ("prompt", "max_tokens", "error", "param", "words"),
    [
        ([], None, InvalidRequestError, "messages", "empty"),
        ([1, 2, 100], None, InvalidRequestError, "messages", "outside the vocabulary (0 to 99)"),
        ([1], 0, InvalidRequestError, "max_tokens", "between 1 and 128"),
        ([1], 129, InvalidRequestError, "max_tokens", "between 1 and 128"),
        ([1] * 512, None, PromptTooLongError, "messages", "context is 512"),
        ([1] * 40, 4, PromptTooLongError, "messages", "KV budget holds 40"),
    ],
)
def test_a_request_the_server_cannot_run_is_refused_by_field(
    prompt: list[int], max_tokens: int | None, error: type[Exception], param: str, words: str
) -> None:
    with pytest.raises(error, match=re.escape(words)) as refused:
        checked_max_tokens(prompt, max_tokens, LIMITS)
    assert getattr(refused.value, "param", None) == param


def test_an_unset_max_tokens_shrinks_to_the_room_left_and_a_set_one_is_refused() -> None:
    roomy = Limits(max_context=100, max_tokens_cap=128, default_max_tokens=64)
    assert checked_max_tokens([1] * 10, None, roomy) == 64
    assert checked_max_tokens([1] * 60, None, roomy) == 40
    with pytest.raises(PromptTooLongError, match="plus max_tokens") as refused:
        checked_max_tokens([1] * 60, 41, roomy)
    assert refused.value.param == "max_tokens"
    assert checked_max_tokens([1] * 60, 40, roomy) == 40
