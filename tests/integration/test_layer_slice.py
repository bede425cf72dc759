from __future__ import annotations

import functools
import random
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import pytest
from mlx import nn
from mlx.utils import tree_flatten

from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.cpu import accelerator_for
from semantic.adapters.mlx.cpu.attention import install
from semantic.adapters.mlx.cpu.layer_slice import StepTimes
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.adapters.mlx.models.model_parts import BodyAndHead
from semantic.domain.generation import SamplingParams
from semantic.ports.model_backend import PromptChunk, SampledToken, SliceProgress, StepOutput
from tests.helpers import mlx_lm_greedy, tiny_family


@pytest.mark.parametrize(
    ("times", "layout", "predicted"),
    [
        # heads in runs and a split MLP, then a short chunk's layer: one step of each
        (StepTimes((6.0, 3.0, 3.0), (6.0, 3.0)), (1, 1), [12.0, 9.0]),
        # and back: each kind's total spread over its steps
        (StepTimes((12.0,), (9.0,)), (3, 2), [4.0, 4.0, 4.0, 4.5, 4.5]),
        (StepTimes((5.0, 2.0, 2.0), (6.0, 3.0)), (3, 2), [5.0, 2.0, 2.0, 6.0, 3.0]),
        (StepTimes(), (3, 2), [0.0] * 5),
    ],
)
def test_a_chunks_step_times_carry_over_by_kind(
    times: StepTimes, layout: tuple[int, int], predicted: list[float]
) -> None:
    """A short chunk attends in one step where others took three: the MLP must still be
    predicted from the MLP, or the first layer of the next chunk runs past its round."""
    assert times.predict(*layout) == predicted


def _collect(output: StepOutput, got: dict[str, list[int]]) -> None:
    for token in output.tokens:
        got[token.seq_id].append(token.token)


def _open(backend: MlxBackend, seq_id: str, n_new: int) -> None:
    backend.open_sequence(
        seq_id, restored=None, n_restored=0, n_new=n_new, sampling=SamplingParams()
    )


def _step_beside(backend: MlxBackend, work: Callable[[], SliceProgress]) -> tuple[Any, Any]:
    """A round as the engine runs it: the streams' decode step begun beside the slice's
    steps where the backend can (ADR 0015), else before them."""
    if backend.begin_decode_step():
        progress = work()
        return progress, backend.end_decode_step()
    output = backend.decode_step() if backend.decoding_count else StepOutput([])
    return work(), output


@pytest.mark.parametrize("family", ["llama", "llama3", "mistral", "qwen2", "qwen3"])
def test_a_sliced_prompt_beside_streams_and_a_ride_give_mlx_lms_greedy_tokens(
    family: str,
) -> None:
    """Issue 36: the fast paths on each llama-bodied family. A stream decodes (host pass
    where it runs) while a 300-token prompt is prefilled in 128-token chunks one layer step
    at a time (its attention split by KV heads, its MLP in three products), and then a
    short prompt rides a decode step (the fused pass): every sequence's greedy tokens are
    those of mlx-lm's own model on the same weights."""
    shape: dict[str, Any] = {"num_attention_heads": 4, "num_key_value_heads": 2}
    if family == "qwen2":  # its head size is hidden / heads: 64
        shape["hidden_size"] = 256
    reference = tiny_family(family, seed=5, **shape)
    model = tiny_family(family, seed=5, **shape)
    assert install(model)
    backend = MlxBackend(
        model, spec_from_model(model), family, frozenset(), accelerator=accelerator_for(model)
    )
    assert backend.capabilities.can_slice
    rng = random.Random(family)
    prompts = {name: [rng.randrange(512) for _ in range(n)] for name, n in NEW_TOKENS.items()}
    got: dict[str, list[int]] = {name: [] for name in prompts}
    _open(backend, "stream", 40)
    got["stream"].append(backend.prefill_and_sample("stream", prompts["stream"]).token)
    backend.start_decoding("stream", got["stream"][0], 60)
    _open(backend, "long", 300)
    _, first = _slice_long_beside_stream(backend, prompts["long"], got)
    got["long"].append(first.token)
    backend.start_decoding("long", got["long"][0], 8)
    _open(backend, "ride", 30)
    backend.prefill("ride", prompts["ride"][:10])
    output = backend.decode_step(PromptChunk("ride", tuple(prompts["ride"][10:]), last=True))
    _collect(output, got)
    assert output.first_token is not None
    got["ride"].append(output.first_token.token)
    backend.start_decoding("ride", got["ride"][0], 6)
    while backend.decoding_count:
        _collect(backend.decode_step(), got)
    for name, prompt in prompts.items():
        assert got[name] == mlx_lm_greedy(reference, prompt, len(got[name])), name


