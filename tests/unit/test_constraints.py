"""The engine's part in constrained decoding: it compiles a request's constraint at
submission, hands each admitted sequence a matcher of its own, and the sequence ends as a
turn ends once the grammar is complete (or at max_tokens before that)."""

from __future__ import annotations

from typing import Any

import pytest

from semantic.application.chat.generation import GenerationInput, GenerationService, Limits
from semantic.application.engine.batch_engine import BlockPoolBatchEngine, EngineConfig
from semantic.application.engine.engine_loop import EngineLoop
from semantic.application.engine.events import TokenEvent
from semantic.application.scheduler.pacer import PacerConfig
from semantic.domain.block_pool import BlockPool
from semantic.domain.constraints import OutputConstraint, UnsupportedSchemaError
from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import FinishReason, SamplingParams
from tests.helpers import completions, run_until_idle
from tests.unit.fakes import (
    EOS,
    FakeBackend,
    FakeGrammars,
    FakeModel,
    FakeTokenizer,
    next_token,
)

PROMPT = [5, 9, 2, 7, 11, 3, 8, 1, 4, 6]
LITERAL = (12, 30, 4, 4, 51)
CONSTRAINT = OutputConstraint(json_schema="[12,30,4,4,51]")


def make_engine(
    grammars: FakeGrammars | None = None,
    *,
    forced_opening: bool = True,
    forced_runs: bool = False,
    pool_blocks: int = 200,
) -> tuple[BlockPoolBatchEngine, FakeBackend]:
    backend = FakeBackend(FakeModel(forced_runs=forced_runs))
    config = EngineConfig(
        prefill_chunk_tokens=4, pacer=PacerConfig(8), forced_opening=forced_opening
    )
    engine = BlockPoolBatchEngine(
        backend, FakeTokenizer(), BlockPool(pool_blocks), config, grammars=grammars
    )
    return engine, backend


def free_tokens(prompt: list[int], n: int) -> list[int]:
    history, out = list(prompt), []
    for _ in range(n):
        out.append(next_token(history))
        history.append(out[-1])
    return out


def test_a_constrained_request_says_what_its_grammar_allows_then_ends_its_turn() -> None:
    engine, _ = make_engine(FakeGrammars())
    rid = engine.submit("a", PROMPT, max_tokens=20, constraint=CONSTRAINT)
    done = completions(run_until_idle(engine))[rid]
    assert list(done.token_ids) == [*LITERAL, EOS]
    assert done.finish_reason is FinishReason.END_OF_TURN


def test_a_free_request_beside_a_constrained_one_decodes_as_it_would_alone() -> None:
    engine, _ = make_engine(FakeGrammars())
    free = engine.submit("free", PROMPT, max_tokens=8)
    held = engine.submit("held", PROMPT, max_tokens=20, constraint=CONSTRAINT)
    events = run_until_idle(engine)
    done = completions(events)
    assert list(done[free].token_ids) == free_tokens(PROMPT, 8)
    streamed = [e.token_id for e in events if isinstance(e, TokenEvent) and e.request_id == held]
    assert streamed == [*LITERAL, EOS] == list(done[held].token_ids)


def test_max_tokens_before_the_grammar_completes_ends_with_max_tokens() -> None:
    engine, _ = make_engine(FakeGrammars())
    rid = engine.submit("a", PROMPT, max_tokens=3, constraint=CONSTRAINT)
    done = completions(run_until_idle(engine))[rid]
    assert list(done.token_ids) == list(LITERAL[:3])
    assert done.finish_reason is FinishReason.MAX_TOKENS


def forced_run(forced_opening: bool, max_tokens: int = 20) -> tuple[list[int], Any, FakeBackend]:
    """A constrained request whose grammar forces its first three tokens: what it streamed,
    its completion, and the backend."""
    engine, backend = make_engine(FakeGrammars(forced=3), forced_opening=forced_opening)
    rid = engine.submit("a", PROMPT, max_tokens=max_tokens, constraint=CONSTRAINT)
    events = run_until_idle(engine)
    streamed = [e.token_id for e in events if isinstance(e, TokenEvent) and e.request_id == rid]
    return streamed, completions(events)[rid], backend


def test_a_forced_opening_is_prefilled_with_the_prompt_and_streamed_as_output() -> None:
    streamed, done, backend = forced_run(forced_opening=True)
    streamed_before, before, backend_before = forced_run(forced_opening=False)
    assert streamed == streamed_before == [*LITERAL, EOS] == list(done.token_ids)
    assert done.prompt_tokens == before.prompt_tokens == len(PROMPT)
    assert done.blocks is not None
    assert before.blocks is not None
    assert done.blocks.token_ids == before.blocks.token_ids, "the KV kept: prompt, then reply"
    prefilled = sum(n for _, n in backend.made("prefill"))
    assert prefilled == len(PROMPT) + 3 == sum(n for _, n in backend_before.made("prefill")) + 3
    assert len(backend.made("step")) == len(backend_before.made("step")) - 3


def test_a_forced_opening_longer_than_max_tokens_is_decoded_as_before() -> None:
    streamed, done, backend = forced_run(forced_opening=True, max_tokens=3)
    assert streamed == list(LITERAL[:3]) == list(done.token_ids)
    assert done.finish_reason is FinishReason.MAX_TOKENS
    assert sum(n for _, n in backend.made("prefill")) == len(PROMPT)


