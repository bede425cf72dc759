"""Constrained decoding on the real embedded model: JSON that always validates, tool calls
in their format, free text under ``auto``, and free sequences unchanged beside constrained
ones in the same decode steps."""

from __future__ import annotations

import json

import jsonschema
import pytest

from semantic.application.engine.batch_engine import BlockPoolBatchEngine
from semantic.application.engine.events import CompletionEvent, EngineEvent
from semantic.domain.chat import ChatMessage
from semantic.domain.constraints import OutputConstraint, TaggedSchema
from semantic.domain.generation import FinishReason, SamplingParams
from semantic.ports.grammar import GrammarCompiler
from tests.helpers import completions, generate, run_until_idle
from tests.integration.conftest import EngineFactory, RealModel

pytestmark = pytest.mark.model

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "mood": {"enum": ["happy", "sad", "calm"]},
        "pets": {"type": "integer"},
    },
    "required": ["name", "age", "mood"],
    "additionalProperties": False,
}
WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
ADD = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
    "required": ["a", "b"],
    "additionalProperties": False,
}
TRIGGER = "<tool_call>"
TOOLS = {"get_weather": WEATHER, "add": ADD}
SUBJECTS = [
    "a baker from Lyon", "a retired pilot", "a child who loves trains", "a grumpy cat owner",
    "a marathon runner", "a young violinist", "a fisherman", "a nurse on night shifts",
    "an astronomer", "a chess champion", "a farmer with three dogs", "a librarian",
    "a teenage skater", "a sleepy student", "a happy grandmother", "a tired programmer",
    "a ship captain", "a painter in Rome", "a beekeeper", "a sad clown",
]  # fmt: skip


def chat(real_model: RealModel, text: str) -> list[int]:
    return real_model.tokenizer.render_chat([ChatMessage("user", text)])


def call_format(name: str, schema: dict[str, object]) -> TaggedSchema:
    begin = f'{TRIGGER}{{"name": "{name}", "arguments": '
    return TaggedSchema(begin, json.dumps(schema), "}</tool_call>")


def calls(*, require_call: bool) -> OutputConstraint:
    tools = tuple(call_format(name, schema) for name, schema in TOOLS.items())
    triggers = () if require_call else (TRIGGER,)
    return OutputConstraint(calls=tools, triggers=triggers, require_call=require_call, max_calls=1)


def run_all(
    engine: BlockPoolBatchEngine, requests: list[tuple[list[int], dict[str, object]]]
) -> list[CompletionEvent]:
    ids = [engine.submit(f"agent-{i}", p, **kw) for i, (p, kw) in enumerate(requests)]  # type: ignore[arg-type]  # test passthrough
    done = completions(run_until_idle(engine))
    return [done[rid] for rid in ids]


def test_json_schema_output_validates_in_20_of_20_varied_prompts(
    real_model: RealModel, make_engine: EngineFactory, grammars: GrammarCompiler
) -> None:
    engine, _ = make_engine(grammars=grammars)
    constraint = OutputConstraint(json_schema=json.dumps(PERSON))
    requests = [
        (
            chat(real_model, f"Describe {subject} as a JSON object with name, age and mood."),
            {
                "max_tokens": 48,
                "constraint": constraint,
                "sampling": SamplingParams(temperature=0.9, top_p=0.95, top_k=40, seed=i)
                if i % 2
                else SamplingParams(),
            },
        )
        for i, subject in enumerate(SUBJECTS)
    ]
    for done in run_all(engine, requests):
        assert done.finish_reason is FinishReason.END_OF_TURN, done.text
        jsonschema.validate(json.loads(done.text), PERSON)


def test_a_required_call_comes_in_its_format_with_arguments_of_its_schema(
    real_model: RealModel, make_engine: EngineFactory, grammars: GrammarCompiler
) -> None:
    engine, _ = make_engine(grammars=grammars)
    prompts = ["What is the weather in Paris?", "What is 2 plus 40?", "Hello!"]
    requests = [
        (chat(real_model, text), {"max_tokens": 48, "constraint": calls(require_call=True)})
        for text in prompts
    ]
    for done in run_all(engine, requests):
        text = done.text
        assert done.finish_reason is FinishReason.END_OF_TURN, text
        assert text.startswith(f'{TRIGGER}{{"name": "')
        assert text.endswith("}</tool_call>")
        call = json.loads(text[len(TRIGGER) : -len("</tool_call>")])
        jsonschema.validate(call["arguments"], TOOLS[call["name"]])


