"""Log-probabilities asked for: every shown token's, with its alternatives, through the
engine to the reply's deltas and result; drawn tokens only (no forced opening or runs)."""

from __future__ import annotations

import pytest

from semantic.adapters.http.openai_logprobs import token_entries
from semantic.application.chat.generation import (
    GenerationInput,
    GenerationResult,
    GenerationService,
    Limits,
    TextDelta,
)
from semantic.application.engine.batch_engine import BlockPoolBatchEngine
from semantic.application.engine.engine_loop import EngineLoop
from semantic.application.engine.events import TokenEvent
from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import TokenLogprob, TokenPiece
from tests.helpers import run_until_idle
from tests.unit.fakes import EOS, FakeBackend, FakeGrammars, FakeModel
from tests.unit.test_constraints import CONSTRAINT, LITERAL, PROMPT, make_engine
from tests.unit.test_engine_loop import expected, small_engine

LIMITS = Limits(512, 256, 16)


async def reply(
    engine: BlockPoolBatchEngine, request: GenerationInput
) -> tuple[list[TextDelta], GenerationResult]:
    loop = EngineLoop(engine)
    loop.start()
    try:
        events = [event async for event in GenerationService(loop, None, LIMITS).stream(request)]
    finally:
        loop.stop()
    result = events[-1]
    assert isinstance(result, GenerationResult)
    return [e for e in events if isinstance(e, TextDelta)], result


async def test_each_shown_token_comes_with_its_logprob_and_alternatives() -> None:
    deltas, result = await reply(
        small_engine(FakeBackend()), GenerationInput((1, 2, 3), max_tokens=6, logprobs=2)
    )
    assert [entry.token for entry in result.logprobs] == expected([1, 2, 3], 6)
    assert [entry for delta in deltas for entry in delta.logprobs] == list(result.logprobs)
    assert all(len(entry.top) == 2 for entry in result.logprobs)
    assert all(entry.top[0] == (entry.token, entry.logprob) for entry in result.logprobs)


async def test_a_request_that_asks_for_none_gets_none() -> None:
    deltas, result = await reply(
        small_engine(FakeBackend()), GenerationInput((1, 2, 3), max_tokens=6)
    )
    assert result.logprobs == ()
    assert all(delta.logprobs == () for delta in deltas)


async def test_a_constrained_reply_with_logprobs_draws_every_token() -> None:
    """Neither its forced opening nor forced runs: a token they give was not drawn."""
    engine, _ = make_engine(FakeGrammars(forced=3), forced_runs=True)
    request = GenerationInput(
        tuple(PROMPT), max_tokens=len(LITERAL) + 1, constraint=CONSTRAINT, logprobs=0
    )
    _, result = await reply(engine, request)
    assert [entry.token for entry in result.logprobs] == list(LITERAL)
    assert all(entry.top == () for entry in result.logprobs)


@pytest.mark.parametrize("top", [-1, 21])
def test_alternatives_out_of_range_are_refused_naming_the_field(top: int) -> None:
    service = GenerationService(EngineLoop(small_engine(FakeBackend())), None, LIMITS)
    with pytest.raises(InvalidRequestError) as refused:
        service.check(GenerationInput((1, 2, 3), logprobs=top))
    assert refused.value.param == "top_logprobs"


def test_the_end_of_the_turn_comes_with_no_logprob() -> None:
    """It is no part of the reply: OpenAI's figures never show it."""
    engine = small_engine(FakeBackend(FakeModel(eos_at_length=6)))
    engine.submit("a", [1, 2, 3], max_tokens=10, logprobs=1)
    tokens = [e for e in run_until_idle(engine) if isinstance(e, TokenEvent)]
    assert tokens[-1].token_id == EOS
    assert tokens[-1].logprob is None
    assert all(e.logprob is not None for e in tokens[:-1])


def test_an_entry_shows_a_split_characters_own_bytes_beside_its_replacement_text() -> None:
    smile = "🙂".encode()
    pieces = {1: TokenPiece("\ufffd", smile[:2]), 2: TokenPiece("\ufffd", smile[2:])}
    entries = token_entries(
        [TokenLogprob(1, -0.5, ((1, -0.5), (2, -1.5))), TokenLogprob(2, -0.1)], pieces.__getitem__
    )
    assert [e["token"] for e in entries] == ["\ufffd", "\ufffd"]
    assert bytes(entries[0]["bytes"] + entries[1]["bytes"]).decode() == "🙂"
    alternatives = entries[0]["top_logprobs"]
    assert [alt["bytes"] for alt in alternatives] == [list(smile[:2]), list(smile[2:])]
