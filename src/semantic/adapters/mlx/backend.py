"""The model backend on MLX: our own chunked prefill, then our batched decode step.

Prefill runs here, one sequence and one chunk at a time, so the engine's scheduler decides
exactly how many prompt tokens each step costs. The prompt's last chunk also yields the
first new token, which the caller can stream at once; the sequence then joins the
``DecodeBatch`` (mlx-lm's model and batch caches, our sampling) with that token as its next
input. Every method runs on the engine thread: MLX streams belong to the thread that made
them.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from semantic.adapters.mlx.accelerator import Accelerator, Group
from semantic.adapters.mlx.decode_batch import Caches, DecodeBatch
from semantic.adapters.mlx.devices import HOST_VIEWS, HostMemory
from semantic.adapters.mlx.kv.cache_room import (
    clone_prefix,
    reserve_room,
    room_to_reserve,
    size_cache,
)
from semantic.adapters.mlx.kv.kv_blocks import cut_into_blocks, window_history
from semantic.adapters.mlx.kv.restore_buffers import RestoreBuffers
from semantic.adapters.mlx.kv.restored_caches import RestoredCaches
from semantic.adapters.mlx.lm import BatchKVCache
from semantic.adapters.mlx.models.model_parts import BodyAndHead
from semantic.adapters.mlx.sampling import log_softmax, make_sampler
from semantic.adapters.mlx.sequence_state import SequenceState, fresh_plain, sample_first
from semantic.application.scheduler.round_runner import RoundRunner
from semantic.domain.blocks import AgentBlocks
from semantic.domain.cache_spec import ModelCacheSpec
from semantic.domain.errors import InvalidRequestError
from semantic.domain.generation import SamplingParams
from semantic.ports.grammar import GrammarMatcher
from semantic.ports.model_backend import (
    BackendCapabilities,
    DecodedToken,
    ExportedKV,
    PromptChunk,
    RoundResult,
    RoundWork,
    SampledToken,
    SliceProgress,
    StepOutput,
)


class MlxBackend:
    def __init__(
        self,
        model: Any,
        spec: ModelCacheSpec,
        model_id: str,
        eos_token_ids: frozenset[int],
        buffers: RestoreBuffers | None = None,
        *,
        accelerator: Accelerator | None,
        host: HostMemory = HOST_VIEWS,
        forced_runs: bool = True,
    ) -> None:
        """``buffers``: where finished sequences' blocks are copied (the restore buffers'
        recycled memory); without them, or for caches that cannot be stacked (sliding
        windows, other than float32), each block layer is an MLX array of its own.
        ``accelerator``: what may take passes off MLX (the CPU one, ``cpu.accelerator_for``);
        without one, every pass is mlx-lm's own and a prompt is never sliced.
        ``host``: whether numpy may view the KV where it lies (``devices.host_memory``);
        where not, blocks are cut and gathered by MLX ops on the device's own stream, and
        no restored prefix is read in place. ``forced_runs``: ``DecodeBatch``'s."""
        self._model = model
        self._buffers = buffers if host.addressable else None
        self._spec = spec
        self._accelerator = accelerator
        self._host_rows = accelerator.host_rows if accelerator is not None else 0
        ride_rows = accelerator.ride_rows if accelerator is not None else 0
        self._decoder = DecodeBatch(
            model, eos_token_ids, accelerator, forced_runs=forced_runs, pass_rows=ride_rows
        )
        self._split = BodyAndHead.of(model)
        self._restored = RestoredCaches(model, spec, host, self._host_rows)
        self._capabilities = BackendCapabilities(
            spec,
            model_id,
            can_slice=self._split is not None and accelerator is not None,
            ride_rows=ride_rows,
        )
        self._sequences: dict[str, SequenceState] = {}
        self._beside = accelerator.beside(self._decoder, self._step_output) if accelerator else None
        self._runner = RoundRunner(self, time.perf_counter)
        self._in_place: set[str] = set()
        """Sequences reading their restored blocks where they lie, as last reported."""

    @property
    def decoding_count(self) -> int:
        return len(self._decoder)

    def open_sequence(
        self,
        seq_id: str,
        *,
        restored: AgentBlocks | None,
        n_restored: int,
        n_new: int,
        sampling: SamplingParams,
        track_top_prob: bool = False,
        matcher: GrammarMatcher | None = None,
        logprobs: int | None = None,
    ) -> bool:
        if seq_id in self._sequences:
            raise InvalidRequestError(f"sequence {seq_id} is already open")
        caches, prefix = self._restored.open(restored, n_restored, n_new)
        sampler = make_sampler(sampling)
        self._sequences[seq_id] = SequenceState(
            caches, sampler, track_top_prob, n_new, prefix, matcher=matcher, logprobs=logprobs
        )
        if prefix is not None:
            self._in_place.add(seq_id)
        return prefix is not None

    def run(self, work: RoundWork) -> RoundResult:
        """The round in ``RoundRunner``'s order, on this backend's steps; then the sequences
        whose restored prefix was copied since the last round (their first pass, a step
        that built their cache, a copy for a follower)."""
        outcomes = self._runner.run(work)
        copied = frozenset(s for s in self._in_place if not self._reads_restored(s))
        self._in_place -= copied
        return RoundResult(outcomes, copied)

    def _caches(self, sequence: SequenceState) -> list[Any]:
        """The sequence's caches, with a prefix read in place copied in front first."""
        if sequence.prefix is not None:
            sequence.caches = self._restored.gathered(sequence.prefix, sequence.caches)
            sequence.prefix = None
        return sequence.caches

    def prefill(self, seq_id: str, tokens: Sequence[int]) -> None:
        sequence = self._sequences[seq_id]
        reserve_room(sequence.caches, sequence.room, self._spec)
        if self._split is not None:  # no logits needed: skip the output head entirely
            self._body(mx.array([list(tokens)]), sequence)
        else:
            self._model(mx.array([list(tokens)]), cache=self._caches(sequence))
        mx.eval([(c.keys, c.values) for c in sequence.caches])

    def prefill_and_sample(self, seq_id: str, tokens: Sequence[int]) -> SampledToken:
        sequence = self._sequences[seq_id]
        return sample_first(sequence, self._last_logits(mx.array([list(tokens)]), sequence))

    def prefill_many_and_sample(
        self, prompts: Sequence[tuple[str, Sequence[int]]]
    ) -> list[SampledToken]:
        """Left-padded into one batch (mlx-lm's ``BatchKVCache`` masks the padding), then
        each sequence's cache is cut back out of it; one by one where a cache is not a plain
        empty ``KVCache`` (a sliding-window layer, say)."""
        sequences = [self._sequences[seq_id] for seq_id, _ in prompts]
        if len(prompts) < 2 or not all(map(fresh_plain, sequences)):
            return [self.prefill_and_sample(seq_id, tokens) for seq_id, tokens in prompts]
        longest = max(len(tokens) for _, tokens in prompts)
        padding = [longest - len(tokens) for _, tokens in prompts]
        batch = mx.array(
            [[0] * pad + list(tokens) for pad, (_, tokens) in zip(padding, prompts, strict=True)]
        )
        caches: list[Any] = [BatchKVCache(padding) for _ in sequences[0].caches]  # mlx-lm: untyped
        logits = self._last_logits(batch, SequenceState(caches, sequences[0].sampler, False))
        sampled = [sample_first(s, logits[row : row + 1]) for row, s in enumerate(sequences)]
        own = [[cache.extract(row) for cache in caches] for row in range(len(sequences))]
        for sequence, extracted in zip(sequences, own, strict=True):  # all or nothing
            sequence.caches = extracted
        return sampled

    def prefill_slice(
        self,
        seq_id: str,
        tokens: Sequence[int],
        seconds: float,
        *,
        last: bool,
        must_progress: bool = True,
    ) -> SliceProgress:
        sequence = self._sequences[seq_id]
        if self._split is None or self._accelerator is None:  # nothing to pause: whole chunk
            if last:
                return SliceProgress(True, self.prefill_and_sample(seq_id, tokens))
            self.prefill(seq_id, tokens)
            return SliceProgress(True)
        body = self._split.body
        started = time.perf_counter()
        if sequence.slice is None:  # a restored prefix is gathered first: no room to size
            caches = self._caches(sequence)
            room = 0 if last else room_to_reserve(caches, sequence.room)
            size = functools.partial(size_cache, room=room, spec=self._spec) if room else None
            sequence.slice = self._accelerator.start_slice(body, tokens, caches, size)
        left = seconds - (time.perf_counter() - started)
        done = sequence.slice.advance(
            body, sequence.caches, left, must_progress=must_progress, between=self._catch_up
        )
        if not done:
            return SliceProgress(False)
        hidden, sequence.slice = sequence.slice.hidden, None
        if not last:
            return SliceProgress(True)
        logits = self._split.head(hidden[:, -1:, :])[:, -1, :]
        mx.eval(logits)
        return SliceProgress(True, sample_first(sequence, logits))

    def prefill_logprobs(self, seq_id: str, tokens: Sequence[int]) -> mx.array:
        """Prefill ``tokens`` and return the log-probabilities after the last one."""
        logits = self._last_logits(mx.array([list(tokens)]), self._sequences[seq_id])
        logprobs = log_softmax(logits)
        mx.eval(logprobs)
        return logprobs

    def _last_logits(self, batch: mx.array, sequence: SequenceState) -> mx.array:
        """Run ``batch`` (rows of tokens) into the caches; the logits after each row."""
        if self._split is not None:  # the output head for the last position only
            hidden = self._body(batch, sequence)[:, -1:, :]
            logits: mx.array = self._split.head(hidden)[:, -1, :]
        else:
            logits = self._model(batch, cache=self._caches(sequence))[:, -1, :]
        mx.eval(logits, [(c.keys, c.values) for c in sequence.caches])
        return logits

    def _body(self, batch: mx.array, sequence: SequenceState) -> mx.array:
        """The final hidden states of a llama model; the accelerator may take a small pass."""
        if self._accelerator is not None:
            hidden = self._accelerator.hidden([Group(batch, sequence.caches, sequence.prefix)])
            if hidden is not None:
                return hidden[0]
        assert self._split is not None  # callers checked: a llama model
        return self._split.body(batch, cache=self._caches(sequence))  # type: ignore[no-any-return]

    def copy_prefix(self, source_id: str, target_id: str, n_tokens: int, room: int) -> bool:
        if source_id in self._decoder:
            caches = self._decoder.prefix_of(source_id, n_tokens)
        else:
            caches = self._caches(self._sequences[source_id])
        clones = clone_prefix(caches, n_tokens, room) if caches is not None else None
        if clones is None:
            return False
        target = self._sequences[target_id]
        target.caches, target.prefix, target.room = clones, None, room
        return True

    def start_decoding(self, seq_id: str, first_token: int, max_new_tokens: int) -> None:
        sequence = self._sequences[seq_id]
        caches: Caches = sequence.caches
        if self._spec.has_sliding_layers and sequence.prefix is None:
            sequence.history = window_history(sequence.caches, self._spec)
        if sequence.prefix is not None:  # built at the next step, after the first token is out
            caches = functools.partial(self._restored.gathered, sequence.prefix, sequence.caches)
        self._decoder.add(
            seq_id,
            caches,
            first_token,
            max_new_tokens,
            sequence.sampler,
            track_top_prob=sequence.track_top_prob,
            matcher=sequence.matcher,
            logprobs=sequence.logprobs,
        )
        sequence.caches, sequence.prefix = [], None  # the batch holds the KV now

    def decode_step(self, ride: PromptChunk | None = None) -> StepOutput:
        group = None
        if ride is not None:
            if len(ride.tokens) > self._ride_capacity():
                raise InvalidRequestError(f"{len(ride.tokens)} tokens cannot ride this step")
            riding = self._sequences[ride.seq_id]
            if not ride.last:
                reserve_room(riding.caches, riding.room, self._spec)
            if not self._host_rows or len(ride.tokens) + len(self._decoder) > self._host_rows:
                self._caches(riding)  # a pass on MLX needs the prefix copied in first
            group = Group(mx.array([list(ride.tokens)]), riding.caches, riding.prefix)
        produced, ridden = self._decoder.step(group)
        first = self._finish_ride(ride, group, ridden) if ride is not None else None
        return self._step_output(produced, first)

    def _step_output(
        self, produced: list[DecodedToken], first: SampledToken | None = None
    ) -> StepOutput:
        for token in produced:
            if token.finished:
                caches = self._decoder.take_finished(token.seq_id)
                if caches is not None and token.seq_id in self._sequences:
                    self._sequences[token.seq_id].caches = caches
        return StepOutput(produced, first, self._decoder.take_failed())

    def begin_decode_step(self) -> bool:
        return self._beside is not None and self._beside.begin()

    def end_decode_step(self) -> StepOutput:
        if self._beside is None:
            raise RuntimeError("no decode step was begun beside a slice")
        return self._beside.end()

    def _catch_up(self) -> bool:
        """Between a slice's steps: whether a step begun beside it still runs its body."""
        return self._beside is not None and self._beside.catch_up()

    def _finish_ride(
        self, ride: PromptChunk, group: Group | None, ridden: mx.array | None
    ) -> SampledToken | None:
        """Evaluate the ridden chunk (and sample its prompt's first token if it was the
        last); when every row failed to join, nothing ran, so the chunk runs alone."""
        if ridden is None or group is None:
            if ride.last:
                return self.prefill_and_sample(ride.seq_id, ride.tokens)
            self.prefill(ride.seq_id, ride.tokens)
            return None
        if ride.last and self._split is not None:  # riding implies a llama model
            logits = self._split.head(ridden[:, -1:, :])[:, -1, :]
            mx.eval(logits, [(c.keys, c.values) for c in group.caches])
            return sample_first(self._sequences[ride.seq_id], logits)
        mx.eval([(c.keys, c.values) for c in group.caches])
        return None

    def _reads_restored(self, seq_id: str) -> bool:
        sequence = self._sequences.get(seq_id)
        pending_in_batch = self._decoder.builds_pending(seq_id)
        return (sequence is not None and sequence.prefix is not None) or pending_in_batch

    @property
    def capabilities(self) -> BackendCapabilities:
        """``ride_rows``: the fused pass's rows, where the model has one."""
        return self._capabilities

    def _ride_capacity(self) -> int:
        return self._capabilities.ride_capacity(len(self._decoder))

    def close_sequence(self, seq_id: str, keep_tokens: int) -> ExportedKV:
        self._in_place.discard(seq_id)
        sequence = self._sequences.pop(seq_id)
        if keep_tokens <= 0:  # nothing to keep: a pending cache build is not worth doing
            if seq_id in self._decoder:
                self._decoder.remove(seq_id, build=False)
            return ExportedKV(0, [[] for _ in range(self._spec.n_layers)])
        in_batch = seq_id in self._decoder
        caches = self._decoder.remove(seq_id) if in_batch else self._caches(sequence)
        held = min(int(c.offset) for c in caches) if caches else 0
        keep = min(keep_tokens, held)
        if keep <= 0:
            return ExportedKV(0, [[] for _ in range(self._spec.n_layers)])
        blocks = cut_into_blocks(caches, keep, self._spec, self._buffers, sequence.history)
        return ExportedKV(keep, blocks)

    def warm_up(self) -> None:
        """Prefill and decode a few tokens so MLX has compiled and allocated what it needs."""
        self.open_sequence(
            "warm-up", restored=None, n_restored=0, n_new=8, sampling=SamplingParams()
        )
        first = self.prefill_and_sample("warm-up", [0] * 8)
        self.start_decoding("warm-up", first.token, 2)
        for _ in range(3):
            if any(token.finished for token in self.decode_step().tokens):
                break
        self.close_sequence("warm-up", 0)
