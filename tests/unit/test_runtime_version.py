from __future__ import annotations

import pytest

from semantic.adapters.mlx.errors import UnsupportedRuntimeError
from semantic.adapters.mlx.models.runtime import OVERRIDE_ENV, check_mlx_lm_version


@pytest.mark.parametrize("version", ["0.32.2", "0.32.9", "0.32.3rc1"])
def test_tested_mlx_lm_versions_are_accepted(version: str) -> None:
    assert check_mlx_lm_version(version) == version


@pytest.mark.parametrize("version", ["0.31.0", "0.33.0", "1.0"])
def test_an_untested_mlx_lm_version_is_refused_with_the_fix(version: str) -> None:
    with pytest.raises(UnsupportedRuntimeError, match=r"pip install 'mlx-lm>=0\.32\.2,<0\.33\.0'"):
        check_mlx_lm_version(version)


def test_the_refusal_can_be_overridden(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(OVERRIDE_ENV, "1")
    assert check_mlx_lm_version("0.40.0") == "0.40.0"
