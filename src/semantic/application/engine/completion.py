"""Completion detection: what a stream may show, and when (and why) a request ends.

Checked every token in this order: the model's end-of-turn tokens, stop strings, max tokens,
the maximum response length in characters, then low confidence (cancellation is checked by
the engine before a token is even produced). The spec put max tokens first; but a reply whose
last allowed token ends the turn, or completes a stop string, is whole, and clients read
"length" as cut short (and may retry or warn), so it ends as the model ended it.

Whatever ends a request, the text is cut at the earliest stop-string occurrence, and the
kept token ids end with the last token that lies wholly before the cut, so the KV kept for
the agent ends where the text ends.

A stream shows text as soon as it is safe: held back only while its tail could still grow
into a stop string, or while a stop string that starts earlier than one already found might
still complete.

Stop strings are looked for only before the first of ``stops_before`` (where a tool call
begins): a stop string must end before it, and one found where that text may be starting
ends the request only once it is not (a stop string ``"<tool"`` is the start of
``"<tool_call>"`` until the next characters say otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass

from semantic.application.engine.detokenizer import IncrementalDetokenizer
from semantic.domain.generation import CompletionCriteria, FinishReason
from semantic.ports.tokenizer import Tokenizer


@dataclass(frozen=True, slots=True)
class Progress:
    text: str
    """Text that became safe to show with this token (may be empty)."""
    finish: FinishReason | None


class CompletionDetector:
    def __init__(
        self, tokenizer: Tokenizer, criteria: CompletionCriteria, end_tokens: frozenset[int]
    ) -> None:
        self._criteria = criteria
        self._stops = criteria.stop_strings
        self._longest = criteria.longest_stop
        self._markers = criteria.stops_before
        self._region: int | None = None
        """Where the first of ``stops_before`` starts, once written: stops end before it."""
        self._end_tokens = end_tokens
        self._detok = IncrementalDetokenizer(tokenizer)
        self._tokens: list[int] = []
        self._shown = 0
        self._stop_at: int | None = None
        self.stop_string: str | None = None
        """The stop string the text was cut at, if any (Anthropic reports it)."""
        self._scanned = 0
        self._low_streak = 0
        self._cut: int | None = None
        self.reason: FinishReason | None = None

    @property
    def finished(self) -> bool:
        return self.reason is not None

    @property
    def generated_count(self) -> int:
        return len(self._tokens)

    @property
    def text(self) -> str:
        """The visible text: final once the request has finished."""
        end = self._cut if self._cut is not None else self._shown
        return self._detok.text[:end]

    @property
    def kept_tokens(self) -> list[int]:
        """Generated token ids whose KV is kept: all of them unless the text was cut."""
        if self._cut is None or self._cut >= len(self._detok.text):
            return list(self._tokens)
        return self._tokens[: self._detok.tokens_within(self._cut)]

    def add(self, token: int, top_prob: float | None = None) -> Progress:
        """Take one generated token; say what to show and whether the request ended."""
        if self.finished:
            raise RuntimeError("CompletionDetector.add after the request finished")
        self._tokens.append(token)
        is_end = token in self._end_tokens
        if not is_end:
            self._detok.add(token)
            self._scan_for_stops()
        if is_end:  # even as the last token allowed: the reply is whole
            return self._finish(FinishReason.END_OF_TURN)
        if (
            self._stop_at is not None
            and self._pending_stop_start() is None
            and not self._may_begin_a_marker()
        ):
            return self._finish(FinishReason.STOP_STRING)
        if len(self._tokens) >= self._criteria.max_tokens:
            # A stop string found while an earlier one might still have completed: with no
            # more tokens coming, the found one is where the reply ends.
            found = self._stop_at is not None
            return self._finish(FinishReason.STOP_STRING if found else FinishReason.MAX_TOKENS)
        max_chars = self._criteria.max_chars
        if max_chars is not None and len(self._detok.text) >= max_chars:
            return self._finish(FinishReason.MAX_CHARS, limit=max_chars)
        if self._is_unconfident(top_prob):
            return self._finish(FinishReason.LOW_CONFIDENCE)
        return Progress(self._release(self._safe_end()), None)

    def end(self, reason: FinishReason) -> Progress:
        """End from outside (cancellation, pool exhaustion, an error): show what is final."""
        if self.finished:
            return Progress("", self.reason)
        return self._finish(reason)

    def _finish(self, reason: FinishReason, limit: int | None = None) -> Progress:
        self.reason = reason
        self._detok.flush()
        self._scan_for_stops()
        cut = len(self._detok.text)
        if self._stop_at is not None:
            cut = min(cut, self._stop_at)
        if limit is not None:
            cut = min(cut, limit)
        if cut != self._stop_at:
            self.stop_string = None
        elif reason in (FinishReason.MAX_TOKENS, FinishReason.END_OF_TURN):
            self.reason = FinishReason.STOP_STRING  # found only in the tail flushed just now
        self._cut = cut
        return Progress(self._release(cut), self.reason)

    def _release(self, end: int) -> str:
        end = max(end, self._shown)
        delta = self._detok.text[self._shown : end]
        self._shown = end
        return delta

    def _scan_for_stops(self) -> None:
        """Record the earliest start of any stop string in text not scanned before."""
        if not self._stops:
            return
        text = self._detok.text
        start = max(0, self._scanned - self._longest + 1)
        if self._region is None and self._markers and self._find_region(text):
            start = 0  # a stop found so far may reach into it: look again, before it only
        within = text if self._region is None else text[: self._region]
        for stop in self._stops:
            found = within.find(stop, start)
            if found != -1 and (self._stop_at is None or found < self._stop_at):
                self._stop_at = found
                self.stop_string = stop
        self._scanned = len(text)

    def _find_region(self, text: str) -> bool:
        """Whether the first of ``stops_before`` is written now (stops found are then
        forgotten, to be found again before it)."""
        start = max(0, self._scanned - self._criteria.longest_marker + 1)
        found = [at for at in (text.find(m, start) for m in self._markers) if at != -1]
        if not found:
            return False
        self._region = min(found)
        self._stop_at, self.stop_string = None, None
        return True

    def _may_begin_a_marker(self) -> bool:
        """Whether the stop string found reaches into text that may still grow into the
        first of ``stops_before`` (it would not end the text, then)."""
        if self._region is not None or not self._markers or self._stop_at is None:
            return False
        text, reach = self._detok.text, self._stop_at + len(self.stop_string or "")
        first = max(0, len(text) - self._criteria.longest_marker + 1)
        return any(
            any(len(m) > len(text) - at and m.startswith(text[at:]) for m in self._markers)
            for at in range(first, min(reach, len(text)))
        )

    def _pending_stop_start(self) -> int | None:
        """Earliest position whose tail is a proper prefix of some stop string."""
        if self._region is not None:
            return None  # every stop lies before it, and is found
        text = self._detok.text
        limit = self._stop_at if self._stop_at is not None else len(text)
        for start in range(max(0, len(text) - self._longest + 1), min(limit, len(text))):
            tail = text[start:]
            if any(len(stop) > len(tail) and stop.startswith(tail) for stop in self._stops):
                return start
        return None

    def _safe_end(self) -> int:
        end = len(self._detok.text)
        if self._stop_at is not None:
            end = self._stop_at
        pending = self._pending_stop_start()
        return end if pending is None else min(end, pending)

    def _is_unconfident(self, top_prob: float | None) -> bool:
        threshold = self._criteria.min_top_prob
        if threshold is None or top_prob is None:
            return False
        self._low_streak = self._low_streak + 1 if top_prob < threshold else 0
        return self._low_streak >= self._criteria.low_confidence_patience
