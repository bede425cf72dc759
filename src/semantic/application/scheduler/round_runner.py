"""One round's work run on a backend's own steps, in the order every backend runs it.

The port takes a round in one call (``ModelBackend.run``); a backend does it with steps
of its own: joins, the batched decode step (a chunk riding it, or begun beside a slice
where the backend can run it on another core), then the prompt parts: whole prompts in
one pass (alone, each, should it fail), plain chunks, and slices that stop when their
time is up and go on into the next chunk while time is left. ``RoundRunner`` is that
order, written once for the MLX backend and the unit tests' fake; each failure is an
outcome naming the sequences it touched, and the round goes on without them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Protocol

from semantic.ports.model_backend import (
    Failed,
    InFlight,
    Outcome,
    Prefilled,
    PromptChunk,
    RoundWork,
    SampledToken,
    SlicedPrompt,
    SliceProgress,
    SoFar,
    StepFailed,
    StepOutput,
    Stepped,
    WholePrompts,
)


class RoundSteps(Protocol):
    """A backend's own steps, as the runner calls them."""

    @property
    def decoding_count(self) -> int: ...

    def start_decoding(self, seq_id: str, first_token: int, max_new_tokens: int) -> None: ...

    def decode_step(self, ride: PromptChunk | None = None) -> StepOutput: ...

    def begin_decode_step(self) -> bool:
        """Begin the step beside the slices that follow; False: nothing begun."""
        ...

    def end_decode_step(self) -> StepOutput: ...

    def prefill(self, seq_id: str, tokens: Sequence[int]) -> None: ...

    def prefill_and_sample(self, seq_id: str, tokens: Sequence[int]) -> SampledToken: ...

    def prefill_slice(
        self,
        seq_id: str,
        tokens: Sequence[int],
        seconds: float,
        *,
        last: bool,
        must_progress: bool = True,
    ) -> SliceProgress: ...

    def prefill_many_and_sample(
        self, prompts: Sequence[tuple[str, Sequence[int]]]
    ) -> list[SampledToken]: ...


class RoundRunner:
    """``clock``: the backend's, seconds; the round began ``work.elapsed`` before ``run``."""

    def __init__(self, steps: RoundSteps, clock: Callable[[], float]) -> None:
        self._steps = steps
        self._clock = clock

    def run(self, work: RoundWork) -> tuple[Outcome, ...]:
        return _Round(self._steps, self._clock, work).run()


