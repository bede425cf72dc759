"""A decode step's body on the second core while the engine thread slices a prompt.

A round beside a long prompt was the streams' decode step (~28 ms here, both cores on the
weights) and then the prompt's slice. The step's body reads 538 MB of weights for 4 rows:
on one core it took 34 ms, and a slice's products on the other core ran at the same speed
with it as without it (the one streams memory, the other computes from cache). So the
body runs on a worker thread, each side on one thread (OpenBLAS at one thread, our
kernels without their helper), and the slice gets back both threads once the body is
done. A slice then makes ~20% more progress per round. ADR 0015 has the measurements.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from semantic.adapters.mlx.accelerator import PendingStep, StepDecoder
from semantic.adapters.mlx.cpu.compute_threads import ComputeThreads, compute_threads
from semantic.ports.model_backend import DecodedToken, StepOutput

SIDE_BY_SIDE_ENV = "SEMANTIC_SIDE_BY_SIDE"
"""``0``: a round's decode step runs before its slice, both on every core."""


def step_beside_slice(
    decoder: StepDecoder, report: Callable[[list[DecodedToken]], StepOutput]
) -> StepBesideSlice | None:
    """None where the products' threads cannot be switched (or ``SEMANTIC_SIDE_BY_SIDE=0``)."""
    threads = compute_threads() if os.environ.get(SIDE_BY_SIDE_ENV) != "0" else None
    return None if threads is None else StepBesideSlice(decoder, SideBySide(threads), report)


class SideBySide:
    """One piece of work at a time on a worker thread, the products one thread each
    meanwhile. ``start``, ``done`` and ``wait`` are called from the engine thread only,
    between MLX evaluations."""

    def __init__(self, threads: ComputeThreads) -> None:
        self._threads = threads
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="decode-body")
        self._running: Future[None] | None = None

    def start(self, work: Callable[[], None]) -> None:
        if self._running is not None:
            raise RuntimeError("work is already running beside this thread")
        self._threads.one_each()
        self._running = self._worker.submit(work)

    def done(self) -> bool:
        return self._running is None or self._running.done()

    def wait(self) -> None:
        """Wait for the work and give the products their threads back; re-raises the
        work's error."""
        running, self._running = self._running, None
        if running is None:
            return
        try:
            running.result()
        finally:
            self._threads.restore()


class StepBesideSlice:
    """A decode batch's step begun beside a slice: ``begin``, then ``catch_up`` between
    the slice's steps (the head and sampling run here once the body is done), then
    ``end``. ``report`` turns the step's tokens into the backend's output."""

    def __init__(
        self,
        decoder: StepDecoder,
        side: SideBySide,
        report: Callable[[list[DecodedToken]], StepOutput],
    ) -> None:
        self._decoder = decoder
        self._side = side
        self._report = report
        self._pending: PendingStep | None = None
        self._outcome: StepOutput | Exception | None = None

    def begin(self) -> bool:
        if self._pending is not None:
            return False
        pending = self._decoder.begin_step()
        if pending is None:
            return False
        self._side.start(pending.body.run)
        self._pending = pending
        return True

    def catch_up(self, *, wait: bool = False) -> bool:
        """Finish the step once its body is done, or at once with ``wait``. Whether the
        body still runs, and the products with it one thread each."""
        if self._pending is None:
            return False
        if not wait and not self._side.done():
            return True
        pending, self._pending = self._pending, None
        try:
            self._side.wait()
            self._outcome = self._report(self._decoder.finish_step(pending))
        except Exception as error:  # noqa: BLE001 - end raises it, for the streams
            self._outcome = error
        return False

    def end(self) -> StepOutput:
        self.catch_up(wait=True)
        outcome, self._outcome = self._outcome, None
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is None:
            raise RuntimeError("no decode step was begun beside a slice")
        return outcome
