"""The observer port: what a metrics adapter hears about each request."""

from __future__ import annotations

from typing import Protocol

from semantic.domain.generation import FinishedRequest


class GenerationObserver(Protocol):
    def on_first_token(self, seconds: float) -> None:
        """Time from accepting the request to its first token."""
        ...

    def on_token_gap(self, seconds: float) -> None:
        """Time between two consecutive tokens of one request."""
        ...

    def on_finished(self, finished: FinishedRequest) -> None:
        """A request ended."""
        ...

    def on_abandoned(self) -> None:
        """A request's caller went away before its end (a client that disconnected): the
        request is cancelled, and counted here rather than as finished."""
        ...
