"""The round executor: one round's plan run on the backend.

A round is one batched decode step for every decoding request (the plan's riding chunk
computed inside its forward pass, or the step begun beside a sliced chunk where the
backend can run it on another core), then the planned prefill chunks: fresh prompts that
fit whole share one pass, a sliced chunk runs layer by layer for the time the pacer gives
it, the rest run chunk by chunk. Each failure fails only the requests it touched.
"""

from __future__ import annotations

import math

from semantic.application.active_request import ActiveRequest
from semantic.application.engine.admission import Admission
from semantic.application.engine.lifecycle import Events, Lifecycle
from semantic.application.engine.state import EngineState
from semantic.application.scheduler.pacer import PrefillPacer
from semantic.application.scheduler.prefill_adder import PlannedChunk, PrefillAdder, RoundPlan
from semantic.ports.model_backend import ModelBackend, PromptChunk, SampledToken


class RoundExecutor:
    def __init__(
        self,
        backend: ModelBackend,
        pacer: PrefillPacer,
        *,
        adder: PrefillAdder,
        admission: Admission,
        lifecycle: Lifecycle,
        state: EngineState,
    ) -> None:
        self._backend = backend
        self._pacer = pacer
        self._adder = adder
        self._admission = admission
        self._lifecycle = lifecycle
        self._running = state.running
        self._clock = state.clock
        self._round_started = 0.0
        self._stepped = False
        """Whether this round's decode step ran (or was begun beside its slice): its slice
        has what is left of the round."""

    def run(self, plan: RoundPlan, events: Events, started: float) -> None:
        """Run ``plan``, a round that began at ``started``."""
        self._round_started, self._stepped = started, False
        beside = None if plan.ride is not None else self._begin_decode_beside_slice(plan, events)
        if beside is None:
            self._decode(events, plan.ride, plain=not plan.chunks and plan.ride is None)
        try:
            self._prefill(plan, events)
        finally:
            if beside is not None:
                self._end_decode_beside_slice(events, beside)

    def _decode(self, events: Events, ride: PlannedChunk | None, plain: bool) -> None:
        batch = self._backend.decoding_count
        if batch == 0:
            self._pacer.observe_idle()
            return
        chunk = None
        if ride is not None:
            active, n = ride.request, ride.tokens
            tokens = active.prompt[active.prefilled : active.prefilled + n]
            chunk = PromptChunk(active.id, tokens, active.prefilled + n == len(active.prompt))
        started = self._clock()
        try:
            output = self._backend.decode_step(chunk)
        except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the server
            self._lifecycle.fail_decoding(error, events)
            if ride is not None:
                self._lifecycle.fail(ride.request, error, events)
            return
        elapsed = self._clock() - started
        if ride is None:
            self._pacer.observe_decode(elapsed, batch=batch, plain=plain)
            self._stepped = True
        else:
            self._pacer.observe_ride(ride.tokens, ride.request.prefilled, elapsed)
        self._lifecycle.take_output(output, events)
        if ride is not None:
            self._lifecycle.chunk_done(ride.request, ride.tokens, output.first_token, events)

    def _begin_decode_beside_slice(
        self, plan: RoundPlan, events: Events
    ) -> list[ActiveRequest] | None:
        """The requests this round's decode step steps, if it was begun beside its slice
        (the backend runs it on another core while the slice goes on). Its time is not
        the streams' pace, so the pacer does not see it; the slice has the whole round.
        Should beginning it fail, the requests it would step fail, and the round goes on
        without them."""
        if plan.slice_seconds is None or not self._backend.decoding_count:
            return None
        stepping = self._lifecycle.decoding()
        try:
            begun = self._backend.begin_decode_step()
        except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the server
            self._lifecycle.fail_decoding(error, events)
            return None
        self._stepped = begun
        return stepping if begun else None

    def _end_decode_beside_slice(self, events: Events, stepping: list[ActiveRequest]) -> None:
        """The step's tokens; should it fail, it fails the requests it was stepping (not a
        prompt that got its first token beside it)."""
        try:
            output = self._backend.end_decode_step()
        except Exception as error:  # noqa: BLE001 - a failed step fails its requests, not the server
            self._lifecycle.fail_decoding(error, events, stepping)
            return
        self._lifecycle.take_output(output, events)

    def _prefill(self, plan: RoundPlan, events: Events) -> None:
        chunks = list(plan.chunks)
        whole = [
            c.request
            for c in chunks
            if c.request.prefilled == 0
            and c.tokens == len(c.request.prompt)
            and not c.request.in_flight
        ]
        if len(whole) > 1:
            self._prefill_whole_prompts(whole, events)
            batched = {a.id for a in whole}
            chunks = [c for c in chunks if c.request.id not in batched]
        for chunk in chunks:
            if chunk.request.id in self._running:  # an earlier chunk may have failed it
                self._prefill_chunk(chunk.request, chunk.tokens, plan.slice_seconds, events)
        self._admission.fail_refused(events)

    def _prefill_chunk(
        self, active: ActiveRequest, n: int, planned: float | None, events: Events
    ) -> None:
        batch = self._backend.decoding_count
        elapsed = (lambda: self._clock() - self._round_started) if self._stepped else None
        seconds = self._pacer.chunk_seconds(
            planned, in_flight=bool(active.in_flight), batch=batch, round_elapsed=elapsed
        )
        if seconds is not None:
            self._prefill_slice(active, n, seconds, events)
            return
        chunk = active.prompt[active.prefilled : active.prefilled + n]
        first: SampledToken | None = None
        started = self._clock()
        try:
            if active.prefilled + n < len(active.prompt):
                self._backend.prefill(active.id, chunk)
            else:
                first = self._backend.prefill_and_sample(active.id, chunk)
        except Exception as error:  # noqa: BLE001 - one failed prompt must not fail the others
            self._lifecycle.fail(active, error, events)
            return
        self._pacer.observe_prefill(n, active.prefilled, self._clock() - started)
        self._lifecycle.chunk_done(active, n, first, events)

    def _prefill_slice(self, active: ActiveRequest, n: int, seconds: float, events: Events) -> None:
        """Some of a chunk's layers; the chunk counts as prefilled once all have it. A chunk
        that ends before the slice's time does goes on into the next chunk, whose first
        steps may wait for the next round: an ended chunk left ~0.4 s of a 4,000-token
        prompt's slices unused beside four streams."""
        deadline = self._clock() + seconds
        first = True
        while self._slice_chunk(active, n, seconds, events, first=first):
            seconds = deadline - self._clock()
            if not (math.isfinite(seconds) and seconds > 0 and active.remaining_prompt > 0):
                return
            n, first = self._adder.next_slice(active), False

    def _slice_chunk(
        self, active: ActiveRequest, n: int, seconds: float, events: Events, *, first: bool
    ) -> bool:
        """Whether the chunk was finished (and the request still runs)."""
        chunk = active.prompt[active.prefilled : active.prefilled + n]
        last = active.prefilled + n == len(active.prompt)
        try:
            progress = self._backend.prefill_slice(
                active.id, chunk, seconds, last=last, must_progress=first
            )
        except Exception as error:  # noqa: BLE001 - one failed prompt must not fail the others
            self._lifecycle.fail(active, error, events)
            return False
        active.in_flight = 0 if progress.done else n
        if progress.done:
            self._lifecycle.chunk_done(active, n, progress.first_token, events)
        return progress.done and active.id in self._running

    def _prefill_whole_prompts(self, batch: list[ActiveRequest], events: Events) -> None:
        """Fresh prompts that fit this round whole share one forward pass; if it fails, each
        runs alone, so only a prompt that fails by itself fails."""
        started = self._clock()
        try:
            firsts = self._backend.prefill_many_and_sample([(a.id, a.prompt) for a in batch])
        except Exception:  # noqa: BLE001 - retried one by one below, where errors are reported
            for active in batch:
                if active.id in self._running:
                    self._prefill_chunk(active, len(active.prompt), None, events)
            return
        self._pacer.observe_prefill(sum(len(a.prompt) for a in batch), 0, self._clock() - started)
        for active, first in zip(batch, firsts, strict=True):
            active.prefilled = len(active.prompt)
            self._lifecycle.copy_to_followers(active)
            self._lifecycle.first_token(active, first, events)
