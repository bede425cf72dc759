"""The tokenizer port on top of mlx-lm's ``TokenizerWrapper`` (a Hugging Face fast tokenizer)."""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from typing import Any

import jinja2

from semantic.adapters.mlx.tokenizer.piece_encoder import PieceEncoder, quote_marks
from semantic.adapters.mlx.tokenizer.token_bytes import TokenBytes
from semantic.adapters.tool_formats import PromptFormat, format_for
from semantic.domain.chat import ChatMessage
from semantic.domain.errors import InvalidRequestError, PromptTooLongError
from semantic.domain.tools import Tool

Turn = dict[str, Any]


NO_CHAT_TEMPLATE = (
    "this model has no chat template (a base model's tokenizer_config.json names none), so "
    "messages cannot be made into its prompt: send the raw prompt to /v1/completions, or "
    "give the model directory a chat_template"
)


class MlxTokenizer:
    """``max_context``: a text that cannot fit it is refused before it is tokenized
    (``_refuse_if_certainly_too_long``)."""

    def __init__(self, wrapper: Any, max_context: int | None = None) -> None:
        self._wrapper = wrapper
        self._max_context = max_context
        self._eos = frozenset(int(i) for i in wrapper.eos_token_ids)
        # Counted once: the wrapper rebuilds a 49k-entry dict per ``vocab`` call (20 ms here),
        # and every request's validation asks.
        self._vocab_size = len(wrapper.vocab)
        backend = getattr(wrapper, "backend_tokenizer", None)
        self._pieces = PieceEncoder.of(backend) if backend is not None else None
        self._longest_token = longest_token_bytes(backend) if backend is not None else None
        self._bytes = TokenBytes(backend) if backend is not None else None
        self._special_texts = [str(t) for t in getattr(wrapper, "all_special_tokens", [])]
        template = getattr(wrapper, "chat_template", None)
        self._tools = format_for(template if isinstance(template, str) else None)

    @property
    def tool_format(self) -> PromptFormat:
        """How this model's prompts list tools and its replies write calls (ADR 0018)."""
        return self._tools

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return self._eos

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def tokenizers_json(self) -> str | None:
        """The ``tokenizers`` library's JSON of this tokenizer (padding and truncation off),
        from which a grammar engine builds its view of the vocabulary; None for a tokenizer
        that has none (not a fast tokenizer)."""
        backend = getattr(self._wrapper, "backend_tokenizer", None)
        if backend is None:
            return None
        if getattr(backend, "padding", None) is None and getattr(backend, "truncation", 0) is None:
            return str(backend.to_str())  # nothing to turn off: no copy (~0.3 s at 49k)
        copied = copy.copy(backend)
        copied.no_padding()
        copied.no_truncation()
        return str(copied.to_str())

    def encode(self, text: str, scope: str = "", known: Sequence[int] = ()) -> list[int]:
        self._refuse_if_certainly_too_long(text)
        if self._pieces is not None:
            return self._pieces.encode(text, scope, known)
        return list(self._wrapper.encode(text, add_special_tokens=False))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._wrapper.decode(list(token_ids), skip_special_tokens=False))

    def token_bytes(self, token_id: int) -> bytes:
        """The decoding's bytes where it is whole (a decoder may clean up spaces the piece
        holds), the piece's where it is part of a character."""
        text = self.decode([token_id])
        raw = self._bytes.of(token_id) if self._bytes is not None and "\ufffd" in text else None
        return raw if raw is not None else text.encode()

    def render_chat(
        self,
        messages: Sequence[ChatMessage],
        *,
        add_generation_prompt: bool = True,
        scope: str = "",
        continue_final: bool = False,
        tools: Sequence[Tool] = (),
        known: Sequence[int] = (),
    ) -> list[int]:
        turns, listed = self._tools.render(messages, tools)
        text = self._template(turns, listed, add_generation_prompt, continue_final)
        if any(self._spells_special(t["content"]) for t in turns):
            return self._encode_quoting(turns, listed, text, add_generation_prompt, continue_final)
        if any(self._spells_special(part) for part in _outside_content(turns, listed)):
            raise _cannot_quote("this text is not quoted where the template writes it")
        return self.encode(text, scope, known)

    def _template(
        self,
        turns: list[Turn],
        listed: list[Turn] | None,
        add_generation_prompt: bool,
        continue_final: bool,
    ) -> str:
        extra = {"tools": listed} if listed else {}
        if not getattr(self._wrapper, "chat_template", None):
            raise InvalidRequestError(NO_CHAT_TEMPLATE, param="messages")

        def applied(shown: list[Turn]) -> str:
            return str(
                self._wrapper.apply_chat_template(
                    shown,
                    add_generation_prompt=add_generation_prompt and not continue_final,
                    continue_final_message=continue_final,
                    tokenize=False,
                    **extra,
                )
            )

        try:
            try:
                return applied(turns)
            except jinja2.TemplateError:  # a template that wants roles to alternate (Gemma's,
                merged = one_turn_a_role(turns)  # Mistral's) takes two turns as one
                if merged == turns:
                    raise
                return applied(merged)
        except jinja2.TemplateError as error:  # its raise_exception: the model's own rule
            message = f"this model's chat template refuses the conversation: {error}"
            raise InvalidRequestError(message, param="messages") from None
        except ValueError as error:  # transformers: the template rewrote the final message
            if not continue_final:
                raise
            message = f"this model's chat template cannot continue the final message: {error}"
            raise InvalidRequestError(message, param="messages") from None

    def _spells_special(self, text: str) -> bool:
        if self._pieces is not None:
            return self._pieces.mentions_special(text)
        return any(token in text for token in self._special_texts)

    def _encode_quoting(
        self,
        turns: list[Turn],
        listed: list[Turn] | None,
        text: str,
        add_generation_prompt: bool,
        continue_final: bool,
    ) -> list[int]:
        """A message spells a special token: render again with each message's text between
        quote marks, so only the template's own markers become special tokens. Refused
        where that cannot be done exactly (a tokenizer that cannot read special tokens' text
        as text, or a template that rewrites the text it is given)."""
        self._refuse_if_certainly_too_long(text)
        marks = quote_marks(t["content"] for t in turns)
        if self._pieces is None or not self._pieces.can_quote or marks is None:
            raise _cannot_quote("this model's tokenizer cannot read them as plain text")
        opening, closing = marks
        quoted = [{**t, "content": f"{opening}{t['content']}{closing}"} for t in turns]
        with_quotes = self._template(quoted, listed, add_generation_prompt, continue_final)
        if with_quotes.replace(opening, "").replace(closing, "") != text:
            raise _cannot_quote("this model's chat template rewrites the text it is given")
        return self._pieces.encode_quoted(with_quotes, marks)

    def _refuse_if_certainly_too_long(self, text: str) -> None:
        """No token spans more than ``_longest_token`` bytes, so a text of more bytes than
        that many tokens' worth cannot fit the context. Tokenizing takes ~1 s a megabyte
        here and holds the GIL throughout: a 3 MB prompt held every stream up for 2 s
        before its 400."""
        if self._max_context is None or self._longest_token is None:
            return
        if len(text) < self._max_context:  # 4 bytes a character at most: the bound cannot bite
            return
        at_least = -(-len(text.encode("utf-8", "surrogatepass")) // self._longest_token)
        if at_least >= self._max_context:
            raise PromptTooLongError(
                f"the prompt is at least {at_least} tokens; the model's context is "
                f"{self._max_context}",
                param="messages",
            )


def one_turn_a_role(turns: list[Turn]) -> list[Turn]:
    """Neighbouring plain turns of one role (a tool's results, then the user's words) as
    one turn, their texts a blank line apart; turns that carry calls or answer one stay."""
    out: list[Turn] = []
    for turn in turns:
        last = out[-1] if out else None
        if last is not None and _plain(last) and _plain(turn) and last["role"] == turn["role"]:
            out[-1] = {**last, "content": f"{last['content']}\n\n{turn['content']}"}
        else:
            out.append(turn)
    return out


def _plain(turn: Turn) -> bool:
    return turn.keys() == {"role", "content"} and isinstance(turn["content"], str)


def _cannot_quote(why: str) -> InvalidRequestError:
    return InvalidRequestError(
        "a message spells one of the model's control tokens (such as <|im_end|>), which "
        f"must be read as plain text, and {why}",
        param="messages",
    )


def _outside_content(turns: list[Turn], listed: list[Turn] | None) -> list[str]:
    """Text a template writes from other fields than ``content`` (tool calls, tools), which
    quote marks cannot reach."""
    calls = [t["tool_calls"] for t in turns if "tool_calls" in t]
    return [json.dumps(part, ensure_ascii=False) for part in (*calls, listed) if part]


def longest_token_bytes(backend: Any) -> int | None:
    """The most bytes of text one token stands for, where that is sure: a byte-level BPE
    without a normalizer (one vocabulary character is one byte; added tokens are their
    text). None for any other tokenizer."""
    decoder = getattr(backend, "decoder", None)
    if type(decoder).__name__ != "ByteLevel" or getattr(backend, "normalizer", None) is not None:
        return None
    try:
        vocab = backend.get_vocab(with_added_tokens=False)
        added = backend.get_added_tokens_decoder().values()
    except AttributeError:
        return None
    lengths = [len(token) for token in vocab] + [len(t.content.encode()) for t in added]
    return max(lengths, default=None)
