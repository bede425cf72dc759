"""Several observers heard as one: the metrics and the dashboard's turn history."""

from __future__ import annotations

from semantic.domain.generation import FinishedRequest
from semantic.ports.observer import GenerationObserver


class Observers:
    """A ``GenerationObserver`` telling each of its observers in turn."""

    def __init__(self, *observers: GenerationObserver) -> None:
        self._observers = observers

    def on_first_token(self, seconds: float) -> None:
        for observer in self._observers:
            observer.on_first_token(seconds)

    def on_token_gap(self, seconds: float) -> None:
        for observer in self._observers:
            observer.on_token_gap(seconds)

    def on_finished(self, finished: FinishedRequest) -> None:
        for observer in self._observers:
            observer.on_finished(finished)

    def on_abandoned(self) -> None:
        for observer in self._observers:
            observer.on_abandoned()
