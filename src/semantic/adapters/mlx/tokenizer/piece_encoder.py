"""Tokenize a conversation's text between its special tokens, remembering each piece.

Every turn renders the whole conversation and tokenizes it again: 4,132 tokens took 5 ms
here, and the cost grows with the conversation, for text the server tokenized the turn
before. A fast tokenizer first cuts its input at its special tokens and encodes each piece
between them on its own; a chat template puts special tokens around every message. So
encoding piece by piece, and remembering the pieces, gives the same ids, and a new turn
only encodes its new messages.

This holds only where the special tokens cut the text exactly as the tokenizer does: all
added tokens special, matched as written (not normalized) and without stripping or
whole-word rules, and where the pre-tokenizer treats every piece alike (a sentencepiece
"first" prefix space does not). ``PieceEncoder.of`` checks both, on a sample, and returns
None for any other tokenizer, which is then used as it is. ADR 0014.

A message's own text is never read as special tokens (``encode_quoted``): a user who writes
``<|im_end|>`` gets those characters, not the end of their turn, or they could forge turns
of any role. Only the chat template's own markers are special.
"""

from __future__ import annotations

import functools
import re
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

# Pieces shorter than this are encoded each time: remembering them saves nothing.
_SHORTEST_KEPT = 64
# A piece bigger than this share of the memory is encoded but not kept: it would push out
# everything else.
_LARGEST_SHARE = 8
QUOTE_MARKS = tuple((chr(0xFDD0 + i), chr(0xFDD1 + i)) for i in range(0, 32, 2))
"""Pairs of marks to put around a message's text in a rendered template, for
``encode_quoted``: Unicode noncharacters, which no client means as text; a pair that none of
the texts holds is taken (``quote_marks``), since a model can write them too."""


def quote_marks(texts: Iterable[str]) -> tuple[str, str] | None:
    """The first pair of ``QUOTE_MARKS`` that occurs in none of ``texts``."""
    seen = set("".join(texts)) & {mark for pair in QUOTE_MARKS for mark in pair}
    return next((pair for pair in QUOTE_MARKS if not seen & set(pair)), None)


class PieceEncoder:
    """Encodes like ``backend.encode(text, add_special_tokens=False).ids`` with truncation
    and padding off (as ``transformers``' ``encode`` does), keeping the ids of recent
    pieces in at most ``max_bytes`` of memory, text and ids counted. Pieces are kept per
    ``scope`` (a namespace): a piece another tenant sent is encoded again, not found, so
    the time of a request tells nothing about what others sent."""

    def __init__(
        self,
        backend: Any,
        special: dict[str, int],
        max_bytes: int,
        as_text: Callable[[], Any] | None = None,
        decodes_exactly: bool = False,
    ) -> None:
        """``as_text``: makes the same tokenizer reading special tokens' text as text (or
        None where it cannot), called the first time a message needs it: rare, and a copy
        of the tokenizer costs ~0.2 s at every start otherwise."""
        self._backend = backend
        self._decodes_exactly = decodes_exactly
        self._make_as_text = as_text
        self._as_text: Any = None
        self._special = special
        # Longest first: at one position the alternation takes the first that matches,
        # which is then the longest, as the tokenizer's own matcher does.
        by_length = sorted(special, key=len, reverse=True)
        self._splitter = re.compile("(" + "|".join(re.escape(t) for t in by_length) + ")")
        # Ids as 4-byte integers: a tuple of Python ints costs ~36 bytes a token.
        self._pieces: OrderedDict[tuple[str, str], array[int]] = OrderedDict()
        self._kept_bytes = 0
        self._max_bytes = max_bytes
        self._lock = threading.Lock()  # requests render from several threads

    @classmethod
    def of(cls, backend: Any, max_bytes: int = 64 << 20) -> PieceEncoder | None:
        """An encoder for ``backend`` (a ``tokenizers.Tokenizer``), or None where cutting at
        the special tokens could differ from the tokenizer's own cuts."""
        if getattr(backend, "encode_special_tokens", False):
            return None  # it reads special tokens' text as text
        try:
            added = backend.get_added_tokens_decoder()
            own = _own_copy(backend)
        except AttributeError:
            return None
        special: dict[str, int] = {}
        for token_id, token in added.items():
            as_written = not (token.normalized or token.lstrip or token.rstrip or token.single_word)
            if not (token.special and as_written and token.content):
                return None
            special[token.content] = int(token_id)
        if not special:
            return None
        as_text = functools.partial(_reading_special_as_text, own, special)
        encoder = cls(own, special, max_bytes, as_text, _decodes_exactly(own))
        tokens = list(special)
        sample = " x 12 ".join(["Hello, world!", *tokens, " end\n", *tokens]) + "".join(
            f"{token}a{token}\na " for token in tokens
        )
        plain = list(own.encode(sample, add_special_tokens=False).ids)
        return encoder if encoder.encode(sample) == plain else None

    def encode(self, text: str, scope: str = "", known: Sequence[int] = ()) -> list[int]:
        """``known``: ids this encoder gave for an earlier text in ``scope`` (any prefix of
        them); a piece not in memory is taken from them where they spell it."""
        ids: list[int] = []
        recall = _Recall(known, self) if known and self._decodes_exactly else None
        for index, piece in enumerate(self._splitter.split(text)):
            if index % 2:  # the splitter's group: a special token
                ids.append(self._special[piece])
            elif piece:
                ids.extend(self._piece(piece, scope, recall))
        return ids

    def decode_piece(self, ids: Sequence[int]) -> str:
        return str(self._backend.decode(list(ids), skip_special_tokens=False))

    @property
    def special_ids(self) -> frozenset[int]:
        return frozenset(self._special.values())

    def mentions_special(self, text: str) -> bool:
        return self._splitter.search(text) is not None

    @property
    def can_quote(self) -> bool:
        return self._quoting() is not None

    def _quoting(self) -> Any:
        with self._lock:
            if self._make_as_text is not None:
                self._as_text, self._make_as_text = self._make_as_text(), None
            return self._as_text

    def encode_quoted(self, text: str, marks: tuple[str, str]) -> list[int]:
        """Encode ``text`` where each stretch between the two ``marks`` (a message's own
        text) holds no special token, whatever it spells; the marks themselves are dropped.
        The ids are those of the text with the quoted stretches' special-token spellings
        encoded as plain text. Rare (only a message that spells a special token comes here),
        so nothing is remembered."""
        if self._quoting() is None:
            raise ValueError("this tokenizer cannot read special tokens' text as text")
        ids: list[int] = []
        between: list[str] = []  # the text since the last special token
        quotes = re.compile(f"[{re.escape(''.join(marks))}]")
        for index, stretch in enumerate(quotes.split(text)):
            if index % 2:
                between.append(stretch)
                continue
            for part_index, part in enumerate(self._splitter.split(stretch)):
                if part_index % 2:
                    ids += self._plain("".join(between))
                    ids.append(self._special[part])
                    between = []
                else:
                    between.append(part)
        return ids + self._plain("".join(between))

    def _plain(self, text: str) -> list[int]:
        return list(self._as_text.encode(text, add_special_tokens=False).ids) if text else []

    def _piece(self, piece: str, scope: str, recall: _Recall | None) -> array[int] | list[int]:
        if len(piece) < _SHORTEST_KEPT:
            return list(self._backend.encode(piece, add_special_tokens=False).ids)
        key = (scope, piece)
        with self._lock:
            known = self._pieces.get(key)
            if known is not None:
                self._pieces.move_to_end(key)
                return known
        recalled = recall.get(piece) if recall is not None else None
        ids = (
            recalled
            if recalled is not None
            else array("I", self._backend.encode(piece, add_special_tokens=False).ids)
        )
        size = _size(key, ids)
        if size > self._max_bytes // _LARGEST_SHARE:
            return ids
        with self._lock:
            if key not in self._pieces:
                self._pieces[key] = ids
                self._kept_bytes += size
            while self._kept_bytes > self._max_bytes:
                self._kept_bytes -= _size(*self._pieces.popitem(last=False))
        return ids


