"""Drive an engine (real or on fakes) to completion from a test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

from semantic.application.engine.batch_engine import BlockPoolBatchEngine
from semantic.application.engine.events import CompletionEvent, EngineEvent


def run_until_idle(engine: BlockPoolBatchEngine, limit: int = 10_000) -> list[EngineEvent]:
    events: list[EngineEvent] = []
    for _ in range(limit):
        if not engine.has_work():
            return events
        events += engine.step().events
    raise AssertionError("engine did not go idle")


def completions(events: list[EngineEvent]) -> dict[str, CompletionEvent]:
    return {e.request_id: e for e in events if isinstance(e, CompletionEvent)}


def generate(
    engine: BlockPoolBatchEngine, prompt: list[int], n: int, **kwargs: object
) -> CompletionEvent:
    request_id = engine.submit("test", prompt, max_tokens=n, **kwargs)  # type: ignore[arg-type]  # test passthrough
    return completions(run_until_idle(engine))[request_id]


def kv_of_both(
    ours: CompletionEvent, theirs: CompletionEvent, layers: tuple[int, ...] = (0, 29)
) -> list[tuple[Any, Any]]:
    """The keys and the values of two replies' blocks side by side, block by block, in
    ``layers``: (ours, theirs) pairs of MLX arrays to compare."""
    from semantic.adapters.mlx.kv.kv_payloads import MlxKV

    assert ours.blocks is not None
    assert theirs.blocks is not None
    pairs = []
    for layer in layers:
        for mine, other in zip(ours.blocks.layers[layer], theirs.blocks.layers[layer], strict=True):
            assert isinstance(mine.payload, MlxKV)
            assert isinstance(other.payload, MlxKV)
            pairs += [
                (mine.payload.keys, other.payload.keys),
                (mine.payload.values, other.payload.values),
            ]
    return pairs


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter that sees this one's modules (a fresh process is the
    only place to see what happens before MLX or a library loads)."""
    full_env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **env}
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=300,
        check=False,
    )


def tiny_llama(model_type: str = "llama", seed: int = 0, vocab: int = 512) -> Any:
    """A two-layer random llama-class model (mlx-lm's ``llama.Model``), evaluated."""
    import mlx.core as mx
    from mlx_lm.models import llama

    mx.random.seed(seed)
    args = llama.ModelArgs(
        model_type=model_type,
        hidden_size=128,
        num_hidden_layers=2,
        intermediate_size=256,
        num_attention_heads=2,
        num_key_value_heads=1,
        rms_norm_eps=1e-5,
        vocab_size=vocab,
        head_dim=64,
    )
    model = llama.Model(args)
    mx.eval(model.parameters())
    return model


def tiny_family(family: str, seed: int = 0, vocab: int = 512, **overrides: Any) -> Any:
    """A random model of one of the conformance matrix's families (``FAMILIES``), built by
    mlx-lm's own class for it, with a small vocabulary; projections scaled up and norm
    weights (Qwen3's per-head ones too) and biases spread, so that reading any of them
    wrong changes the outputs. The same arguments give the same weights."""
    import mlx.core as mx
    from mlx.utils import tree_map_with_path
    from mlx_lm.utils import _get_classes

    from tests.conformance.tiny_models import FAMILIES

    config = {**FAMILIES[family], "vocab_size": vocab, **overrides}
    model_class, args_class = _get_classes(config)
    mx.random.seed(seed)
    model = model_class(args_class.from_dict(config))

    def spread(path: str, p: mx.array) -> mx.array:
        if p.ndim == 2:
            return p if "embed" in path else p * 3.0
        return p + 0.2 * mx.random.normal(p.shape)

    model.update(tree_map_with_path(spread, model.parameters()))
    mx.eval(model.parameters())
    return model


def mlx_lm_greedy(model: Any, prompt: list[int], n: int) -> list[int]:
    """mlx-lm's own forward, one whole prompt then one token at a time: the reference."""
    import mlx.core as mx
    from mlx_lm.models.cache import make_prompt_cache

    cache = make_prompt_cache(model)
    logits = model(mx.array([prompt]), cache=cache)[0, -1]
    out: list[int] = []
    for _ in range(n):
        token = mx.argmax(logits).item()
        assert isinstance(token, int)
        out.append(token)
        logits = model(mx.array([out[-1:]]), cache=cache)[0, -1]
    return out


def huge_pages_expected() -> bool:
    """Whether this machine should put the weights on huge pages (ADR 0032): Linux 6.1 or
    later, transparent huge pages not switched off, the switch not set to 0."""
    if not sys.platform.startswith("linux") or os.environ.get("SEMANTIC_HUGE_PAGES") == "0":
        return False
    numbers = re.match(r"(\d+)\.(\d+)", os.uname().release)
    release = (int(numbers[1]), int(numbers[2])) if numbers else (0, 0)
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as mode:
            off = "[never]" in mode.read()
    except OSError:
        return False
    return release >= (6, 1) and not off
