"""The grammar port on llguidance: Lark grammars over the model's own vocabulary.

llguidance (ADR 0017) needs no torch, ships abi3 wheels for Linux x86-64 and macOS arm64,
compiles a 20-tool grammar in about 3 ms, and computes a token mask in tens of
microseconds. A compiled grammar is a pristine matcher that each sequence deep-copies.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from typing import Protocol

import llguidance

from semantic.adapters.grammar.lark import as_generated, lark_for
from semantic.domain.constraints import OutputConstraint, UnsupportedSchemaError

CACHED_GRAMMARS = 256
_UNIMPLEMENTED = re.compile(r"Unimplemented keys: (\[[^\]]*\])")


class Decoder(Protocol):
    """What the guard needs of llguidance's tokenizer: a run of tokens' bytes."""

    def decode_bytes(self, tokens: list[int], /) -> bytes: ...


class RepeatGuard:
    """Ends a reply at a call written exactly as an earlier one (``end_on_repeat``).

    Calls are told apart by the triggers that start them, in the reply's text; they are
    looked at whenever the grammar turns accepting again (inside a call's JSON it cannot
    end, after the call's closing text it can). A token that spans a call's end and the
    separator after it (``}\n``) skips that moment, so calls are looked at as all those
    that began since the last look: a repeat is then caught one call later, never missed."""

    def __init__(self, tokenizer: Decoder, triggers: Sequence[str]) -> None:
        self._tokenizer = tokenizer
        self._triggers = [t.encode() for t in triggers if t]
        self._tokens: list[int] = []
        self._looked = 0
        """How much of the reply's text has been looked at for calls."""
        self._calls: set[bytes] = set()
        self._was_accepting = True
        self.repeated = False

    def step(self, token: int, accepting: bool) -> None:
        self._tokens.append(token)
        if accepting and not self._was_accepting:
            text = self._tokenizer.decode_bytes(self._tokens)
            for call in self._calls_in(text, self._looked):
                self.repeated = self.repeated or call in self._calls
                self._calls.add(call)
            self._looked = len(text)
        self._was_accepting = accepting

    def _calls_in(self, text: bytes, start: int) -> list[bytes]:
        """The calls that begin at or after ``start``, each up to the next (none where the
        reply is the format's JSON, which ends accepting too, with no trigger in it)."""
        starts = sorted({at for trigger in self._triggers for at in _found(text, trigger, start)})
        if not starts:
            return []
        ends = [*starts[1:], len(text)]
        return [text[a:b].strip() for a, b in zip(starts, ends, strict=True)]


def _found(text: bytes, part: bytes, start: int) -> list[int]:
    """Where ``part`` occurs in ``text`` from ``start`` on."""
    found, at = [], text.find(part, start)
    while at >= 0:
        found.append(at)
        at = text.find(part, at + 1)
    return found


class LlguidanceMatcher:
    """llguidance's own ``is_stopped`` means "only the end token may follow" (its mask
    then holds just that); this matcher is done once the end token was accepted."""

    def __init__(
        self, matcher: llguidance.LLMatcher, end_only: bytes, guard: RepeatGuard | None
    ) -> None:
        self._matcher = matcher
        self._end_only = end_only
        self._guard = guard
        self._ended = False
        self._mask: bytes | None = None
        """The mask at this place, once computed: a step looks for a forced run, then masks."""

    def allowed(self) -> bytes:
        if self._matcher.is_error():  # a refused token: end the turn rather than go on
            return self._end_only
        if self._guard is not None and self._guard.repeated:
            return self._end_only
        if self._mask is None:
            self._mask = self._matcher.compute_bitmask()
        return self._mask

    def accept(self, token: int) -> bool:
        byte = token // 8
        self._ended = byte < len(self._end_only) and bool(self._end_only[byte] >> (token % 8) & 1)
        self._mask = None
        accepted = self._matcher.consume_token(token)
        if self._guard is not None and not self._ended:
            self._guard.step(token, self._matcher.is_accepting())
        return accepted

    def take_forced(self, limit: int) -> tuple[int, ...]:
        """Walks the masks rather than llguidance's fast-forward tokens: those are the
        forced text's canonical tokens, which the mask may allow beside others."""
        taken: list[int] = []
        while len(taken) < limit and not self._ended:
            token = _only(self.allowed())
            if token is None:
                break
            self.accept(token)
            taken.append(token)
        return tuple(taken)

    @property
    def done(self) -> bool:
        return self._ended


def _only(mask: bytes) -> int | None:
    """The one token a mask allows; None where it allows several (or none)."""
    rest = mask.lstrip(b"\x00")
    if len(rest.rstrip(b"\x00")) != 1 or rest[0] & (rest[0] - 1):
        return None
    return (len(mask) - len(rest)) * 8 + rest[0].bit_length() - 1