def test_a_required_calls_forced_tokens_computed_together_give_the_tokens_decoding_gave(
    real_model: RealModel, make_engine: EngineFactory, grammars: GrammarCompiler
) -> None:
    """``<tool_call>{"name": "`` is computed with the prompt, and a call's other forced
    runs (``", "arguments": {"`` ...) in the step of the token before them, not a decode
    step a token: the calls come out the same, token for token, three at once and one
    alone, in fewer rounds."""
    prompts = ["What is the weather in Paris?", "What is 2 plus 40?", "Hello!"]
    requests = [
        (chat(real_model, text), {"max_tokens": 48, "constraint": calls(require_call=True)})
        for text in prompts
    ]
    replies, rounds = {}, {}
    for forced in (True, False):
        engine, _ = make_engine(grammars=grammars, forced_opening=forced, forced_runs=forced)
        together, rounds_together = counted_rounds(engine, requests)
        alone, rounds_alone = counted_rounds(engine, requests[:1])
        replies[forced] = [d.token_ids for d in [*together, *alone]]
        rounds[forced] = (rounds_together, rounds_alone)
    assert replies[True] == replies[False]
    assert grammars.compile(calls(require_call=True)).opening, "the opening is forced"
    assert all(a < b - 5 for a, b in zip(rounds[True], rounds[False], strict=True)), rounds


def test_a_seeded_sampled_reply_is_the_same_with_forced_runs_as_a_step_a_token(
    real_model: RealModel, make_engine: EngineFactory, grammars: GrammarCompiler
) -> None:
    """A run's tokens are not drawn, yet the seeded sampler moves past them as if they
    were: whether a forced token comes in a run (alone) or a step (beside a riding prompt,
    past a pass's rows), the draws after it are the same."""
    constraint = OutputConstraint(json_schema=json.dumps(PERSON))
    seeded = SamplingParams(temperature=0.9, top_p=0.95, seed=5)
    request = (
        chat(real_model, "Describe a pilot as JSON."),
        {"max_tokens": 40, "constraint": constraint, "sampling": seeded},
    )
    replies = []
    for forced_runs in (True, False):
        engine, _ = make_engine(grammars=grammars, forced_runs=forced_runs)
        replies.append(run_all(engine, [request])[0].token_ids)
    assert replies[0] == replies[1]


def counted_rounds(
    engine: BlockPoolBatchEngine, requests: list[tuple[list[int], dict[str, object]]]
) -> tuple[list[CompletionEvent], int]:
    """The requests' completions, and the engine rounds they took."""
    ids = [engine.submit(f"agent-{i}", p, **kw) for i, (p, kw) in enumerate(requests)]  # type: ignore[arg-type]  # test passthrough
    events: list[EngineEvent] = []
    rounds = 0
    while engine.has_work():
        events += engine.step().events
        rounds += 1
    done = completions(events)
    return [done[rid] for rid in ids], rounds


def test_under_auto_free_text_goes_through_as_it_would_unconstrained(
    real_model: RealModel, make_engine: EngineFactory, grammars: GrammarCompiler
) -> None:
    engine, _ = make_engine(grammars=grammars)
    prompt = chat(real_model, "What is the capital of France?")
    free = generate(engine, prompt, 24)
    auto = generate(engine, prompt, 24, constraint=calls(require_call=False))
    assert "Paris" in auto.text
    assert auto.token_ids == free.token_ids
    assert auto.finish_reason is free.finish_reason


def test_free_sequences_beside_constrained_ones_decode_exactly_as_alone(
    real_model: RealModel, make_engine: EngineFactory, grammars: GrammarCompiler
) -> None:
    engine, _ = make_engine(grammars=grammars)
    story = chat(real_model, "Tell me a short story about a dragon.")
    seeded = SamplingParams(temperature=0.8, top_p=0.9, seed=11)
    alone = [generate(engine, story, 24), generate(engine, story, 24, sampling=seeded)]
    constraint = OutputConstraint(json_schema=json.dumps(PERSON))
    person = chat(real_model, "Describe a pilot as JSON.")
    together = run_all(
        engine,
        [
            (person, {"max_tokens": 40, "constraint": constraint}),
            (story, {"max_tokens": 24}),
            (person, {"max_tokens": 5, "constraint": constraint}),
            (story, {"max_tokens": 24, "sampling": seeded}),
        ],
    )
    assert [d.token_ids for d in (together[1], together[3])] == [a.token_ids for a in alone]
    jsonschema.validate(json.loads(together[0].text), PERSON)
    assert together[2].finish_reason is FinishReason.MAX_TOKENS


def test_a_penalized_reply_takes_no_forced_runs(
    real_model: RealModel, make_engine: EngineFactory, grammars: GrammarCompiler
) -> None:
    """Its penalties count every token it drew, and a run's tokens are not drawn: with
    runs allowed it decodes a step a token, as with none, and so comes out the same."""
    penalized = SamplingParams(temperature=0.0, frequency_penalty=0.5)
    request = (
        chat(real_model, "What is the weather in Paris?"),
        {"max_tokens": 48, "constraint": calls(require_call=True), "sampling": penalized},
    )
    replies, rounds = [], []
    for forced_runs in (True, False):
        engine, _ = make_engine(grammars=grammars, forced_opening=False, forced_runs=forced_runs)
        done, taken = counted_rounds(engine, [request])
        replies.append(done[0].token_ids)
        rounds.append(taken)
    assert replies[0] == replies[1]
    assert rounds[0] == rounds[1]
