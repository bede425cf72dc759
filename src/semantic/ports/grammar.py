"""The grammar port: an ``OutputConstraint`` compiled into per-sequence token masks.

The engine compiles a request's constraint once, at submission (so a schema the grammar
engine cannot honour is refused before any work, naming the keyword), and gives each
sequence its own matcher. The backend asks the matcher which tokens may come next before
every token it samples for that sequence, and tells it each token that was chosen.
"""

from __future__ import annotations

from typing import Protocol

from semantic.domain.constraints import OutputConstraint


class GrammarMatcher(Protocol):
    """One sequence's place in a compiled grammar; used on the engine thread only."""

    def allowed(self) -> bytes:
        """The tokens that may come next: one bit per token id, token ``t`` allowed when bit
        ``t % 8`` of byte ``t // 8`` is set. When the grammar is complete only the
        end-of-turn token is allowed, so the sequence ends as a turn ends."""
        ...

    def accept(self, token: int) -> bool:
        """Advance past ``token`` (one the mask allowed); False if the grammar refuses it."""
        ...

    def take_forced(self, limit: int) -> tuple[int, ...]:
        """Up to ``limit`` next tokens, each the only one its mask allows, accepted: what
        decoding would produce whatever the logits, so a decode step may compute them
        with the token before them (a call's ``", "arguments": {"city": "``)."""
        ...

    @property
    def done(self) -> bool:
        """Nothing more can follow: the end-of-turn token was accepted, or the matcher
        failed. Its mask then no longer matters."""
        ...


class Grammar(Protocol):
    """A compiled constraint; cheap to start a matcher from, shared by the requests that
    carry an equal constraint."""

    def matcher(self) -> GrammarMatcher: ...

    @property
    def opening(self) -> tuple[int, ...]:
        """The tokens every reply under it begins with, the grammar allowing no other at
        each (a required call's ``<tool_call>{"name": "``): the engine computes them with
        the prompt, in one pass, instead of a decode step each. May be shorter than what
        the grammar forces (empty: none known)."""
        ...


class GrammarCompiler(Protocol):
    def compile(self, constraint: OutputConstraint) -> Grammar:
        """Compiled (or the cached compilation of an equal ``cache_key``). Raises
        ``UnsupportedSchemaError`` for a schema keyword the engine cannot honour, and
        ``InvalidRequestError`` for a schema that is not JSON or not a valid schema."""
        ...
