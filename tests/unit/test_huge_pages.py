"""Which pages under the weights are collapsed, and what is said when some are not."""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable

from semantic.adapters.mlx.cpu.huge_pages import (
    BUSY_TRIES,
    HUGE_PAGE,
    HUGE_PAGES_ENV,
    Span,
    WeightPages,
    collapse_spans,
    merged,
    obstacle,
    page_runs,
)
from semantic.adapters.mlx.cpu.page_placement import PagePlacement

MB = 1 << 20


class FakeKernel:
    """``madvise(MADV_COLLAPSE)`` that refuses the calls it is told to, and remembers all."""

    def __init__(self, refuse: dict[Span, int] | None = None) -> None:
        self.refuse = refuse or {}
        self.calls: list[Span] = []

    def __call__(self, start: int, length: int) -> int:
        self.calls.append((start, start + length))
        return self.refuse.get((start, start + length), 0)


def test_touching_and_overlapping_arrays_merge_and_pages_cover_them_whole() -> None:
    spans = merged([(10 * MB, 11 * MB), (3 * MB, 5 * MB), (5 * MB, 6 * MB), (4 * MB, 4 * MB + 1)])
    assert spans == [(3 * MB, 6 * MB), (10 * MB, 11 * MB)]
    assert page_runs(spans) == [(2 * MB, 6 * MB), (10 * MB, 12 * MB)]


def test_pages_larger_than_2_mib_stay_inside_the_weights() -> None:
    big = 32 * MB
    spans = [(10 * MB, 100 * MB), (130 * MB, 150 * MB)]
    assert page_runs(spans, big) == [(32 * MB, 96 * MB)]


def test_every_page_collapsed_counts_every_weight_byte() -> None:
    spans = [(3 * MB, 6 * MB), (7 * MB, 9 * MB)]
    kernel = FakeKernel()
    pages = collapse_spans(spans, kernel)
    assert kernel.calls == [(p, p + HUGE_PAGE) for p in range(2 * MB, 10 * MB, HUGE_PAGE)]
    assert (pages.weight_bytes, pages.huge_bytes, pages.why_not) == (5 * MB, 5 * MB, None)
    assert pages.mostly


def test_a_page_refused_leaves_the_others_collapsed_and_is_said() -> None:
    straddling = (4 * MB, 6 * MB)
    kernel = FakeKernel({straddling: errno.EINVAL})
    pages = collapse_spans([(0, 8 * MB)], kernel)
    assert kernel.calls == [(p, p + HUGE_PAGE) for p in range(0, 8 * MB, HUGE_PAGE)]
    assert pages.huge_bytes == 6 * MB
    assert pages.why_not == "some pages straddle two mappings"
    assert not pages.mostly


def test_a_kernel_without_collapse_and_one_out_of_pages_are_told_apart() -> None:
    old = collapse_spans([(0, HUGE_PAGE)], FakeKernel({(0, HUGE_PAGE): errno.EINVAL}))
    assert old.huge_bytes == 0
    assert "Linux 6.1" in (old.why_not or "")
    full = collapse_spans([(0, HUGE_PAGE)], FakeKernel({(0, HUGE_PAGE): errno.ENOMEM}))
    assert "no huge page was free" in (full.why_not or "")
    assert "0 of 2 MB on huge pages" in full.describe()


def test_the_switch_and_other_systems_turn_it_off() -> None:
    assert obstacle("linux", {}) is None
    assert obstacle("linux", {HUGE_PAGES_ENV: "0"}) == f"{HUGE_PAGES_ENV}=0"
    assert "Linux" in (obstacle("darwin", {}) or "")


def test_a_busy_page_is_tried_again() -> None:
    class BusyOnce(FakeKernel):
        def __call__(self, start: int, length: int) -> int:
            super().__call__(start, length)
            return errno.EAGAIN if len(self.calls) <= 2 else 0

    kernel = BusyOnce()
    pages = collapse_spans([(0, HUGE_PAGE)], kernel)
    assert len(kernel.calls) == 3  # busy twice, then collapsed
    assert pages.huge_bytes == HUGE_PAGE


def test_a_page_busy_every_time_is_said() -> None:
    kernel = FakeKernel({(0, HUGE_PAGE): errno.EAGAIN})
    pages = collapse_spans([(0, HUGE_PAGE)], kernel)
    assert len(kernel.calls) == BUSY_TRIES
    assert "busy" in (pages.why_not or "")


