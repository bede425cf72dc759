"""Small hand-written fakes at the ports, for unit tests of the application ring."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from semantic.adapters.round_runner import RoundRunner
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
    PromptChunk,
    RoundResult,
    RoundWork,
    SampledToken,
    SliceProgress,
    StepOutput,
)

EOS = 0
VOCAB = 64


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
    pending: int | None = None
    remaining: int = 0
    decoding: bool = False
    finished: bool = False
    matcher: GrammarMatcher | None = None


@dataclass
class FakeBackend:
    """A model whose "KV" is the token ids themselves, so restores can be checked exactly.
    Its round runs on the steps below in ``RoundRunner``'s order, as the MLX backend's."""

    spec: ModelCacheSpec = field(
        default_factory=lambda: ModelCacheSpec(2, 1, 2, 2, "float32", (None, None), 4)
    )
    eos_at_length: int | None = None
    """Produce the end-of-turn token once a sequence holds this many positions."""
    fail_prefill_for: set[int] = field(default_factory=set)
    """First prompt tokens whose prefill raises, to test failure isolation."""
    fail_join_for: set[str] = field(default_factory=set)
    """Sequence ids whose cache fails to build as they join the decode batch."""
    model_id: str = "fake"
    paused: threading.Event = field(default_factory=threading.Event)
    """While set, decode steps make no progress (a request stays in flight)."""
    ride_rows: int = 0
    """Rows a fused decode pass may hold (0: no riding, like a model without fusion)."""
    can_slice: bool = True
    slice_calls: int = 3
    """Calls a sliced chunk takes when its time is bounded (the model's layers, in thirds)."""
    side_by_side: bool = False
    """Whether a sliced round's decode step may be begun beside its slice."""
    fail_beside: bool = False
    """A step begun beside a slice fails as it ends."""
    reading_restored: set[str] = field(default_factory=set)
    """Sequences that read their restored blocks in place (the MLX backend's first pass
    over a returning agent's blocks), as they open and until taken out of this set."""
    sequences: dict[str, _Seq] = field(default_factory=dict)
    restored_tokens: dict[str, list[int]] = field(default_factory=dict)
    prefill_calls: list[tuple[str, int]] = field(default_factory=list)
    decode_batches: list[int] = field(default_factory=list)
    batched_prefills: list[int] = field(default_factory=list)
    copies: list[tuple[str, str, int]] = field(default_factory=list)
    rides: list[tuple[str, int]] = field(default_factory=list)
    slices: list[tuple[str, int, bool]] = field(default_factory=list)
    """(sequence, chunk tokens, done) for each ``prefill_slice`` call."""
    beside: list[StepOutput] = field(default_factory=list)
    """The output of each step begun beside a slice, in order."""
    _sliced: dict[str, int] = field(default_factory=dict)
    _begun: StepOutput | None = None
    _in_place: set[str] = field(default_factory=set)

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(self.spec, self.model_id, self.can_slice, self.ride_rows)

    @property
    def decoding_count(self) -> int:
        return sum(1 for s in self.sequences.values() if s.decoding and not s.finished)

    def clock(self) -> float:
        return time.monotonic()

    def open_sequence(
        self,
        seq_id: str,
        *,
        restored: AgentBlocks | None,
        n_restored: int,
        matcher: GrammarMatcher | None = None,
        **_: object,
    ) -> bool:
        tokens = _gather(restored, n_restored, self.spec) if restored else []
        self.restored_tokens[seq_id] = list(tokens)
        self.sequences[seq_id] = _Seq(tokens, matcher=matcher)
        if seq_id in self.reading_restored:
            self._in_place.add(seq_id)
        return seq_id in self.reading_restored

    def run(self, work: RoundWork) -> RoundResult:
        outcomes = RoundRunner(self, self.clock).run(work)
        copied = frozenset(self._in_place - self.reading_restored)
        self._in_place -= copied
        return RoundResult(outcomes, copied)

    def prefill(self, seq_id: str, tokens: Sequence[int]) -> None:
        if tokens and tokens[0] in self.fail_prefill_for:
            raise RuntimeError("prefill failed on purpose")
        self.prefill_calls.append((seq_id, len(tokens)))
        self.sequences[seq_id].tokens.extend(tokens)

    def prefill_and_sample(self, seq_id: str, tokens: Sequence[int]) -> SampledToken:
        self.prefill(seq_id, tokens)
        return SampledToken(self._next(self.sequences[seq_id]), 0.5)

    def _prefill(self, seq_id: str, tokens: Sequence[int], last: bool) -> SampledToken | None:
        if last:
            return self.prefill_and_sample(seq_id, tokens)
        self.prefill(seq_id, tokens)
        return None

    def prefill_slice(
        self,
        seq_id: str,
        tokens: Sequence[int],
        seconds: float,
        *,
        last: bool,
        must_progress: bool = True,
    ) -> SliceProgress:
        calls = self._sliced.pop(seq_id, 0) + 1
        done = calls >= self.slice_calls or math.isinf(seconds)
        self.slices.append((seq_id, len(tokens), done))
        if not done:
            self._sliced[seq_id] = calls
            return SliceProgress(False)
        return SliceProgress(True, self._prefill(seq_id, tokens, last))

    def prefill_many_and_sample(
        self, prompts: Sequence[tuple[str, Sequence[int]]]
    ) -> list[SampledToken]:
        if any(tokens and tokens[0] in self.fail_prefill_for for _, tokens in prompts):
            raise RuntimeError("batched prefill failed on purpose")  # all or nothing, like MLX
        self.batched_prefills.append(len(prompts))
        return [self.prefill_and_sample(seq_id, tokens) for seq_id, tokens in prompts]

    def copy_prefix(self, source_id: str, target_id: str, n_tokens: int, room: int) -> bool:
        source = self.sequences[source_id].tokens
        if len(source) < n_tokens:
            raise ValueError("the source has not prefilled that far")
        self.copies.append((source_id, target_id, n_tokens))
        self.sequences[target_id].tokens = list(source[:n_tokens])
        return True

    def start_decoding(self, seq_id: str, first_token: int, max_new_tokens: int) -> None:
        seq = self.sequences[seq_id]
        seq.pending, seq.remaining, seq.decoding = first_token, max_new_tokens, True

    def decode_step(self, ride: PromptChunk | None = None) -> StepOutput:
        if ride is not None and len(ride.tokens) > self.capabilities.ride_capacity(
            self.decoding_count
        ):
            raise ValueError("too many tokens to ride")
        failed, tokens, first = self._failed_joins(), self._decode_tokens(), None
        if ride is not None:
            self.rides.append((ride.seq_id, len(ride.tokens)))
            first = self._prefill(ride.seq_id, ride.tokens, ride.last)
        return StepOutput(tokens, first, failed)

    def begin_decode_step(self) -> bool:
        if not self.side_by_side or self._begun is not None:
            return False
        self._begun = self.decode_step()  # the work is done at once; only its report waits
        return True

    def end_decode_step(self) -> StepOutput:
        output, self._begun = self._begun, None
        if output is None:
            raise RuntimeError("no decode step was begun beside a slice")
        if self.fail_beside:
            raise RuntimeError("the step beside the slice failed on purpose")
        self.beside.append(output)
        return output

    def _failed_joins(self) -> dict[str, Exception]:
        """Like the MLX decode batch: a joining sequence whose cache fails to build leaves
        the batch, reported; the others decode."""
        failed: dict[str, Exception] = {}
        for seq_id in self.fail_join_for & self.sequences.keys():
            seq = self.sequences[seq_id]
            if seq.decoding and seq.pending is not None:
                seq.decoding = False
                failed[seq_id] = MemoryError("no room to build the cache, on purpose")
        return failed

    def _decode_tokens(self) -> list[DecodedToken]:
        """Like the MLX backend's pipelined decode batch: a newly joined sequence only has
        its first token fed in its first step; afterwards each token is fed before it is
        returned."""
        out: list[DecodedToken] = []
        if self.paused.is_set():
            return out
        live = [(k, s) for k, s in self.sequences.items() if s.decoding and not s.finished]
        self.decode_batches.append(len(live))
        for seq_id, seq in live:
            if seq.pending is not None:
                seq.tokens.append(seq.pending)
                seq.pending = None
                continue
            token = self._next(seq)
            seq.tokens.append(token)
            seq.remaining -= 1
            seq.finished = seq.remaining <= 0 or token == EOS
            out.append(DecodedToken(seq_id, token, 0.5, seq.finished))
        return out

    def close_sequence(self, seq_id: str, keep_tokens: int) -> ExportedKV:
        self._sliced.pop(seq_id, None)
        self._in_place.discard(seq_id)
        seq = self.sequences.pop(seq_id)
        return _cut(seq.tokens, min(keep_tokens, len(seq.tokens)), self.spec)

    def _next(self, seq: _Seq) -> int:
        """The fake model's next token, drawn within a constrained sequence's grammar (which
        is told it)."""
        if self.eos_at_length is not None and len(seq.tokens) >= self.eos_at_length:
            token = EOS
        else:
            token = next_token(seq.tokens)
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