class _Recall:
    """The pieces of ``known`` ids by their text, read back on the first look-up: each
    stretch between two special ids (a stretch cut off by the end is left out)."""

    def __init__(self, known: Sequence[int], encoder: PieceEncoder) -> None:
        self._known = known
        self._encoder = encoder
        self._texts: dict[str, array[int]] | None = None

    def get(self, piece: str) -> array[int] | None:
        if self._texts is None:
            self._texts = self._read()
        return self._texts.get(piece)

    def _read(self) -> dict[str, array[int]]:
        special = self._encoder.special_ids
        texts: dict[str, array[int]] = {}
        start = 0
        for index, token in enumerate(self._known):
            if token not in special:
                continue
            if index - start > 1:  # one token is shorter than any piece worth keeping
                stretch = array("I", self._known[start:index])
                texts[self._encoder.decode_piece(stretch)] = stretch
            start = index + 1
        return texts


def _decodes_exactly(backend: Any) -> bool:
    """Whether reading a text's ids back gives the text: a byte-level decoder (one
    vocabulary character per byte) and no normalizer, and a sample that comes back."""
    decoder = getattr(backend, "decoder", None)
    if type(decoder).__name__ != "ByteLevel" or getattr(backend, "normalizer", None) is not None:
        return False
    sample = "Hello, world!\n  leading spaces, digits 1234 3.14, déjà vu 漢字 🙂\t end  "
    try:
        ids = backend.encode(sample, add_special_tokens=False).ids
        return bool(backend.decode(ids, skip_special_tokens=False) == sample)
    except (AttributeError, TypeError):
        return False


def _own_copy(backend: Any) -> Any:
    """A copy of the tokenizer without truncation or padding: a tokenizer.json may turn
    them on, and the shared tokenizer carries that state between calls."""
    copy = type(backend).from_str(backend.to_str())
    copy.no_truncation()
    copy.no_padding()
    return copy


def _reading_special_as_text(backend: Any, special: dict[str, int]) -> Any:
    """A copy of ``backend`` that encodes special tokens' text as plain text (``tokenizers``'
    ``encode_special_tokens``); None where this version cannot, or does not."""
    try:
        copy = _own_copy(backend)
        copy.encode_special_tokens = True
        ids = set(copy.encode("".join(special), add_special_tokens=False).ids)
    except (AttributeError, TypeError):
        return None
    return copy if not ids & set(special.values()) else None


def _size(key: tuple[str, str], ids: array[int]) -> int:
    return sys.getsizeof(key[0]) + sys.getsizeof(key[1]) + ids.itemsize * len(ids)
