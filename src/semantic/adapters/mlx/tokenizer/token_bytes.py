"""Each token's own bytes of text, for a log-probability's ``bytes``.

A token that holds part of a character (byte-level BPE splits an emoji or a CJK character
over two or three tokens) decodes alone to U+FFFD, which says nothing of the part; its
vocabulary piece still names its bytes. Byte-level vocabularies spell each byte as one
character (``byte_level_alphabet``); SentencePiece's byte fallback spells one as ``<0xNN>``.
Any other piece's bytes are left to its decoding, which is whole there."""

from __future__ import annotations

import re
from typing import Any

_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def byte_level_alphabet() -> dict[str, int]:
    """Byte-level BPE's characters and the bytes they stand for: a byte that prints as a
    Latin-1 character stands for itself; every other byte (controls, the space, ...) is
    spelled by the next code point from 256 up, in byte order (the space is U+0120)."""
    printable = {*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    alphabet: dict[str, int] = {}
    moved = 0
    for byte in range(256):
        if byte in printable:
            alphabet[chr(byte)] = byte
        else:
            alphabet[chr(256 + moved)] = byte
            moved += 1
    return alphabet


class TokenBytes:
    """Token ids to their bytes through a ``tokenizers`` backend's vocabulary."""

    def __init__(self, backend: Any) -> None:
        self._backend = backend
        try:
            added = backend.get_added_tokens_decoder()
        except AttributeError:  # a backend without added tokens: every id is a piece
            added = {}
        self._added = {int(i): str(t.content).encode() for i, t in added.items()}
        byte_level = type(getattr(backend, "decoder", None)).__name__ == "ByteLevel"
        self._alphabet = byte_level_alphabet() if byte_level else None

    def of(self, token: int) -> bytes | None:
        """None where the piece does not spell bytes this way (its decoding then does)."""
        if token in self._added:
            return self._added[token]
        piece = self._backend.id_to_token(token)
        if piece is None:
            return None
        if self._alphabet is not None:
            alphabet = self._alphabet
            return bytes(alphabet[c] for c in piece) if all(c in alphabet for c in piece) else None
        spelled = _BYTE_PIECE.fullmatch(piece)
        return bytes([int(spelled.group(1), 16)]) if spelled else None