def test_a_prompt_the_pool_holds_only_without_its_opening_is_decoded_as_before() -> None:
    """Six blocks of four tokens in two layers: the prompt and a first token fit (11
    positions), not with the opening too (14): it is decoded, not left waiting for room."""
    engine, backend = make_engine(FakeGrammars(forced=3), pool_blocks=6)
    rid = engine.submit("a", PROMPT, max_tokens=20, constraint=CONSTRAINT)
    done = completions(run_until_idle(engine, limit=100))[rid]
    assert list(done.token_ids) == list(LITERAL[:2])
    assert done.finish_reason is FinishReason.POOL_EXHAUSTED
    assert sum(n for _, n in backend.made("prefill")) == len(PROMPT)


def test_requests_sharing_a_forced_opening_report_no_more_cached_than_their_prompt() -> None:
    """Two alike arrive at once: the second copies the first's prefix, its opening too."""
    engine, _ = make_engine(FakeGrammars(forced=3))
    ids = [engine.submit(f"a{n}", PROMPT, max_tokens=20, constraint=CONSTRAINT) for n in (0, 1)]
    done = completions(run_until_idle(engine))
    for rid in ids:
        assert list(done[rid].token_ids) == [*LITERAL, EOS]
        assert done[rid].stats.cached_tokens <= len(PROMPT) - 1
        assert done[rid].prompt_tokens == len(PROMPT)


class GapCounter:
    def __init__(self) -> None:
        self.firsts = 0
        self.gaps = 0

    def on_first_token(self, seconds: float) -> None:
        self.firsts += 1

    def on_token_gap(self, seconds: float) -> None:
        self.gaps += 1

    def on_finished(self, finished: Any) -> None:
        pass

    def on_abandoned(self) -> None:
        pass


async def counted_reply(engine: BlockPoolBatchEngine, max_tokens: int) -> tuple[str, GapCounter]:
    """The constrained reply's text through the service, and the token gaps it counted."""
    loop = EngineLoop(engine)
    loop.start()
    counted = GapCounter()
    try:
        service = GenerationService(loop, None, Limits(512, 256, 16), counted)
        reply = await service.complete(
            GenerationInput(tuple(PROMPT), max_tokens=max_tokens, constraint=CONSTRAINT)
        )
    finally:
        loop.stop()
    return reply.text, counted


async def test_a_forced_opening_counts_no_gaps_between_tokens_of_its_own() -> None:
    """It comes in the first sampled token's step: one first token, then a gap a step."""
    engine, _ = make_engine(FakeGrammars(forced=3))
    text, counted = await counted_reply(engine, max_tokens=9)
    assert text == FakeTokenizer().decode(LITERAL)
    assert counted.firsts == 1
    assert counted.gaps == len(LITERAL) - 3, "the steps after the first: 51, then the end"


async def test_a_forced_run_in_a_step_counts_no_gaps_between_its_tokens() -> None:
    """The literal after its first sampled token is forced: it comes in one step, with
    the token before it; one gap is counted for that step, none inside it."""
    engine, _ = make_engine(FakeGrammars(forced=1), forced_runs=True)
    text, counted = await counted_reply(engine, max_tokens=len(LITERAL) + 1)
    assert text == FakeTokenizer().decode(LITERAL)
    assert (counted.firsts, counted.gaps) == (1, 1)


def test_a_schema_the_grammar_engine_refuses_is_refused_at_submission() -> None:
    grammars = FakeGrammars()
    engine, backend = make_engine(grammars)
    refused = OutputConstraint(json_schema='{"not": {"type": "string"}}')
    with pytest.raises(UnsupportedSchemaError) as caught:
        engine.submit("a", PROMPT, max_tokens=5, constraint=refused)
    assert caught.value.keywords == ("not",)
    assert not engine.has_work()
    assert not backend.model.sequences


def test_each_request_gets_a_matcher_of_its_own() -> None:
    grammars = FakeGrammars()
    engine, _ = make_engine(grammars)
    ids = [engine.submit(f"a{i}", PROMPT, max_tokens=20, constraint=CONSTRAINT) for i in range(3)]
    done = completions(run_until_idle(engine))
    assert all(list(done[rid].token_ids) == [*LITERAL, EOS] for rid in ids)


def test_without_a_grammar_engine_a_constraint_is_refused() -> None:
    engine, _ = make_engine(None)
    with pytest.raises(InvalidRequestError, match="constrained decoding"):
        engine.submit("a", PROMPT, max_tokens=5, constraint=CONSTRAINT)


async def test_the_use_case_refuses_a_schema_before_queueing_and_completes_a_valid_one() -> None:
    engine, _ = make_engine(FakeGrammars())
    loop = EngineLoop(engine)
    loop.start()
    try:
        service = GenerationService(loop, None, Limits(512, 256, 16))
        refused = OutputConstraint(json_schema='{"not": {}}')
        with pytest.raises(UnsupportedSchemaError):
            await service.start(GenerationInput(tuple(PROMPT), max_tokens=9, constraint=refused))
        assert not loop.active_requests
        reply = await service.complete(
            GenerationInput(tuple(PROMPT), max_tokens=9, constraint=CONSTRAINT)
        )
    finally:
        loop.stop()
    assert reply.finish_reason is FinishReason.END_OF_TURN
    assert reply.text == FakeTokenizer().decode(LITERAL)


def test_a_penalized_reply_takes_no_forced_opening() -> None:
    """Its penalties count every token it drew; an opening's tokens would not be drawn."""
    engine, backend = make_engine(FakeGrammars(forced=3))
    penalized = SamplingParams(frequency_penalty=0.5)
    rid = engine.submit("a", PROMPT, max_tokens=20, constraint=CONSTRAINT, sampling=penalized)
    done = completions(run_until_idle(engine))[rid]
    assert list(done.token_ids) == [*LITERAL, EOS]
    assert sum(n for _, n in backend.made("prefill")) == len(PROMPT)
