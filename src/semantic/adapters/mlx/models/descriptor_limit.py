"""Import mlx-lm without letting it lower the process's descriptor limit.

mlx-lm sets RLIMIT_NOFILE to (2048, 4096) when it is imported (``mlx_lm/utils.py``, "for
large models with lots of files"). Where the system's hard limit is higher, that lowers it
for good (only a privileged process may raise a hard limit again): a server that raised
its limit to 20,000 at start was back at 2,048 once the model code loaded, which is where a
slow-client flood found it (issue 32). Where the hard limit is lower than 4,096, the import
fails outright (``ValueError: not allowed to raise maximum limit``). For the length of that
import only, ``resource.setrlimit`` on RLIMIT_NOFILE may raise the soft limit (within the
hard one) but never lower either.
"""

from __future__ import annotations

import importlib
import resource
import sys
from collections.abc import Iterator
from contextlib import contextmanager


def import_mlx_lm_keeping_descriptor_limit() -> None:
    if "mlx_lm.utils" in sys.modules:
        return
    with _descriptor_limit_only_raised():
        importlib.import_module("mlx_lm.utils")


@contextmanager
def _descriptor_limit_only_raised() -> Iterator[None]:
    original = resource.setrlimit

    def raise_only(which: int, limits: tuple[int, int], /) -> None:
        if which != resource.RLIMIT_NOFILE:
            original(which, limits)
            return
        soft, hard = resource.getrlimit(which)
        wanted = limits[0] if hard == resource.RLIM_INFINITY else min(limits[0], hard)
        if soft != resource.RLIM_INFINITY and wanted > soft:
            original(which, (wanted, hard))

    resource.setrlimit = raise_only
    try:
        yield
    finally:
        resource.setrlimit = original
