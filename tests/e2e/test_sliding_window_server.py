"""A Gemma 3 shaped model (sliding-window layers) served end to end, across restarts.

Issue 36: a tiny random Gemma 3 answered a three-turn chat, and after a restart the next
turn failed with a 500 ("layer 0 is missing positions ..."), as did the same prompt under
another agent id. The model is built here with mlx-lm's own classes, random weights, and
the embedded model's tokenizer; it loads in a moment.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import openai
import pytest
from mlx.utils import tree_flatten
from mlx_lm.models import gemma3_text
from reliability.server import ServerProcess

from semantic.adapters.cli.progress import ProgressPrinter
from semantic.bootstrap import prepare_model
from semantic.config import Settings
from tests.e2e.sdk_types import openai_messages

pytestmark = pytest.mark.model

Start = Callable[..., ServerProcess]
WINDOW = 64
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


@pytest.fixture(scope="module")
def tiny_gemma_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An ordinary mlx-lm model directory: config, random weights, the embedded tokenizer."""
    settings = Settings(data_dir=tmp_path_factory.mktemp("embedded"))
    embedded, _ = prepare_model(settings, ProgressPrinter())
    config: dict[str, Any] = {
        "model_type": "gemma3_text",
        "hidden_size": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 128,
        "num_attention_heads": 2,
        "head_dim": 32,
        "num_key_value_heads": 1,
        "vocab_size": 49152,
        "sliding_window": WINDOW,
        "sliding_window_pattern": 2,
        "query_pre_attn_scalar": 32,
        "eos_token_id": 2,
    }
    mx.random.seed(36)
    args = gemma3_text.ModelArgs.from_dict(config)  # type: ignore[no-untyped-call]  # mlx-lm: unannotated
    model = gemma3_text.Model(args)
    out = tmp_path_factory.mktemp("tiny-gemma")
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (out / "config.json").write_text(json.dumps(config))
    for name in TOKENIZER_FILES:
        shutil.copy(embedded / name, out / name)
    return out


def chat(server: ServerProcess, messages: list[dict[str, str]], **headers: str) -> Any:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", default_headers=headers)
    return client.chat.completions.create(
        model="default", messages=openai_messages(messages), temperature=0, max_tokens=12
    )


def question(turn: int) -> dict[str, str]:
    facts = " ".join(f"Fact {turn}.{i}: the river runs north of hill {i}." for i in range(12))
    return {"role": "user", "content": f"{facts} What is fact {turn}.3?"}


def test_a_gemma_chat_continues_after_a_restart_and_a_fork_like_a_cold_run(
    new_server: Start, tiny_gemma_dir: Path
) -> None:
    """Its replies are random text, tokenized otherwise when sent back: each next turn
    leaves the stored one inside its reply, where only the sliding layers' history holds
    the window it needs."""
    model = ("--model", str(tiny_gemma_dir), "--kv-budget-mb", "64")
    server = new_server(*model)
    agent = {"X-Agent-Id": "gemma"}
    history: list[dict[str, str]] = []
    for turn in range(3):
        history.append(question(turn))
        reply = chat(server, history, **agent)
        history.append({"role": "assistant", "content": reply.choices[0].message.content})
    last_prompt = reply.usage.prompt_tokens
    assert last_prompt > 500
    server.stop()
    server = new_server(*model, data_dir=server.data_dir)
    fork = [*history, question(4)]  # another agent, another question, from the same past
    forked = chat(server, fork, **{"X-Agent-Id": "fork"})
    history.append(question(3))
    warm = chat(server, history, **agent)
    assert server.metric("semantic_prefix_cache_dropped_total") == 0
    for continued, messages in ((forked, fork), (warm, history)):
        assert continued.usage.prompt_tokens_details.cached_tokens >= last_prompt
        cold = chat(server, messages, **{"X-Namespace": "elsewhere"})
        assert cold.usage.prompt_tokens_details.cached_tokens == 0
        assert continued.choices[0].message.content == cold.choices[0].message.content
    # the second cold prompt found the first one's blocks, which kept their sliding windows
    # near their own end only: dropped, and the prompt computed (not a 500)
    assert server.metric("semantic_prefix_cache_dropped_total") == 1
