"""Small hand-written fakes at the ports, for unit tests of the application ring."""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from semantic.adapters.tool_formats import DefaultFormat
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.chat import ChatMessage
from semantic.domain.constraints import OutputConstraint, UnsupportedSchemaError
from semantic.domain.errors import IncompatibleCacheError
from semantic.domain.tools import Tool
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import (
    BackendCapabilities,
    BlockPayload,
    DecodedToken,
    ExportedKV,
    Failed,
    InFlight,
    Outcome,
    Prefilled,
    PromptChunk,
    PromptPart,
    RoundResult,
    RoundWork,
    SampledToken,
    SlicedPrompt,
    SoFar,
    StepFailed,
    StepOutput,
    Stepped,
    WholePrompts,
)

EOS = 0
VOCAB = 64
FAKE_SPEC = ModelCacheSpec(2, 1, 2, 2, "float32", (None, None), 4)
PASS_S = 1e-4
"""The seconds the fake backend reports for each pass (a slice's pace is twice a step's:
with none, an in-flight chunk would run whole)."""


class FakeTokenizer:
    """Token ``i`` is the letter-ish piece ``PIECES[i]``; 0 is the end-of-turn token."""

    PIECES = ("<eos>", *[chr(ord("a") + i % 26) + str(i // 26 or "") for i in range(1, VOCAB)])

    @property
    def tool_format(self) -> DefaultFormat:
        return DefaultFormat()

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset({EOS})

    @property
    def vocab_size(self) -> int:
        return VOCAB

    def encode(self, text: str) -> list[int]:
        return [self.PIECES.index(ch) for ch in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        return "".join(self.PIECES[t] for t in token_ids)

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
        return [t for m in messages for t in self.encode(m.content)]


class ByteTokenizer:
    """Tokens are UTF-8 byte strings, so one character can span several tokens."""

    def __init__(self, pieces: Sequence[bytes]) -> None:
        self.pieces = list(pieces)

    @property
    def tool_format(self) -> DefaultFormat:
        return DefaultFormat()

    @property
    def eos_token_ids(self) -> frozenset[int]:
        return frozenset()

    @property
    def vocab_size(self) -> int:
        return len(self.pieces)

    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def decode(self, token_ids: Sequence[int]) -> str:
        return b"".join(self.pieces[t] for t in token_ids).decode("utf-8", errors="replace")

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
        raise NotImplementedError


def next_token(history: Sequence[int]) -> int:
    """The fake model: a deterministic function of everything before (never the EOS id)."""
    return 1 + (sum((i + 7) * t for i, t in enumerate(history[-5:])) + len(history)) % (VOCAB - 1)


class LiteralMatcher:
    """A grammar of one token sequence: its next token is the only one allowed, then only
    the end-of-turn token."""

    def __init__(self, literal: Sequence[int]) -> None:
        self._literal = list(literal)
        self._at = 0
        self._ended = False

    def allowed(self) -> bytes:
        token = self._literal[self._at] if self._at < len(self._literal) else EOS
        mask = bytearray((VOCAB + 7) // 8)
        mask[token // 8] |= 1 << (token % 8)
        return bytes(mask)

    def accept(self, token: int) -> bool:
        if self._at == len(self._literal):
            self._ended = token == EOS
            return self._ended
        ok = token == self._literal[self._at]
        self._at += ok
        return ok

    @property
    def done(self) -> bool:
        return self._ended


@dataclass
class LiteralGrammar:
    literal: tuple[int, ...]

    def matcher(self) -> LiteralMatcher:
        return LiteralMatcher(self.literal)


@dataclass
class FakeGrammars:
    """Compiles a JSON-schema constraint whose schema is a JSON list of token ids into
    that literal; a schema holding ``"not"`` is refused, as llguidance refuses it."""

    compiled: list[OutputConstraint] = field(default_factory=list)

    def compile(self, constraint: OutputConstraint) -> LiteralGrammar:
        schema = constraint.json_schema or "[]"
        if '"not"' in schema:
            raise UnsupportedSchemaError("not supported: not", keywords=("not",))
        self.compiled.append(constraint)
        return LiteralGrammar(tuple(int(t) for t in schema.strip("[]").split(",") if t))


def masked_choice(preferred: int, allowed: bytes) -> int:
    """What a masked sampler does with the fake model's choice: keeps it if the grammar
    allows it, else takes the next allowed id after it."""
    for step in range(VOCAB):
        token = (preferred + step) % VOCAB
        if allowed[token // 8] >> (token % 8) & 1:
            return token
    raise ValueError("the grammar allows no token")


@dataclass
class _Seq:
    tokens: list[int]
    matcher: GrammarMatcher | None
    pending: int | None = None
    remaining: int = 0
    decoding: bool = False
    sliced: int = 0  # rounds its chunk in flight has had


@dataclass
class FakeBackend:
    """A model whose "KV" is the token ids themselves, so restores can be checked exactly. It
    answers a round at once in ``RoundRunner``'s order (its step never beside a slice);
    ``step_fakes.StepBackend`` runs the runner itself, on steps made of this fake's rounds."""

    spec: ModelCacheSpec = FAKE_SPEC
    ride_rows: int = 0
    eos_at_length: int | None = None  # the end-of-turn token once a sequence is this long
    fail_prefill_for: set[int] = field(default_factory=set)  # first prompt tokens that fail
    fail_join_for: set[str] = field(default_factory=set)  # caches that fail in their first step
    reading_restored: set[str] = field(default_factory=set)  # read in place while in here
    paused: threading.Event = field(default_factory=threading.Event)  # steps make no tokens
    sequences: dict[str, _Seq] = field(default_factory=dict)
    restored_tokens: dict[str, list[int]] = field(default_factory=dict)
    prefill_calls: list[tuple[str, int]] = field(default_factory=list)
    batched_prefills: list[int] = field(default_factory=list)
    decode_batches: list[int] = field(default_factory=list)
    copies: list[tuple[str, str, int]] = field(default_factory=list)
    rides: list[tuple[str, int]] = field(default_factory=list)
    slices: list[tuple[str, int, bool]] = field(default_factory=list)  # (seq, tokens, done)
    _failed: dict[str, Exception] = field(default_factory=dict)
    _in_place: set[str] = field(default_factory=set)

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(self.spec, "fake", True, self.ride_rows)

    @property
    def decoding_count(self) -> int:
        return sum(s.decoding and s.remaining > 0 for s in self.sequences.values())

    def open_sequence(self, seq_id: str, *, restored: AgentBlocks | None, **kw: Any) -> bool:
        tokens = _gather(restored, kw["n_restored"], self.spec) if restored else []
        self.restored_tokens[seq_id] = list(tokens)
        self.sequences[seq_id] = _Seq(tokens, kw.get("matcher"))
        self._in_place |= {seq_id} & self.reading_restored
        return seq_id in self._in_place

    def copy_prefix(self, source_id: str, target_id: str, n_tokens: int, room: int) -> bool:
        if len(self.sequences[source_id].tokens) < n_tokens:
            raise ValueError("the source has not prefilled that far")
        self.copies.append((source_id, target_id, n_tokens))
        self.sequences[target_id].tokens = self.sequences[source_id].tokens[:n_tokens]
        return True

    def close_sequence(self, seq_id: str, keep_tokens: int) -> ExportedKV:
        self._in_place.discard(seq_id)
        tokens = self.sequences.pop(seq_id).tokens
        return _cut(tokens, min(keep_tokens, len(tokens)), self.spec)

    def run(self, work: RoundWork) -> RoundResult:
        for join in work.joins:  # as in MLX's batch, a cache that fails to build fails alone
            if join.seq_id in self.fail_join_for:  # at the next step
                self._failed[join.seq_id] = MemoryError("no room to build the cache, on purpose")
                continue
            seq = self.sequences[join.seq_id]
            seq.pending, seq.remaining, seq.decoding = join.first_token, join.max_new_tokens, True
        step = [self._step(work.ride)] if work.decode else []
        parts = [outcome for part in work.parts for outcome in self._part(part)]
        copied = frozenset(self._in_place - self.reading_restored)
        self._in_place -= copied
        return RoundResult((*step, *parts), copied)

    def _step(self, ride: PromptChunk | None) -> Outcome:
        failed, self._failed = self._failed, {}
        if ride and ride.tokens[0] in self.fail_prefill_for:
            return StepFailed(RuntimeError("the ridden step failed on purpose"))
        live = [(k, s) for k, s in self.sequences.items() if s.decoding and s.remaining > 0]
        tokens = []
        for seq_id, seq in [] if self.paused.is_set() else live:
            if seq.pending is not None:  # as MLX's pipelined batch: its first step feeds it
                seq.tokens.append(seq.pending)
                seq.pending = None
                continue
            seq.tokens.append(token := self._next(seq))
            seq.remaining = 0 if token == EOS else seq.remaining - 1
            tokens.append(DecodedToken(seq_id, token, 0.5, seq.remaining == 0))
        self.decode_batches += [] if self.paused.is_set() else [len(live)]
        self.rides += [(ride.seq_id, len(ride.tokens))] if ride else []
        first = self._prefill(ride.seq_id, ride.tokens, ride.last) if ride else None
        return Stepped(StepOutput(tokens, first, failed), PASS_S)

    def _part(self, part: PromptPart) -> list[Outcome]:
        """A pass of whole prompts fails as a whole (as MLX's), then each runs alone; a
        sliced chunk is done in its third round (its first if its time is endless)."""
        if isinstance(part, WholePrompts):
            if any(tokens[0] in self.fail_prefill_for for _, tokens in part.prompts):
                return [o for s, t in part.prompts for o in self._part(PromptChunk(s, t, True))]
            self.batched_prefills.append(len(part.prompts))
            firsts = tuple(self._prefill(s, t, True) for s, t in part.prompts)
            return [Prefilled(tuple((s, len(t)) for s, t in part.prompts), 0, PASS_S, firsts)]
        n, last = len(part.tokens), isinstance(part, PromptChunk) and part.last
        if isinstance(part, SlicedPrompt):
            n, last = part.sizes[0], part.sizes[0] == len(part.tokens)
            seq = self.sequences[part.seq_id]
            seq.sliced += 1
            endless = math.isinf(part.budget(SoFar(None, None, self.decoding_count)))
            self.slices.append((part.seq_id, n, endless or seq.sliced == 3))
            if not self.slices[-1][2]:
                return [InFlight(part.seq_id, n)]
            seq.sliced = 0
        try:
            first = self._prefill(part.seq_id, part.tokens[:n], last)
        except RuntimeError as error:
            return [Failed(part.seq_id, error)]
        seconds = None if isinstance(part, SlicedPrompt) else PASS_S
        return [Prefilled(((part.seq_id, n),), part.position, seconds, (first,))]

    def _prefill(self, seq_id: str, tokens: Sequence[int], last: bool) -> SampledToken | None:
        if tokens[0] in self.fail_prefill_for:
            raise RuntimeError("prefill failed on purpose")
        self.prefill_calls.append((seq_id, len(tokens)))
        self.sequences[seq_id].tokens.extend(tokens)
        return SampledToken(self._next(self.sequences[seq_id]), 0.5) if last else None

    def _next(self, seq: _Seq) -> int:
        """The model's next token, drawn within a constrained sequence's grammar (told it)."""
        eos = self.eos_at_length is not None and len(seq.tokens) >= self.eos_at_length
        token = EOS if eos else next_token(seq.tokens)
        if seq.matcher is not None:
            token = masked_choice(token, seq.matcher.allowed())
            seq.matcher.accept(token)
        return token


def _cut(tokens: list[int], keep: int, spec: ModelCacheSpec) -> ExportedKV:
    """The first ``keep`` tokens as blocks, layer by layer: a sliding layer keeps its last
    window only."""
    size, layers = spec.block_tokens, []
    for layer in range(spec.n_layers):
        window = spec.window(layer)
        first = 0 if window is None else max(0, keep - window)
        layers.append(
            [
                BlockPayload(
                    i // size,
                    max(first, i) - i,
                    min(size, keep - i),
                    tuple(tokens[max(first, i) : min(i + size, keep)]),
                )
                for i in range(0, keep, size)
                if i + size > first
            ]
        )
    return ExportedKV(keep, layers)


def _gather(blocks: AgentBlocks, n: int, spec: ModelCacheSpec) -> list[int]:
    """The first ``n`` tokens, read back from the layers: every position from a global
    layer, the last window from a sliding one (which must agree)."""
    per_layer = []
    for layer, layer_blocks in enumerate(blocks.layers):
        held: dict[int, int] = {}
        for block in layer_blocks:
            payload = block.payload
            if not isinstance(payload, tuple):
                raise IncompatibleCacheError("fake payload must be a tuple of token ids")
            base = block.index * spec.block_tokens + block.start
            held.update((base + offset, token) for offset, token in enumerate(payload))
        window = spec.window(layer)
        first = 0 if window is None else max(0, n - window)
        missing = [p for p in range(first, n) if p not in held]
        if missing:
            raise IncompatibleCacheError(f"layer {layer} is missing positions {missing}")
        per_layer.append([held[p] for p in range(first, n)])
    tokens = max(per_layer, key=len)
    if any(layer != tokens[len(tokens) - len(layer) :] for layer in per_layer):
        raise IncompatibleCacheError("layers disagree")
    if len(tokens) != n:
        raise IncompatibleCacheError("no global layer holds every position")
    return tokens