def test_weights_never_placed_are_not_said_to_be_on_huge_pages() -> None:
    pages = WeightPages(0, 0, f"{HUGE_PAGES_ENV}=0")
    assert not pages.mostly
    assert pages.describe() == f"{HUGE_PAGES_ENV}=0"


class HeldKernel(FakeKernel):
    """Each call waits until the test lets it go."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Semaphore(0)
        self.go = threading.Semaphore(0)

    def __call__(self, start: int, length: int) -> int:
        self.entered.release()
        assert self.go.acquire(timeout=30)
        return super().__call__(start, length)


def test_a_placement_is_under_way_until_its_thread_ends_and_then_tells_everyone() -> None:
    kernel, heard = HeldKernel(), list[WeightPages]()
    placement = PagePlacement([(0, HUGE_PAGE)], kernel, HUGE_PAGE)
    placement.when_done(heard.append)
    assert not kernel.entered.acquire(timeout=0.05)  # nothing moves before the start
    placement.start()
    placement.start()  # once
    assert kernel.entered.acquire(timeout=30)
    assert placement.pages is None
    assert placement.wait(0) is None
    kernel.go.release()
    done = placement.wait(30)
    assert done is not None
    assert done.huge_bytes == HUGE_PAGE
    assert heard == [done]
    placement.when_done(heard.append)  # after the end: at once, on this thread
    assert heard == [done, done]


def test_a_stopped_placement_moves_no_piece_after_the_one_under_way() -> None:
    piece = HUGE_PAGE
    kernel = HeldKernel()
    placement = PagePlacement([(0, 3 * piece)], kernel, HUGE_PAGE)
    placement.start()
    assert kernel.entered.acquire(timeout=30)
    placement.stop()
    kernel.go.release()
    pages = placement.wait(30)
    assert pages is not None
    assert kernel.calls == [(0, piece)]
    assert pages.huge_bytes == piece
    assert pages.why_not == "stopped before it was over"


def test_a_placement_ruled_out_is_over_from_the_start() -> None:
    placement = PagePlacement.ruled_out(f"{HUGE_PAGES_ENV}=0")
    assert placement.pages == WeightPages(0, 0, f"{HUGE_PAGES_ENV}=0")
    assert placement.wait(0) is placement.pages


def test_a_placement_moves_while_the_server_is_idle_or_once_its_patience_runs_out() -> None:
    piece = HUGE_PAGE
    kernel, busy = FakeKernel(), threading.Event()
    busy.set()
    placement = PagePlacement([(0, 2 * piece)], kernel, HUGE_PAGE)
    placement.start(idle=lambda: not busy.is_set(), patience=3600)
    assert placement.wait(0.2) is None
    assert kernel.calls == []  # a busy server: nothing moves
    busy.clear()
    assert placement.wait(30) is not None
    assert kernel.calls == [(0, piece), (piece, 2 * piece)]
    impatient = PagePlacement([(0, piece)], FakeKernel(), HUGE_PAGE)
    impatient.start(idle=lambda: False, patience=0)
    moved = impatient.wait(30)
    assert moved is not None
    assert moved.huge_bytes == piece


def test_work_before_the_move_runs_first_on_its_thread_under_the_same_gate() -> None:
    kernel, seen = FakeKernel(), list[tuple[str, list[Span], bool]]()
    placement = PagePlacement([(0, HUGE_PAGE)], kernel, HUGE_PAGE)

    def before(go_ahead: Callable[[], bool]) -> None:
        seen.append((threading.current_thread().name, list(kernel.calls), go_ahead()))

    assert placement.start(before=before)
    assert placement.wait(30) is not None
    assert seen == [("huge-pages", [], True)]  # before any page moved
    assert not placement.start(before=before)  # begun once: nothing more runs
    over = PagePlacement.ruled_out(f"{HUGE_PAGES_ENV}=0")
    assert not over.start(before=before)  # the caller does the work itself
    assert len(seen) == 1


def test_work_before_the_move_that_fails_leaves_the_move_to_go_on() -> None:
    kernel = FakeKernel()
    placement = PagePlacement([(0, HUGE_PAGE)], kernel, HUGE_PAGE)

    def failing(_go_ahead: Callable[[], bool]) -> None:
        raise RuntimeError("no memory")

    assert placement.start(before=failing)
    moved = placement.wait(30)
    assert moved is not None
    assert moved.huge_bytes == HUGE_PAGE
