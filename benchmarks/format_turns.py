"""An agent's next turn from disk in one weight format: ours after a restart, llama.cpp
from its state file, over the same conversation (``weight_formats`` runs it for each row).

The first turn is a history of about 4K tokens; the next one adds a short assistant reply
and a question. Ours answers the first turn (its blocks are saved), then each of
``resume.RESTARTS`` servers, started on a fresh copy of that data directory, answers the
next turn: the median time to its first streamed token. llama.cpp saves its state after
the first turn's tokens and times loading that file and computing the new tokens to the
first one, as ``resume`` does for the float32 comparison.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median

from mlx_lm.utils import load_tokenizer

from benchmarks import llama_cpp
from benchmarks.corpus import conversation
from benchmarks.resume import QUESTION, RESTARTS, Ttft, middle, on_a_fresh_copy, stream_ttft
from benchmarks.servers import steady_server
from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from semantic.bootstrap import prepare_model
from semantic.config import Settings
from semantic.domain.chat import ChatMessage

REPLY = "The main point is that the example keeps state between calls, which is easy to miss."


@dataclass(frozen=True, slots=True)
class Turns:
    """Both turns as messages (for our HTTP server) and as token ids (for llama.cpp)."""

    first: list[dict[str, str]]
    second: list[dict[str, str]]
    first_tokens: list[int]
    second_tokens: list[int]

    def save(self, path: Path) -> Path:
        path.write_text(json.dumps(asdict(self)))
        return path

    @classmethod
    def load(cls, path: Path) -> Turns:
        return cls(**json.loads(path.read_text()))


def make_turns(history_tokens: int) -> Turns:
    """The conversation, tokenized as the server renders it (the embedded tokenizer)."""
    path, _ = prepare_model(Settings(), ProgressPrinter())
    tokenizer = MlxTokenizer(load_tokenizer(path))  # type: ignore[no-untyped-call]  # mlx-lm: untyped
    history = conversation(7, history_tokens, lambda m: len(tokenizer.render_chat(m)))
    second = [*history, ChatMessage("assistant", REPLY), ChatMessage("user", QUESTION)]
    return Turns(
        [_plain(m) for m in history],
        [_plain(m) for m in second],
        tokenizer.render_chat(history),
        tokenizer.render_chat(second),
    )


def _plain(message: ChatMessage) -> dict[str, str]:
    return {"role": message.role, "content": message.content}


def ours(server_args: Sequence[str], turns: Turns, work: Path) -> float:
    with steady_server(work / "data", *server_args).start() as server:
        stream_ttft(server.url, turns.first, "agent")
        server.stop()
    runs = [
        on_a_fresh_copy(work, index, _next_turn(turns), server_args) for index in range(RESTARTS)
    ]
    return middle(runs)[0]


def _next_turn(turns: Turns) -> Callable[[str], Ttft]:
    return lambda url: stream_ttft(url, turns.second, "agent")


def theirs(gguf: Path, turns: Turns, work: Path) -> float:
    state = llama_cpp.LlamaCppState(gguf, len(turns.second_tokens) + 64, work)
    shared = len(turns.first_tokens)
    if turns.second_tokens[:shared] != turns.first_tokens:
        raise ValueError("the next turn's tokens do not extend the first turn's")
    saved = state.save("turn", turns.first_tokens)
    return median(state.resume(saved, turns.second_tokens[shared:]) for _ in range(RESTARTS))