class _Round:
    def __init__(self, steps: RoundSteps, clock: Callable[[], float], work: RoundWork) -> None:
        self._steps = steps
        self._clock = clock
        self._work = work
        self._started = clock() - work.elapsed
        self._out: list[Outcome] = []
        self._failed: set[str] = set()
        self._stepped = False
        """Whether the step ran (or was begun beside the slice): a slice has what is left
        of the round."""
        self._step_seconds: float | None = None
        self._begin_failed = False
        """Beginning the step beside the slice failed: its sequences fail, no step runs."""

    def run(self) -> tuple[Outcome, ...]:
        for join in self._work.joins:
            try:
                self._steps.start_decoding(join.seq_id, join.first_token, join.max_new_tokens)
            except Exception as error:  # noqa: BLE001 - only that sequence fails
                self._fail(join.seq_id, error)
        beside = self._work.ride is None and self._begin_beside()
        if not beside and self._work.decode and not self._begin_failed:
            self._step(self._work.ride)
        try:
            for part in self._work.parts:
                self._part(part)
        finally:
            if beside:
                self._end_beside()
        return tuple(self._out)

    def _fail(self, seq_id: str, error: Exception) -> None:
        self._failed.add(seq_id)
        self._out.append(Failed(seq_id, error))

    def _step(self, ride: PromptChunk | None) -> None:
        started = self._clock()
        try:
            output = self._steps.decode_step(ride)
        except Exception as error:  # noqa: BLE001 - a failed step fails its sequences only
            self._out.append(StepFailed(error))
            if ride is not None:
                self._failed.add(ride.seq_id)
            return
        seconds = self._clock() - started
        if ride is None:  # a ridden step's time is the ride's, not the round's pace
            self._stepped, self._step_seconds = True, seconds
        self._failed.update(output.failed)
        self._out.append(Stepped(output, seconds))

    def _begin_beside(self) -> bool:
        """Whether the step was begun beside the round's slice (its time is then not the
        streams' pace); should beginning it fail, the sequences it would step fail."""
        if not (self._work.sliced and self._work.decode):
            return False
        try:
            begun = self._steps.begin_decode_step()
        except Exception as error:  # noqa: BLE001 - a failed step fails its sequences only
            self._out.append(StepFailed(error))
            self._begin_failed = True
            return False
        self._stepped = begun
        return begun

    def _end_beside(self) -> None:
        try:
            output = self._steps.end_decode_step()
        except Exception as error:  # noqa: BLE001 - a failed step fails its sequences only
            self._out.append(StepFailed(error, beside=True))
            return
        self._out.append(Stepped(output, None, beside=True))

    def _part(self, part: WholePrompts | PromptChunk | SlicedPrompt) -> None:
        if isinstance(part, WholePrompts):
            self._whole(part)
        elif part.seq_id in self._failed:
            return
        elif isinstance(part, SlicedPrompt):
            self._sliced(part)
        else:
            self._chunk(part)

    def _chunk(self, chunk: PromptChunk) -> None:
        first: SampledToken | None = None
        started = self._clock()
        try:
            if chunk.last:
                first = self._steps.prefill_and_sample(chunk.seq_id, chunk.tokens)
            else:
                self._steps.prefill(chunk.seq_id, chunk.tokens)
        except Exception as error:  # noqa: BLE001 - one failed prompt must not fail the others
            self._fail(chunk.seq_id, error)
            return
        done = ((chunk.seq_id, len(chunk.tokens)),)
        self._out.append(Prefilled(done, chunk.position, self._clock() - started, (first,)))

    def _whole(self, part: WholePrompts) -> None:
        prompts = [
            (seq_id, tokens) for seq_id, tokens in part.prompts if seq_id not in self._failed
        ]
        started = self._clock()
        try:
            firsts = self._steps.prefill_many_and_sample(prompts)
        except Exception:  # noqa: BLE001 - each runs alone below, where errors are reported
            for seq_id, tokens in prompts:
                self._chunk(PromptChunk(seq_id, tokens, last=True))
            return
        done = tuple((seq_id, len(tokens)) for seq_id, tokens in prompts)
        self._out.append(Prefilled(done, 0, self._clock() - started, tuple(firsts)))

    def _sliced(self, part: SlicedPrompt) -> None:
        """Its chunks' layers while its time lasts; a chunk counts once all have it. One that
        ends early goes on into the next, whose first steps may wait for the next round:
        an ended chunk left ~0.4 s of a 4,000-token prompt's slices unused beside four
        streams."""
        elapsed = self._clock() - self._started if self._stepped else None
        seconds = part.budget(SoFar(elapsed, self._step_seconds, self._steps.decoding_count))
        deadline, offset = self._clock() + seconds, 0
        for index, n in enumerate(part.sizes):
            if index:
                seconds = deadline - self._clock()
                if not (math.isfinite(seconds) and seconds > 0):
                    return
            tokens, last = part.tokens[offset : offset + n], offset + n == len(part.tokens)
            try:
                progress = self._steps.prefill_slice(
                    part.seq_id, tokens, seconds, last=last, must_progress=not index
                )
            except Exception as error:  # noqa: BLE001 - one failed prompt must not fail the others
                self._fail(part.seq_id, error)
                return
            if not progress.done:
                self._out.append(InFlight(part.seq_id, n))
                return
            first = (progress.first_token,)
            self._out.append(Prefilled(((part.seq_id, n),), part.position + offset, None, first))
            offset += n
