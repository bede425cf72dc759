"""Small hand-written fakes at the ports, for unit tests of the application ring."""

from __future__ import annotations

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
from semantic.domain.generation import TokenLogprob
from semantic.domain.tools import Tool
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import (
    BackendCapabilities,
    BlockPayload,
    DecodedToken,
    ExportedKV,
    Failed,
    Outcome,
    Prefilled,
    PromptChunk,
    PromptPart,
    RoundResult,
    RoundWork,
    SampledToken,
    SlicedPrompt,
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

    def token_bytes(self, token_id: int) -> bytes:
        return self.PIECES[token_id].encode()

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

    def token_bytes(self, token_id: int) -> bytes:
        return self.pieces[token_id]

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

    def take_forced(self, limit: int) -> tuple[int, ...]:
        """Every token of the literal is the only one its mask allows, then the end's."""
        taken: list[int] = []
        while len(taken) < limit and not self._ended:
            token = self._literal[self._at] if self._at < len(self._literal) else EOS
            self.accept(token)
            taken.append(token)
        return tuple(taken)

    @property
    def done(self) -> bool:
        return self._ended


@dataclass
class LiteralGrammar:
    literal: tuple[int, ...]
    forced: int = 0
    """How much of the literal it says every reply begins with (``opening``)."""

    def matcher(self) -> LiteralMatcher:
        return LiteralMatcher(self.literal)

    @property
    def opening(self) -> tuple[int, ...]:
        return self.literal[: self.forced]


@dataclass
class FakeGrammars:
    """Compiles a JSON-schema constraint whose schema is a JSON list of token ids into
    that literal; a schema holding ``"not"`` is refused, as llguidance refuses it."""

    compiled: list[OutputConstraint] = field(default_factory=list)
    forced: int = 0
    """How many of each literal's first tokens its grammar says are forced."""

    def compile(self, constraint: OutputConstraint) -> LiteralGrammar:
        schema = constraint.json_schema or "[]"
        if '"not"' in schema:
            raise UnsupportedSchemaError("not supported: not", keywords=("not",))
        self.compiled.append(constraint)
        literal = tuple(int(t) for t in schema.strip("[]").split(",") if t)
        return LiteralGrammar(literal, self.forced)


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
    pending: int | None = None  # the first token, fed by the first step after it joins
    remaining: int = 0  # tokens it may still make: it decodes while there are any
    logprobs: int | None = None  # alternatives a token's log-probability comes with

    def logprob(self, token: int) -> TokenLogprob | None:
        """A made-up log-probability: the token the likeliest, -0.25, then -1.25, ..."""
        if self.logprobs is None:
            return None
        top = tuple((token + i, -0.25 - i) for i in range(self.logprobs))
        return TokenLogprob(token, -0.25, top)


@dataclass
class FakeModel:
    """The model behind the fake backend: a sequence's "KV" is its token ids, and its next
    token a function of them (``next_token``), drawn within its grammar where it has one."""

    eos_at_length: int | None = None  # the end-of-turn token once a sequence is this long
    forced_runs: bool = False
    """A constrained step's token is followed in the same step by those its grammar
    forces after it (``GrammarMatcher.take_forced``), as the MLX batch does for a row."""
    sequences: dict[str, _Seq] = field(default_factory=dict)

    def decoding(self) -> list[str]:
        return [seq_id for seq_id, seq in self.sequences.items() if seq.remaining > 0]

    def feed(self, seq_id: str, tokens: Sequence[int], sample: bool) -> SampledToken | None:
        seq = self.sequences[seq_id]
        seq.tokens.extend(tokens)
        if not sample:
            return None
        token = self._next(seq)
        return SampledToken(token, 0.5, seq.logprob(token))

    def decode(self, seq_id: str) -> list[DecodedToken]:
        seq = self.sequences[seq_id]
        if seq.pending is not None:  # as MLX's pipelined batch: its first step feeds it
            seq.tokens.append(seq.pending)
            seq.pending = None
            return []
        seq.tokens.append(token := self._next(seq))
        seq.remaining = 0 if token == EOS else seq.remaining - 1
        out = [DecodedToken(seq_id, token, 0.5, seq.remaining == 0, logprob=seq.logprob(token))]
        runs = self.forced_runs and seq.logprobs is None  # a row with them takes none
        if runs and seq.matcher is not None and seq.remaining > 0:
            for forced in seq.matcher.take_forced(seq.remaining):
                seq.tokens.append(forced)
                seq.remaining = 0 if forced == EOS else seq.remaining - 1
                out.append(DecodedToken(seq_id, forced, 1.0, seq.remaining == 0, together=True))
        return out

    def _next(self, seq: _Seq) -> int:
        eos = self.eos_at_length is not None and len(seq.tokens) >= self.eos_at_length
        token = EOS if eos else next_token(seq.tokens)
        if seq.matcher is not None:
            token = masked_choice(token, seq.matcher.allowed())
            seq.matcher.accept(token)
        return token


@dataclass
class FakeBackend:
    """The port on ``FakeModel``: a round at once, in ``RoundRunner``'s order, each call
    logged (``made``); failures where the test asks. It cannot slice:
    ``step_fakes.StepBackend`` can, running the runner itself on this fake's rounds."""

    model: FakeModel = field(default_factory=FakeModel)
    spec: ModelCacheSpec = FAKE_SPEC
    ride_rows: int = 0
    fail_prefill_for: set[int] = field(default_factory=set)  # first prompt tokens that fail
    fail_join_for: set[str] = field(default_factory=set)  # caches that fail in their first step
    reading_restored: set[str] = field(default_factory=set)  # read in place while in here
    paused: threading.Event = field(default_factory=threading.Event)  # steps make no tokens
    log: list[tuple[Any, ...]] = field(default_factory=list)  # (kind, *what), in order
    _failed: dict[str, Exception] = field(default_factory=dict)
    _in_place: set[str] = field(default_factory=set)

    def made(self, kind: str) -> list[Any]:
        """Each logged call of a kind: "restore" (seq, tokens), "copy" (source, target, n),
        "prefill" (seq, n), "batch" prompts, "step" rows, "ride" (seq, n)."""
        return [what[1] if len(what) == 2 else what[1:] for what in self.log if what[0] == kind]

    @property
    def capabilities(self) -> BackendCapabilities:
        return BackendCapabilities(self.spec, "fake", False, self.ride_rows)

    def open_sequence(self, seq_id: str, *, restored: AgentBlocks | None, **kw: Any) -> bool:
        tokens = _gather(restored, kw["n_restored"], self.spec) if restored else []
        self.log.append(("restore", seq_id, list(tokens)))
        self.model.sequences[seq_id] = _Seq(tokens, kw.get("matcher"), logprobs=kw.get("logprobs"))
        self._in_place |= {seq_id} & self.reading_restored
        return seq_id in self._in_place

    def copy_prefix(self, source_id: str, target_id: str, n_tokens: int, room: int) -> bool:
        tokens = self.model.sequences[source_id].tokens
        if len(tokens) < n_tokens:
            raise ValueError("the source has not prefilled that far")
        self.log.append(("copy", source_id, target_id, n_tokens))
        self.model.sequences[target_id].tokens = tokens[:n_tokens]
        return True

    def close_sequence(self, seq_id: str, keep_tokens: int) -> ExportedKV:
        self._in_place.discard(seq_id)
        tokens = self.model.sequences.pop(seq_id).tokens
        return _cut(tokens, min(keep_tokens, len(tokens)), self.spec)

    def run(self, work: RoundWork) -> RoundResult:
        for join in work.joins:  # as in MLX's batch, a cache that fails to build fails alone
            if join.seq_id in self.fail_join_for:  # at the next step
                self._failed[join.seq_id] = MemoryError("no room to build the cache, on purpose")
            else:
                seq = self.model.sequences[join.seq_id]
                seq.pending, seq.remaining = join.first_token, join.max_new_tokens
        step = [self._step(work.ride)] if work.decode else []
        parts = [outcome for part in work.parts for outcome in self._part(part)]
        copied = frozenset(self._in_place - self.reading_restored)
        self._in_place -= copied
        return RoundResult((*step, *parts), copied)

    def _step(self, ride: PromptChunk | None) -> Outcome:
        failed, self._failed = self._failed, {}
        if ride and ride.tokens[0] in self.fail_prefill_for:
            return StepFailed(RuntimeError("the ridden step failed on purpose"))
        live = [] if self.paused.is_set() else self.model.decoding()
        self.log.append(("step", len(live)))
        self.log += [("ride", ride.seq_id, len(ride.tokens))] if ride else []
        tokens = [token for seq_id in live for token in self.model.decode(seq_id)]
        first = self._prefill(ride.seq_id, ride.tokens, ride.last) if ride else None
        return Stepped(StepOutput(tokens, first, failed), PASS_S)

    def _part(self, part: PromptPart) -> list[Outcome]:
        """A pass of whole prompts fails as a whole (as MLX's), then each runs alone."""
        assert not isinstance(part, SlicedPrompt), "this fake cannot slice: a StepBackend can"
        if isinstance(part, WholePrompts):
            if any(tokens[0] in self.fail_prefill_for for _, tokens in part.prompts):
                return [o for s, t in part.prompts for o in self._part(PromptChunk(s, t, True))]
            self.log.append(("batch", len(part.prompts)))
            firsts = tuple(self._prefill(s, t, True) for s, t in part.prompts)
            return [Prefilled(tuple((s, len(t)) for s, t in part.prompts), 0, PASS_S, firsts)]
        try:
            first = self._prefill(part.seq_id, part.tokens, part.last)
        except RuntimeError as error:
            return [Failed(part.seq_id, error)]
        return [Prefilled(((part.seq_id, len(part.tokens)),), part.position, PASS_S, (first,))]

    def _prefill(self, seq_id: str, tokens: Sequence[int], last: bool) -> SampledToken | None:
        if tokens[0] in self.fail_prefill_for:
            raise RuntimeError("prefill failed on purpose")
        self.log.append(("prefill", seq_id, len(tokens)))
        return self.model.feed(seq_id, tokens, last)


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
