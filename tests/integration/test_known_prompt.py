"""A chain's next turn after a restart takes its history's ids from the previous prompt
(read from its stored blocks) instead of tokenizing it again, and gets the same ids."""

from __future__ import annotations

import itertools
import json
from typing import Any

from semantic.adapters.mlx.tokenizer.piece_encoder import PieceEncoder
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.application.chat.prompt_marks import mark, marked
from semantic.domain.chat import ChatMessage
from semantic.domain.tools import Tool, ToolCall
from tests.integration.conftest import RealModel

WEATHER = Tool(
    "weather",
    "The weather in a city, today, for someone planning a long walk.",
    json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}),
)


def chain() -> list[list[ChatMessage]]:
    """Each turn's whole conversation: a chain with calls and their results."""
    call = ToolCall("call_1", "weather", json.dumps({"city": "Lisbon"}))
    turns = [
        [
            ChatMessage("system", "You are a careful assistant who plans walks. " * 4),
            ChatMessage("user", "I want to walk along the river in Lisbon this afternoon. " * 3),
        ],
        [
            ChatMessage("assistant", "Let me look at the weather before we plan it.", (call,)),
            ChatMessage(
                "tool",
                "Sunny, 24 degrees, light wind from the north-west. " * 2,
                tool_call_id="call_1",
            ),
        ],
        [
            ChatMessage("assistant", "It is sunny and warm: a good afternoon for the river. " * 2),
            ChatMessage("user", "Thanks. Which part of the river walk is the most shaded? " * 2),
        ],
    ]
    so_far: list[ChatMessage] = []
    out = []
    for turn in turns:
        so_far = so_far + turn
        out.append(list(so_far))
    return out


def fresh(real_model: RealModel) -> MlxTokenizer:
    """The tokenizer of a server just started: it remembers no piece."""
    return MlxTokenizer(real_model.loaded.tokenizer)


def test_the_next_turn_from_the_previous_prompt_gets_the_whole_renderings_ids(
    real_model: RealModel,
) -> None:
    fingerprint = "model-a"
    turns = chain()
    for previous, current in itertools.pairwise(turns):
        prompt = fresh(real_model).render_chat(previous, scope="ns", tools=[WEATHER])
        # the blocks hold the prompt, then the reply's ids as the model chose them (here one
        # token a character: not the ids its text tokenizes to)
        reply = [
            i for ch in "A reply, written token by token." for i in real_model.tokenizer.encode(ch)
        ]
        blocks = [*prompt, *reply]
        known = marked(fingerprint, mark(fingerprint, prompt), blocks)
        assert list(known) == prompt
        whole = fresh(real_model).render_chat(current, scope="ns", tools=[WEATHER])
        given = fresh(real_model).render_chat(current, scope="ns", tools=[WEATHER], known=known)
        assert given == whole
        # even given the reply's ids too, only whole pieces that spell the text are taken
        assert (
            fresh(real_model).render_chat(current, scope="ns", tools=[WEATHER], known=blocks)
            == whole
        )


def test_a_mark_finds_only_the_exact_prompt_of_its_model() -> None:
    prompt = [5, 6, 7, 8]
    stored = mark("model-a", prompt)
    assert list(marked("model-a", stored, [*prompt, 9, 10])) == prompt
    assert marked("model-b", stored, [*prompt, 9]) == ()  # another model's blocks
    assert marked("model-a", stored, [5, 6, 7, 9, 9]) == ()  # blocks of another turn
    assert marked("model-a", stored, prompt[:3]) == ()  # fewer blocks than the prompt
    assert marked("model-a", "", prompt) == ()
    assert marked("model-a", "x:y", prompt) == ()


class Counting:
    """The real tokenizer, counting the texts it encodes."""

    def __init__(self, backend: Any) -> None:
        self.backend = backend
        self.encoded: list[str] = []

    def encode(self, text: str, add_special_tokens: bool) -> Any:
        self.encoded.append(text)
        return self.backend.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, ids: list[int], skip_special_tokens: bool) -> str:
        return str(self.backend.decode(ids, skip_special_tokens=skip_special_tokens))


def test_only_the_new_text_is_encoded_and_only_where_ids_read_back_exactly(
    real_model: RealModel,
) -> None:
    backend = real_model.loaded.tokenizer.backend_tokenizer
    history = "<|im_start|>user\n" + "an earlier question, long enough to be kept " * 3
    new = "<|im_start|>user\n" + "the new question, long enough to be kept as well " * 3
    known = PieceEncoder.of(backend)
    assert known is not None
    previous = known.encode(f"{history}<|im_end|>\n")
    text = f"{history}<|im_end|>\n{new}<|im_end|>\n"
    special = {"<|im_start|>": 1, "<|im_end|>": 2}
    counting = Counting(backend)
    exact = PieceEncoder(counting, special, 1 << 20, decodes_exactly=True)
    assert exact.encode(text, known=previous) == known.encode(text)
    assert [t for t in counting.encoded if len(t) > 60] == [new.removeprefix("<|im_start|>")]
    counting.encoded.clear()
    unsure = PieceEncoder(counting, special, 1 << 20, decodes_exactly=False)
    assert unsure.encode(text, known=previous) == known.encode(text)
    assert len([t for t in counting.encoded if len(t) > 60]) == 2  # both encoded