def _slice_long_beside_stream(
    backend: MlxBackend, prompt: list[int], got: dict[str, list[int]]
) -> tuple[int, SampledToken]:
    """``prompt`` in chunks of 128, each sliced with no time to spare (one step a call)
    beside the decoding stream; the slice calls made and the prompt's first token."""
    chunks = [prompt[at : at + 128] for at in range(0, len(prompt), 128)]
    calls = 0
    for index, chunk in enumerate(chunks):
        last, progress = index == len(chunks) - 1, SliceProgress(False)
        while not progress.done:
            work = functools.partial(backend.prefill_slice, "long", chunk, 0.0, last=last)
            progress, output = _step_beside(backend, work)
            _collect(output, got)
            calls += 1
    assert progress.first_token is not None
    return calls, progress.first_token


NEW_TOKENS = {"stream": 40, "long": 300, "ride": 30}


@pytest.mark.parametrize(
    ("family", "shape", "packed"),
    [
        ("gemma3_text", {"sliding_window": 48, "sliding_window_pattern": 2}, False),
        ("gemma3_text", {"sliding_window": 100, "sliding_window_pattern": 3}, False),
        ("gemma3_text", {"sliding_window": 48, "sliding_window_pattern": 2}, True),
        ("phi3", {}, False),
        ("phi3", {}, True),
    ],
)
def test_a_gemma3_or_phi3_prompt_sliced_layer_by_layer_gives_mlx_lms_greedy_tokens(
    family: str, shape: dict[str, Any], packed: bool
) -> None:
    """Issue 36: slicing for every family of the matrix. Gemma 3 (scaled embeddings,
    sliding-window layers with their own mask over rotating caches, four norms a layer)
    and Phi-3 (fused q/k/v and gate/up) are sliced one whole layer at a time through
    mlx-lm's own layer modules: a 300-token prompt in 128-token chunks, well past the
    window, beside a decoding stream, gives mlx-lm's own greedy tokens, as the stream does;
    also with 4-bit weights and bfloat16 KV."""
    reference = tiny_family(family, seed=3, **shape)
    model = tiny_family(family, seed=3, **shape)
    if packed:  # 4-bit weights, bfloat16 activations and KV: as the matrix's q4 rows
        for each in (reference, model):
            each.set_dtype(mx.bfloat16)  # cast, then quantized, as mlx_lm.convert does
            nn.quantize(each, group_size=64, bits=4)  # type: ignore[attr-defined]  # mlx.nn's stubs omit it
    backend = MlxBackend(
        model, spec_from_model(model), family, frozenset(), accelerator=accelerator_for(model)
    )
    assert backend.capabilities.can_slice
    assert backend.capabilities.spec.kv_dtype == ("bfloat16" if packed else "float32")
    rng = random.Random(family)
    prompts = {"stream": [rng.randrange(512) for _ in range(40)]}
    prompts["long"] = [rng.randrange(512) for _ in range(300)]
    got: dict[str, list[int]] = {name: [] for name in prompts}
    _open(backend, "stream", 40)
    got["stream"].append(backend.prefill_and_sample("stream", prompts["stream"]).token)
    backend.start_decoding("stream", got["stream"][0], 40)
    _open(backend, "long", 300)
    calls, first = _slice_long_beside_stream(backend, prompts["long"], got)
    chunks = -(-len(prompts["long"]) // 128)
    assert calls == chunks * len(model.model.layers)  # one layer a call: it paused
    got["long"].append(first.token)
    backend.start_decoding("long", got["long"][0], 10)
    while backend.decoding_count:
        _collect(backend.decode_step(), got)
    for name, prompt in prompts.items():
        assert got[name] == mlx_lm_greedy(reference, prompt, len(got[name])), name


@pytest.mark.parametrize(
    ("family", "tied"), [("gemma3_text", True), ("gemma3_text", False), ("phi3", True)]
)
def test_the_body_and_head_of_gemma3_and_phi3_give_the_models_logits(
    family: str, tied: bool
) -> None:
    """Gemma 3 ties its head when the weights have none (its ``sanitize`` drops
    ``lm_head`` and says so on the model, not in its args); Phi-3 says so in its args."""
    model = tiny_family(
        family, seed=4, **({"tie_word_embeddings": True} if family == "phi3" else {})
    )
    if family == "gemma3_text" and tied:
        weights = dict(tree_flatten(model.parameters()))
        del weights["lm_head.weight"]
        model.load_weights(list(model.sanitize(weights).items()))
    split = BodyAndHead.of(model)
    assert split is not None
    assert ("lm_head" in model) != tied
    tokens = mx.array([[5, 9, 200, 3, 77]])
    assert mx.array_equal(split.head(split.body(tokens)), model(tokens))
