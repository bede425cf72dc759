"""The backend without an accelerator (``accelerator=None``) is plain mlx-lm: the CPU
accelerator is a collaborator it is handed, not something it reaches for."""

from __future__ import annotations

import random

from semantic.adapters.mlx.backend import MlxBackend
from semantic.adapters.mlx.kv.kv_blocks import spec_from_model
from semantic.domain.generation import SamplingParams
from tests.helpers import mlx_lm_greedy, tiny_family


def test_without_an_accelerator_nothing_slices_or_rides_and_tokens_are_mlx_lms() -> None:
    reference = tiny_family("llama", seed=7)
    model = tiny_family("llama", seed=7)
    backend = MlxBackend(model, spec_from_model(model), "plain", frozenset(), accelerator=None)
    assert not backend.capabilities.can_slice
    assert backend.capabilities.ride_rows == 0
    rng = random.Random(7)
    prompt = [rng.randrange(512) for _ in range(40)]
    backend.open_sequence(
        "plain", restored=None, n_restored=0, n_new=len(prompt), sampling=SamplingParams()
    )
    progress = backend.prefill_slice("plain", prompt, 0.0, last=True)
    assert progress.done  # the whole chunk at once
    assert progress.first_token is not None
    got = [progress.first_token.token]
    backend.start_decoding("plain", got[0], 8)
    assert backend.capabilities.ride_capacity(backend.decoding_count) == 0
    while backend.decoding_count:
        got += [token.token for token in backend.decode_step().tokens]
    assert got == mlx_lm_greedy(reference, prompt, len(got))
