"""Errors of getting a model onto this machine; each names the problem and the fix."""

from __future__ import annotations

from semantic.domain.errors import SemanticError


class ModelSetupError(SemanticError):
    """A model could not be found, fetched, converted or loaded."""


class UnknownModelError(ModelSetupError):
    pass


class ModelDownloadError(ModelSetupError):
    pass


class CorruptModelError(ModelSetupError):
    pass


class UnsupportedRuntimeError(ModelSetupError):
    """The installed mlx-lm is outside the range this release was tested with."""


class UnsupportedModelError(ModelSetupError):
    """The model loads, but semantic cannot keep its KV as blocks (or not in the asked way)."""
