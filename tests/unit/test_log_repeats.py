"""The repeat filter: a line said in a loop is written a few times, then counted."""

from __future__ import annotations

import logging

from semantic.adapters.cli.log_repeats import RepeatFilter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(
    message: str, *args: object, name: str = "asyncio", level: int = logging.ERROR
) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, message, args, None)


def test_a_repeated_line_passes_a_burst_then_is_counted_and_the_count_is_said() -> None:
    clock = Clock()
    repeats = RepeatFilter(burst=3, window_s=10, clock=clock)
    passed = [repeats.filter(record("accept failed on fd %d", fd)) for fd in range(1000)]
    assert passed.count(True) == 3
    clock.now = 10
    after = record("accept failed on fd %d", 7)
    assert repeats.filter(after)
    assert after.getMessage() == (
        "accept failed on fd 7 [997 more like this were dropped before this line]"
    )


def test_lines_that_differ_pass_each_on_its_own() -> None:
    repeats = RepeatFilter(burst=1, window_s=10, clock=Clock())
    assert repeats.filter(record("disk full"))
    assert repeats.filter(record("model failed"))
    assert repeats.filter(record("disk full", name="semantic"))
    assert not repeats.filter(record("disk full"))


def test_numbers_in_an_already_formatted_message_do_not_make_it_new() -> None:
    repeats = RepeatFilter(burst=2, window_s=10, clock=Clock())
    results = [repeats.filter(record(f"socket fd={fd}: Too many open files")) for fd in range(50)]
    assert results.count(True) == 2


def test_lines_below_warning_always_pass() -> None:
    repeats = RepeatFilter(burst=1, window_s=10, clock=Clock())
    lines = [record("req-%d: total %d ms", n, 9, level=logging.INFO) for n in range(20)]
    assert all(repeats.filter(line) for line in lines)
