from __future__ import annotations

import pytest

from semantic.adapters.mlx.layer_slice import _predictions


@pytest.mark.parametrize(
    ("timings", "steps", "predicted"),
    [
        ([6.0, 3.0, 3.0, 9.0], 2, [12.0, 9.0]),  # heads in runs, then a short chunk's layer
        ([12.0, 9.0], 4, [4.0, 4.0, 4.0, 9.0]),  # and back: attention shared, the MLP kept
        ([5.0, 2.0, 2.0, 9.0], 4, [5.0, 2.0, 2.0, 9.0]),
        ([], 4, [0.0, 0.0, 0.0, 0.0]),
    ],
)
def test_a_chunks_step_times_carry_over_by_kind(
    timings: list[float], steps: int, predicted: list[float]
) -> None:
    """A short chunk attends in one step where others took three: the MLP must still be
    predicted from the MLP, or the first layer of the next chunk runs past its round."""
    assert _predictions(timings, steps) == predicted
