"""The round executor: one round's plan, as one call to the backend, then its outcomes.

A round is the sequences that got their first token joining the decoder, one batched
decode step for every decoding request (the plan's riding chunk computed inside its
forward pass, or the step run beside a sliced chunk where the backend can), then the
planned prefill chunks: fresh prompts that fit whole share one pass, a sliced chunk runs
layer by layer for the time the pacer's rule gives it, the rest run chunk by chunk. The
backend runs it all (``ModelBackend.run``) and says what happened, in order; the pacer
and the requests' lifecycle take it in afterwards. Each failure fails only the requests
it touched.

Requests the step finishes are closed once the round is over, not before its chunks: the
round was planned (and its blocks reserved) before it began, so nothing in it waits for
the blocks they free.
"""

from __future__ import annotations

from semantic.application.engine.active_request import ActiveRequest
from semantic.application.engine.admission import Admission
from semantic.application.engine.lifecycle import Events, Lifecycle
from semantic.application.engine.state import EngineState
from semantic.application.scheduler.pacer import PrefillPacer
from semantic.application.scheduler.prefill_adder import PlannedChunk, PrefillAdder, RoundPlan
from semantic.ports.model_backend import (
    Failed,
    InFlight,
    ModelBackend,
    Outcome,
    Prefilled,
    PromptChunk,
    PromptPart,
    RoundWork,
    SlicedPrompt,
    StepFailed,
    Stepped,
    WholePrompts,
)


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

    def run(self, plan: RoundPlan, events: Events, started: float) -> None:
        """Run ``plan``, a round that began at ``started``."""
        stepping = self._lifecycle.decoding()
        if not stepping:
            self._pacer.observe_idle()
        ride = _chunk(plan.ride, plan.ride.request.prefilled) if plan.ride is not None else None
        work = RoundWork(
            decode=bool(stepping),
            joins=self._lifecycle.take_joins(),
            ride=ride,
            parts=self._parts(plan, len(stepping)),
            elapsed=self._clock() - started,
            sliced=plan.slice_seconds is not None,
        )
        result = self._backend.run(work)
        beside: list[Outcome] = []
        for outcome in result.outcomes:
            if isinstance(outcome, Stepped | StepFailed) and outcome.beside:
                beside.append(outcome)  # its tokens come once the slice is done
            else:
                self._take(outcome, plan, stepping, events)
        self._admission.fail_refused(events)
        for outcome in beside:
            self._take(outcome, plan, stepping, events)
        self._admission.release_copied(result.copied)

    def _parts(self, plan: RoundPlan, batch: int) -> tuple[PromptPart, ...]:
        """Fresh prompts that fit whole first, in one pass; then the other chunks in order."""
        chunks = list(plan.chunks)
        whole = [
            c.request
            for c in chunks
            if c.request.prefilled == 0
            and c.tokens == len(c.request.prompt)
            and not c.request.in_flight
        ]
        parts: list[PromptPart] = []
        if len(whole) > 1:
            parts.append(WholePrompts(tuple((a.id, a.prompt) for a in whole)))
            batched = {a.id for a in whole}
            chunks = [c for c in chunks if c.request.id not in batched]
        at = {c.request.id: c.request.prefilled for c in chunks}  # a request may have several
        for chunk in chunks:
            parts.append(self._part(chunk, at[chunk.request.id], plan.slice_seconds, batch))
            at[chunk.request.id] += chunk.tokens
        return tuple(parts)

    def _part(
        self, chunk: PlannedChunk, position: int, planned: float | None, batch: int
    ) -> PromptPart:
        """A chunk planned sliced, or part way through the layers, is sliced (at a slice's
        pace while streams decode, else to its end); any other runs whole."""
        active = chunk.request
        if planned is None and not active.in_flight:
            return _chunk(chunk, position)
        return SlicedPrompt(
            active.id,
            active.prompt[position:],
            self._adder.slice_sizes(position, len(active.prompt), chunk.tokens),
            position,
            self._pacer.slice_budget(planned, in_flight=bool(active.in_flight), batch=batch),
        )

    def _take(
        self, outcome: Outcome, plan: RoundPlan, stepping: list[ActiveRequest], events: Events
    ) -> None:
        if isinstance(outcome, Stepped):
            self._stepped(outcome, plan, len(stepping), events)
        elif isinstance(outcome, StepFailed):
            failing = (
                [*stepping, plan.ride.request] if plan.ride and not outcome.beside else stepping
            )
            for active in failing:
                if active.id in self._running:
                    self._lifecycle.fail(active, outcome.error, events)
        elif isinstance(outcome, Prefilled):
            self._prefilled(outcome, events)
        else:
            self._stopped(outcome, events)

    def _stepped(self, stepped: Stepped, plan: RoundPlan, batch: int, events: Events) -> None:
        """The step's tokens; its time is the streams' pace (or, ridden, what the ride
        added), unless it ran beside a slice."""
        ride = plan.ride if not stepped.beside else None
        if stepped.seconds is not None and ride is None:
            plain = not plan.chunks and plan.ride is None
            self._pacer.observe_decode(stepped.seconds, batch=batch, plain=plain)
        elif stepped.seconds is not None and ride is not None:
            self._pacer.observe_ride(ride.tokens, ride.request.prefilled, stepped.seconds)
        self._lifecycle.take_output(stepped.output, events)
        if ride is not None:
            first = stepped.output.first_token
            self._lifecycle.chunk_done(ride.request, ride.tokens, first, events)

    def _prefilled(self, prefilled: Prefilled, events: Events) -> None:
        if prefilled.seconds is not None:
            tokens = sum(n for _, n in prefilled.chunks)
            self._pacer.observe_prefill(tokens, prefilled.position, prefilled.seconds)
        for (seq_id, n), first in zip(prefilled.chunks, prefilled.firsts, strict=True):
            active = self._running.get(seq_id)
            if active is not None:
                active.in_flight = 0
                self._lifecycle.chunk_done(active, n, first, events)

    def _stopped(self, outcome: InFlight | Failed, events: Events) -> None:
        active = self._running.get(outcome.seq_id)
        if active is None:
            return
        if isinstance(outcome, InFlight):
            active.in_flight = outcome.tokens
        else:
            self._lifecycle.fail(active, outcome.error, events)


def _chunk(chunk: PlannedChunk, position: int) -> PromptChunk:
    prompt, end = chunk.request.prompt, position + chunk.tokens
    return PromptChunk(chunk.request.id, prompt[position:end], end == len(prompt), position)
