"""Incremental detokenization that never shows half a character.

Decoding each new token alone is wrong for byte-level BPE (a character may span tokens) and
for SentencePiece (a leading space depends on the previous token). So we re-decode a short
window that starts one token back and take only what it adds; while the window ends in an
incomplete UTF-8 sequence (U+FFFD), nothing is added.
"""

from __future__ import annotations

from semantic.ports.tokenizer import Tokenizer

_INCOMPLETE = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self._tokens: list[int] = []
        self._prefix_offset = 0
        self._read_offset = 0
        self.text = ""
        self.complete_lengths: list[int | None] = []
        """For each token: the text length once it was added, or None while that token
        ended inside a character. Used to cut tokens where a stop string cuts the text."""

    @property
    def tokens(self) -> list[int]:
        return self._tokens

    def add(self, token: int) -> str:
        """Append one token; return the text it made visible (maybe empty)."""
        self._tokens.append(token)
        window = self._tokens[self._prefix_offset :]
        new_text = self._tokenizer.decode(window)
        if new_text.endswith(_INCOMPLETE):
            self.complete_lengths.append(None)
            return ""
        known = self._tokenizer.decode(self._tokens[self._prefix_offset : self._read_offset])
        delta = new_text[len(known) :]
        self.text += delta
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._tokens)
        self.complete_lengths.append(len(self.text))
        return delta

    def flush(self) -> str:
        """At the end of generation: show whatever is left, except a character whose bytes
        the last tokens began and never finished (a limit cut it): no client wants a
        replacement character standing in for it."""
        if self._read_offset == len(self._tokens):
            return ""
        known = self._tokenizer.decode(self._tokens[self._prefix_offset : self._read_offset])
        whole = self._tokenizer.decode(self._tokens[self._prefix_offset :])
        delta = whole.rstrip(_INCOMPLETE)[len(known) :]
        self.text += delta
        self._prefix_offset = self._read_offset = len(self._tokens)
        if not whole.endswith(_INCOMPLETE):  # else the last tokens stay incomplete: their KV
            self.complete_lengths[-1] = len(self.text)  # is not kept for text never shown
        return delta

    def tokens_within(self, n_chars: int) -> int:
        """How many leading tokens decode to text that fits in the first ``n_chars``."""
        kept = 0
        for index, length in enumerate(self.complete_lengths):
            if length is None:
                continue
            if length > n_chars:
                break
            kept = index + 1
        return kept
