"""The model's weights moved onto huge pages (2 MiB on x86-64) beside the server (ADR 0032).

A decode step reads every weight once, 540 MB for SmolLM2 in float32: on 4 KiB pages that
is some 130,000 translations a step, and each miss stalls a stream the prefetcher would
otherwise keep full. Debian's transparent huge pages are "madvise" only, and MLX's buffers
come from malloc unadvised, so a weight never lands on a huge page by itself. Linux 6.1's
``MADV_COLLAPSE`` rebuilds pages already filled as huge pages, in place, whatever the THP
mode says: one call per 2 MiB page under the weights. Measured on a
Zen 3 VM (EPYC family 25 model 1, OpenBLAS 0.3.21 Zen core; ADR 0032), alternated in one
process: the host pass over one row 18.7 -> 16.6 ms; the collapse itself costs ~7 ms per
2 MiB page there (1.3-1.9 s for SmolLM2 in float32), once; 2.1-7.8 s on the same VM a
day later (most of it the copy into fresh memory, which the hypervisor backs as it is first
touched; ``glibc.malloc.hugetlb=1`` paid as much at first touch). While a page moves, the
address space is locked, so the move runs once the server is up, on a thread of its own in
the machine's and the engine's idle time (``page_placement``); ``SEMANTIC_HUGE_PAGES=
at-load`` makes it at load instead (the benchmarks: their figures are steady states).

The pages it rebuilds may hold neighbouring allocations too; their contents are unchanged,
and memory freed later on such a page only splits it back.
"""

from __future__ import annotations

import ctypes
import errno
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

HUGE_PAGES_ENV = "SEMANTIC_HUGE_PAGES"
AT_LOAD = "at-load"
"""``SEMANTIC_HUGE_PAGES=at-load``: the load waits for the move (``0``: no move at all)."""
HUGE_PAGE = 2 << 20
"""x86-64's and 4 KiB-paged arm64's; the kernel's own figure wins (``huge_page_size``)."""
PMD_SIZE_FILE = "/sys/kernel/mm/transparent_hugepage/hpage_pmd_size"
MADV_COLLAPSE = 25
BUSY_TRIES = 3

Span = tuple[int, int]
"""[start, end) in the process's address space."""

Collapse = Callable[[int, int], int]
"""``madvise(start, length, MADV_COLLAPSE)``: 0, or the errno it failed with."""


@dataclass(frozen=True, slots=True)
class WeightPages:
    """How much of the weights lie on huge pages, and why not all of them where not."""

    weight_bytes: int
    huge_bytes: int
    why_not: str | None

    @property
    def mostly(self) -> bool:
        """Nineteen bytes in twenty: a page or two that straddle mappings do not matter."""
        return self.huge_bytes > 0 and self.huge_bytes * 20 >= self.weight_bytes * 19

    def describe(self) -> str:
        if self.weight_bytes == 0:
            return self.why_not or "no weights"
        mb = f"{self.huge_bytes / 1e6:.0f} of {self.weight_bytes / 1e6:.0f} MB"
        return f"{mb} on huge pages" + (f" ({self.why_not})" if self.why_not else "")


def obstacle(platform: str, environ: Mapping[str, str]) -> str | None:
    if environ.get(HUGE_PAGES_ENV) == "0":
        return f"{HUGE_PAGES_ENV}=0"
    if not platform.startswith("linux"):
        return "Linux's transparent huge pages only"
    return None


def weight_spans(model: Any) -> list[Span]:
    """The address ranges of the model's parameters, merged where they touch or overlap
    (a tied head is the embedding's own memory)."""
    import mlx.core as mx
    import numpy as np
    from mlx.utils import tree_flatten

    spans = []
    parameters: Any = tree_flatten(model.parameters())  # a list of (path, array) pairs
    for _, array in parameters:
        plain = array.view(mx.uint16) if array.dtype == mx.bfloat16 else array  # numpy lacks it
        host = np.asarray(plain)  # a view of MLX's buffer on the CPU, not a copy
        spans.append((host.ctypes.data, host.ctypes.data + host.nbytes))
    return merged(spans)


def merged(spans: Iterable[Span]) -> list[Span]:
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out


def huge_page_size() -> int:
    """What one huge page spans here: 2 MiB on x86-64, 32 MiB or 512 MiB on arm64 kernels
    with 16 or 64 KiB pages."""
    try:
        with open(PMD_SIZE_FILE) as size:
            return int(size.read())
    except (OSError, ValueError):
        return HUGE_PAGE


def page_runs(spans: Iterable[Span], page: int = HUGE_PAGE) -> list[Span]:
    """The aligned runs of huge pages under ``spans``, as few calls as possible: rounded out
    to cover them where a page is 2 MiB, rounded in where it is larger (a 512 MiB page
    half outside the weights would fill hundreds of megabytes that were never touched)."""
    if page > HUGE_PAGE:
        inner = ((-(-start // page) * page, end // page * page) for start, end in spans)
        return merged(run for run in inner if run[1] > run[0])
    return merged((start // page * page, -(-end // page) * page) for start, end in spans)


def collapse_spans(
    spans: list[Span],
    collapse: Collapse,
    page: int = HUGE_PAGE,
    go_ahead: Callable[[], bool] = lambda: True,
) -> WeightPages:
    """Collapse the pages under ``spans`` one call a page, a busy page a few times: between
    calls the move may wait for an idle engine or stop (``go_ahead()``, asked before each
    page: False stops it), and a thread that faults meanwhile waits for one page on the
    move, not for a run. Counts the weight bytes on pages that collapsed."""
    done: list[Span] = []
    errors: set[int] = set()
    for one in pages_of(page_runs(spans, page), page):
        if not go_ahead():
            errors.add(errno.ECANCELED)
            break
        if _collapsed(one, collapse, errors):
            done.append(one)
    size = sum(end - start for start, end in spans)
    huge = _overlap(spans, merged(done))
    return WeightPages(size, huge, _why(errors, any_done=bool(done)) if huge < size else None)


def pages_of(runs: Iterable[Span], page: int) -> Iterator[Span]:
    for start, end in runs:
        for at in range(start, end, page):
            yield at, at + page


def _collapsed(page: Span, collapse: Collapse, errors: set[int]) -> bool:
    """EAGAIN: a page could not be locked or isolated just then; it passes."""
    for _ in range(BUSY_TRIES):
        if (error := collapse(page[0], page[1] - page[0])) != errno.EAGAIN:
            break
    if error:
        errors.add(error)
    return error == 0


def _why(errors: set[int], *, any_done: bool) -> str:
    if errno.ECANCELED in errors:
        return "stopped before it was over"
    if errors == {errno.EINVAL}:
        if any_done:
            return "some pages straddle two mappings"
        return "the kernel refused MADV_COLLAPSE (Linux 6.1 or later)"
    if errno.ENOMEM in errors:  # madvise's word for a range not wholly mapped, too
        return "a page reaches past mapped memory, or no huge page was free"
    if errno.EAGAIN in errors:
        return "pages stayed busy (locked or in flight) through every try"
    return "madvise failed: " + ", ".join(sorted(errno.errorcode.get(e, str(e)) for e in errors))


def _overlap(spans: list[Span], pages: list[Span]) -> int:
    total = 0
    for start, end in spans:
        for low, high in pages:
            total += max(0, min(end, high) - max(start, low))
    return total


def madvise_collapse() -> Collapse | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int

    def collapse(start: int, length: int) -> int:
        return 0 if madvise(start, length, MADV_COLLAPSE) == 0 else ctypes.get_errno()

    return collapse
