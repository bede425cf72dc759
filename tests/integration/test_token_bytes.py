"""A token's own bytes, for log-probabilities: whole characters' where it holds them, the
part's where it holds part of one, with the real tokenizer and a byte-fallback one."""

from __future__ import annotations

from tokenizers import Tokenizer, decoders, models

from semantic.adapters.mlx.tokenizer.token_bytes import TokenBytes, byte_level_alphabet
from semantic.adapters.mlx.tokenizer.tokenizer import MlxTokenizer
from tests.integration.conftest import RealModel

SPLIT = "emoji 🙂🚀, accents déjà vu, CJK 漢字 世界"


def test_the_byte_level_alphabet_spells_every_byte_once() -> None:
    alphabet = byte_level_alphabet()
    assert sorted(alphabet.values()) == list(range(256))
    assert alphabet["Ġ"] == ord(" ")
    assert alphabet["A"] == ord("A")


def test_tokens_bytes_join_to_the_texts_where_some_decode_alone_to_nothing_whole(
    real_model: RealModel,
) -> None:
    tokenizer = MlxTokenizer(real_model.loaded.tokenizer)
    ids = tokenizer.encode(SPLIT)
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # the case that matters
    assert b"".join(tokenizer.token_bytes(t) for t in ids) == SPLIT.encode()
    for token in ids:
        alone = tokenizer.decode([token])
        if "\ufffd" not in alone:
            assert tokenizer.token_bytes(token) == alone.encode()
    end = tokenizer.encode("<|im_end|>")
    assert [tokenizer.token_bytes(t) for t in end] == [b"<|im_end|>"]


def test_a_byte_fallback_piece_is_its_byte_and_other_pieces_are_left_to_decoding() -> None:
    vocab = {"<unk>": 0, "<0xE2>": 1, "\u2581Hi": 2}
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", byte_fallback=True))
    backend.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Fuse()])
    pieces = TokenBytes(backend)
    assert pieces.of(1) == b"\xe2"
    assert pieces.of(2) is None
    assert pieces.of(99) is None  # no such id
