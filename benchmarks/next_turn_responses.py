"""The realistic next turn after a restart: through Responses, beside chat completions.

    python -m benchmarks.next_turn_responses [--history 4096] [--repeats 3]

A conversation of about ``--history`` tokens is answered once through ``/v1/responses``
(its items as input) and once through chat completions (in another namespace, so neither
finds the other's blocks); the server restarts; then the next turn is timed to its first
token both ways: Responses sends only the question (and the instructions, which OpenAI does
not carry along a chain) on ``previous_response_id`` (the server resumes the chain from its
blocks on disk), chat completions re-sends the whole history
(the server tokenizes it and finds its prefix on disk). Needs a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from reliability.server import ServerProcess

from benchmarks.common import load_bench, median
from benchmarks.corpus import conversation
from benchmarks.resume import QUESTION, stream_ttft

CHAT_NAMESPACE = "chat"


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


def one_run(data: Path, messages: list[dict[str, str]], responses_first: bool) -> tuple[float, ...]:
    system, talk = messages[0]["content"], messages[1:]
    with ServerProcess(data).start() as server:
        _, first = respond(server.url, {"instructions": system, "input": talk})
        _, reply, _ = stream_ttft(server.url, messages, CHAT_NAMESPACE)
        server.stop()
    turn = [
        *messages,
        {"role": "assistant", "content": reply},
        {"role": "user", "content": QUESTION},
    ]
    with ServerProcess(data).start() as server:
        timings: dict[str, tuple[float, int]] = {}
        for way in ("responses", "chat") if responses_first else ("chat", "responses"):
            if way == "responses":
                ask = {"previous_response_id": first["id"], "input": QUESTION}
                ask["instructions"] = system  # not carried along a chain: sent each turn
                ttft, done = respond(server.url, ask)
                timings[way] = (ttft, done["usage"]["input_tokens_details"]["cached_tokens"])
            else:
                ttft, _, cached = stream_ttft(server.url, turn, CHAT_NAMESPACE)
                timings[way] = (ttft, cached)
        server.stop()
    (r_ttft, r_cached), (c_ttft, c_cached) = timings["responses"], timings["chat"]
    print(
        f"next turn after a restart: Responses {r_ttft * 1e3:.0f} ms ({r_cached} cached), "
        f"chat completions {c_ttft * 1e3:.0f} ms ({c_cached} cached)"
    )
    return r_ttft, c_ttft


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--history", type=int, default=4096)
    parser.add_argument(
        "--repeats", type=int, default=4, help="even: each way goes first as often as second"
    )
    args = parser.parse_args()
    tokenizer = load_bench().tokenizer
    history = conversation(
        100 + args.history, args.history, lambda m: len(tokenizer.render_chat(m))
    )
    messages = [{"role": m.role, "content": m.content} for m in history]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(args.repeats):
            runs.append(one_run(Path(tmp) / f"d{repeat}", messages, repeat % 2 == 0))
    responses, chat = median([r for r, _ in runs]), median([c for _, c in runs])
    print(
        f"median over {len(runs)}: Responses {responses * 1e3:.0f} ms, chat completions "
        f"{chat * 1e3:.0f} ms, ratio {responses / chat:.2f}x; median of each run's ratio "
        f"{median([r / c for r, c in runs]):.2f}x"
    )


if __name__ == "__main__":
    main()
