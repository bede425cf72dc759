"""What the engine reports as it runs: tokens as they are made, completions, and each
step's tally."""

from __future__ import annotations

from dataclasses import dataclass

from semantic.domain.blocks import AgentBlocks
from semantic.domain.generation import FinishReason, RequestStats, TokenLogprob


@dataclass(frozen=True, slots=True)
class TokenEvent:
    request_id: str
    token_id: int
    text: str
    """Text that became safe to show with this token; empty while held back."""
    together: bool = False
    """It came in the same step as the token before it (a run its grammar forced, or the
    first sampled token after a forced opening): no gap between them to count."""
    logprob: TokenLogprob | None = None
    """Where the request asked for log-probabilities."""


@dataclass(frozen=True, slots=True)
class CompletionEvent:
    """A request ended. ``blocks`` (owned by the pool owner ``request_id`` until someone
    adopts or releases them) hold the KV of ``blocks.token_ids``: the prompt and the kept
    generated tokens."""

    request_id: str
    agent_id: str
    namespace: str
    finish_reason: FinishReason
    text: str
    token_ids: tuple[int, ...]
    prompt_tokens: int
    blocks: AgentBlocks | None
    stats: RequestStats
    error: str | None = None
    stop_string: str | None = None


EngineEvent = TokenEvent | CompletionEvent


@dataclass(frozen=True, slots=True)
class StepResult:
    """One ``step``: its events, and the requests decoding, prefilling and waiting after it."""

    events: list[EngineEvent]
    decoding: int
    prefilling: int
    waiting: int
