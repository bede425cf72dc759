"""Drive the real services in-process: start, converse as agents and plain clients, stop."""

from __future__ import annotations

import asyncio
import io
import os
import random
import threading
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import mlx.core as mx
import numpy as np

from semantic.adapters.cli.progress import ProgressPrinter
from semantic.adapters.mlx.cpu.llama_native import native_library
from semantic.adapters.mlx.devices import DEVICE_CHOICES
from semantic.adapters.mlx.kv.kv_payloads import kv_arrays
from semantic.application.agents.values import CommittedReply, Turn
from semantic.application.chat.generation import GenerationInput, GenerationResult
from semantic.bootstrap import Services, start_services, stop_services
from semantic.config import Settings
from semantic.domain.blocks import AgentBlocks
from semantic.domain.chat import ChatMessage
from semantic.domain.generation import FinishedRequest
from tests.conformance.tiny_models import Variant

T = TypeVar("T")

NAMESPACE = "matrix"
REPLY_TOKENS = 8

_WORDS = (
    "river",
    "stone",
    "lantern",
    "orbit",
    "copper",
    "meadow",
    "signal",
    "harbor",
    "velvet",
    "thunder",
    "quiet",
    "maple",
    "engine",
    "paper",
    "violet",
    "summit",
    "candle",
    "desert",
    "pillow",
    "rocket",
    "garden",
    "silver",
    "anchor",
    "winter",
    "bridge",
    "falcon",
    "marble",
    "cotton",
    "planet",
    "harvest",
    "mirror",
    "ladder",
    "copper",
    "basket",
    "cloud",
    "island",
)


def words(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(_WORDS) for _ in range(n))


DEVICE_ENV = "SEMANTIC_TEST_DEVICE"


def device_choice() -> str:
    """The MLX device the tests run on: cpu unless ``SEMANTIC_TEST_DEVICE`` says otherwise."""
    name = os.environ.get(DEVICE_ENV, "cpu")
    if name not in DEVICE_CHOICES:
        raise ValueError(f"{DEVICE_ENV} must be one of {', '.join(DEVICE_CHOICES)}, not {name!r}")
    return name


def served_kv_dtype(variant: Variant) -> str:
    """A row's KV dtype as served: on the CPU with our products, a bfloat16 model runs in
    float32 over its bfloat16 weights, its KV too (ADR 0031)."""
    on_our_products = device_choice() == "cpu" and native_library() is not None
    return "float32" if on_our_products else variant.dtype


def settings_for(model: Path, data_dir: Path, kv_at_rest: str = "lossless") -> Settings:
    return Settings(
        data_dir=data_dir,
        model=str(model),
        device=device_choice(),
        kv_budget_bytes=64 << 20,
        prefault_bytes=1 << 20,
        kv_at_rest=kv_at_rest,
        grace_s=10.0,
    )


@dataclass
class Order:
    """The order in which requests' first tokens and ends were seen (an observer): four
    first tokens before any end show four sequences decoding in one batch."""

    seen: list[str] = field(default_factory=list)

    def on_first_token(self, seconds: float) -> None:
        self.seen.append("first")

    def on_token_gap(self, seconds: float) -> None:
        pass

    def on_finished(self, finished: FinishedRequest) -> None:
        self.seen.append("end")

    def on_abandoned(self) -> None:
        self.seen.append("abandoned")


@asynccontextmanager
async def serving(settings: Settings, observer: Order | None = None) -> AsyncIterator[Services]:
    """One life of the server: everything stopped (saves flushed) when it ends."""
    services = await start_services(settings, ProgressPrinter(io.StringIO()), observer)
    try:
        yield services
    finally:
        await stop_services(services, settings.grace_s)


async def turn(services: Services, agent: str, content: str) -> CommittedReply:
    """One agent turn through the agents API (the server keeps the transcript)."""
    result = None
    async for event in services.agents.send(
        NAMESPACE, agent, Turn(content, max_tokens=REPLY_TOKENS)
    ):
        if isinstance(event, CommittedReply):
            result = event
    assert result is not None, "the turn ended without a reply"
    return result


async def plain(
    services: Services, prompt: tuple[int, ...], namespace: str = NAMESPACE
) -> GenerationResult:
    """A plain (OpenAI-style) request for ``prompt``; another namespace shares no KV."""
    request = GenerationInput(prompt, namespace, max_tokens=REPLY_TOKENS)
    return await services.generation.complete(request)


async def next_prompt(services: Services, agent: str, content: str) -> tuple[int, ...]:
    """The prompt the agent's next turn with ``content`` will be (its transcript, rendered)."""
    history = await services.agents.messages(NAMESPACE, agent)
    chat = [ChatMessage(m.role, m.content) for m in history] + [ChatMessage("user", content)]
    return tuple(services.tokenizer.render_chat(chat, scope=NAMESPACE))


HostKV = dict[tuple[int, int], tuple[np.ndarray, np.ndarray]]
"""Keys and values per (layer, block index), as float32 host copies."""


async def stored_kv(services: Services, namespace: str, prompt: tuple[int, ...]) -> HostKV:
    """The KV stored for ``prompt``'s longest prefix (read from disk if it is not in
    memory)."""
    prefix = await services.cache.prepare(namespace, prompt)
    try:
        assert prefix.blocks is not None, "nothing stored for the prompt"
        return _host_copies(prefix.blocks)
    finally:
        services.cache.release(prefix)


def _host_copies(blocks: AgentBlocks) -> HostKV:
    out: HostKV = {}
    for layer_blocks in blocks.layers:
        for block in layer_blocks:
            keys, values = kv_arrays(block.payload)
            out[block.layer, block.index] = (
                np.array(keys.astype(mx.float32)),
                np.array(values.astype(mx.float32)),
            )
    return out


async def together(services: Services, requests: list[Coroutine[Any, Any, T]]) -> list[T]:
    """Run ``requests`` so they are all queued before the engine's next round: the engine
    thread waits (between two steps) until each has been submitted, so they are admitted
    and decoded together whatever the machine's load."""
    gate = threading.Event()
    services.loop.call(gate.wait)
    try:
        tasks = [asyncio.ensure_future(request) for request in requests]
        async with asyncio.timeout(120):
            while services.loop.active_requests < len(tasks):
                await asyncio.sleep(0.005)  # a condition polled for, not a timing
    finally:
        gate.set()
    return list(await asyncio.gather(*tasks))


def chat_prompt(services: Services, content: str) -> tuple[int, ...]:
    """A new one-message conversation, rendered as the server renders it."""
    return tuple(services.tokenizer.render_chat([ChatMessage("user", content)], scope=NAMESPACE))