class LlguidanceGrammar:
    """``guarded_by``: the tokenizer a ``RepeatGuard`` reads calls with, and the triggers
    that start them (None: no guard)."""

    def __init__(
        self,
        pristine: llguidance.LLMatcher,
        end_only: bytes,
        guarded_by: tuple[llguidance.LLTokenizer, tuple[str, ...]] | None,
    ) -> None:
        self._pristine = pristine
        self._end_only = end_only
        self._guarded_by = guarded_by
        self._opening = tuple(pristine.deep_copy().compute_ff_tokens())
        """Computed here, with the compilation (off the event loop, once per constraint)."""

    def matcher(self) -> LlguidanceMatcher:
        guard = None if self._guarded_by is None else RepeatGuard(*self._guarded_by)
        return LlguidanceMatcher(self._pristine.deep_copy(), self._end_only, guard)

    @property
    def opening(self) -> tuple[int, ...]:
        """llguidance's fast-forward tokens at the start: forced, and tokenized as the model
        would write them (it leaves out a last token that the text after could merge into)."""
        return self._opening


class LlguidanceCompiler:
    """``tokenizer_json``: the model's ``tokenizers`` JSON (byte-level BPE); its
    ``vocab_size`` ids, of which ``end_ids`` end a turn (the model's stop tokens).
    llguidance's token trie is built at the first compile (about 160 ms, once), not at
    start: most runs of the server never constrain anything."""

    def __init__(self, tokenizer_json: str, vocab_size: int, end_ids: Iterable[int]) -> None:
        self._json = tokenizer_json
        self._vocab_size = vocab_size
        self._ends = sorted(end_ids)
        mask = bytearray((vocab_size + 31) // 32 * 4)
        for token in self._ends:
            mask[token // 8] |= 1 << (token % 8)
        self._end_only = bytes(mask)
        self._tokenizer: llguidance.LLTokenizer | None = None
        self._cache: OrderedDict[tuple[object, ...], LlguidanceGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def prepare(self) -> llguidance.LLTokenizer:
        """The token trie, built now if it was not yet."""
        with self._lock:
            if self._tokenizer is None:
                self._tokenizer = llguidance.LLTokenizer(
                    self._json, n_vocab=self._vocab_size, eos_token=self._ends
                )
            return self._tokenizer

    def compile(self, constraint: OutputConstraint) -> LlguidanceGrammar:
        key = constraint.cache_key
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        guard = (self.prepare(), constraint.triggers) if constraint.end_on_repeat else None
        grammar = LlguidanceGrammar(self._compiled(constraint), self._end_only, guard)
        with self._lock:
            self._cache[key] = grammar
            while len(self._cache) > CACHED_GRAMMARS:
                self._cache.popitem(last=False)
        return grammar

    def _compiled(self, constraint: OutputConstraint) -> llguidance.LLMatcher:
        matcher = llguidance.LLMatcher(self.prepare(), lark_for(constraint), log_level=0)
        if matcher.is_error():
            raise _refusal(matcher.get_error(), constraint)
        return matcher


def _refusal(error: str, constraint: OutputConstraint) -> UnsupportedSchemaError:
    """The error naming the keywords llguidance refused, and whose schema held them."""
    schemas: list[tuple[int | None, str]] = [(i, c.schema) for i, c in enumerate(constraint.calls)]
    if constraint.json_schema is not None:
        schemas.append((None, constraint.json_schema))
    for index, schema in schemas:
        alone = llguidance.LLMatcher.validate_grammar(_alone(schema))
        if alone:
            return _error(alone, index)
    return _error(error, None)


def _alone(schema: str) -> str:
    loaded = json.loads(schema)
    if isinstance(loaded, dict):
        loaded = as_generated(loaded)
    return llguidance.LLMatcher.grammar_from_json_schema(json.dumps(loaded))


def _one_line(message: str) -> str:
    """llguidance's message on one line: a regex error's text, without the carets under it
    (``regex parse error: (?=a)b: look-around ... is not supported``)."""
    lines = [line.strip() for line in message.splitlines()]
    kept = [line.removeprefix("error: ") for line in lines if line.strip("^ ")]
    return ": ".join(line.rstrip(":") for line in kept) or "invalid"


def _error(message: str, index: int | None) -> UnsupportedSchemaError:
    found = _UNIMPLEMENTED.search(message)
    where = "the schema" if index is None else f"the schema of call {index}"
    if found is None:
        return UnsupportedSchemaError(
            f"{where} cannot be compiled: {_one_line(message)}", call_index=index
        )
    keywords = tuple(json.loads(found.group(1)))
    return UnsupportedSchemaError(
        f"{where} uses JSON Schema keyword(s) constrained decoding cannot honour: "
        + ", ".join(keywords),
        keywords=keywords,
        call_index=index,
    )
