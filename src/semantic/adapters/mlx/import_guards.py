"""What importing mlx-lm does to the whole process, undone: ``lm`` imports it inside
``process_kept``, and every module here takes mlx-lm's names from ``lm``.

- mlx-lm's package init sets ``TRANSFORMERS_NO_ADVISORY_WARNINGS`` in ``os.environ``: a
  program embedding semantic, or a test, would find its environment changed by an import.
  What the import sets or removes is put back.
- ``mlx_lm/utils.py`` sets RLIMIT_NOFILE to (2048, 4096) "for large models with lots of
  files". Where the system's hard limit is higher, that lowers it for good (only a
  privileged process may raise a hard limit again): a server that raised its limit to
  20,000 at start was back at 2,048 once the model code loaded, which is where a slow-client
  flood found it (issue 32). Where the hard limit is lower than 4,096, the import fails
  outright (``ValueError: not allowed to raise maximum limit``). During the import,
  ``resource.setrlimit`` on RLIMIT_NOFILE may raise the soft limit (within the hard one)
  but never lower either.

Nothing here imports mlx, so the guards can be tested on their own.
"""

from __future__ import annotations

import contextlib
import os
import resource
from collections.abc import Iterator


@contextlib.contextmanager
def process_kept() -> Iterator[None]:
    with environ_kept(), descriptor_limit_only_raised():
        yield


@contextlib.contextmanager
def environ_kept() -> Iterator[None]:
    """The environment as it was before the block, whatever the block set or removed."""
    kept = dict(os.environ)
    try:
        yield
    finally:
        for name in set(os.environ) - set(kept):
            del os.environ[name]
        for name, value in kept.items():
            if os.environ.get(name) != value:
                os.environ[name] = value


@contextlib.contextmanager
def descriptor_limit_only_raised() -> Iterator[None]:
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
