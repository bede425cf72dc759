"""What a request may ask of the sampler, refused naming the field when out of range."""

from __future__ import annotations

import math

import pytest

from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import SamplingParams


@pytest.mark.parametrize(
    ("asked", "field"),
    [
        ({"temperature": -0.1}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"presence_penalty": 2.01}, "presence_penalty"),
        ({"frequency_penalty": -2.01}, "frequency_penalty"),
        ({"frequency_penalty": math.nan}, "frequency_penalty"),
        ({"logit_bias": ((5, 100.5),)}, "logit_bias"),
        ({"logit_bias": ((-1, 1.0),)}, "logit_bias"),
        ({"logit_bias": ((5, math.inf),)}, "logit_bias"),
    ],
)
def test_out_of_range_is_refused_naming_the_field(asked: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        SamplingParams(**asked)  # type: ignore[arg-type]  # test passthrough
    assert refused.value.param == field


def test_only_penalties_make_a_reply_draw_every_token() -> None:
    assert SamplingParams(presence_penalty=0.5).penalized
    assert SamplingParams(frequency_penalty=-0.5).penalized
    assert not SamplingParams(logit_bias=((5, -100.0),)).penalized  # the same at any count
    assert not SamplingParams().penalized
