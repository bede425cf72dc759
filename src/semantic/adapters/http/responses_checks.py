"""What a Responses request may ask of this server: each field it does not serve, asked
for beyond its neutral value, refused by name before any work."""

from __future__ import annotations

from semantic.adapters.http.identity import checked_id
from semantic.adapters.http.responses_schemas import ResponseRequest
from semantic.adapters.http.translate import must_default
from semantic.domain.errors import InvalidRequestError


def check_unserved(data: ResponseRequest) -> None:
    """Refused by name before any work: what this server does not serve, and fields that
    contradict each other."""
    if data.background:
        raise InvalidRequestError("background responses are not supported", param="background")
    if data.truncation not in (None, "auto", "disabled"):
        raise InvalidRequestError("truncation must be 'auto' or 'disabled'", param="truncation")
    must_default(data.prompt, None, "prompt")
    must_default(data.context_management or None, None, "context_management")
    if data.previous_response_id is not None and data.conversation is not None:
        raise InvalidRequestError(
            "give previous_response_id or conversation, not both", param="conversation"
        )
    if data.max_output_tokens is not None and data.max_output_tokens < 1:
        raise InvalidRequestError("max_output_tokens must be at least 1", param="max_output_tokens")
    if data.previous_response_id is not None:
        checked_id(data.previous_response_id, "previous_response_id")
    unknown = sorted(set(data.include or ()) - INCLUDABLE)
    if unknown:
        raise InvalidRequestError(
            f"include: {unknown[0][:64]!r} is not one of {', '.join(sorted(INCLUDABLE))}",
            param="include",
        )


INCLUDABLE = frozenset(
    {
        "message.output_text.logprobs",
        "reasoning.encrypted_content",
        "file_search_call.results",
        "web_search_call.results",
        "web_search_call.action.sources",
        "message.input_image.image_url",
        "computer_call_output.output.image_url",
        "code_interpreter_call.outputs",
    }
)
"""OpenAI's ``include`` values: the text's log-probabilities are served; the others name
items this server never makes (hosted tools, images, encrypted reasoning), so asking for
them changes nothing, as it would not where no such item comes."""
