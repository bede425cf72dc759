"""The tokenizer port on top of mlx-lm's ``TokenizerWrapper`` (a Hugging Face fast tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from semantic.adapters.mlx.piece_encoder import PieceEncoder
from semantic.domain.chat import ChatMessage


class MlxTokenizer:
    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper
        self._eos = frozenset(int(i) for i in wrapper.eos_token_ids)
        # Counted once: the wrapper rebuilds a 49k-entry dict per ``vocab`` call (20 ms here),
        # and every request's validation asks.
        self._vocab_size = len(wrapper.vocab)
        backend = getattr(wrapper, "backend_tokenizer", None)
        self._pieces = PieceEncoder.of(backend) if backend is not None else None

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str, scope: str = "") -> list[int]:
        if self._pieces is not None:
            return self._pieces.encode(text, scope)
        return list(self._wrapper.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._wrapper.decode(list(token_ids), skip_special_tokens=False))

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        scope: str = "",
    ) -> list[int]:
        text = self._wrapper.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
        )
        return self.encode(str(text), scope)
