from __future__ import annotations

import pytest

from semantic.adapters.mlx.layer_slice import StepTimes


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
