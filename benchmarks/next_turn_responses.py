"""The realistic next turn after a restart: through Responses, beside chat completions.

    python -m benchmarks.next_turn_responses [--history 4096] [--repeats 12]

A conversation of about ``--history`` tokens is answered once through ``/v1/responses``
(its items as input) and once through chat completions (in another namespace, so neither
finds the other's blocks). Then, ``--repeats`` times, the next turn is timed to its first
token both ways, each as the first request of a server started on a fresh copy of that
data: Responses sends only the question (and the instructions, which OpenAI does not carry
along a chain) on ``previous_response_id`` (the server resumes the chain from its blocks on
disk); chat completions re-sends the whole history (the server tokenizes it and finds its
prefix on disk). Needs a quiet machine.
"""

from __future__ import annotations

import argparse
import functools
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import load_bench, median
from benchmarks.corpus import conversation
from benchmarks.resume import QUESTION, on_a_fresh_copy, stream_ttft
from benchmarks.servers import steady_server

CHAT_NAMESPACE = "chat"
Timing = tuple[float, int]


def respond(url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """Seconds to the first streamed text, and the completed response. The client is made
    before the clock starts, as ``stream_ttft``'s is (making one takes 15-30 ms here)."""
    body = {"model": "default", "temperature": 0, "max_output_tokens": 16, "stream": True, **body}
    with httpx.Client() as client:
        return _timed(client, url, body)


def _timed(client: httpx.Client, url: str, body: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    started, first, final = time.perf_counter(), 0.0, {}
    with client.stream("POST", f"{url}/v1/responses", json=body, timeout=600) as reply:
        reply.raise_for_status()
        for line in reply.iter_lines():
            if not line.startswith("data: "):
                continue
            event = json.loads(line[6:])
            if event["type"] == "response.output_text.delta":
                first = first or time.perf_counter()
            elif event["type"] in ("response.completed", "response.incomplete"):
                final = event["response"]
    return (first or time.perf_counter()) - started, final


def first_turns(data: Path, messages: list[dict[str, str]]) -> tuple[str, str]:
    """The conversation answered once each way on one server: the first response's id,
    and the reply chat completions gave (which its next turn re-sends)."""
    system, talk = messages[0]["content"], messages[1:]
    with steady_server(data).start() as server:
        _, first = respond(server.url, {"instructions": system, "input": talk})
        _, reply, _ = stream_ttft(server.url, messages, CHAT_NAMESPACE)
        server.stop()
    return str(first["id"]), reply


def next_turn(url: str, way: str, ask: dict[str, Any], turn: list[dict[str, str]]) -> Timing:
    """Seconds to the first token of the next turn ``way``, and the prompt tokens it found
    cached."""
    if way == "responses":
        ttft, done = respond(url, ask)
        return ttft, done["usage"]["input_tokens_details"]["cached_tokens"]
    ttft, _, cached = stream_ttft(url, turn, CHAT_NAMESPACE)
    return ttft, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument(
        "--repeats", type=int, default=12, help="pairs of restarts; each way first in half"
    )
    args = parser.parse_args()
    tokenizer = load_bench().tokenizer
    history = conversation(
        100 + args.history, args.history, lambda m: len(tokenizer.render_chat(m))
    )
    messages = [{"role": m.role, "content": m.content} for m in history]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        first_id, reply = first_turns(work / "data", messages)
        ask = {"previous_response_id": first_id, "input": QUESTION}
        ask["instructions"] = messages[0]["content"]  # not carried along a chain: sent each turn
        turn = [*messages, {"role": "assistant", "content": reply}]
        turn.append({"role": "user", "content": QUESTION})
        runs = [_pair(work, repeat, ask, turn) for repeat in range(args.repeats)]
    _report(runs)


def _pair(
    work: Path, repeat: int, ask: dict[str, Any], turn: list[dict[str, str]]
) -> tuple[float, float]:
    """The next turn both ways, each the first request of a server restarted on a fresh
    copy of the data (the first request after a start pays costs a second does not)."""
    ways = ("responses", "chat") if repeat % 2 == 0 else ("chat", "responses")
    timed = {
        way: on_a_fresh_copy(
            work, 2 * repeat + n, functools.partial(next_turn, way=way, ask=ask, turn=turn)
        )
        for n, way in enumerate(ways)
    }
    (r_ttft, r_cached), (c_ttft, c_cached) = timed["responses"], timed["chat"]
    print(
        f"next turn after a restart: Responses {r_ttft * 1e3:.0f} ms ({r_cached} cached), "
        f"chat completions {c_ttft * 1e3:.0f} ms ({c_cached} cached)"
    )
    return r_ttft, c_ttft


def _report(runs: list[tuple[float, float]]) -> None:
    responses, chat = median([r for r, _ in runs]), median([c for _, c in runs])
    print(
        f"median over {len(runs)}: Responses {responses * 1e3:.0f} ms, chat completions "
        f"{chat * 1e3:.0f} ms, ratio {responses / chat:.2f}x; median of each pair's ratio "
        f"{median([r / c for r, c in runs]):.2f}x"
    )


if __name__ == "__main__":
    main()
