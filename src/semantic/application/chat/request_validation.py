"""Checks a request must pass before it may queue: nothing malformed reaches the model."""

from __future__ import annotations

from semantic.application.engine.active_request import GenerationRequest
from semantic.domain.block_pool import BlockPool
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import InvalidRequestError, PromptTooLongError
from semantic.ports.tokenizer import Tokenizer


def validate_request(
    request: GenerationRequest,
    spec: ModelCacheSpec,
    pool: BlockPool,
    tokenizer: Tokenizer,
    max_context: int,
) -> None:
    if not request.agent_id:
        raise InvalidRequestError("agent_id must not be empty", param="agent_id")
    prompt = request.prompt
    if not prompt:
        raise InvalidRequestError("the prompt is empty", param="messages")
    vocab = tokenizer.vocab_size
    bad = next((t for t in prompt if not 0 <= t < vocab), None)
    if bad is not None:
        raise InvalidRequestError(
            f"token id {bad} is outside the vocabulary (0 to {vocab - 1})", param="messages"
        )
    total = len(prompt) + request.criteria.max_tokens
    if total > max_context:
        raise PromptTooLongError(
            f"the prompt ({len(prompt)} tokens) plus max_tokens ({request.criteria.max_tokens}) "
            f"is {total} tokens, over the model's context of {max_context}",
            param="max_tokens",
        )
    needed = spec.blocks_for_tokens(len(prompt) + 1)
    if needed > pool.capacity:
        raise PromptTooLongError(
            f"the prompt needs {needed} KV blocks; this server's KV budget holds "
            f"{pool.capacity} (raise --kv-budget-mb or shorten the prompt)",
            param="messages",
        )
    if request.cached is not None:
        request.cached.blocks.validate(spec)
