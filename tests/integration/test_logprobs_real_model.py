"""Log-probabilities on the real model: the drawn token's under the model's distribution,
its alternatives most likely first; asking for them changes no token, and a sequence's
figures are the same alone and in a batch to 1e-4, not to the bit: its tokens are, but a
prompt's chunks are cut by measured time and a batch's cache is padded to its longest
row, which moves the last bits of the scores (by ~1e-5 here)."""

from __future__ import annotations

import math

from semantic.application.engine.events import TokenEvent
from semantic.domain.chat import ChatMessage
from semantic.domain.generation import SamplingParams, TokenLogprob
from tests.helpers import run_until_idle
from tests.integration.conftest import EngineFactory, RealModel

PROMPTS = ("Name three colours.", "What is the capital of France?", "Count to five.")


def prompt_of(real_model: RealModel, text: str) -> list[int]:
    return real_model.tokenizer.render_chat([ChatMessage("user", text)])


def replies(
    make_engine: EngineFactory, prompts: list[list[int]], ends: frozenset[int], **kwargs: object
) -> list[list[TokenEvent]]:
    """Each prompt's reply of 12 tokens, all decoding in one batch, without its end of
    the turn (which has no figures: it is no part of the reply)."""
    engine, _ = make_engine()
    ids = [
        engine.submit(f"a{i}", prompt, max_tokens=12, **kwargs)  # type: ignore[arg-type]  # test passthrough
        for i, prompt in enumerate(prompts)
    ]
    events = [e for e in run_until_idle(engine) if isinstance(e, TokenEvent)]
    return [
        [e for e in events if e.request_id == request_id and e.token_id not in ends]
        for request_id in ids
    ]


def test_greedy_tokens_are_the_likeliest_and_unchanged_by_asking(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    prompts = [prompt_of(real_model, text) for text in PROMPTS]
    ends = real_model.tokenizer.eos_token_ids
    plain = replies(make_engine, prompts, ends)
    asked = replies(make_engine, prompts, ends, logprobs=5)
    for without, with_them in zip(plain, asked, strict=True):
        assert [e.token_id for e in with_them] == [e.token_id for e in without]
        for event in with_them:
            entry = event.logprob
            assert isinstance(entry, TokenLogprob)
            assert len(entry.top) == 5
            assert entry.top[0] == (entry.token, entry.logprob)  # greedy: the likeliest
            values = [value for _, value in entry.top]
            assert values == sorted(values, reverse=True)
            assert entry.logprob <= 0.0
            assert sum(math.exp(value) for value in values) <= 1.0 + 1e-5


def test_a_sequences_logprobs_are_the_same_alone_and_in_a_batch(
    real_model: RealModel, make_engine: EngineFactory
) -> None:
    prompts = [prompt_of(real_model, text) for text in PROMPTS]
    ends = real_model.tokenizer.eos_token_ids
    sampled = SamplingParams(temperature=0.8, seed=7)
    together = replies(make_engine, prompts, ends, logprobs=3, sampling=sampled)
    alone = [
        replies(make_engine, [prompt], ends, logprobs=3, sampling=sampled)[0] for prompt in prompts
    ]
    for batched, single in zip(together, alone, strict=True):
        assert [e.token_id for e in batched] == [e.token_id for e in single]
        for ours, theirs in zip(batched, single, strict=True):
            assert ours.logprob is not None
            assert theirs.logprob is not None
            assert [t for t, _ in ours.logprob.top] == [t for t, _ in theirs.logprob.top]
            pairs = [(ours.logprob.logprob, theirs.logprob.logprob)]
            pairs += [
                (a, b) for (_, a), (_, b) in zip(ours.logprob.top, theirs.logprob.top, strict=True)
            ]
            assert all(math.isclose(a, b, abs_tol=1e-4) for a, b in pairs)
