"""How the agent trace (``benchmarks.agent_trace``) talks to a server: semantic's agents API,
where the server keeps each agent's history, or plain chat completions, where the client
sends the whole history every turn (``mlx_lm.server``, for reference).

A door makes agents and runs one streamed turn of one; it records the time to the first
token (text or a tool call's first fragment), the step to the last, and the prompt tokens
the server says it computed.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

import httpx

from benchmarks.common import content_of


@dataclass(frozen=True)
class TurnSeen:
    agent_id: str
    ttft_s: float
    step_s: float
    """First token to last."""
    prompt_tokens: int
    computed: int
    """Prompt tokens the turn computed (not restored from any tier); 0 where not told."""
    sent_at: float = 0.0
    """When the turn was sent (``time.perf_counter``): where it sat in the trace."""


@dataclass
class Seen:
    turns: list[TurnSeen] = field(default_factory=list)
    failures: int = 0


Message = dict[str, Any]
"""A turn's new message: ``{"content": ...}`` (the user's) or a tool's result
(``{"role": "tool", "tool_call_id": ..., "content": ...}``)."""


class Door(Protocol):
    async def make(self, agent_id: str, retention: str | None) -> None: ...

    async def turn(
        self, agent_id: str, message: Message, choice: str = "required", priority: str | None = None
    ) -> str | None:
        """One streamed turn (``priority``: its ``X-Priority``); the id of the tool call it
        made (None: it made none)."""
        ...


@dataclass
class _Streamed:
    """What one streamed reply showed, as it arrived."""

    started: float = field(default_factory=time.perf_counter)
    first: float | None = None
    last: float | None = None

    def token(self) -> None:
        now = time.perf_counter()
        self.first = self.first or now
        self.last = now

    def record(self, seen: Seen, agent_id: str, usage: dict[str, Any]) -> None:
        if self.first is None or self.last is None:
            return
        prompt = usage.get("prompt_tokens", 0)
        cached = usage.get("cached_tokens")  # the agents API's; OpenAI's is nested
        if cached is None:
            cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        computed = 0 if cached is None else prompt - cached
        ttft, step = self.first - self.started, self.last - self.first
        seen.turns.append(TurnSeen(agent_id, ttft, step, prompt, computed, self.started))


async def _events(reply: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    async for line in reply.aiter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            yield json.loads(line[6:])


class AgentsDoor:
    """semantic's agents API: the server keeps the history; a turn sends its new message."""

    def __init__(
        self, client: httpx.AsyncClient, system: str, tools: list[dict[str, Any]], seen: Seen
    ) -> None:
        self._client, self._system, self._tools, self._seen = client, system, tools, seen

    async def make(self, agent_id: str, retention: str | None) -> None:
        headers = {"X-Retention": retention} if retention else {}
        body = {"id": agent_id, "system_prompt": self._system}
        (await self._client.post("/v1/agents", json=body, headers=headers)).raise_for_status()

    async def turn(
        self, agent_id: str, message: Message, choice: str = "required", priority: str | None = None
    ) -> str | None:
        body = {**message, **_turn_settings(self._tools, choice)}
        streamed, final = _Streamed(), {}
        url = f"/v1/agents/{agent_id}/messages"
        headers = {"X-Priority": priority} if priority else {}
        async with self._client.stream("POST", url, json=body, headers=headers) as reply:
            if reply.status_code != 200:
                await _failed(self._seen, agent_id, reply)
                return None
            async for event in _events(reply):
                if event["type"] in ("delta", "tool_call_delta"):
                    streamed.token()
                elif event["type"] == "message":
                    final = event
        streamed.record(self._seen, agent_id, final.get("usage") or {})
        calls = final.get("tool_calls") or []
        whole = calls and final.get("finish_reason") == "tool_calls"
        return str(calls[0]["id"]) if whole else None


class ChatDoor:
    """Chat completions: the client keeps each agent's history and sends all of it."""

    def __init__(
        self,
        client: httpx.AsyncClient,
        system: str,
        tools: list[dict[str, Any]],
        seen: Seen,
        model: str,
    ) -> None:
        self._client, self._system, self._tools, self._seen = client, system, tools, seen
        self._model = model
        self._histories: dict[str, list[Message]] = {}

    async def make(self, agent_id: str, retention: str | None) -> None:  # noqa: ARG002
        self._histories[agent_id] = [{"role": "system", "content": self._system}]

    async def turn(
        self,
        agent_id: str,
        message: Message,
        choice: str = "required",
        priority: str | None = None,  # noqa: ARG002 - a server of its own: no such header
    ) -> str | None:
        history = self._histories[agent_id]
        history.append({"role": "user", **message} if "role" not in message else message)
        body = {
            "model": self._model,
            "messages": history,
            "stream_options": {"include_usage": True},
            **_turn_settings(self._tools, choice),
        }
        streamed, text = _Streamed(), []
        usage: dict[str, Any] = {}
        async with self._client.stream("POST", "/v1/chat/completions", json=body) as reply:
            if reply.status_code != 200:
                await _failed(self._seen, agent_id, reply)
                history.pop()
                return None
            async for chunk in _events(reply):
                usage = chunk.get("usage") or usage
                if said := content_of(chunk):
                    streamed.token()
                    text.append(said)
        streamed.record(self._seen, agent_id, usage)
        history.append({"role": "assistant", "content": "".join(text)})
        return None  # its history holds no call: the next turn's result goes as the user's


async def _failed(seen: Seen, agent_id: str, reply: httpx.Response) -> None:
    """Counted, and the first said, so a run that fails shows why."""
    if not seen.failures:
        said = (await reply.aread()).decode(errors="replace")[:300]
        print(f"  {agent_id}'s turn failed: {reply.status_code} {said}", flush=True)
    seen.failures += 1


def _turn_settings(tools: list[dict[str, Any]], choice: str) -> dict[str, Any]:
    return {
        "tools": tools,
        "tool_choice": choice,
        "parallel_tool_calls": False,
        "max_tokens": 48,
        "temperature": 0,
        "stream": True,
    }
